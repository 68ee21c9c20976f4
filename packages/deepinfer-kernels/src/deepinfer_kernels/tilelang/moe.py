"""Grouped expert GEMM and the routed-experts MoE forward (TileLang, SM90).

Same functions as ``deepinfer_kernels.ops.moe``:

* ``grouped_expert_gemm_tilelang(x, w, expert_offsets)``: rows ``expert_offsets[e] ..
  expert_offsets[e+1]-1`` of ``x`` (already permuted by expert) times ``w[e].T``.
* ``routed_experts_tilelang(x, weights, ids, w13, w2)``: SwiGLU experts in four kernels at decode
  sizes: one CTA does the routing bookkeeping (expert histogram, offsets, grouped positions, tile
  schedule); the gate/up GEMM gathers the token rows itself (no permuted copy of ``x``), applies
  SwiGLU in its epilogue (two accumulators, gate and up columns of the same tile) and writes the
  activation; the down GEMM follows; a last kernel sums the ``top_k`` weighted expert outputs per
  token in slot order. Past ``PERMUTE_KERNEL_MAX_ROWS`` rows the bookkeeping uses torch's sort.

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

import os

import torch

from deepinfer_kernels.batch_invariant import batch_invariant_enabled
from deepinfer_kernels.tilelang._common import compile_cached, require, require_cuda

# No `from __future__ import annotations` (TileLang evaluates prim_func annotations).

DECODE = dict(bm=64, bn=64, bk=64, stages=4, threads=128)
PREFILL = dict(bm=128, bn=256, bk=64, stages=3, threads=256)
# gate/up (gathered rows): warp-specialized producer (cp.async gather + TMA weights), 2 consumer
# warpgroups; PREFILL_SWIGLU_PIPELINED is the plain cp.async software pipeline (fallback)
PREFILL_SWIGLU = dict(bm=128, bn=128, bk=64, stages=4, threads=384, ws=1)
PREFILL_SWIGLU_PIPELINED = dict(bm=128, bn=128, bk=64, stages=3, threads=256)


def pick_config(rows: int, num_experts: int, swiglu: bool, k: int = 0) -> dict:
    """Decode tiles while the average expert has at most 64 rows, prefill tiles beyond. The
    hand warp-specialized gate/up kernel (``PREFILL_SWIGLU``) hung in its H200 tests at 1,024
    tokens (2026-11-30), so the plain pipeline serves prefill gate/up unless
    ``DEEPINFER_MOE_GATEUP_WS=1`` asks for it (debugging; it needs K % (bk * stages) == 0)."""
    if rows <= 64 * num_experts:
        return DECODE
    if not swiglu:
        return PREFILL
    ws = PREFILL_SWIGLU
    if os.environ.get("DEEPINFER_MOE_GATEUP_WS") == "1" and k % (ws["bk"] * ws["stages"]) == 0:
        return ws
    return PREFILL_SWIGLU_PIPELINED


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


def _build_grouped(E: int, K: int, NOUT: int, bm: int, bn: int, bk: int, stages: int, threads: int,
                   gather: bool, swiglu: bool, dtype: str):
    import tilelang.language as T

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
                    for i, j in T.Parallel(bm, bn):
                        if i < rows:
                            g = T.cast(T.cast(acc[i, j], dtype), T.float32)
                            u = T.cast(T.cast(acc2[i, j], dtype), T.float32)
                            Out[row0 + i, by * bn + j] = T.cast(g / (1.0 + T.exp(-g)) * u, dtype)
                else:
                    for i, j in T.Parallel(bm, bn):
                        if i < rows:
                            Out[row0 + i, by * bn + j] = T.cast(acc[i, j], dtype)

    return main


def _build_grouped_ws(E: int, K: int, NOUT: int, bm: int, bn: int, bk: int, stages: int, swiglu: bool,
                      dtype: str):
    """Warp-specialized gather GEMM (prefill gate/up): warpgroup 2 is the producer -- it gathers
    the activation rows with cp.async (completion signalled on the stage's mbarrier through
    cp.async.mbarrier.arrive.noinc) and brings the weight tiles in with TMA on the same barrier;
    warpgroups 0-1 run the wgmmas (BM = 128 rows, 64 per warpgroup) and the SwiGLU epilogue."""
    import tilelang.language as T

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
                        for i, j in T.Parallel(bm, bn):
                            if i < rows:
                                g = T.cast(T.cast(acc[i, j], dtype), T.float32)
                                u = T.cast(T.cast(acc2[i, j], dtype), T.float32)
                                Out[row0 + i, by * bn + j] = T.cast(g / (1.0 + T.exp(-g)) * u, dtype)
                    else:
                        for i, j in T.Parallel(bm, bn):
                            if i < rows:
                                Out[row0 + i, by * bn + j] = T.cast(acc[i, j], dtype)
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


_DT = {torch.bfloat16: "bfloat16", torch.float16: "float16"}


def _grouped_kernel(E, K, NOUT, cfg, gather, swiglu, dtype):
    key = (E, K, NOUT, tuple(sorted(cfg.items())), gather, swiglu, _DT[dtype])
    # Gathered activations cannot use TMA; TileLang's automatic warp specialization would then
    # load them synchronously in the consumer, so the gather kernels use the plain cp.async
    # software pipeline instead.
    if cfg.get("ws"):
        return compile_cached("moe_grouped_gemm_ws", key, lambda: _build_grouped_ws(
            E, K, NOUT, cfg["bm"], cfg["bn"], cfg["bk"], cfg["stages"], swiglu, _DT[dtype]))
    pc = {"tl.disable_warp_specialized": True} if gather else None
    return compile_cached("moe_grouped_gemm", key, lambda: _build_grouped(
        E, K, NOUT, cfg["bm"], cfg["bn"], cfg["bk"], cfg["stages"], cfg["threads"], gather, swiglu, _DT[dtype]),
        pass_configs=pc)


def _slots_kernel(num_experts: int, bm: int, offn: str):
    return compile_cached("moe_slots", (num_experts, bm, offn), lambda: _build_slots(num_experts, bm, offn))


def _combine_kernel(topk: int, h: int, dtype: torch.dtype):
    return compile_cached("moe_combine", (topk, h, _DT[dtype]), lambda: _build_combine(topk, h, _DT[dtype]))


def _permute_kernel(num_experts: int, topk: int, bm: int):
    return compile_cached("moe_permute", (num_experts, topk, bm), lambda: _build_permute(num_experts, topk, bm))


PERMUTE_KERNEL_MAX_ROWS = 16384   # beyond this the torch sort path is used (cost negligible there)


def _slots(offsets: torch.Tensor, num_experts: int, rows: int, bm: int) -> torch.Tensor:
    nsl = (rows + bm - 1) // bm + num_experts
    slots = torch.empty(3, nsl, dtype=torch.int32, device=offsets.device)
    offn = "int64" if offsets.dtype == torch.int64 else "int32"
    _slots_kernel(num_experts, bm, offn)(offsets, slots)
    return slots


def grouped_expert_gemm_tilelang(x: torch.Tensor, w: torch.Tensor, expert_offsets: torch.Tensor,
                                 *, config: dict | None = None) -> torch.Tensor:
    """x [N, K] (rows grouped by expert), w [E, Nout, K], expert_offsets [E+1] -> [N, Nout] (x.dtype).
    bf16/fp16; K a multiple of 64, Nout a multiple of the tile width (64 decode, 256 prefill)."""
    require(x.dim() == 2 and w.dim() == 3 and x.shape[1] == w.shape[2], "x [N, K] and w [E, Nout, K] expected")
    require(x.dtype in _DT and w.dtype == x.dtype, f"x/w: bf16 or fp16 of one dtype, got {x.dtype}/{w.dtype}")
    require(expert_offsets.dim() == 1 and expert_offsets.shape[0] == w.shape[0] + 1
            and expert_offsets.dtype in (torch.int32, torch.int64), "expert_offsets: int [E+1]")
    device = require_cuda(x=x, w=w, expert_offsets=expert_offsets)
    n, k = x.shape
    e, nout, _ = w.shape
    out = torch.empty(n, nout, dtype=x.dtype, device=device)
    if n == 0:
        return out
    cfg = config or pick_config(n, e, swiglu=False)
    require(k % cfg["bk"] == 0 and nout % cfg["bn"] == 0, f"K={k} / Nout={nout} must divide the tile {cfg}")
    dummy = torch.empty(1, dtype=torch.int32, device=device)
    slots = _slots(expert_offsets.contiguous(), e, n, cfg["bm"])
    _grouped_kernel(e, k, nout, cfg, False, False, x.dtype)(x.contiguous(), w.contiguous(), slots, dummy, out)
    return out


def precompile_specs(kind: str, rows: int, num_experts: int, k: int, nout: int, topk: int = 6,
                     config: dict | None = None, dtype: torch.dtype = torch.bfloat16,
                     off_dtype: str = "int64") -> list[tuple[str, tuple]]:
    """(function, args) of the kernels one call needs. kind "gemm": grouped_expert_gemm(x [rows, k],
    w [E, nout, k]); kind "routed": routed_experts with hidden k, expert width nout, tokens rows."""
    if kind == "gemm":
        cfg = config or pick_config(rows, num_experts, swiglu=False)
        return [("_slots_kernel", (num_experts, cfg["bm"], off_dtype)),
                ("_grouped_kernel", (num_experts, k, nout, cfg, False, False, dtype))]
    n = rows * topk
    cfg1 = config or pick_config(n, num_experts, swiglu=True, k=k)
    cfg2 = pick_config(n, num_experts, swiglu=False)
    first = (("_permute_kernel", (num_experts, topk, cfg1["bm"])) if n <= PERMUTE_KERNEL_MAX_ROWS
             else ("_slots_kernel", (num_experts, cfg1["bm"], "int32")))
    specs = [first,
             ("_grouped_kernel", (num_experts, k, nout, cfg1, True, True, dtype)),
             ("_grouped_kernel", (num_experts, nout, k, cfg2, False, False, dtype)),
             ("_combine_kernel", (topk, k, dtype))]
    if cfg2["bm"] != cfg1["bm"]:
        specs.append(("_slots_kernel", (num_experts, cfg2["bm"], "int32")))
    return specs


def permute_by_expert(ids: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Same as ``ops.moe.permute_by_expert``: (order [T*k] int64 stable by expert, offsets [E+1])."""
    flat = ids.reshape(-1).long()
    order = torch.sort(flat, stable=True).indices
    counts = torch.bincount(flat, minlength=num_experts)
    offsets = torch.zeros(num_experts + 1, dtype=torch.long, device=ids.device)
    offsets[1:] = torch.cumsum(counts, 0)
    return order, offsets


