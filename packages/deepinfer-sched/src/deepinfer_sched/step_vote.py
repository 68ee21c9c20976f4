"""DP step-type vote (see csrc/step_vote.hpp): pure functions, the engine does allreduce(MIN).

    point = prefill_attempt_point(decode_steps_since_prefill)
    vote = np.array(step_type_vote(sched.has_prefill_work(), sched.has_decode_work()))
    dist.all_reduce(vote, op=MIN)                       # elementwise, across the DP group
    kind = decide_step_kind(vote, point); out = sched.schedule(kind)
"""

from __future__ import annotations

import os

from ._core import AttemptPoint, decide_step_kind, step_type_vote
from ._core import prefill_attempt_point as _prefill_attempt_point

PREFILL_ATTEMPT_INTERVAL_ENV = "DEEPINFER_PREFILL_ATTEMPT_INTERVAL"
PREFILL_ANY_ATTEMPT_INTERVAL_ENV = "DEEPINFER_PREFILL_ANY_ATTEMPT_INTERVAL"


def prefill_attempt_point(
    decode_steps_since_prefill: int, all_interval: int | None = None, any_interval: int | None = None
) -> AttemptPoint:
    """ALL / ANY / NONE attempt point; intervals default to the env knobs (70 and 100)."""
    if all_interval is None:
        all_interval = int(os.environ.get(PREFILL_ATTEMPT_INTERVAL_ENV, "70"))
    if any_interval is None:
        any_interval = int(os.environ.get(PREFILL_ANY_ATTEMPT_INTERVAL_ENV, "100"))
    return _prefill_attempt_point(decode_steps_since_prefill, all_interval, any_interval)


__all__ = ["AttemptPoint", "decide_step_kind", "prefill_attempt_point", "step_type_vote"]
