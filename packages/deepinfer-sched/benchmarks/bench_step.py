"""One full decode step with 1,024 running sequences and nextn = 5:
schedule + process_outputs + build_request_outputs (+ gather) + release, C++ ledger against a
pure-Python implementation of the same policy (below), in the same run.

    pytest packages/deepinfer-sched --benchmark-only
"""

from __future__ import annotations

import time

import numpy as np

from deepinfer_sched import (
    VERIFIED_END,
    RequestOutputPool,
    RequestParams,
    Scheduler,
    SchedulerConfig,
    StepKind,
)

NUM_SEQS = 1024
NEXTN = 5
PROMPT_LEN = 32
BLOCK_SIZE = 16
ROUNDS = 60
EOS = 2


def config() -> SchedulerConfig:
    return SchedulerConfig(block_size=BLOCK_SIZE, num_blocks=NUM_SEQS * 48, max_num_seqs=NUM_SEQS,
                           max_num_batched_tokens=NUM_SEQS * (NEXTN + 1), max_model_len=4096, nextn=NEXTN,
                           min_final_chunk_tokens=0, eos_token_ids=[EOS])


def prompt(r: int) -> list[int]:
    return [3 + r] + [5] * (PROMPT_LEN - 1)  # distinct first block: no prefix sharing


def accept_pattern(rng: np.random.Generator) -> np.ndarray:
    """Accepted drafts per request (fixed across rounds): geometric with a = 0.75, capped at nextn."""
    return np.minimum(rng.geometric(0.25, NUM_SEQS) - 1, NEXTN).astype(np.int32)


# ------------------------------------------------------------------------------------------------
# Pure-Python baseline: the same policy and ledger (LCFS decode, block accounting with
# hash-chained prefix registration, optimistic advance / commit, per-token stop checks,
# one output object per token).


class PySeq:
    __slots__ = ("rid", "tokens", "prompt_len", "max_tokens", "min_tokens", "stop_ids", "ignore_eos",
                 "num_tokens", "prev_num_tokens", "uncommitted", "blocks", "num_hashed", "last_hash",
                 "slot", "finished", "reason", "drafts_next", "prev_conf")

    def __init__(self, rid, prompt, max_tokens):
        self.rid, self.tokens, self.prompt_len = rid, list(prompt), len(prompt)
        self.max_tokens, self.min_tokens, self.stop_ids, self.ignore_eos = max_tokens, 0, (), False
        self.num_tokens = self.prev_num_tokens = self.uncommitted = 0
        self.blocks, self.num_hashed, self.last_hash = [], 0, 0
        self.slot, self.finished, self.reason, self.drafts_next, self.prev_conf = 0, False, None, -1, []


class PyOutput:
    __slots__ = ("request_id", "token_id", "token_logprob", "finished", "finish_reason", "num_output_tokens",
                 "prompt_len", "draft_tok", "accept_tok")

    def __init__(self, request_id, token_id, token_logprob, num_output_tokens, prompt_len):
        self.request_id, self.token_id, self.token_logprob = request_id, token_id, token_logprob
        self.num_output_tokens, self.prompt_len = num_output_tokens, prompt_len
        self.finished, self.finish_reason, self.draft_tok, self.accept_tok = False, None, -1, -1


