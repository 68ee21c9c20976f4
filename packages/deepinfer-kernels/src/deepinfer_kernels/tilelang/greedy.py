"""Greedy pick in two launches (TileLang, SM90): ``deepinfer_kernels.ops.sampling.greedy``.

1. ``partials``: grid (vocab / CHUNK, rows), 256 threads. Each CTA reads CHUNK logits of one row
   (16 per thread, coalesced) and writes their max, the lowest column holding it, and
   ``sum(exp(x - max))``: warp shuffles, then the 8 warps through shared memory.
2. ``combine``: one warp per request. Its final row's partials give the row max M, the lowest
   column holding M, and ``S = sum(s_c * exp(m_c - M))``; the logprob of the argmax is ``-log(S)``.
"""

import torch

from deepinfer_kernels.tilelang._common import PDL, compile_cached, pdl_sync, require, require_cuda

# No `from __future__ import annotations` (TileLang evaluates prim_func annotations).

NT = 256
CHUNK = 4096                 # logits per CTA of the first kernel
PER = CHUNK // NT
WARPS = NT // 32
LOG2E = 1.4426950408889634
_DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
_INDEX = {torch.int32: "int32", torch.int64: "int64"}
NO_COLUMN = 2 ** 31 - 1      # column sentinel: no finite maximum seen yet


def _better(T, m, i, om, oi):
    """(om, oi) beats (m, i): a larger value, or the same value at a lower column."""
    return T.Or(om > m, T.And(om == m, oi < i))


def _warp_best_macro(T):
    """``warp_best(m, i, om, oi)``: every lane's (m, i) <- the best of the warp's 32 (a butterfly of
    shuffles; ``om``, ``oi`` are scratch)."""

    @T.macro
    def warp_best(m: T.Ref, i: T.Ref, om: T.Ref, oi: T.Ref):   # alloc_var scalars, by reference
        for o in T.unroll(5):
            om = T.shfl_xor(m, 1 << (4 - o))
            oi = T.shfl_xor(i, 1 << (4 - o))
            if _better(T, m, i, om, oi):
                m = om
                i = oi

    return warp_best


def _partial_dims(T):
    """Rows R and chunks C of the partials (Pm, Pi, Ps [R, C]): the first kernel writes them, the
    second reads them."""
    return T.dynamic("R"), T.dynamic("C")


def _build_partials(dtype: str):
    import tilelang.language as T

    warp_best = _warp_best_macro(T)

    R, C = _partial_dims(T)
    V = T.dynamic("V")

    @T.prim_func
    def main(
        X: T.Tensor((R, V), dtype),
        Pm: T.Tensor((R, C), T.float32),
        Pi: T.Tensor((R, C), T.int32),
        Ps: T.Tensor((R, C), T.float32),
    ):
        with T.Kernel(C, R, threads=NT) as (c, r):
            if PDL:   # wait for the previous kernel before touching memory (_common.PDL)
                T.evaluate(pdl_sync())
            tx = T.get_thread_binding()
            lane = tx % 32
            warp = tx // 32
            xv = T.alloc_local((PER,), T.float32)
            m = T.alloc_var(T.float32)
            i = T.alloc_var(T.int32)
            s = T.alloc_var(T.float32)
            om = T.alloc_var(T.float32)
            oi = T.alloc_var(T.int32)
            bm = T.alloc_var(T.float32)
            wm = T.alloc_shared((WARPS,), T.float32)
            wi = T.alloc_shared((WARPS,), T.int32)
            wsum = T.alloc_shared((WARPS,), T.float32)
            m = -T.infinity(T.float32)
            i = NO_COLUMN
            for k in T.serial(PER):
                j = c * CHUNK + k * NT + tx
                xv[k] = T.if_then_else(j < V, T.cast(X[r, T.min(j, V - 1)], T.float32), -T.infinity(T.float32))
                if xv[k] > m:                    # columns rise with k: the first maximum stays
                    m = xv[k]
                    i = j
            warp_best(m, i, om, oi)
            if lane == 0:
                wm[warp] = m
                wi[warp] = i
            T.sync_threads()
            m = wm[0]
            i = wi[0]
            for w in T.serial(WARPS - 1):
                om = wm[w + 1]
                oi = wi[w + 1]
                if _better(T, m, i, om, oi):
                    m = om
                    i = oi
            bm = T.if_then_else(m == -T.infinity(T.float32), 0.0, m)   # an all -inf chunk: sum 0, not NaN
            s = 0.0
            for k in T.serial(PER):
                s = s + T.exp2((xv[k] - bm) * LOG2E)
            for o in T.unroll(5):
                s = s + T.shfl_xor(s, 1 << (4 - o))
            if lane == 0:
                wsum[warp] = s
            T.sync_threads()
            if tx == 0:
                s = 0.0
                for w in T.serial(WARPS):
                    s = s + wsum[w]
                Pm[r, c] = m
                Pi[r, c] = i
                Ps[r, c] = s

    return main


