"""Test support shipped with the package: a simulated device and a ledger-checking engine loop.

`SimulatedDevice` plays the GPU (accepts a random prefix of each request's drafts, samples main
tokens) and checks the row layout of every SchedulerOutput, including the ZOS position
correction. `LedgerHarness` runs the engine loop (optionally with the ZOS one-step lag) and
asserts the four ledger checkpoints of seed 000 plus the end-to-end bookkeeping on every step.
Pure numpy: no torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ._core import VERIFIED_END, FinishReason, RequestOutputPool, SchedulerOutput, StepKind
from .config import RequestParams, SchedulerConfig
from .scheduler import Scheduler


# The CPU tests' scheduler: 4-token blocks, 64 of them, 4 sequences, 64 rows a step, prompt + output
# <= 64, no speculation, no YOCO minimum on the last chunk, EOS 2.
SMALL_CONFIG = dict(block_size=4, num_blocks=64, max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64,
                    nextn=0, min_final_chunk_tokens=0, eos_token_ids=(2,))


def small_scheduler(**overrides) -> Scheduler:
    """A scheduler over SMALL_CONFIG, with `overrides` (SchedulerConfig fields) replacing its values."""
    return Scheduler(SchedulerConfig(**{**SMALL_CONFIG, **overrides}))


def prefill_alone(s: Scheduler, request_id: int, prompt: list[int]) -> tuple[SchedulerOutput, object]:
    """Admit `prompt` (one output token) and run its whole prefill as one step, sampling token 9:
    -> (that step's SchedulerOutput, the Sequence as admitted, before the step's outputs)."""
    s.add_request(request_id, prompt, RequestParams(max_tokens=1))
    out = s.schedule()
    seq = s.get_sequence(request_id)
    admitted = (seq.num_cached_tokens, seq.prefix_miss)
    assert int(out.num_computed_tokens[0]) == admitted[0]   # the step starts at the hit
    s.process_outputs(out, np.full(out.req_cnt, 9, np.int32), np.full(out.total_q, VERIFIED_END, np.int32))
    return out, admitted


@dataclass
class Sampled:
    """What the device hands the ledger for one step (SampledInfo)."""

    token_ids: np.ndarray  # [req_cnt] int32 main token per request
    verified_token_ids: np.ndarray  # [total_q] int32 accepted drafts, VERIFIED_END terminated
    token_logprobs: np.ndarray  # [req_cnt] float32
    verified_logprobs: np.ndarray  # [total_q] float32
    confidence: np.ndarray | None  # [req_cnt, nextn] float32
    num_accepted: np.ndarray  # [req_cnt] int32 (device-side count, for checks)


def check_row_layout(out: SchedulerOutput) -> None:
    """Checkpoint 1: ftp is the exclusive prefix sum of seqlens_q and rows are laid out by it."""
    n, q = out.req_cnt, out.total_q
    sq, ftp = out.seqlens_q, out.first_token_pos
    assert sq.shape == (n,) and ftp.shape == (n,)
    assert out.positions.shape == (q,) and out.slot_mapping.shape == (q,) and out.input_token_ids.shape == (q,)
    if n == 0:
        assert q == 0
        return
    assert ftp[0] == 0 and np.all(sq >= 1)
    assert np.array_equal(ftp[1:], np.cumsum(sq)[:-1]) and ftp[-1] + sq[-1] == q
    assert np.array_equal(out.context_lens, out.num_computed_tokens + sq)
    bs = out.block_size
    bt = out.block_tables
    for i in range(n):
        pos = out.positions[ftp[i] : ftp[i] + sq[i]]
        assert np.array_equal(pos, out.num_computed_tokens[i] + np.arange(sq[i]))
        blocks = bt[i, pos // bs]
        assert np.all(blocks >= 0), f"request {out.request_ids[i]}: rows without a block"
        assert np.array_equal(out.slot_mapping[ftp[i] : ftp[i] + sq[i]], blocks.astype(np.int64) * bs + pos % bs)
    assert len(np.unique(out.slot_mapping)) == q, "two rows of one step write the same KV slot"
    assert len(np.unique(out.request_ids)) == n


class SimulatedDevice:
    """Plays the GPU for one scheduler. Deterministic in `seed`."""

    def __init__(
        self,
        seed: int,
        vocab_size: int = 32,
        accept_prob: float = 0.7,
        token_fn: Callable[[np.random.Generator], int] | None = None,
    ) -> None:
        self.rng = np.random.default_rng(seed)
        self.vocab_size = vocab_size
        self.accept_prob = accept_prob
        self.token_fn = token_fn or (lambda r: int(r.integers(0, vocab_size)))
        self.true_len: dict[int, int] = {}  # request -> tokens it has on the device (no stop)
        self.prev_rows: np.ndarray = np.zeros(0, np.int32)  # last sampled step, by row block
        self.prev_kept: np.ndarray = np.zeros(0, np.int32)

    def sample(self, out: SchedulerOutput) -> Sampled:
        check_row_layout(out)
        n, q, nextn = out.req_cnt, out.total_q, out.nextn
        decode = out.step_kind == StepKind.DECODE
        tokens = np.array([self.token_fn(self.rng) for _ in range(n)], dtype=np.int32)
        verified = np.full(q, VERIFIED_END, dtype=np.int32)
        accepted = np.zeros(n, dtype=np.int32)
        kept = out.seqlens_q.astype(np.int32).copy()
        for i in range(n):
            rid, f, rows = int(out.request_ids[i]), int(out.first_token_pos[i]), int(out.seqlens_q[i])
            # ZOS: the CPU positions assume the in-flight step kept all its rows; correct them.
            correction = 0
            if out.num_uncommitted_rows[i] > 0:
                r = int(out.remap[i])
                assert r >= 0, f"request {rid}: uncommitted rows but not in the previous step"
                correction = int(self.prev_rows[r] - self.prev_kept[r])
            true_pos = int(out.positions[f]) - correction
            if decode:
                assert true_pos == self.true_len[rid] - 1, (
                    f"request {rid}: golden row at {true_pos}, device has {self.true_len[rid]} tokens"
                )
                k = 0
                while k < rows - 1 and self.rng.random() < self.accept_prob:
                    verified[f + k] = self.token_fn(self.rng)
                    k += 1
                accepted[i] = k
                kept[i] = k + 1
                self.true_len[rid] = true_pos + k + 2
            elif out.is_last_chunk[i]:
                self.true_len[rid] = true_pos + rows + 1
        self.prev_rows, self.prev_kept = out.seqlens_q.astype(np.int32).copy(), kept
        logprobs = -self.rng.exponential(2.0, size=n).astype(np.float32)
        if n:
            logprobs[0] = -np.inf  # clamped to -9999 on the way out
        conf = self.rng.random((n, nextn)).astype(np.float32) if nextn > 0 else None
        vlp = -self.rng.exponential(1.0, size=q).astype(np.float32)
        return Sampled(tokens, verified, logprobs, vlp, conf, accepted)


@dataclass
class RequestRecord:
    prompt_len: int
    params: RequestParams
    emitted: list[int] = field(default_factory=list)
    finish_reasons: list[str] = field(default_factory=list)
    ignored: bool = False


class LedgerHarness:
    """Engine loop over a Scheduler + SimulatedDevice that checks the ledger on every step."""

    def __init__(
        self,
        sched: Scheduler,
        device: SimulatedDevice,
        zos: bool = False,
        pool: RequestOutputPool | None = None,
        deep_checks: bool = True,
        swa_capacity: int = 4,
    ) -> None:
        self.sched = sched
        self.device = device
        self.zos = zos
        self.pool = pool or RequestOutputPool(10_000)
        self.deep_checks = deep_checks
        cfg = sched.config
        self.eos = set(cfg.eos_token_ids)
        self.max_model_len = cfg.max_model_len
        self.requests: dict[int, RequestRecord] = {}
        self.in_flight: tuple[SchedulerOutput, Sampled] | None = None
        self.stale: set[int] = set()  # requests preempted while the in-flight step ran
        self.aborted: set[int] = set()
        self.num_steps = 0
        self.swa_keys: list[int] = []   # SWA snapshot keys registered with the scheduler (oldest first)
        self.swa_capacity = swa_capacity

    # -- requests ----------------------------------------------------------------------------
    def add(self, rid: int, prompt: list[int], params: RequestParams) -> None:
        self.sched.add_request(rid, prompt, params)
        self.requests[rid] = RequestRecord(len(prompt), params, ignored=len(prompt) > self.max_model_len)

    def abort(self, rid: int) -> bool:
        live_before = self.sched.get_sequence(rid) is not None
        ok = self.sched.abort_request(rid)
        assert ok == live_before, f"request {rid}: abort_request returned {ok}, live={live_before}"
        if ok:
            self.aborted.add(rid)
        return ok

    def finished(self, rid: int) -> bool:
        return bool(self.requests[rid].finish_reasons)

    # -- loop ----------------------------------------------------------------------------------
    def step(self) -> bool:
        """One engine step; False once nothing is left (all finished, nothing in flight)."""
        if not self.sched.has_unfinished() and self.in_flight is None:
            return False
        self.num_steps += 1
        if not self.zos:
            out = self._schedule()
            self._process(out, self.device.sample(out))
            return True
        if self.sched.has_unfinished():
            out = self._schedule()  # schedule(N+1) before process_outputs(N)
            sampled = self.device.sample(out)
            prev, self.in_flight = self.in_flight, (out, sampled)
            self.stale = set(int(r) for r in out.preempted_request_ids)
            if prev is not None:
                self._process(*prev, stale=self.stale)
        else:  # flush the last in-flight step
            prev, self.in_flight = self.in_flight, None
            self._process(*prev, stale=set())
        return True

    def run(self, max_steps: int = 10_000) -> None:
        for _ in range(max_steps):
            if not self.step():
                return
        raise AssertionError(f"not drained after {max_steps} steps")

    # -- checks ----------------------------------------------------------------------------------
    def _schedule(self) -> SchedulerOutput:
        out = self.sched.schedule()
        s = self.sched
        if s.config.nextn > 0:  # checkpoint 4
            assert s.num_used_mtp_slots() == s.num_running(), "used MTP slots != running"
            slots = out.mtp_slots
            assert np.all(slots >= 1) and len(np.unique(slots)) == len(slots)
        else:
            assert s.num_used_mtp_slots() == 0
        assert s.num_used_state_slots() == s.num_running(), "used state slots != running"
        states = out.state_slots
        assert np.all(states >= 1) and len(np.unique(states)) == len(states), "state slots shared or 0"
        assert np.all(states <= s.config.max_num_seqs)
        held = [q.state_slot for rid in self.requests if (q := s.get_sequence(int(rid))) is not None and q.state_slot]
        assert len(held) == len(set(held)) == s.num_running(), "a state slot held twice, or by a waiting sequence"
        for rid in out.request_ids:
            assert not self.finished(int(rid)), f"request {rid} scheduled after its final output"
        a = s.config.swa_snapshot_tokens
        for i in np.flatnonzero(out.restore_tokens > 0):   # SWA tier: hits only at registered snapshot points
            restore = out.restore_tokens[i]
            assert a > 0 and restore % a == 0 and restore == out.num_computed_tokens[i]
            assert int(out.restore_keys[i]) in self.swa_keys, "a hit on a snapshot the engine does not hold"
        return out

    def _store_swa_snapshots(self, out: SchedulerOutput) -> None:
        """The engine side of the SWA tier: keep every reported crossing in a bounded FIFO store."""
        a = self.sched.config.swa_snapshot_tokens
        for p, key in zip(out.swa_points.tolist(), out.swa_keys.tolist()):
            if p == 0:
                continue
            assert a > 0 and p % a == 0
            if key not in self.swa_keys:
                self.swa_keys.append(key)
                self.sched.add_swa_snapshot(key)
            if len(self.swa_keys) > self.swa_capacity:
                assert self.sched.remove_swa_snapshot(self.swa_keys.pop(0))
        assert self.sched.num_swa_snapshots() == len(self.swa_keys)

    def _expected_push(self, rid: int, tokens: list[int]) -> tuple[int, bool]:
        rec = self.requests[rid]
        p = rec.params
        out_len = len(rec.emitted)
        for j, t in enumerate(tokens):
            out_len += 1
            stop = out_len >= p.min_tokens and ((t in self.eos and not p.ignore_eos) or t in p.stop_token_ids)
            if stop or out_len >= p.max_tokens or rec.prompt_len + out_len >= self.max_model_len:
                return j + 1, True
        return len(tokens), False

    def _process(self, out: SchedulerOutput, sm: Sampled, stale: set[int] = frozenset()) -> None:
        s = self.sched
        # Checkpoint 2: the accepted prefix is contiguous and -1 terminated.
        for i in range(out.req_cnt):
            f, rows = int(out.first_token_pos[i]), int(out.seqlens_q[i])
            seg = sm.verified_token_ids[f : f + rows]
            k = int(sm.num_accepted[i])
            assert np.all(seg[:k] >= 0) and np.all(seg[k:] == VERIFIED_END)
        pushed = s.process_outputs(out, sm.token_ids, sm.verified_token_ids, sm.confidence)
        self._store_swa_snapshots(out)
        decode = out.step_kind == StepKind.DECODE
        expected_tokens: dict[int, list[int]] = {}
        finishing: set[int] = set()
        for i in range(out.req_cnt):
            rid, k = int(out.request_ids[i]), int(sm.num_accepted[i])
            f = int(out.first_token_pos[i])
            live = not self.finished(rid) and rid not in stale and rid not in self.aborted
            if not live or not (decode or out.is_last_chunk[i]):
                assert pushed[i] == 0, f"request {rid}: pushed {pushed[i]}, expected 0"
                continue
            tokens = [int(t) for t in sm.verified_token_ids[f : f + k]] + [int(sm.token_ids[i])]
            exp, stops = self._expected_push(rid, tokens)
            # Checkpoint 3: pushed <= accepted + 1, strictly less only on a stop.
            assert pushed[i] == exp, f"request {rid}: pushed {pushed[i]}, oracle {exp} (tokens {tokens})"
            assert pushed[i] <= k + 1 and (pushed[i] == k + 1 or stops)
            expected_tokens[rid] = tokens[: pushed[i]]
            if stops:
                finishing.add(rid)
        handles = s.build_request_outputs(
            out, pushed, self.pool, sm.token_logprobs, sm.verified_logprobs, out.first_token_pos
        )
        self._consume(out, handles, expected_tokens, finishing)
        self.pool.release(handles)
        if self.deep_checks:
            self._check_live()

    def _consume(self, out, handles, expected_tokens, finishing) -> None:
        cols = self.pool.gather(handles)
        assert np.all(cols["token_logprob"] >= -9999.0)
        per_req: dict[int, list[int]] = {}
        for j in range(len(handles)):
            per_req.setdefault(int(cols["request_id"][j]), []).append(j)
        ignored = set(int(r) for r in out.ignored_request_ids)
        aborted = set(int(r) for r in out.aborted_request_ids)
        for rid, idx in per_req.items():
            rec = self.requests[rid]
            assert not rec.finish_reasons, f"request {rid}: output after its final output"
            if rid in ignored or rid in aborted:
                assert len(idx) == 1
                j = idx[0]
                assert cols["finished"][j]
                reason = "prompt_length_exceeded" if rid in ignored else "abort"
                assert cols["finish_reason"][j] == (
                    FinishReason.PROMPT_LENGTH_EXCEEDED if rid in ignored else FinishReason.ABORT
                )
                if rid in ignored:
                    assert rec.ignored and cols["num_output_tokens"][j] == len(rec.emitted) + 1
                else:
                    assert cols["token_id"][j] == -1 and cols["num_output_tokens"][j] == len(rec.emitted)
                rec.finish_reasons.append(reason)
                continue
            toks = [int(cols["token_id"][j]) for j in idx]
            assert toks == expected_tokens.get(rid), f"request {rid}: emitted {toks}, appended {expected_tokens.get(rid)}"
            for n, j in enumerate(idx):
                rec.emitted.append(toks[n])
                assert cols["num_output_tokens"][j] == len(rec.emitted)
                last = n == len(idx) - 1
                assert cols["finished"][j] == (last and rid in finishing)
                assert (cols["draft_tok"][j] >= 0) == last
            if rid in finishing:
                reason = int(cols["finish_reason"][idx[-1]])
                assert reason in (FinishReason.STOP, FinishReason.LENGTH)
                rec.finish_reasons.append("stop" if reason == FinishReason.STOP else "length")
        for rid in ignored | aborted:
            assert rid in per_req, f"request {rid}: no final output"
        for rid in finishing:
            assert rid in per_req

    def _check_live(self) -> None:
        s = self.sched
        held: set[int] = set()
        total_refs: dict[int, int] = {}
        for rid, rec in self.requests.items():
            seq = s.get_sequence(rid)
            if seq is None:
                continue
            assert seq.output_token_ids == rec.emitted, f"request {rid}: sequence and emitted tokens differ"
            for b in seq.block_table:
                total_refs[b] = total_refs.get(b, 0) + 1
                held.add(b)
        for b, r in total_refs.items():
            assert s.block_ref_count(b) == r, f"block {b}: ref_count {s.block_ref_count(b)} != holders {r}"
        assert s.num_free_blocks() + len(held) == s.config.num_blocks, "blocks leaked"

    def check_drained(self) -> None:
        s = self.sched
        assert not s.has_unfinished() and self.in_flight is None
        assert s.num_free_blocks() == s.config.num_blocks, "blocks did not all return"
        assert s.num_used_mtp_slots() == 0 and s.num_running() == 0 and s.num_waiting() == 0
        assert s.num_used_state_slots() == 0, "state slots did not all return"
        assert self.pool.num_in_use == 0
        for rid, rec in self.requests.items():
            assert len(rec.finish_reasons) == 1, f"request {rid} finished {len(rec.finish_reasons)} times"