class PyScheduler:
    def __init__(self, cfg: SchedulerConfig):
        self.cfg = cfg
        self.free = list(range(cfg.num_blocks - 1, -1, -1))
        self.ref = [0] * cfg.num_blocks
        self.cached: dict[int, int] = {}
        self.running: list[PySeq] = []
        self.slots = list(range(cfg.max_num_seqs, 0, -1))
        self.eos = set(cfg.eos_token_ids)

    def admit_prefilled(self, seq: PySeq):
        """Set up a sequence as if its prefill had run (the benchmark measures decode steps)."""
        bs = self.cfg.block_size
        n = -(-seq.prompt_len // bs)
        for _ in range(n):
            b = self.free.pop()
            self.ref[b] = 1
            seq.blocks.append(b)
        seq.tokens.append(7)
        seq.num_tokens = seq.prompt_len
        seq.slot = self.slots.pop()
        self.running.append(seq)

    def schedule(self):
        bs, nextn = self.cfg.block_size, self.cfg.nextn
        budget = self.cfg.max_num_batched_tokens
        seqs, seqlens, ftp, ncomp, positions, input_ids, slot_mapping, mtp_slots = [], [], [], [], [], [], [], []
        total = 0
        for seq in reversed(self.running):  # LCFS
            d = nextn if seq.drafts_next < 0 else seq.drafts_next
            seq.drafts_next = -1
            rows = min(1 + d, budget)
            need = -(-(seq.num_tokens + rows) // bs) - len(seq.blocks)
            if need > len(self.free):
                raise RuntimeError("benchmark pool too small")
            for _ in range(need):
                b = self.free.pop()
                self.ref[b] = 1
                seq.blocks.append(b)
            start = seq.num_tokens
            seqs.append(seq)
            seqlens.append(rows)
            ftp.append(total)
            ncomp.append(start)
            mtp_slots.append(seq.slot)
            golden = seq.tokens[-1] if seq.uncommitted == 0 else -1
            for j in range(rows):
                pos = start + j
                positions.append(pos)
                input_ids.append(golden if j == 0 else -1)
                slot_mapping.append(seq.blocks[pos // bs] * bs + pos % bs)
            seq.prev_num_tokens = seq.num_tokens
            seq.num_tokens += rows
            seq.uncommitted += rows
            total += rows
            budget -= rows
        width = max(len(s.blocks) for s in seqs)
        tables = np.full((len(seqs), width), -1, np.int32)
        for i, s in enumerate(seqs):
            tables[i, : len(s.blocks)] = s.blocks
        return dict(kind=StepKind.DECODE, seqs=seqs, seqlens_q=np.array(seqlens, np.int32),
                    first_token_pos=np.array(ftp, np.int32), num_computed_tokens=np.array(ncomp, np.int32),
                    positions=np.array(positions, np.int32), input_token_ids=np.array(input_ids, np.int32),
                    slot_mapping=np.array(slot_mapping, np.int64), block_tables=tables,
                    mtp_slots=np.array(mtp_slots, np.int32))

    def _check_stop(self, seq: PySeq, tok: int):
        out_len = len(seq.tokens) - seq.prompt_len
        if out_len >= seq.min_tokens and ((tok in self.eos and not seq.ignore_eos) or tok in seq.stop_ids):
            seq.finished, seq.reason = True, "stop"
        elif out_len >= seq.max_tokens or len(seq.tokens) >= self.cfg.max_model_len:
            seq.finished, seq.reason = True, "length"

    def _cache_blocks(self, seq: PySeq, committed: int):
        bs = self.cfg.block_size
        for i in range(seq.num_hashed, min(committed // bs, len(seq.blocks))):
            h = hash((seq.last_hash, tuple(seq.tokens[i * bs : (i + 1) * bs])))
            self.cached.setdefault(h, seq.blocks[i])
            seq.last_hash, seq.num_hashed = h, i + 1

    def process_outputs(self, out, token_ids, verified):
        token_ids, verified = token_ids.tolist(), verified.tolist()
        pushed, accepted_all, before = [], [], []
        for i, seq in enumerate(out["seqs"]):
            rows, base = int(out["seqlens_q"][i]), int(out["first_token_pos"][i])
            before.append(len(seq.tokens) - seq.prompt_len)
            k = 0
            for j in range(rows - 1):
                if verified[base + j] == VERIFIED_END:
                    break
                k += 1
            accepted_all.append(k)
            if seq.finished:
                pushed.append(0)
                continue
            cnt = 0
            for tok in verified[base : base + k] + [token_ids[i]]:
                seq.tokens.append(tok)
                cnt += 1
                self._check_stop(seq, tok)
                if seq.finished:
                    break
            seq.num_tokens -= rows - cnt
            seq.uncommitted -= rows
            self._cache_blocks(seq, seq.num_tokens - seq.uncommitted)
            pushed.append(cnt)
        out["pushed"], out["accepted"], out["before"] = pushed, accepted_all, before
        return np.array(pushed, np.int32)

    def build_request_outputs(self, out, token_logprobs, verified_logprobs):
        res = []
        tl, vl = token_logprobs.tolist(), verified_logprobs.tolist()
        for i, seq in enumerate(out["seqs"]):
            p, k = out["pushed"][i], out["accepted"][i]
            start = seq.prompt_len + out["before"][i]
            base = int(out["first_token_pos"][i])
            for j in range(p):
                lp = vl[base + j] if j < k else tl[i]
                o = PyOutput(seq.rid, seq.tokens[start + j], max(lp, -9999.0), out["before"][i] + j + 1,
                             seq.prompt_len)
                if j == p - 1:
                    o.finished, o.finish_reason = seq.finished, seq.reason
                    o.draft_tok, o.accept_tok = int(out["seqlens_q"][i]), k + 1
                res.append(o)
        return res


# ------------------------------------------------------------------------------------------------


def make_inputs(accepted: np.ndarray):
    seqlens = np.full(NUM_SEQS, NEXTN + 1, np.int32)
    ftp = np.concatenate([[0], np.cumsum(seqlens)[:-1]]).astype(np.int32)
    verified = np.full(NUM_SEQS * (NEXTN + 1), VERIFIED_END, np.int32)
    for i, k in enumerate(accepted):
        verified[ftp[i] : ftp[i] + k] = 7
    tokens = np.full(NUM_SEQS, 7, np.int32)
    logprobs = np.full(NUM_SEQS, -0.5, np.float32)
    vlogprobs = np.full(verified.shape, -0.25, np.float32)
    return tokens, verified, logprobs, vlogprobs


class CppStep:
    def __init__(self):
        self.sched = Scheduler(config())
        self.pool = RequestOutputPool()
        for r in range(NUM_SEQS):
            self.sched.add_request(r, prompt(r), RequestParams(max_tokens=100_000))
        while self.sched.has_prefill_work():
            out = self.sched.schedule()
            assert out.step_kind == StepKind.PREFILL
            self.sched.process_outputs(out, np.full(out.req_cnt, 7, np.int32))
        assert self.sched.num_running() == NUM_SEQS
        # LCFS: the decode row-block order is the reverse admission order.
        acc = accept_pattern(np.random.default_rng(0))
        self.inputs = make_inputs(acc[::-1].copy())
        self.prev = np.zeros(0, np.uint64)

    def __call__(self):
        s = self.sched
        self.pool.release(self.prev)  # last step's handles, released one step later
        out = s.schedule()
        tokens, verified, lp, vlp = self.inputs
        pushed = s.process_outputs(out, tokens, verified)
        handles = s.build_request_outputs(out, pushed, self.pool, lp, vlp, out.first_token_pos)
        cols = self.pool.gather(handles)
        self.prev = handles
        return out, pushed, cols


class PyStep:
    def __init__(self):
        self.sched = PyScheduler(config())
        for r in range(NUM_SEQS):
            self.sched.admit_prefilled(PySeq(r, prompt(r), 100_000))
        acc = accept_pattern(np.random.default_rng(0))
        self.inputs = make_inputs(acc[::-1].copy())
        self.prev = []

    def __call__(self):
        s = self.sched
        self.prev = None  # release last step's outputs
        out = s.schedule()
        tokens, verified, lp, vlp = self.inputs
        pushed = s.process_outputs(out, tokens, verified)
        self.prev = s.build_request_outputs(out, lp, vlp)
        return out, pushed, self.prev


def test_baselines_agree():
    """Both implementations make the same step (same rows, same pushed, same outputs)."""
    c, p = CppStep(), PyStep()
    for _ in range(3):
        (co, cp, cols), (po, pp, outs) = c(), p()
        assert np.array_equal(co.positions, po["positions"]) and np.array_equal(co.seqlens_q, po["seqlens_q"])
        assert np.array_equal(co.slot_mapping, po["slot_mapping"])
        assert np.array_equal(cp, pp)
        assert cols["token_id"].tolist() == [o.token_id for o in outs]
        assert cols["num_output_tokens"].tolist() == [o.num_output_tokens for o in outs]
        assert cols["accept_tok"].tolist() == [o.accept_tok for o in outs]


def _min_time(fn, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def test_bench_full_step_python_baseline(benchmark):
    step = PyStep()
    step()
    benchmark.group = "full step: 1024 seqs, nextn=5"
    benchmark.pedantic(step, rounds=15, iterations=1, warmup_rounds=1)


def test_bench_full_step_cpp(benchmark):
    step = CppStep()
    step()
    benchmark.group = "full step: 1024 seqs, nextn=5"
    benchmark.pedantic(step, rounds=ROUNDS, iterations=1, warmup_rounds=2)
    # Same run: the pure-Python baseline on the same workload, for the ratio.
    py = PyStep()
    py()
    py_s = _min_time(py, 10)
    cpp_s = benchmark.stats.stats.min
    ratio = py_s / cpp_s
    benchmark.extra_info.update(python_min_ms=py_s * 1e3, cpp_min_ms=cpp_s * 1e3, speedup=ratio)
    print(f"\nfull step, 1024 seqs, nextn=5: C++ {cpp_s * 1e3:.3f} ms, Python {py_s * 1e3:.2f} ms, "
          f"speedup {ratio:.1f}x")
    assert ratio >= 20, f"C++ step only {ratio:.1f}x faster than the Python baseline (target 20x)"
