"""The per-step agreement of the DP ranks: one all-reduce(MIN) of a small int64 vector.

    vector (per rank)                               after MIN over the DP group
    [0:3] step_type_vote(has_prefill, has_decode)   deepinfer_sched's vote -> decide_step_kind
    [3]   1 if this rank is idle (nothing queued,   1 = every rank is idle
          running or in flight) else 0
    [4]   -commands consumed                        -(the most any rank consumed)
    [5]   commands consumed                         the fewest any rank consumed

Commands reach every rank (front_end.py broadcasts each), but not at the same step: when every
rank is idle but one has consumed fewer commands than another, that one catches up (blocking: its
commands are on the way) and every rank votes again. Only a group idle with equal counts waits
for the next command, so no rank waits for commands while another waits in this all-reduce.

`VotedScheduler` wraps the engine's Scheduler so that `LLMEngine.step()` runs the voted kind:
while a step is forced every rank schedules (a rank without work of that kind gets an IDLE
output and runs no forward: its MoE rounds are the phantoms of ep_comm.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from deepinfer_sched import StepKind, decide_step_kind, prefill_attempt_point, step_type_vote


@dataclass(frozen=True)
class GroupState:
    kind_vote: list[int]      # [3] MIN of step_type_vote
    all_idle: bool
    max_consumed: int
    min_consumed: int

    def step_kind(self, decode_steps_since_prefill: int, all_interval: int, any_interval: int) -> StepKind:
        point = prefill_attempt_point(decode_steps_since_prefill, all_interval, any_interval)
        return decide_step_kind(self.kind_vote, point)


def vote(has_prefill: bool, has_decode: bool, idle: bool, consumed: int,
         group: dist.ProcessGroup | None = None) -> GroupState:
    v = list(step_type_vote(has_prefill, has_decode)) + [int(idle), -consumed, consumed]
    t = torch.tensor(v, dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=group)
    r = t.tolist()
    return GroupState(r[0:3], bool(r[3]), -r[4], r[5])


class VotedScheduler:
    """The engine's Scheduler with the step kind forced by the group vote (`force` before each step)."""

    def __init__(self, inner):
        self._inner = inner
        self._forced: StepKind | None = None
        self.last_kind: StepKind = StepKind.IDLE   # the kind of the last output (IDLE: no forward ran)

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def force(self, kind: StepKind) -> None:
        self._forced = kind

    def has_unfinished(self) -> bool:
        # A forced PREFILL / DECODE makes a rank without requests run the step (its phantom EP
        # rounds). A forced IDLE runs no forward anywhere, so it is no work: counted as work, a ZOS
        # engine put an IDLE step in flight on every loop and the rank never went idle again (it
        # spun on votes after its last request and never saw "stop").
        forced_work = self._forced is not None and self._forced != StepKind.IDLE
        return forced_work or self._inner.has_unfinished()

    def has_local_work(self) -> bool:
        return self._inner.has_unfinished()

    def schedule(self, step_kind: StepKind | None = None):
        kind, self._forced = (self._forced if self._forced is not None else step_kind), None
        out = self._inner.schedule(kind)
        self.last_kind = out.step_kind
        return out


def kv_used_fraction(scheduler) -> float:
    total = scheduler.config.num_blocks
    return float(np.clip(1.0 - scheduler.num_free_blocks() / max(total, 1), 0.0, 1.0))
