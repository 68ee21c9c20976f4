"""TileLang builder of the warp-specialized sparse MLA kernel ("ws"; see
``common.py`` for the layout and the other kernels)."""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations at
# decoration time against the builder locals.

from deepinfer_kernels.tilelang._common import PDL, pdl_sync
from deepinfer_kernels.tilelang._cuda import DEQUANT_SRC
from deepinfer_kernels.tilelang.sparse_mla.common import (
    BLOCK_TOKENS,
    _record_bytes,
    _staged_consumer_macro,
    _vec_bytes,
    one_row_kernel,
    row_dims,
)


def _build_ws(heads: int, d: int, hb: int, split: bool):
    """Warp-specialized kernel. Dynamic: rows R, width W, slots S, splits NS; ``bps`` (blocks per
    split) is even.

    One producer warpgroup walks all blocks, loading block i+1 into one register buffer while it
    dequantizes block i from the other (one block, 33 KB per SM, of loads in flight); each block's
    slots are loaded two blocks ahead, so a record load never waits on its index load.
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
    assert BI * CH % PT == 0 and d % 64 == 0
    consume = _staged_consumer_macro(T, hb, d, H, split)

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
    def load_indices(Idx, r, W, blk, ok_blk, tp, pidx):
        # the slots of this thread's records of block ``blk`` (-1: none)
        for k in T.unroll(RPT):
            col = blk * BI + k * (PT // P) + (tp // 32) * RW + (tp % 32) % RW
            pidx[k] = T.if_then_else(ok_blk & (col < W), Idx[r, T.min(col, W - 1)], -1)

    @T.macro
    def load_block(Idx, Pool, r, W, blk, ok_blk, tp, qbuf, sbuf, ibuf, pidx):
        # pidx holds block blk's slots (prefetched two blocks earlier): the record loads do not
        # wait on an index load, and pidx is refilled with block blk + 2's slots for next time
        for k in T.unroll(RPT):
            ibuf[k] = pidx[k]
        load_indices(Idx, r, W, blk + 2, ok_blk, tp, pidx)
        for k in T.unroll(RPT):
            part = (tp % 32) // RW
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
    def produce(Idx, Pool, Kb, vm, bar_full, bar_empty, r, W, b0, bps, nj, tp):
        qa = T.alloc_local((NCH * 16,), T.uint8)
        qb = T.alloc_local((NCH * 16,), T.uint8)
        sa = T.alloc_local((RPT * SB,), T.uint8)
        sb = T.alloc_local((RPT * SB,), T.uint8)
        ia = T.alloc_local((RPT,), T.int32)
        ib = T.alloc_local((RPT,), T.int32)
        pa = T.alloc_local((RPT,), T.int32)
        pb = T.alloc_local((RPT,), T.int32)
        bv = T.alloc_local((16,), T.bfloat16)
        # block 2j+s goes to register buffer s (a/b) one step before it is dequantized into
        # bf16 stage s; its slots were loaded into p(a/b) one step before that
        load_indices(Idx, r, W, b0, 0 < bps, tp, pa)
        load_indices(Idx, r, W, b0 + 1, 1 < bps, tp, pb)
        for j in T.serial(nj + 1):
            for s in T.unroll(2):
                if s == 0:
                    load_block(Idx, Pool, r, W, b0 + 2 * j, 2 * j + 2 < bps, tp, qa, sa, ia, pa)
                else:
                    load_block(Idx, Pool, r, W, b0 + 2 * j + 1, 2 * j + 3 < bps, tp, qb, sb, ib, pb)
                pj = 2 * j + s - 1       # block dequantized now, into stage 1 - s
                if (pj >= 0) and (pj < bps):
                    T.barrier_wait(bar_empty[1 - s], ((pj // 2) & 1) ^ 1)
                    if s == 0:
                        store_block(Kb, vm, 1, tp, qb, sb, ib, bv)
                    else:
                        store_block(Kb, vm, 0, tp, qa, sa, ia, bv)
                    T.fence_proxy_async()
                    T.barrier_arrive(bar_full[1 - s])

    R, W, S, NS, RP = dims = row_dims(T)
    NTH = 128 + PT

    @T.macro
    def body(Q, Pool, Idx, Out, Lse, Opart, Lpart, scale, bps):
        # head groups of one row are adjacent CTAs, so the second group's gathers hit L2
        with T.Kernel(R * HG, NS, threads=NTH) as (bx, sp):
            if PDL:   # wait for the previous kernel before touching memory (_common.PDL)
                T.evaluate(pdl_sync())
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
                consume(tx, r, hg, sp, nj, Q, Q_s, Kb, vm, S_sm, P_s, alpha_s, inv_s, bar_full, bar_empty,
                        Out, Lse, Opart, Lpart, scale)
            else:
                # ---------------------------------------------------------------- producer
                produce(Idx, Pool, Kb, vm, bar_full, bar_empty, r, W, b0, bps, nj, tx - 128)

    return one_row_kernel(T, H, d, dims, body)