def _build_combine(idx_dtype: str):
    import tilelang.language as T

    warp_best = _warp_best_macro(T)

    Q = T.dynamic("Q")                  # requests
    R, C = _partial_dims(T)

    @T.prim_func
    def main(
        Pm: T.Tensor((R, C), T.float32),
        Pi: T.Tensor((R, C), T.int32),
        Ps: T.Tensor((R, C), T.float32),
        Ftp: T.Tensor((Q,), idx_dtype),
        Seq: T.Tensor((Q,), idx_dtype),
        Tok: T.Tensor((Q,), T.int32),
        Lp: T.Tensor((Q,), T.float32),
        Final: T.Tensor((Q,), T.int32),
    ):
        with T.Kernel(Q, threads=32) as q:
            if PDL:   # wait for the previous kernel before touching memory (_common.PDL)
                T.evaluate(pdl_sync())
            lane = T.get_thread_binding()
            row = T.alloc_var(T.int32)
            m = T.alloc_var(T.float32)
            i = T.alloc_var(T.int32)
            s = T.alloc_var(T.float32)
            om = T.alloc_var(T.float32)
            oi = T.alloc_var(T.int32)
            row = T.if_then_else(Seq[q] > 0, T.cast(Ftp[q] + Seq[q] - 1, T.int32), 0)
            m = -T.infinity(T.float32)
            i = NO_COLUMN
            for k in T.serial(T.ceildiv(C, 32)):
                if k * 32 + lane < C:
                    om = Pm[row, k * 32 + lane]
                    oi = Pi[row, k * 32 + lane]
                    if _better(T, m, i, om, oi):
                        m = om
                        i = oi
            warp_best(m, i, om, oi)
            s = 0.0
            for k in T.serial(T.ceildiv(C, 32)):
                if k * 32 + lane < C:
                    if Ps[row, k * 32 + lane] > 0:
                        s = s + Ps[row, k * 32 + lane] * T.exp2((Pm[row, k * 32 + lane] - m) * LOG2E)
            for o in T.unroll(5):
                s = s + T.shfl_xor(s, 1 << (4 - o))
            if lane == 0:
                Final[q] = row
                Tok[q] = T.if_then_else(i == NO_COLUMN, 0, i)                 # all -inf: column 0, as torch
                Lp[q] = T.if_then_else(m == -T.infinity(T.float32), T.float32(float("nan")), -T.log(s))

    return main


def greedy_pick_tilelang(logits: torch.Tensor, ftp: torch.Tensor, seqlens_q: torch.Tensor):
    """logits [rows, vocab] fp32 / bf16 / fp16 (rows contiguous), ftp / seqlens_q [req_cnt] int32 /
    int64 -> (token_ids int32, token_logprobs float32, final_row int32), each [req_cnt]."""
    require(logits.dtype in _DTYPES and logits.dim() == 2 and logits.stride(1) == 1,
            "logits: [rows, vocab] fp32 / bf16 / fp16, rows contiguous")
    require(ftp.dtype in _INDEX and seqlens_q.dtype == ftp.dtype, "ftp, seqlens_q: int32 / int64 of one dtype")
    require(logits.shape[1] < NO_COLUMN, f"vocab {logits.shape[1]}: below 2^31 - 1")
    require_cuda(logits=logits, ftp=ftp, seqlens_q=seqlens_q)
    rows, vocab = logits.shape
    req = ftp.shape[0]
    dev = logits.device
    tok = torch.empty(req, dtype=torch.int32, device=dev)
    lp = torch.empty(req, dtype=torch.float32, device=dev)
    final = torch.empty(req, dtype=torch.int32, device=dev)
    if req == 0:
        return tok, lp, final
    chunks = (vocab + CHUNK - 1) // CHUNK
    pm = torch.empty(rows, chunks, dtype=torch.float32, device=dev)
    pi = torch.empty(rows, chunks, dtype=torch.int32, device=dev)
    ps = torch.empty(rows, chunks, dtype=torch.float32, device=dev)
    dt = _DTYPES[logits.dtype]
    compile_cached("greedy_partials", (dt,), lambda: _build_partials(dt))(logits, pm, pi, ps)
    it = _INDEX[ftp.dtype]
    compile_cached("greedy_combine", (it,), lambda: _build_combine(it))(pm, pi, ps, ftp.contiguous(),
                                                                        seqlens_q.contiguous(), tok, lp, final)
    return tok, lp, final
