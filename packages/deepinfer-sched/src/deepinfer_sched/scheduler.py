"""Typed wrapper of the C++ Scheduler: converts Python sequences to contiguous numpy arrays.

One step (without ZOS):

    out = sched.schedule()                                   # SchedulerOutput
    ... device: forward + sample ...
    pushed = sched.process_outputs(out, token_ids, verified_token_ids, confidence)
    handles = sched.build_request_outputs(out, pushed, pool, token_logprobs, verified_logprobs,
                                          first_token_positions=out.first_token_pos)
    cols = pool.gather(handles); ...; pool.release(handles)  # release one step later

With zero-overhead scheduling the engine calls schedule(N+1) before process_outputs(N) and
flushes the last in-flight step at the end (see csrc/sequence.hpp for the counter timeline).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from . import _core
from ._core import RequestOutputPool, SchedulerOutput, StepKind
from .config import RequestParams, SchedulerConfig

ArrayLike = Sequence[int] | npt.NDArray[np.integer]


def _arr(x: object, dtype: type) -> np.ndarray:
    return np.ascontiguousarray(x, dtype=dtype)


def _opt(x: object | None, dtype: type) -> np.ndarray | None:
    return None if x is None else np.ascontiguousarray(x, dtype=dtype)


class Scheduler:
    """Admission, chunked prefill, LCFS decode with preemption, and the output ledger."""

    def __init__(self, config: SchedulerConfig) -> None:
        self._config = config
        self._core = _core.Scheduler(config.to_core())

    @property
    def config(self) -> SchedulerConfig:
        return self._config

    def add_request(
        self, request_id: int, prompt_token_ids: ArrayLike, params: RequestParams | None = None
    ) -> None:
        """Queue a request. A prompt longer than max_model_len is not an error: it finishes with
        reason "prompt_length_exceeded" on the next schedule() without running."""
        self._core.add_request(request_id, _arr(prompt_token_ids, np.int32), (params or RequestParams()).to_core())

    def abort_request(self, request_id: int) -> bool:
        """Finish now (blocks and slot freed); one final "abort" output rides on the next step.
        False when the request is unknown or already finished."""
        return self._core.abort_request(request_id)

    def set_num_drafts(self, request_ids: ArrayLike, num_drafts: ArrayLike) -> None:
        """Drafts to verify in each request's next decode step (0..nextn; one-shot, default nextn)."""
        self._core.set_num_drafts(_arr(request_ids, np.int64), _arr(num_drafts, np.int32))

    def schedule(self, step_kind: StepKind | None = None) -> SchedulerOutput:
        """Plan one step. `step_kind` forces the kind (DP step-type vote); None = prefill first."""
        return self._core.schedule(step_kind)

    def process_outputs(
        self,
        out: SchedulerOutput,
        token_ids: ArrayLike,  # [req_cnt] main token per request
        verified_token_ids: ArrayLike | None = None,  # [total_q] accepted drafts, -1 terminated
        confidence: npt.ArrayLike | None = None,  # [req_cnt, nextn] next step's draft confidences
        first_token_positions: ArrayLike | None = None,  # [req_cnt] device ftp, cross-checked
    ) -> npt.NDArray[np.int32]:
        """Commit one step's samples; returns pushed_tokens_before_finish [req_cnt]."""
        conf = None
        if confidence is not None:
            conf = np.ascontiguousarray(confidence, dtype=np.float32).reshape(out.req_cnt, out.nextn)
        return self._core.process_outputs(
            out,
            _arr(token_ids, np.int32),
            _opt(verified_token_ids, np.int32),
            conf,
            _opt(first_token_positions, np.int32),
        )

    def build_request_outputs(
        self,
        out: SchedulerOutput,
        pushed: ArrayLike,
        pool: RequestOutputPool,
        token_logprobs: npt.ArrayLike | None = None,  # [req_cnt]
        verified_logprobs: npt.ArrayLike | None = None,  # [total_q]
        first_token_positions: ArrayLike | None = None,  # [req_cnt], required when drafts are emitted
    ) -> npt.NDArray[np.uint64]:
        """One pooled RequestOutput per pushed token (+ ignored / aborted finals); returns handles."""
        return self._core.build_request_outputs(
            out,
            _arr(pushed, np.int32),
            pool,
            _opt(token_logprobs, np.float32),
            _opt(verified_logprobs, np.float32),
            _opt(first_token_positions, np.int32),
        )

    def has_unfinished(self) -> bool:
        return self._core.has_unfinished()

    def has_prefill_work(self) -> bool:
        return self._core.has_prefill_work()

    def has_decode_work(self) -> bool:
        return self._core.has_decode_work()

    def num_waiting(self) -> int:
        return self._core.num_waiting()

    def num_running(self) -> int:
        return self._core.num_running()

    def num_free_blocks(self) -> int:
        return self._core.num_free_blocks()

    def num_cached_blocks(self) -> int:
        return self._core.num_cached_blocks()

    def num_used_mtp_slots(self) -> int:
        return self._core.num_used_mtp_slots()

    def prefix_cache_stats(self) -> _core.PrefixCacheStats:
        """Admissions, prompt tokens, tokens served from the prefix cache, admissions per
        `PrefixMiss` reason (a copy)."""
        return self._core.prefix_cache_stats()

    def add_swa_snapshot(self, key: int) -> None:
        """The engine holds the SWA snapshot keyed `key` (a prefix chain hash from
        `SchedulerOutput.swa_keys`): admissions may hit at its point (swa_snapshot_tokens > 0)."""
        self._core.add_swa_snapshot(key)

    def remove_swa_snapshot(self, key: int) -> bool:
        """The engine dropped that snapshot (evicted); False if it was not registered."""
        return self._core.remove_swa_snapshot(key)

    def num_swa_snapshots(self) -> int:
        return self._core.num_swa_snapshots()

    def num_used_state_slots(self) -> int:
        """State slots held (one per running sequence: its window rings and compressor stage)."""
        return self._core.num_used_state_slots()

    def block_ref_count(self, block_id: int) -> int:
        return self._core.block_ref_count(block_id)

    def get_sequence(self, request_id: int) -> _core.Sequence | None:
        """Snapshot (a copy) of a waiting or running sequence; None once finished."""
        return self._core.get_sequence(request_id)
