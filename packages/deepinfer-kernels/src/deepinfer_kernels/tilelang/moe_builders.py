"""TileLang builders of the MoE's grouped GEMMs (launched by ``moe.py``; the tile schedule, the
decode permutation and the weighted combine are in ``moe_schedule_builders.py``).

Tiling: the grid's x axis enumerates "m-slots", an upper bound ``ceil(N / BM) + E`` on the
number of (expert, BM-row tile) pairs; each CTA reads its expert from the tile schedule on the
device (no host sync, so the launch is CUDA-graph friendly), slots past the real tile count exit
at once. The y axis is the BN-column tile. Weights come in through TMA-able 2D tiles
(``w[e, n0:n0+BN, k0:k0+BK]``); activations through row gathers. Configurations: at decode, the
operand-swapped kernel (weights on the wgmma's M side, a slot of 16 token rows on N; while experts
average <= 16 rows), then 64 x 64 tiles (enough CTAs stream the weights, cp.async pipeline);
prefill down (128 x 256 tiles, TMA on both operands, TileLang's automatic warp specialization)
and prefill gate/up (128 x 128 x {gate, up}, a hand warp-specialized kernel: one producer
warpgroup gathers the rows with cp.async and brings the weights with TMA, two consumer
warpgroups run the wgmmas; ``PREFILL_SWIGLU_PIPELINED`` is its plain-pipeline fallback).

Numerics mirror the reference: fp32 accumulation, the gate/up GEMM output rounded to the input
dtype before SwiGLU, the activation rounded again, the down GEMM output rounded, then the
weighted top-k sum in fp32 in slot order (deterministic).
"""

from deepinfer_kernels.tilelang._common import PDL, pdl_sync

# No `from __future__ import annotations` (TileLang evaluates prim_func annotations).


def grouped_dims(T):
    """The grouped GEMMs' dynamic sizes: rows of x NX (tokens when gathering), output rows N (the
    permuted rows), rows of RowIdx NR (N when gathering, else 1), m-slots NSL."""
    return T.dynamic("NX"), T.dynamic("N"), T.dynamic("NR"), T.dynamic("NSL")


def grouped_kernel(T, E: int, K: int, NOUT: int, NW: int, dtype: str, dims, body):
    """The prim_func of every grouped GEMM (``moe.py`` launches them alike): x [NX, K], weights
    [E, NW, K] (NW = 2 NOUT with SwiGLU), the tile schedule [3, NSL], the gather rows [NR], out
    [N, NOUT], around ``body`` (a ``T.macro`` of the same arguments that opens the kernel)."""
    NX, N, NR, NSL = dims

    @T.prim_func
    def main(
        X: T.Tensor((NX, K), dtype),
        Wt: T.Tensor((E, NW, K), dtype),
        Slots: T.Tensor((3, NSL), T.int32),
        RowIdx: T.Tensor((NR,), T.int32),
        Out: T.Tensor((N, NOUT), dtype),
    ):
        body(X, Wt, Slots, RowIdx, Out)

    return main


def _store_tile_macro(T, dtype: str, swiglu: bool, transposed: bool, bm: int, bn: int):
    """The epilogue of every grouped GEMM: rows ``row0 + i`` (``i < rows``) of ``Out``, columns
    ``col0 + j``. SwiGLU rounds the gate and up accumulators to ``dtype`` first, as the reference
    does; without it ``acc2`` (the up accumulator) is not read. ``transposed``: the accumulators
    hold [bn columns, bm rows] (the operand-swapped kernel)."""

    @T.macro
    def store(Out, acc, acc2, row0, col0, rows):
        if transposed:
            for j, i in T.Parallel(bn, bm):
                if i < rows:
                    if swiglu:
                        g = T.cast(T.cast(acc[j, i], dtype), T.float32)
                        u = T.cast(T.cast(acc2[j, i], dtype), T.float32)
                        Out[row0 + i, col0 + j] = T.cast(g / (1.0 + T.exp(-g)) * u, dtype)
                    else:
                        Out[row0 + i, col0 + j] = T.cast(acc[j, i], dtype)
        else:
            for i, j in T.Parallel(bm, bn):
                if i < rows:
                    if swiglu:
                        g = T.cast(T.cast(acc[i, j], dtype), T.float32)
                        u = T.cast(T.cast(acc2[i, j], dtype), T.float32)
                        Out[row0 + i, col0 + j] = T.cast(g / (1.0 + T.exp(-g)) * u, dtype)
                    else:
                        Out[row0 + i, col0 + j] = T.cast(acc[i, j], dtype)

    return store


