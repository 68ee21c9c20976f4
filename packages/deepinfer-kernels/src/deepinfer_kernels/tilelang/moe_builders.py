"""TileLang builders of the MoE kernels (launched by ``moe.py``).

Tiling: the grid's x axis enumerates "m-slots", an upper bound ``ceil(N / BM) + E`` on the
number of (expert, BM-row tile) pairs; each CTA finds its expert from ``expert_offsets`` on the
device (no host sync, so the launch is CUDA-graph friendly), slots past the real tile count exit
at once. The y axis is the BN-column tile. Weights come in through TMA-able 2D tiles
(``w[e, n0:n0+BN, k0:k0+BK]``); activations through row gathers. Configurations: a decode one
(few rows per expert, BM x BN = 64 x 64 so enough CTAs stream the weights, cp.async pipeline),
prefill down (128 x 256 tiles, TMA on both operands, TileLang's automatic warp specialization)
and prefill gate/up (128 x 128 x {gate, up}, a hand warp-specialized kernel: one producer
warpgroup gathers the rows with cp.async and brings the weights with TMA, two consumer
warpgroups run the wgmmas; ``PREFILL_SWIGLU_PIPELINED`` is its plain-pipeline fallback).

Numerics mirror the reference: fp32 accumulation, the gate/up GEMM output rounded to the input
dtype before SwiGLU, the activation rounded again, the down GEMM output rounded, then the
weighted top-k sum in fp32 in slot order (deterministic).
"""

# No `from __future__ import annotations` (TileLang evaluates prim_func annotations).


def _build_slots(E: int, bm: int, off_dtype: str):
    """Tile schedule: slot s -> (expert, first row, rows) of the s-th BM-row tile in expert order;
    slots past the last tile get rows = 0. One thread per slot scans the E offsets."""
    import tilelang.language as T

    NSL = T.dynamic("NSL")
    NT = 128

    @T.prim_func
    def main(
        Offs: T.Tensor((E + 1,), off_dtype),
        Slots: T.Tensor((3, NSL), T.int32),
    ):
        with T.Kernel(T.ceildiv(NSL, NT), threads=NT) as bx:
            off_s = T.alloc_shared((E + 1,), T.int32)
            ex = T.alloc_var(T.int32)
            row0 = T.alloc_var(T.int32)
            rows = T.alloc_var(T.int32)
            cum = T.alloc_var(T.int32)
            tx = T.get_thread_binding()
            for i in T.Parallel(E + 1):
                off_s[i] = T.cast(Offs[i], T.int32)
            s = bx * NT + tx
            ex = 0
            row0 = 0
            rows = 0
            cum = 0
            for e in T.serial(E):
                ne = off_s[e + 1] - off_s[e]
                te = (ne + bm - 1) // bm
                if (rows == 0) and (s >= cum) and (s < cum + te):
                    ex = e
                    row0 = off_s[e] + (s - cum) * bm
                    rows = T.min(bm, off_s[e + 1] - row0)
                cum = cum + te
            if s < NSL:
                Slots[0, s] = ex
                Slots[1, s] = row0
                Slots[2, s] = rows

    return main


