"""TileLang builders of the MoE's bookkeeping kernels around the grouped GEMMs (``moe_builders.py``),
launched by ``moe.py``: the tile schedule (m-slot -> expert, first row, rows), the decode-size
permutation by expert in one CTA, and the weighted top-k combine in slot order (the prefill
path's SwiGLU between its torch grouped GEMMs is ``activation.py``'s kernel).
"""

from deepinfer_kernels.tilelang._common import PDL, pdl_sync

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
            if PDL:   # wait for the previous kernel before touching memory (_common.PDL)
                T.evaluate(pdl_sync())
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


def _build_permute(E: int, topk: int, bm: int):
    """Decode-size routing bookkeeping in one CTA: expert histogram, offsets, an expert-grouped
    position for every (token, slot) and the tile schedule. Rows of one expert come out in an
    arbitrary order (shared-memory atomics): every row is computed independently and the combine
    sums the slots of a token in slot order, so the result does not depend on it.

    Latency is the point at decode (one launch on the critical path of every MoE layer): the
    per-expert rows and tiles are prefix-summed by two warps' shuffle scans (``T.cumsum``) and each
    expert writes its own tiles of the schedule, so no thread walks all E experts (the serial walk
    took 15.8 us at 384 experts, 2026-12-01)."""
    import tilelang.language as T

    NT = 1024
    N = T.dynamic("N")                   # tokens * topk
    NSL = T.dynamic("NSL")
    ECH = (E + NT - 1) // NT             # experts per thread

    @T.prim_func
    def main(
        Ids: T.Tensor((N,), T.int32),
        TokenOf: T.Tensor((N,), T.int32),
        Inv: T.Tensor((N,), T.int32),
        Offs: T.Tensor((E + 1,), T.int32),
        Slots: T.Tensor((3, NSL), T.int32),
    ):
        with T.Kernel(1, threads=NT) as _bx:
            if PDL:   # wait for the previous kernel before touching memory (_common.PDL)
                T.evaluate(pdl_sync())
            cnt = T.alloc_shared((E,), T.int32)
            fill = T.alloc_shared((E,), T.int32)
            scan = T.alloc_shared((2, E), T.int32)   # inclusive prefix sums: [0] rows, [1] tiles
            rows = T.alloc_var(T.int32)
            first_row = T.alloc_var(T.int32)
            tiles = T.alloc_var(T.int32)
            first_tile = T.alloc_var(T.int32)
            total_tiles = T.alloc_var(T.int32)
            ex = T.alloc_var(T.int32)
            tx = T.get_thread_binding()
            for j in T.serial(ECH):
                if j * NT + tx < E:
                    cnt[j * NT + tx] = 0
                    fill[j * NT + tx] = 0
            T.sync_threads()
            for j in T.serial(T.ceildiv(N, NT)):
                if j * NT + tx < N:
                    T.atomic_add(cnt[Ids[j * NT + tx]], 1)
            T.sync_threads()
            for j in T.serial(ECH):
                e = j * NT + tx
                if e < E:
                    scan[0, e] = cnt[e]
                    scan[1, e] = (cnt[e] + bm - 1) // bm
            T.sync_threads()
            T.cumsum(src=scan, dim=1)
            T.sync_threads()
            for j in T.serial(ECH):
                e = j * NT + tx
                if e < E:
                    rows = cnt[e]
                    first_row = scan[0, e] - rows
                    tiles = (rows + bm - 1) // bm
                    first_tile = scan[1, e] - tiles
                    Offs[e] = first_row
                    for t in T.serial(tiles):   # this expert's tiles of the schedule
                        Slots[0, first_tile + t] = e
                        Slots[1, first_tile + t] = first_row + t * bm
                        Slots[2, first_tile + t] = T.min(bm, rows - t * bm)
            total_tiles = scan[1, E - 1]
            if tx == 0:
                Offs[E] = scan[0, E - 1]
            for j in T.serial(T.ceildiv(NSL, NT)):   # slots past the last tile: rows = 0
                sl = j * NT + tx
                if sl >= total_tiles and sl < NSL:
                    Slots[0, sl] = 0
                    Slots[1, sl] = 0
                    Slots[2, sl] = 0
            for j in T.serial(T.ceildiv(N, NT)):
                i = j * NT + tx
                if i < N:
                    ex = Ids[i]
                    pos = scan[0, ex] - cnt[ex] + T.atomic_add(fill[ex], 1, return_prev=True)
                    TokenOf[pos] = i // topk
                    Inv[i] = pos

    return main