def _build_grouped(E: int, K: int, NOUT: int, bm: int, bn: int, bk: int, stages: int, threads: int,
                   gather: bool, swiglu: bool, dtype: str):
    import tilelang.language as T

    store = _store_tile_macro(T, dtype, swiglu, False, bm, bn)

    NW = 2 * NOUT if swiglu else NOUT
    NX, N, NR, NSL = dims = grouped_dims(T)
    assert K % bk == 0 and NOUT % bn == 0

    @T.macro
    def body(X, Wt, Slots, RowIdx, Out):
        with T.Kernel(NSL, NOUT // bn, threads=threads) as (bx, by):
            if PDL:   # wait for the previous kernel before touching memory (_common.PDL)
                T.evaluate(pdl_sync())
            A_s = T.alloc_shared((bm, bk), dtype)
            B_s = T.alloc_shared((bn, bk), dtype)
            acc = T.alloc_fragment((bm, bn), T.float32)
            if swiglu:
                B2_s = T.alloc_shared((bn, bk), dtype)
                acc2 = T.alloc_fragment((bm, bn), T.float32)
            ex = Slots[0, bx]
            row0 = Slots[1, bx]
            rows = Slots[2, bx]
            if rows > 0:
                T.clear(acc)
                if swiglu:
                    T.clear(acc2)
                for k in T.Pipelined(K // bk, num_stages=stages):
                    if gather:
                        # rows past this expert's tile point at row NX (out of bounds): the
                        # bounds-checked cp.async zero-fills them without touching memory
                        for i, kk in T.Parallel(bm, bk):
                            A_s[i, kk] = X[T.if_then_else(i < rows, RowIdx[T.min(row0 + i, NR - 1)], NX), k * bk + kk]
                    else:
                        T.copy(X[row0:row0 + bm, k * bk:(k + 1) * bk], A_s)
                    T.copy(Wt[ex, by * bn:(by + 1) * bn, k * bk:(k + 1) * bk], B_s)
                    if swiglu:
                        T.copy(Wt[ex, NOUT + by * bn:NOUT + (by + 1) * bn, k * bk:(k + 1) * bk], B2_s)
                    T.gemm(A_s, B_s, acc, transpose_B=True)
                    if swiglu:
                        T.gemm(A_s, B2_s, acc2, transpose_B=True)
                store(Out, acc, acc2 if swiglu else acc, row0, by * bn, rows)

    return grouped_kernel(T, E, K, NOUT, NW, dtype, dims, body)


def _build_grouped_swapped(E: int, K: int, NOUT: int, bm: int, bn: int, bk: int, stages: int, threads: int,
                           gather: bool, swiglu: bool, dtype: str, stage_rows_whole_k: bool = True):
    """Decode-size grouped GEMM with the operands swapped: the weight tile is the MMA's M side and
    the slot's few token rows its N side (``out^T[bn, bm] = W[e, n0:n0+bn, :] . X[rows, :]^T``), so
    a slot of bm = 8 or 16 rows costs an m64nBMk16 wgmma per 64 weight rows instead of the 64-row
    tiles of ``_build_grouped`` (mostly zero rows at decode). ``stage_rows_whole_k``: the slot's rows
    of X (gathered when ``gather``) are staged once, whole K, in shared memory before the weight
    tiles stream through the software pipeline; otherwise each k-step's [bm, bk] tile of them is
    one more cp.async operand of the pipeline (no serial prologue, less shared memory)."""
    import tilelang.language as T

    store = _store_tile_macro(T, dtype, swiglu, True, bm, bn)

    NW = 2 * NOUT if swiglu else NOUT
    KT = K // bk
    NX, N, NR, NSL = dims = grouped_dims(T)
    assert K % bk == 0 and NOUT % bn == 0

    @T.macro
    def body(X, Wt, Slots, RowIdx, Out):
        with T.Kernel(NSL, NOUT // bn, threads=threads) as (bx, by):
            if PDL:   # wait for the previous kernel before touching memory (_common.PDL)
                T.evaluate(pdl_sync())
            X_s = T.alloc_shared((KT if stage_rows_whole_k else 1, bm, bk), dtype)
            W_s = T.alloc_shared((bn, bk), dtype)
            acc = T.alloc_fragment((bn, bm), T.float32)
            if swiglu:
                W2_s = T.alloc_shared((bn, bk), dtype)
                acc2 = T.alloc_fragment((bn, bm), T.float32)
            ex = Slots[0, bx]
            row0 = Slots[1, bx]
            rows = Slots[2, bx]
            if rows > 0:
                if stage_rows_whole_k:
                    for kt, i, kk in T.Parallel(KT, bm, bk):
                        src = RowIdx[T.min(row0 + i, NR - 1)] if gather else T.min(row0 + i, NX - 1)
                        X_s[kt, i, kk] = T.if_then_else(i < rows, X[src, kt * bk + kk], T.cast(0, dtype))
                T.clear(acc)
                if swiglu:
                    T.clear(acc2)
                for k in T.Pipelined(KT, num_stages=stages):
                    if not stage_rows_whole_k:
                        # rows past the slot point at row NX: the bounds-checked cp.async zero-fills them
                        for i, kk in T.Parallel(bm, bk):
                            src = RowIdx[T.min(row0 + i, NR - 1)] if gather else row0 + i
                            X_s[0, i, kk] = X[T.if_then_else(i < rows, src, NX), k * bk + kk]
                    T.copy(Wt[ex, by * bn:(by + 1) * bn, k * bk:(k + 1) * bk], W_s)
                    if swiglu:
                        T.copy(Wt[ex, NOUT + by * bn:NOUT + (by + 1) * bn, k * bk:(k + 1) * bk], W2_s)
                    xk = k if stage_rows_whole_k else 0
                    T.gemm(W_s, X_s[xk, :, :], acc, transpose_B=True)
                    if swiglu:
                        T.gemm(W2_s, X_s[xk, :, :], acc2, transpose_B=True)
                store(Out, acc, acc2 if swiglu else acc, row0, by * bn, rows)

    return grouped_kernel(T, E, K, NOUT, NW, dtype, dims, body)


def _build_grouped_ws(E: int, K: int, NOUT: int, bm: int, bn: int, bk: int, stages: int, swiglu: bool,
                      dtype: str):
    """Warp-specialized gather GEMM (prefill gate/up): warpgroup 2 is the producer -- it gathers
    the activation rows with cp.async (completion signalled on the stage's mbarrier through
    cp.async.mbarrier.arrive.noinc) and brings the weight tiles in with TMA on the same barrier;
    warpgroups 0-1 run the wgmmas (BM = 128 rows, 64 per warpgroup) and the SwiGLU epilogue."""
    import tilelang.language as T

    store = _store_tile_macro(T, dtype, swiglu, False, bm, bn)

    NW = 2 * NOUT if swiglu else NOUT
    NX, N, NR, NSL = dims = grouped_dims(T)
    KT = K // bk
    CPT = bm * bk // 8 // 128            # 16-byte chunks of the A tile per producer thread
    assert K % bk == 0 and NOUT % bn == 0 and KT % stages == 0 and bm == 128

    @T.macro
    def body(X, Wt, Slots, RowIdx, Out):
        with T.Kernel(NSL, NOUT // bn, threads=384) as (bx, by):
            if PDL:   # wait for the previous kernel before touching memory (_common.PDL)
                T.evaluate(pdl_sync())
            A_s = T.alloc_shared((stages, bm, bk), dtype)
            B_s = T.alloc_shared((stages, bn, bk), dtype)
            B2_s = T.alloc_shared((stages, bn, bk), dtype)
            full = T.alloc_barrier(arrive_count=[128] * stages)
            empty = T.alloc_barrier(arrive_count=[256] * stages)
            tx = T.get_thread_binding()
            ex = Slots[0, bx]
            row0 = Slots[1, bx]
            rows = Slots[2, bx]
            if rows > 0:
                if tx < 256:
                    T.set_max_nreg(224, 1)
                    acc = T.alloc_fragment((bm, bn), T.float32)
                    acc2 = T.alloc_fragment((bm, bn), T.float32)
                    T.clear(acc)
                    T.clear(acc2)
                    for ko in T.serial(KT // stages):
                        for s in T.unroll(stages):
                            T.barrier_wait(full[s], ko & 1)
                            # A_s was written by cp.async (generic proxy): order it before the
                            # wgmma reads (async proxy)
                            T.fence_proxy_async()
                            T.gemm(A_s[s, :, :], B_s[s, :, :], acc, transpose_B=True)
                            if swiglu:
                                T.gemm(A_s[s, :, :], B2_s[s, :, :], acc2, transpose_B=True)
                            T.barrier_arrive(empty[s])
                    store(Out, acc, acc2, row0, by * bn, rows)
                else:
                    T.set_max_nreg(64, 0)
                    tp = tx - 256
                    for ko in T.serial(KT // stages):
                        for s in T.unroll(stages):
                            k = ko * stages + s
                            T.barrier_wait(empty[s], (ko & 1) ^ 1)
                            # TMA first: its expect_tx is registered before this thread's
                            # cp.async arrival, so the phase cannot complete without the bytes
                            T.tma_copy(Wt[ex, by * bn:(by + 1) * bn, k * bk:(k + 1) * bk], B_s[s, :, :],
                                       barrier=full[s])
                            if swiglu:
                                T.tma_copy(Wt[ex, NOUT + by * bn:NOUT + (by + 1) * bn, k * bk:(k + 1) * bk],
                                           B2_s[s, :, :], barrier=full[s])
                            for c in T.unroll(CPT):
                                ch = c * 128 + tp
                                i = ch // (bk // 8)
                                c8 = ch % (bk // 8)
                                src_row = T.if_then_else(i < rows, RowIdx[T.min(row0 + i, NR - 1)], 0)
                                T.ptx_cp_async(T.access_ptr(A_s[s, i, c8 * 8], "w", 8),
                                               T.access_ptr(X[src_row, k * bk + c8 * 8], "r", 8), 8,
                                               predicate=i < rows)
                            T.cp_async_barrier_noinc(full[s])

    return grouped_kernel(T, E, K, NOUT, NW, dtype, dims, body)