def routed_experts_tilelang(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor,
                            w13: torch.Tensor, w2: torch.Tensor, *, gate_up_config: dict | None = None,
                            down_config: dict | None = None) -> torch.Tensor:
    """x [T, H], weights [T, k], ids [T, k], w13 [E, 2I, H], w2 [E, H, I] -> [T, H]; like
    ``routed_experts_ref``."""
    require(x.dim() == 2 and x.dtype in _DT, "x: bf16/fp16 [T, H]")
    t, h = x.shape
    require(ids.dim() == 2 and ids.shape[0] == t and weights.shape == ids.shape, "ids/weights: [T, k]")
    e, two_i, hh = w13.shape
    inter = two_i // 2
    require(hh == h and w2.shape == (e, h, inter) and w13.dtype == x.dtype and w2.dtype == x.dtype,
            "w13 [E, 2I, H] / w2 [E, H, I] of x's dtype expected")
    device = require_cuda(x=x, weights=weights, ids=ids, w13=w13, w2=w2)
    topk = ids.shape[1]
    out = torch.empty(t, h, dtype=x.dtype, device=device)
    if t == 0:
        return out
    n = t * topk
    if batch_invariant_enabled():   # the same tiles (so the same K blocking) at every token count
        gate_up_config, down_config = gate_up_config or DECODE, down_config or DECODE
    cfg1 = gate_up_config or pick_config(n, e, swiglu=True, k=h)
    cfg2 = down_config or pick_config(n, e, swiglu=False)
    require(h % cfg1["bk"] == 0 and inter % cfg1["bn"] == 0 and inter % cfg2["bk"] == 0 and h % cfg2["bn"] == 0,
            f"H={h} / I={inter} must divide the tiles")
    if n <= PERMUTE_KERNEL_MAX_ROWS:
        # one kernel instead of sort / bincount / cumsum / scatter (decode latency)
        token_of = torch.empty(n, dtype=torch.int32, device=device)
        inv = torch.empty(n, dtype=torch.int32, device=device)
        offsets = torch.empty(e + 1, dtype=torch.int32, device=device)
        slots1 = torch.empty(3, (n + cfg1["bm"] - 1) // cfg1["bm"] + e, dtype=torch.int32, device=device)
        _permute_kernel(e, topk, cfg1["bm"])(ids.to(torch.int32).reshape(-1).contiguous(), token_of, inv, offsets,
                                             slots1)
    else:
        order, offsets = permute_by_expert(ids, e)
        offsets = offsets.to(torch.int32)
        token_of = (order // topk).to(torch.int32)
        inv = torch.empty(n, dtype=torch.int32, device=device)
        inv[order] = torch.arange(n, dtype=torch.int32, device=device)
        slots1 = _slots(offsets, e, n, cfg1["bm"])
    act = torch.empty(n, inter, dtype=x.dtype, device=device)
    _grouped_kernel(e, h, inter, cfg1, True, True, x.dtype)(x.contiguous(), w13.contiguous(), slots1, token_of, act)
    y = torch.empty(n, h, dtype=x.dtype, device=device)
    dummy = torch.empty(1, dtype=torch.int32, device=device)
    slots2 = slots1 if cfg2["bm"] == cfg1["bm"] else _slots(offsets, e, n, cfg2["bm"])
    _grouped_kernel(e, inter, h, cfg2, False, False, x.dtype)(act, w2.contiguous(), slots2, dummy, y)
    _combine_kernel(topk, h, x.dtype)(y, weights.float().contiguous(), inv, out)
    return out