def _store_tile_macro(T, dtype: str, swiglu: bool, transposed: bool, bm: int, bn: int):
    """The epilogue of every grouped GEMM: rows ``row0 + i`` (``i < rows``) of ``Out``, columns
    ``col0 + j``. SwiGLU rounds the gate and up accumulators to ``dtype`` first, as the reference
    does. ``transposed``: the accumulators hold [bn columns, bm rows] (the operand-swapped kernel)."""

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
    NX = T.dynamic("NX")                 # rows of x (tokens when gathering)
    N = T.dynamic("N")                   # rows of the output (= permuted rows)
    NR = T.dynamic("NR")                 # rows of RowIdx (N when gathering, else 1)
    NSL = T.dynamic("NSL")               # m-slots
    assert K % bk == 0 and NOUT % bn == 0

    @T.prim_func
    def main(
        X: T.Tensor((NX, K), dtype),
        Wt: T.Tensor((E, NW, K), dtype),
        Slots: T.Tensor((3, NSL), T.int32),
        RowIdx: T.Tensor((NR,), T.int32),
        Out: T.Tensor((N, NOUT), dtype),
    ):
        with T.Kernel(NSL, NOUT // bn, threads=threads) as (bx, by):
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
                if swiglu:
                    store(Out, acc, acc2, row0, by * bn, rows)
                else:
                    store(Out, acc, acc, row0, by * bn, rows)

    return main


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
    NX = T.dynamic("NX")
    N = T.dynamic("N")
    NR = T.dynamic("NR")
    NSL = T.dynamic("NSL")
    assert K % bk == 0 and NOUT % bn == 0

    @T.prim_func
    def main(
        X: T.Tensor((NX, K), dtype),
        Wt: T.Tensor((E, NW, K), dtype),
        Slots: T.Tensor((3, NSL), T.int32),
        RowIdx: T.Tensor((NR,), T.int32),
        Out: T.Tensor((N, NOUT), dtype),
    ):
        with T.Kernel(NSL, NOUT // bn, threads=threads) as (bx, by):
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
                if swiglu:
                    store(Out, acc, acc2, row0, by * bn, rows)
                else:
                    store(Out, acc, acc, row0, by * bn, rows)

    return main


def _build_grouped_ws(E: int, K: int, NOUT: int, bm: int, bn: int, bk: int, stages: int, swiglu: bool,
                      dtype: str):
    """Warp-specialized gather GEMM (prefill gate/up): warpgroup 2 is the producer -- it gathers
    the activation rows with cp.async (completion signalled on the stage's mbarrier through
    cp.async.mbarrier.arrive.noinc) and brings the weight tiles in with TMA on the same barrier;
    warpgroups 0-1 run the wgmmas (BM = 128 rows, 64 per warpgroup) and the SwiGLU epilogue."""
    import tilelang.language as T

    store = _store_tile_macro(T, dtype, swiglu, False, bm, bn)

    NW = 2 * NOUT if swiglu else NOUT
    NX = T.dynamic("NX")
    N = T.dynamic("N")
    NR = T.dynamic("NR")
    NSL = T.dynamic("NSL")
    KT = K // bk
    CPT = bm * bk // 8 // 128            # 16-byte chunks of the A tile per producer thread
    assert K % bk == 0 and NOUT % bn == 0 and KT % stages == 0 and bm == 128

    @T.prim_func
    def main(
        X: T.Tensor((NX, K), dtype),
        Wt: T.Tensor((E, NW, K), dtype),
        Slots: T.Tensor((3, NSL), T.int32),
        RowIdx: T.Tensor((NR,), T.int32),
        Out: T.Tensor((N, NOUT), dtype),
    ):
        with T.Kernel(NSL, NOUT // bn, threads=384) as (bx, by):
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
                    if swiglu:
                        store(Out, acc, acc2, row0, by * bn, rows)
                    else:
                        store(Out, acc, acc, row0, by * bn, rows)
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

    return main


def _build_permute(E: int, topk: int, bm: int):
    """Decode-size routing bookkeeping in one CTA: expert histogram, offsets, an expert-grouped
    position for every (token, slot) and the tile schedule. Rows of one expert come out in an
    arbitrary order (shared-memory atomics): every row is computed independently and the combine
    sums the slots of a token in slot order, so the result does not depend on it."""
    import tilelang.language as T

    NT = 1024
    N = T.dynamic("N")                   # tokens * topk
    NSL = T.dynamic("NSL")

    @T.prim_func
    def main(
        Ids: T.Tensor((N,), T.int32),
        TokenOf: T.Tensor((N,), T.int32),
        Inv: T.Tensor((N,), T.int32),
        Offs: T.Tensor((E + 1,), T.int32),
        Slots: T.Tensor((3, NSL), T.int32),
    ):
        with T.Kernel(1, threads=NT) as _bx:
            cnt = T.alloc_shared((E,), T.int32)
            fill = T.alloc_shared((E,), T.int32)
            off = T.alloc_shared((E + 1,), T.int32)
            run = T.alloc_var(T.int32)
            ex = T.alloc_var(T.int32)
            row0 = T.alloc_var(T.int32)
            rows = T.alloc_var(T.int32)
            cum = T.alloc_var(T.int32)
            tx = T.get_thread_binding()
            for j in T.serial(T.ceildiv(E, NT)):
                if j * NT + tx < E:
                    cnt[j * NT + tx] = 0
                    fill[j * NT + tx] = 0
            T.sync_threads()
            for j in T.serial(T.ceildiv(N, NT)):
                if j * NT + tx < N:
                    T.atomic_add(cnt[Ids[j * NT + tx]], 1)
            T.sync_threads()
            if tx == 0:
                run = 0
                for e in T.serial(E):
                    off[e] = run
                    Offs[e] = run
                    run = run + cnt[e]
                off[E] = run
                Offs[E] = run
            T.sync_threads()
            for j in T.serial(T.ceildiv(N, NT)):
                i = j * NT + tx
                if i < N:
                    pos = off[Ids[i]] + T.atomic_add(fill[Ids[i]], 1, return_prev=True)
                    TokenOf[pos] = i // topk
                    Inv[i] = pos
            for j in T.serial(T.ceildiv(NSL, NT)):
                sl = j * NT + tx
                if sl < NSL:
                    ex = 0
                    row0 = 0
                    rows = 0
                    cum = 0
                    for e in T.serial(E):
                        te = (off[e + 1] - off[e] + bm - 1) // bm
                        if (rows == 0) and (sl >= cum) and (sl < cum + te):
                            ex = e
                            row0 = off[e] + (sl - cum) * bm
                            rows = T.min(bm, off[e + 1] - row0)
                        cum = cum + te
                    Slots[0, sl] = ex
                    Slots[1, sl] = row0
                    Slots[2, sl] = rows

    return main


def _build_combine(topk: int, H: int, dtype: str):
    """out[t] = sum_j w[t, j] * y[inv[t * topk + j]] in fp32, j ascending; one CTA row per token."""
    import tilelang.language as T

    NT = min(128, H // 8)
    PER = H // NT
    T_ = T.dynamic("T")
    NY = T.dynamic("NY")
    NI = T.dynamic("NI")                 # = T * topk

    @T.prim_func
    def main(
        Y: T.Tensor((NY, H), dtype),
        Wk: T.Tensor((T_, topk), T.float32),
        Inv: T.Tensor((NI,), T.int32),
        Out: T.Tensor((T_, H), dtype),
    ):
        with T.Kernel(T_, threads=NT) as t:
            tx = T.get_thread_binding()
            acc = T.alloc_local((PER,), T.float32)
            yv = T.alloc_local((PER,), dtype)
            for v in T.vectorized(PER):
                acc[v] = 0.0
            for j in T.serial(topk):
                for v in T.vectorized(PER):
                    yv[v] = Y[Inv[t * topk + j], tx * PER + v]
                for v in T.vectorized(PER):
                    acc[v] = acc[v] + T.cast(yv[v], T.float32) * Wk[t, j]
            for v in T.vectorized(PER):
                Out[t, tx * PER + v] = T.cast(acc[v], dtype)

    return main
