"""Sparse MLA attention over the paged FP8 KV pool (TileLang, SM90).

Same function as ``deepinfer_kernels.ops.sparse_mla.sparse_mla_attention_ref``: for query row r,
head h, over the pool slots ``indices[r, :]`` (``-1`` = empty), key = value = the dequantized
528-byte record (one shared KV head)::

    s_j = sm_scale * q[r, h] . kv_j      out = softmax(s) @ kv      lse = logsumexp(s)

rows with no valid index give ``out = 0`` and ``lse = -inf``.

Kernel layout ("transposed" MQA): one CTA owns one query row and ``HB`` (16 or 32) heads, and
walks the row's index list in blocks of 64 tokens. Tokens are the MMA M dimension, so a wgmma
``m64 n{HB} k16`` serves 16 heads without padding them to 64:

    S^T[64 tok, HB]  = K[64 tok, D] . Q^T          (wgmma, K bf16 tile in shared memory)
    O^T[D, HB]      += V^T[D, 64 tok] . P^T        (wgmma, the same tile read transposed)

Two variants share that math:

* ``"ws"`` (the default, ``"auto"``), warp-specialized, 256 threads. Warpgroup 0 (consumer) runs
  both wgmmas and the online softmax; producer warpgroup 1 gathers the FP8 records with 128-bit
  loads straight into registers, prefetching the next block while it dequantizes the current one
  into the bf16 stage; mbarriers hand the stage back and forth. Each FP8 byte crosses shared
  memory once, as bf16. (A two-producer version, "ws2", hung in its H200 tests on 2026-11-30;
  ``_build_ws(producers=2)`` still builds it for debugging, nothing dispatches to it.)
* ``"pipelined"``: 128 threads, ``T.Pipelined`` cp.async gathers of the FP8 records into a
  two-stage FP8 tile, then dequantize -> QK -> softmax -> PV in program order. Simpler; kept as
  the fallback and as a cross-check of the warp-specialized one.

Dequantization is exact (``_cuda.DEQUANT_SRC``), the QK dot products are bf16 x bf16 with fp32
accumulation (as exact as the reference's fp32 math), P is rounded to bf16 for the PV product.

Split-KV: when there are too few (row, head-group) CTAs to fill the GPU, the index list is cut
into ``num_splits`` contiguous ranges whose partial (normalized out, lse) are merged by a small
second kernel.
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations at
# decoration time against the builder locals.

import math

import torch

from deepinfer_kernels.batch_invariant import batch_invariant_enabled
from deepinfer_kernels.tilelang._common import compile_cached, num_sms, require, require_cuda
from deepinfer_kernels.tilelang._cuda import DEQUANT_SRC

BLOCK_TOKENS = 64           # tokens per block (the wgmma M)
LOG2E = 1.4426950408889634
NEG_INIT = -(2.0 ** 30)     # running-max start: finite, so exp2(m_prev - m) never sees inf - inf
VARIANTS = ("auto", "ws", "pipelined")   # "ws2" hung on the H200 (2026-11-30): not selectable


def resolve_variant(variant: str, heads: int, d: int) -> str:
    """"auto" = "ws" (the one-producer warp-specialized kernel, every shape)."""
    if variant != "auto":
        return variant
    return "ws"


def _record_bytes(d: int) -> int:
    return d + d // 32


def _vec_bytes(rec: int) -> int:
    """Widest power-of-two vector (<= 16 bytes) that keeps every record start aligned."""
    v = 16
    while rec % v:
        v //= 2
    return v


def _heads_per_cta(heads: int) -> int:
    return 16 if heads <= 16 else 32


# ----------------------------------------------------------------------------- kernel builders


def _softmax_macros(T, hb: int, d: int, H: int, split: bool):
    """Macros shared by both variants (128 "consumer" threads ``t`` in 0..127).

    Online softmax in a column-per-thread-group layout: the 64 x hb score tile goes through
    shared memory (fp32), thread t owns head column ``t // TPC`` and tokens ``k * TPC + t % TPC``;
    the column max and sum are reduced with warp shuffles only (a column's TPC threads are
    adjacent lanes). Each thread keeps the running (max, sum) of its column in registers, so no
    cross-warp reduction is needed per block.
    """
    BI = BLOCK_TOKENS
    TPC = 128 // hb           # threads per head column
    TOK = BI // TPC           # tokens per thread
    LOGT = TPC.bit_length() - 1

    @T.macro
    def block_softmax(t, S_sm, vm, vs, P_s, alpha_s, st, scale):
        # st: [m_run, l_run, tmp_max, tmp_sum] of column t // TPC
        st[2] = -T.infinity(T.float32)
        for k in T.serial(TOK):
            st[2] = T.max(st[2], S_sm[k * TPC + t % TPC, t // TPC] + vm[vs, k * TPC + t % TPC])
        for o in T.unroll(LOGT):
            st[2] = T.max(st[2], T.shfl_xor(st[2], 1 << o))
        st[2] = T.max(st[2], st[0])                                   # new running max
        st[3] = 0.0
        for k in T.serial(TOK):
            pv = T.exp2((S_sm[k * TPC + t % TPC, t // TPC] + vm[vs, k * TPC + t % TPC]) * scale - st[2] * scale)
            P_s[k * TPC + t % TPC, t // TPC] = T.cast(pv, T.bfloat16)
            st[3] = st[3] + pv
        for o in T.unroll(LOGT):
            st[3] = st[3] + T.shfl_xor(st[3], 1 << o)
        if t % TPC == 0:
            alpha_s[t // TPC] = T.exp2((st[0] - st[2]) * scale)
        st[1] = st[1] * T.exp2((st[0] - st[2]) * scale) + st[3]
        st[0] = st[2]

    @T.macro
    def finish(t, r, hg, sp, st, inv_s, acc_o, Out, Lse, Opart, Lpart, scale):
        c = t // TPC
        if t % TPC == 0:
            inv_s[c] = T.if_then_else(st[1] > 0, 1.0 / st[1], 0.0)
            if hg * hb + c < H:
                if split:
                    Lpart[sp, r, hg * hb + c] = T.if_then_else(st[1] > 0, T.log2(st[1]) + st[0] * scale,
                                                               -T.infinity(T.float32))
                else:
                    Lse[r, hg * hb + c] = T.if_then_else(st[1] > 0, (T.log2(st[1]) + st[0] * scale) / LOG2E,
                                                         -T.infinity(T.float32))
        if split:
            for k, h in T.Parallel(d, hb):
                if hg * hb + h < H:
                    Opart[sp, r, hg * hb + h, k] = acc_o[k, h] * inv_s[h]
        else:
            for k, h in T.Parallel(d, hb):
                if hg * hb + h < H:
                    Out[r, hg * hb + h, k] = T.cast(acc_o[k, h] * inv_s[h], T.bfloat16)

    return block_softmax, finish


def _build_ws(heads: int, d: int, hb: int, split: bool, producers: int = 1):
    """Warp-specialized kernel. Dynamic: rows R, width W, slots S, splits NS; ``bps`` (blocks per
    split) is even.

    producers = 1 ("ws"): one producer warpgroup walks all blocks, loading block i+1 into one
    register buffer while it dequantizes block i from the other (one block, 33 KB per SM, of loads
    in flight). producers = 2 ("ws2"): producer warpgroup p owns bf16 stage p and the blocks of
    parity p, so two blocks are in flight per SM; 384 threads, registers rebalanced with setmaxnreg.
    """
    import tilelang.language as T

    BI = BLOCK_TOKENS
    REC = _record_bytes(d)
    CH = d // 16                      # 16-byte chunks per record body
    PT = 128                          # threads per producer warpgroup
    NCH = BI * CH // PT               # chunks per producer thread per block
    VW = _vec_bytes(REC)
    H = heads
    HG = (H + hb - 1) // hb
    assert BI * CH % PT == 0 and d % 64 == 0 and producers in (1, 2)
    block_softmax, finish = _softmax_macros(T, hb, d, H, split)

    # Producer thread layout: a thread owns RPT records x CPR consecutive 16-byte chunks of each
    # (one contiguous run of the record body, so its scale bytes are SB consecutive bytes loaded
    # at once). Lane L of warp w takes row L % RW and part L // RW: the 8 lanes of a quarter-warp
    # write 8 different rows of the swizzled bf16 tile, so the 16-byte shared stores do not
    # conflict.
    CPR = min(8, NCH)
    RPT = NCH // CPR
    P = CH // CPR                      # parts per record
    RW = 32 // P                       # rows per warp and per k
    SB = CPR // 2                      # scale bytes per thread-part (CPR chunks = CPR/2 groups)
    SV = min(SB, VW)
    assert RPT * CPR == NCH and P * CPR == CH and RW * P == 32 and SB >= 1

    @T.macro
    def load_block(Idx, Pool, r, W, blk, ok_blk, tp, qbuf, sbuf, ibuf):
        for k in T.unroll(RPT):
            rec = k * (PT // P) + (tp // 32) * RW + (tp % 32) % RW
            part = (tp % 32) // RW
            col = blk * BI + rec
            ibuf[k] = T.if_then_else(ok_blk & (col < W), Idx[r, T.min(col, W - 1)], -1)
            if ibuf[k] >= 0:
                for jj in T.unroll(CPR):
                    for u in T.unroll(16 // VW):
                        for v in T.vectorized(VW):
                            qbuf[(k * CPR + jj) * 16 + u * VW + v] = Pool[ibuf[k], (part * CPR + jj) * 16 + u * VW + v]
                for u in T.unroll(SB // SV):
                    for v in T.vectorized(SV):
                        sbuf[k * SB + u * SV + v] = Pool[ibuf[k], d + part * SB + u * SV + v]

    @T.macro
    def store_block(Kb, vm, stage, tp, qbuf, sbuf, ibuf, bv):
        for k in T.unroll(RPT):
            rec = k * (PT // P) + (tp // 32) * RW + (tp % 32) % RW
            part = (tp % 32) // RW
            for jj in T.unroll(CPR):
                if ibuf[k] >= 0:
                    T.call_extern("handle", "di_dequant16", T.access_ptr(qbuf[(k * CPR + jj) * 16], "r"),
                                  T.access_ptr(bv, "w"), sbuf[k * SB + jj // 2])
                else:
                    for v in T.vectorized(16):
                        bv[v] = T.bfloat16(0)
                for v in T.vectorized(16):
                    Kb[stage, rec, (part * CPR + jj) * 16 + v] = bv[v]
            if part == 0:
                vm[stage, rec] = T.if_then_else(ibuf[k] >= 0, 0.0, -T.infinity(T.float32))

    @T.macro
    def produce(Idx, Pool, Kb, vm, bar_full, bar_empty, r, W, b0, bps, nj, tp, pid):
        # pid is a Python constant: one code path per producer warpgroup (own named barriers)
        qa = T.alloc_local((NCH * 16,), T.uint8)
        qb = T.alloc_local((NCH * 16,), T.uint8)
        sa = T.alloc_local((RPT * SB,), T.uint8)
        sb = T.alloc_local((RPT * SB,), T.uint8)
        ia = T.alloc_local((RPT,), T.int32)
        ib = T.alloc_local((RPT,), T.int32)
        bv = T.alloc_local((16,), T.bfloat16)
        if producers == 1:
            # block 2j+s goes to register buffer s (a/b) one step before it is dequantized into
            # bf16 stage s
            for j in T.serial(nj + 1):
                for s in T.unroll(2):
                    if s == 0:
                        load_block(Idx, Pool, r, W, b0 + 2 * j, 2 * j < bps, tp, qa, sa, ia)
                    else:
                        load_block(Idx, Pool, r, W, b0 + 2 * j + 1, 2 * j + 1 < bps, tp, qb, sb, ib)
                    pj = 2 * j + s - 1       # block dequantized now, into stage 1 - s
                    if (pj >= 0) and (pj < bps):
                        T.barrier_wait(bar_empty[1 - s], ((pj // 2) & 1) ^ 1)
                        if s == 0:
                            store_block(Kb, vm, 1, tp, qb, sb, ib, bv)
                        else:
                            store_block(Kb, vm, 0, tp, qa, sa, ia, bv)
                        T.fence_proxy_async()
                        T.barrier_arrive(bar_full[1 - s])
        else:
            # producer pid owns stage pid; its m-th block is block 2m+pid, loaded into buffer
            # m % 2 one step before it is dequantized
            for mm in T.serial(nj // 2 + 1):
                for u in T.unroll(2):
                    m = 2 * mm + u
                    if u == 0:
                        load_block(Idx, Pool, r, W, b0 + 2 * m + pid, m < nj, tp, qa, sa, ia)
                    else:
                        load_block(Idx, Pool, r, W, b0 + 2 * m + pid, m < nj, tp, qb, sb, ib)
                    if (m >= 1) and (m <= nj):
                        T.barrier_wait(bar_empty[pid], ((m - 1) & 1) ^ 1)
                        if u == 0:
                            store_block(Kb, vm, pid, tp, qb, sb, ib, bv)
                        else:
                            store_block(Kb, vm, pid, tp, qa, sa, ia, bv)
                        T.fence_proxy_async()
                        T.barrier_arrive(bar_full[pid])

    R = T.dynamic("R")
    W = T.dynamic("W")
    S = T.dynamic("S")
    NS = T.dynamic("NS")
    RP = T.dynamic("RP")          # rows of the split partials (1 when not splitting)
    NTH = 128 + PT * producers

    @T.prim_func
    def main(
        Q: T.Tensor((R, H, d), T.bfloat16),
        Pool: T.Tensor((S, REC), T.uint8),
        Idx: T.Tensor((R, W), T.int32),
        Out: T.Tensor((R, H, d), T.bfloat16),
        Lse: T.Tensor((R, H), T.float32),
        Opart: T.Tensor((NS, RP, H, d), T.float32),
        Lpart: T.Tensor((NS, RP, H), T.float32),
        scale: T.float32,          # sm_scale * log2(e)
        bps: T.int32,              # blocks per split (even)
    ):
        # head groups of one row are adjacent CTAs, so the second group's gathers hit L2
        with T.Kernel(R * HG, NS, threads=NTH) as (bx, sp):
            r = bx // HG
            hg = bx % HG
            T.import_source(DEQUANT_SRC)
            Q_s = T.alloc_shared((hb, d), T.bfloat16)
            Kb = T.alloc_shared((2, BI, d), T.bfloat16)
            vm = T.alloc_shared((2, BI), T.float32)
            S_sm = T.alloc_shared((BI, hb + 1), T.float32)
            P_s = T.alloc_shared((BI, hb), T.bfloat16)
            alpha_s = T.alloc_shared((hb,), T.float32)
            inv_s = T.alloc_shared((hb,), T.float32)
            bar_full = T.alloc_barrier(arrive_count=[PT, PT])
            bar_empty = T.alloc_barrier(arrive_count=[128, 128])
            tx = T.get_thread_binding()
            b0 = sp * bps                 # first block of this split
            nj = bps // 2
            if tx < 128:
                # ---------------------------------------------------------------- consumer
                if producers == 2:
                    T.set_max_nreg(160, 0)
                acc_s = T.alloc_fragment((BI, hb), T.float32)
                acc_o = T.alloc_fragment((d, hb), T.float32)
                st = T.alloc_local((4,), T.float32)
                for h, k in T.Parallel(hb, d):
                    Q_s[h, k] = T.if_then_else(hg * hb + h < H, Q[r, T.min(hg * hb + h, H - 1), k], T.bfloat16(0))
                T.fill(acc_o, 0)
                st[0] = NEG_INIT
                st[1] = 0.0
                for j in T.serial(nj):
                    for s in T.unroll(2):
                        T.barrier_wait(bar_full[s], j & 1)
                        T.clear(acc_s)
                        T.gemm(Kb[s, :, :], Q_s, acc_s, transpose_B=True)
                        T.copy(acc_s, S_sm[:, 0:hb])
                        block_softmax(tx, S_sm, vm, s, P_s, alpha_s, st, scale)
                        for k, h in T.Parallel(d, hb):
                            acc_o[k, h] *= alpha_s[h]
                        T.gemm(Kb[s, :, :], P_s, acc_o, transpose_A=True)
                        T.barrier_arrive(bar_empty[s])
                finish(tx, r, hg, sp, st, inv_s, acc_o, Out, Lse, Opart, Lpart, scale)
            elif (producers == 1) or (tx < 256):
                # ---------------------------------------------------------------- producer 0
                if producers == 2:
                    T.set_max_nreg(176, 1)
                produce(Idx, Pool, Kb, vm, bar_full, bar_empty, r, W, b0, bps, nj, tx - 128, 0)
            else:
                # ---------------------------------------------------------------- producer 1
                T.set_max_nreg(176, 1)
                produce(Idx, Pool, Kb, vm, bar_full, bar_empty, r, W, b0, bps, nj, tx - 256, 1)

    return main


def _build_pipelined(heads: int, d: int, hb: int, split: bool, nblk: int):
    """cp.async-pipelined kernel, 128 threads, same signature as the ws kernel. The block loop
    count ``nblk`` is static (T.Pipelined needs it): the launcher passes ``bps`` rounded up to a
    power of two and the extra blocks are masked."""
    import tilelang.language as T

    BI = BLOCK_TOKENS
    REC = _record_bytes(d)
    NG = d // 32
    CH = d // 16
    NT = 128
    NCH = BI * CH // NT
    H = heads
    HG = (H + hb - 1) // hb
    assert BI * CH % NT == 0
    block_softmax, finish = _softmax_macros(T, hb, d, H, split)

    R = T.dynamic("R")
    W = T.dynamic("W")
    S = T.dynamic("S")
    NS = T.dynamic("NS")
    RP = T.dynamic("RP")

    @T.prim_func
    def main(
        Q: T.Tensor((R, H, d), T.bfloat16),
        Pool: T.Tensor((S, REC), T.uint8),
        Idx: T.Tensor((R, W), T.int32),
        Out: T.Tensor((R, H, d), T.bfloat16),
        Lse: T.Tensor((R, H), T.float32),
        Opart: T.Tensor((NS, RP, H, d), T.float32),
        Lpart: T.Tensor((NS, RP, H), T.float32),
        scale: T.float32,
        bps: T.int32,
    ):
        with T.Kernel(R * HG, NS, threads=NT) as (bx, sp):
            r = bx // HG
            hg = bx % HG
            T.import_source(DEQUANT_SRC)
            Q_s = T.alloc_shared((hb, d), T.bfloat16)
            Kq = T.alloc_shared((BI, d), T.uint8)
            Ks = T.alloc_shared((BI, NG), T.uint8)
            Kb = T.alloc_shared((BI, d), T.bfloat16)
            vm = T.alloc_shared((1, BI), T.float32)
            S_sm = T.alloc_shared((BI, hb + 1), T.float32)
            P_s = T.alloc_shared((BI, hb), T.bfloat16)
            alpha_s = T.alloc_shared((hb,), T.float32)
            inv_s = T.alloc_shared((hb,), T.float32)
            acc_s = T.alloc_fragment((BI, hb), T.float32)
            acc_o = T.alloc_fragment((d, hb), T.float32)
            st = T.alloc_local((4,), T.float32)
            qv = T.alloc_local((16,), T.uint8)
            bv = T.alloc_local((16,), T.bfloat16)
            tx = T.get_thread_binding()
            b0 = sp * bps
            for h, k in T.Parallel(hb, d):
                Q_s[h, k] = T.if_then_else(hg * hb + h < H, Q[r, T.min(hg * hb + h, H - 1), k], T.bfloat16(0))
            T.fill(acc_o, 0)
            st[0] = NEG_INIT
            st[1] = 0.0
            for it in T.Pipelined(nblk, num_stages=2):
                # Invalid (-1) slots gather slot 0 here (always a valid address); the dequant
                # below writes zeros for them and the scores are masked, so its contents never
                # matter (even NaN bytes).
                for bi, k in T.Parallel(BI, d):
                    Kq[bi, k] = Pool[T.max(Idx[r, T.min((b0 + it) * BI + bi, W - 1)], 0), k]
                for bi, g in T.Parallel(BI, NG):
                    Ks[bi, g] = Pool[T.max(Idx[r, T.min((b0 + it) * BI + bi, W - 1)], 0), d + g]
                for i in T.unroll(NCH):
                    c = i * NT + tx
                    col = (b0 + it) * BI + c // CH
                    if (col < W) and (it < bps) and (Idx[r, T.min(col, W - 1)] >= 0):
                        for v in T.vectorized(16):
                            qv[v] = Kq[c // CH, (c % CH) * 16 + v]
                        T.call_extern("handle", "di_dequant16", T.access_ptr(qv, "r"), T.access_ptr(bv, "w"),
                                      Ks[c // CH, (c % CH) // 2])
                        if c % CH == 0:
                            vm[0, c // CH] = 0.0
                    else:
                        for v in T.vectorized(16):
                            bv[v] = T.bfloat16(0)
                        if c % CH == 0:
                            vm[0, c // CH] = -T.infinity(T.float32)
                    for v in T.vectorized(16):
                        Kb[c // CH, (c % CH) * 16 + v] = bv[v]
                T.clear(acc_s)
                T.gemm(Kb, Q_s, acc_s, transpose_B=True)
                T.copy(acc_s, S_sm[:, 0:hb])
                block_softmax(tx, S_sm, vm, 0, P_s, alpha_s, st, scale)
                for k, h in T.Parallel(d, hb):
                    acc_o[k, h] *= alpha_s[h]
                T.gemm(Kb, P_s, acc_o, transpose_A=True)
            finish(tx, r, hg, sp, st, inv_s, acc_o, Out, Lse, Opart, Lpart, scale)

    return main


def _build_combine(heads: int, d: int):
    """Merge split partials: out = sum_s 2^(L_s - L) O_s, lse = L / log2(e), L = log2 sum_s 2^L_s."""
    import tilelang.language as T

    H = heads
    R = T.dynamic("R")
    NS = T.dynamic("NS")
    NT = min(128, d // 4)
    PER = d // NT

    @T.prim_func
    def main(
        Opart: T.Tensor((NS, R, H, d), T.float32),
        Lpart: T.Tensor((NS, R, H), T.float32),
        Out: T.Tensor((R, H, d), T.bfloat16),
        Lse: T.Tensor((R, H), T.float32),
    ):
        with T.Kernel(R, H, threads=NT) as (r, h):
            tx = T.get_thread_binding()
            mx = T.alloc_var(T.float32)
            tot = T.alloc_var(T.float32)
            acc = T.alloc_local((PER,), T.float32)
            ov = T.alloc_local((PER,), T.float32)
            mx = -T.infinity(T.float32)
            for s in T.serial(NS):
                mx = T.max(mx, Lpart[s, r, h])
            tot = 0.0
            for v in T.vectorized(PER):
                acc[v] = 0.0
            if mx > -T.infinity(T.float32):
                for s in T.serial(NS):
                    wgt = T.exp2(Lpart[s, r, h] - mx)
                    tot = tot + wgt
                    for v in T.vectorized(PER):
                        ov[v] = Opart[s, r, h, tx * PER + v]
                    for v in T.vectorized(PER):
                        acc[v] = acc[v] + wgt * ov[v]
            for v in T.vectorized(PER):
                Out[r, h, tx * PER + v] = T.cast(T.if_then_else(tot > 0, acc[v] / tot, 0.0), T.bfloat16)
            if tx == 0:
                Lse[r, h] = T.if_then_else(tot > 0, (T.log2(tot) + mx) / LOG2E, -T.infinity(T.float32))

    return main


def pipelined_bucket(bps: int) -> int:
    return max(4, 1 << max(0, (bps - 1).bit_length()))


def get_kernel(heads: int, d: int, variant: str = "ws", split: bool = False, hb: int | None = None,
               bps: int = 0):
    """Compiled kernel for one shape bucket: (heads, D, heads per CTA, split) [+ the static block
    count bucket for the pipelined variant]."""
    hb = hb or _heads_per_cta(heads)
    if variant in ("ws", "ws2"):
        np_ = 1 if variant == "ws" else 2
        return compile_cached("sparse_mla_" + variant, (heads, d, hb, split),
                              lambda: _build_ws(heads, d, hb, split, np_))
    nblk = pipelined_bucket(bps)
    return compile_cached("sparse_mla_pipelined", (heads, d, hb, split, nblk),
                          lambda: _build_pipelined(heads, d, hb, split, nblk))


def get_combine_kernel(heads: int, d: int):
    return compile_cached("sparse_mla_combine", (heads, d), lambda: _build_combine(heads, d))


# ----------------------------------------------------------------------------- launcher


def choose_num_splits(rows: int, head_groups: int, width: int, sms: int) -> int:
    """Split the index list only when (rows x head groups) CTAs would leave most SMs idle."""
    ctas = rows * head_groups
    blocks = math.ceil(width / BLOCK_TOKENS)
    if ctas >= sms // 2 or blocks < 4:
        return 1
    want = math.ceil(sms / max(ctas, 1))
    return max(1, min(want, blocks // 2))


def plan(rows: int, heads: int, d: int, width: int, sms: int, num_splits: int | None = None) -> dict:
    """Launch plan of one call: heads per CTA, number of splits, blocks per split."""
    hb = _heads_per_cta(heads)
    hgroups = math.ceil(heads / hb)
    blocks = math.ceil(width / BLOCK_TOKENS)
    ns = num_splits if num_splits is not None else choose_num_splits(rows, hgroups, width, sms)
    ns = max(1, min(ns, blocks))
    bps = math.ceil(blocks / ns)
    bps += bps % 2                                   # the ws loop handles blocks in pairs
    ns = math.ceil(blocks / bps)
    return {"hb": hb, "num_splits": ns, "bps": bps}


def precompile_specs(rows: int, heads: int, d: int, width: int, variant: str = "auto",
                     num_splits: int | None = None, sms: int = 132) -> list[tuple[str, tuple]]:
    """(function name in this module, args) of every kernel one call needs (for tools/tilelang_precompile.py)."""
    if rows == 0 or width == 0:
        return []
    variant = resolve_variant(variant, heads, d)
    p = plan(rows, heads, d, width, sms, num_splits)
    split = p["num_splits"] > 1
    specs = [("get_kernel", (heads, d, variant, split, p["hb"], p["bps"]))]
    if split:
        specs.append(("get_combine_kernel", (heads, d)))
    return specs


def sparse_mla_attention_tilelang(q: torch.Tensor, kv_pool: torch.Tensor, indices: torch.Tensor,
                                  sm_scale: float, *, variant: str = "auto",
                                  num_splits: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """q bf16 [rows, heads, D], kv_pool uint8 [slots, D + D/32], indices int32 [rows, width]
    (-1 = empty) -> (out bf16 [rows, heads, D], lse float32 [rows, heads]).

    Same arguments and result as ``sparse_mla_attention_ref``. ``D`` must be a multiple of 64
    (512 in the model); int64 indices are converted to int32. ``num_splits`` overrides the
    split-KV heuristic.
    """
    require(variant in VARIANTS, f"variant={variant!r}: expected one of {VARIANTS}")
    require(q.dim() == 3 and q.dtype == torch.bfloat16, f"q: expected bf16 [rows, heads, D], got {q.dtype} {tuple(q.shape)}")
    rows, heads, d = q.shape
    variant = resolve_variant(variant, heads, d)
    require(d % 64 == 0 and d > 0, f"q: head dim {d} must be a positive multiple of 64")
    rec = _record_bytes(d)
    require(kv_pool.dim() == 2 and kv_pool.dtype == torch.uint8 and kv_pool.shape[1] == rec,
            f"kv_pool: expected uint8 [slots, {rec}], got {kv_pool.dtype} {tuple(kv_pool.shape)}")
    require(indices.dim() == 2 and indices.shape[0] == rows and indices.dtype in (torch.int32, torch.int64),
            f"indices: expected int32 [{rows}, width], got {indices.dtype} {tuple(indices.shape)}")
    device = require_cuda(q=q, kv_pool=kv_pool, indices=indices)
    require(kv_pool.stride() == (rec, 1), "kv_pool: rows must be contiguous records")
    require(kv_pool.data_ptr() % 16 == 0, "kv_pool: base must be 16-byte aligned")
    q = q.contiguous()
    indices = indices.to(torch.int32).contiguous()
    width = indices.shape[1]
    out = torch.empty(rows, heads, d, dtype=torch.bfloat16, device=device)
    lse = torch.empty(rows, heads, dtype=torch.float32, device=device)
    if rows == 0:
        return out, lse
    if width == 0:
        out.zero_()
        lse.fill_(float("-inf"))
        return out, lse
    if num_splits is None and batch_invariant_enabled():
        num_splits = 1    # split-KV changes the accumulation order with the row count
    p = plan(rows, heads, d, width, num_sms(device), num_splits)
    hb, ns, bps = p["hb"], p["num_splits"], p["bps"]
    scale = float(sm_scale) * LOG2E
    if ns == 1:
        dummy_o = torch.empty(1, 1, heads, d, dtype=torch.float32, device=device)
        dummy_l = torch.empty(1, 1, heads, dtype=torch.float32, device=device)
        kernel = get_kernel(heads, d, variant, False, hb, bps)
        kernel(q, kv_pool, indices, out, lse, dummy_o, dummy_l, scale, bps)
        return out, lse
    opart = torch.empty(ns, rows, heads, d, dtype=torch.float32, device=device)
    lpart = torch.empty(ns, rows, heads, dtype=torch.float32, device=device)
    kernel = get_kernel(heads, d, variant, True, hb, bps)
    kernel(q, kv_pool, indices, out, lse, opart, lpart, scale, bps)
    get_combine_kernel(heads, d)(opart, lpart, out, lse)
    return out, lse