COMBINE_VEC = 8   # values per thread and load (16 bytes of bf16)


def combine_ctas_per_token(H: int) -> int:
    """CTAs that share one token's row in the combine: 128 threads of COMBINE_VEC columns each when
    H divides into such chunks (flash's 3,072: 3), else one CTA with every column."""
    nt = min(128, H // COMBINE_VEC)
    return H // (nt * COMBINE_VEC) if H % (nt * COMBINE_VEC) == 0 else 1


def _build_combine(topk: int, H: int, dtype: str, add_shared: bool = False, add_residual: bool = False):
    """out[t] = sum_j w[t, j] * y[inv[t * topk + j]] in fp32, j ascending; rounded to dtype, then
    ``+ shared[t]`` and ``residual[t] + ...`` each rounded again when asked (the roundings of torch's
    ``residual + (routed + shared)`` in dtype, so bit-identical to it). Unused addend operands are
    never read (the launcher passes ``out`` for them).

    ``combine_ctas_per_token(H)`` CTAs per token, each thread 8 columns: the token's rows and
    weights are read first, then every expert row's 16-byte load is issued before the sums (a
    decode token's combine was one CTA walking its experts one dependent load after another: 5-6 us
    at flash's width, H200)."""
    import tilelang.language as T

    CPT = combine_ctas_per_token(H)
    NT = min(128, H // COMBINE_VEC)
    PER = H // (NT * CPT)                # columns per thread: COMBINE_VEC when the row splits
    assert NT * CPT * PER == H, f"combine: H={H} must split evenly over {NT} threads"
    T_ = T.dynamic("T")
    NY = T.dynamic("NY")
    NI = T.dynamic("NI")                 # = T * topk

    @T.prim_func
    def main(
        Y: T.Tensor((NY, H), dtype),
        Wk: T.Tensor((T_, topk), T.float32),
        Inv: T.Tensor((NI,), T.int32),
        Shared: T.Tensor((T_, H), dtype),
        Residual: T.Tensor((T_, H), dtype),
        Out: T.Tensor((T_, H), dtype),
    ):
        with T.Kernel(CPT, T_, threads=NT) as (bx, t):
            if PDL:   # wait for the previous kernel before touching memory (_common.PDL)
                T.evaluate(pdl_sync())
            tx = T.get_thread_binding()
            col = (bx * NT + tx) * PER
            rows = T.alloc_local((topk,), T.int32)
            wv = T.alloc_local((topk,), T.float32)
            acc = T.alloc_local((PER,), T.float32)
            yv = T.alloc_local((topk, PER), dtype)
            ov = T.alloc_local((PER,), dtype)
            for j in T.unroll(topk):
                rows[j] = Inv[t * topk + j]
                wv[j] = Wk[t, j]
            for j in T.unroll(topk):
                for v in T.vectorized(PER):
                    yv[j, v] = Y[rows[j], col + v]
            for v in T.vectorized(PER):
                acc[v] = 0.0
            for j in T.unroll(topk):
                for v in T.vectorized(PER):
                    acc[v] = acc[v] + T.cast(yv[j, v], T.float32) * wv[j]
            for v in T.vectorized(PER):
                ov[v] = T.cast(acc[v], dtype)
            if add_shared:
                for v in T.vectorized(PER):
                    ov[v] = T.cast(T.cast(ov[v], T.float32) + T.cast(Shared[t, col + v], T.float32), dtype)
            if add_residual:
                for v in T.vectorized(PER):
                    ov[v] = T.cast(T.cast(Residual[t, col + v], T.float32) + T.cast(ov[v], T.float32), dtype)
            for v in T.vectorized(PER):
                Out[t, col + v] = ov[v]

    return main

