"""One-row linear layer ``y [1, N] = x [1, K] . W [N, K]^T`` (TileLang, SM90): a batch-1 decode
step's projections.

cuBLAS gives a one-row GEMM tiles of 8 x 64 or 64 x 8 outputs (some with a split-K reduce kernel
after them) and takes 4.5-7.3 us per projection of a `mini` batch-1 step on the H200 whatever its
weight bytes (0.8-17 MB: 0.2-4 us at copy bandwidth). Here each CTA streams ``bn`` rows of W
through a software pipeline of ``bk``-wide stages (16 KB each), multiplies them by x on CUDA cores in
float32 and reduces over K; the tiles are picked so that the grid has >= 2 CTAs per SM and, where
that would take several waves of short-lived CTAs, so that it is one resident wave of CTAs with
longer pipelines (``pick_tiles``).
Same values as ``F.linear`` up to float32 summation order (rounded to x's dtype once).
"""

import torch

from deepinfer_kernels.layouts import NormedProjection
from deepinfer_kernels.tilelang._common import PDL, compile_cached, pdl_sync, require, require_cuda

# No `from __future__ import annotations` (TileLang evaluates prim_func annotations).

NT = 128
STAGE_ELEMENTS = 8192     # bn * bk: one pipeline stage of W is 16 KB of bf16
MIN_CTAS = 264            # two per SM of the H200
STAGES = 4
RESIDENT_CTAS = 396       # three per SM: a CTA holds STAGES x 16 KB of W (+ x) in shared memory
ONE_WAVE_MIN_BK = 64      # one-wave tiles keep >= 128-byte row segments (whole L2 lines) per stage
_DT = {torch.bfloat16: "bfloat16", torch.float16: "float16"}
_NORM_DT = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def pick_tiles(n: int, k: int, one_wave: bool = True) -> tuple[int, int] | None:
    """(bn, bk) for W [n, k], or None when no tile divides it (the caller uses cuBLAS).

    First the widest K stage that divides k (up to 2,048) and as many rows per CTA as keep >= 2 CTAs
    per SM. Where that grid is more than one resident wave (``RESIDENT_CTAS``), each CTA lives for
    only a few pipeline steps and the launch ends on a part-empty last wave; with ``one_wave``,
    rows per CTA double (the stage narrows, >= ``ONE_WAVE_MIN_BK``) until the grid fits one wave, if
    it can: flash's MoE input [8064, 3072] 1,008 CTAs x 3 steps -> 252 x 12, its indexer query
    [8192, 1024] 1,024 x 1 -> 256 x 4, q_b [32768, 1024] 4,096 x 1 -> 256 x 16. Weights too tall for
    one wave (flash's lm_head) keep the first tiles."""
    bk = next((b for b in (2048, 1024, 512, 256, 128, 64) if k % b == 0), 0)
    if not bk:
        return None
    bn = STAGE_ELEMENTS // bk
    while bn > 4 and (n % bn or n // bn < MIN_CTAS):
        bn //= 2
    if n % bn:
        return None
    if one_wave and n // bn > RESIDENT_CTAS:
        wide = bn
        while (n // wide > RESIDENT_CTAS and n % (2 * wide) == 0 and STAGE_ELEMENTS // (2 * wide) >= ONE_WAVE_MIN_BK
               and k % (STAGE_ELEMENTS // (2 * wide)) == 0):
            wide *= 2
        if n // wide <= RESIDENT_CTAS:
            return wide, STAGE_ELEMENTS // wide
    return bn, bk


def _build(n: int, k: int, bn: int, bk: int, stages: int, dtype: str, norm: tuple | None = None,
           out_dtype: str | None = None):
    """``norm`` = (weight dtype, eps, add, write_u): the row is first RMS-normalised (``add``: ``X + Res``
    rounded to the dtype first, written to ``Sum`` by CTA 0), exactly as ``norm.py``'s kernel does it
    (its lane layout and summation order, ``(x * rstd) * w`` rounded to the dtype), into shared
    memory (``write_u``: also to ``U``, by CTA 0), then multiplied: the same values as that norm
    kernel followed by this one, in one launch. ``out_dtype`` "float32": Y holds each output rounded
    to the dtype, then widened (the values of the dtype's output followed by ``.float()``)."""
    import tilelang.language as T

    from deepinfer_kernels.tilelang.norm import row_rstd_macro, threads_per_row

    w_dtype, eps, add, write_u = norm if norm is not None else ("float32", 0.0, False, False)
    y_dtype = out_dtype or dtype
    TPR = threads_per_row(k)            # norm.py's layout of a row over threads
    PER_LANE = k // TPR
    row_rstd = row_rstd_macro(T, k, eps)

    @T.macro
    def normed_row(X, NormW, Res, Sum, U, u_s, bx):
        """u_s <- rms_norm(X (+ Res)), norm.py's values (each row's worth of threads computes the sum)."""
        tx = T.get_thread_binding()
        lane = tx % TPR
        xv = T.alloc_local((PER_LANE,), T.float32)
        rstd = T.alloc_local((1,), T.float32)
        for kk in T.serial(PER_LANE):
            if add:
                xv[kk] = T.cast(T.cast(T.cast(X[0, lane + TPR * kk], T.float32)
                                       + T.cast(Res[0, lane + TPR * kk], T.float32), dtype), T.float32)
            else:
                xv[kk] = T.cast(X[0, lane + TPR * kk], T.float32)
        row_rstd(xv, rstd)
        if tx < TPR:   # one row's worth of threads writes it (with 32 per row, the other warps agree)
            for kk in T.serial(PER_LANE):
                u_s[0, lane + TPR * kk] = T.cast(xv[kk] * rstd[0] * T.cast(NormW[lane + TPR * kk], T.float32), dtype)
                if bx == 0:
                    if add:
                        Sum[0, lane + TPR * kk] = T.cast(xv[kk], dtype)
                    if write_u:
                        U[0, lane + TPR * kk] = u_s[0, lane + TPR * kk]
        T.sync_threads()

    @T.macro
    def body(X, W, Y, NormW, Res, Sum, U):
        # Y <- x . W^T, W streaming through the pipeline; x in shared memory: a stage of X at a
        # time, or with ``norm`` the whole normed row (the norm operands are None without it)
        with T.Kernel(n // bn, threads=NT) as bx:
            if PDL:   # wait for the previous kernel before touching memory (_common.PDL)
                T.evaluate(pdl_sync())
            if norm is None:
                x_s = T.alloc_shared((1, bk), dtype)
            else:
                u_s = T.alloc_shared((1, k), dtype)
            w_s = T.alloc_shared((bn, bk), dtype)
            acc = T.alloc_fragment((bn, bk), T.float32)
            y = T.alloc_fragment((bn,), T.float32)
            T.clear(acc)
            for ko in T.Pipelined(k // bk, num_stages=stages):
                if norm is None:
                    T.copy(X[0:1, ko * bk:(ko + 1) * bk], x_s)
                    T.copy(W[bx * bn:(bx + 1) * bn, ko * bk:(ko + 1) * bk], w_s)
                    for i, j in T.Parallel(bn, bk):
                        acc[i, j] += T.cast(w_s[i, j], T.float32) * T.cast(x_s[0, j], T.float32)
                else:
                    T.copy(W[bx * bn:(bx + 1) * bn, ko * bk:(ko + 1) * bk], w_s)
                    if ko == 0:   # while the first stages of W are in flight
                        normed_row(X, NormW, Res, Sum, U, u_s, bx)
                    for i, j in T.Parallel(bn, bk):
                        acc[i, j] += T.cast(w_s[i, j], T.float32) * T.cast(u_s[0, ko * bk + j], T.float32)
            T.reduce_sum(acc, y, dim=1)
            for i in T.Parallel(bn):
                Y[0, bx * bn + i] = T.cast(T.cast(y[i], dtype), y_dtype)

    if norm is None:
        @T.prim_func
        def main(
            X: T.Tensor((1, k), dtype),
            W: T.Tensor((n, k), dtype),
            Y: T.Tensor((1, n), y_dtype),
        ):
            body(X, W, Y, None, None, None, None)
    else:
        @T.prim_func
        def main(
            X: T.Tensor((1, k), dtype),
            W: T.Tensor((n, k), dtype),
            Y: T.Tensor((1, n), y_dtype),
            NormW: T.Tensor((k,), w_dtype),
            Res: T.Tensor((1, k), dtype),
            Sum: T.Tensor((1, k), dtype),
            U: T.Tensor((1, k), dtype),
        ):
            body(X, W, Y, NormW, Res, Sum, U)

    return main


def _kernel(n: int, k: int, dtype: torch.dtype, norm: tuple | None = None, one_wave: bool = True,
            out_float32: bool = False):
    tiles = pick_tiles(n, k, one_wave)
    require(tiles is not None, f"W [{n}, {k}]: no matrix-vector tile divides it")
    bn, bk = tiles
    # a software pipeline of 128 threads, not TileLang's producer / consumer warpgroups: their
    # register split (240 + 24 per thread) leaves room for one CTA per SM, too few bytes in flight
    out_dtype = "float32" if out_float32 else None
    key = (n, k, bn, bk, STAGES, _DT[dtype]) + (() if norm is None else ("norm",) + norm) + \
        (("out", out_dtype) if out_dtype else ())
    return compile_cached("matvec", key, lambda: _build(n, k, bn, bk, STAGES, _DT[dtype], norm, out_dtype),
                          pass_configs={"tl.disable_warp_specialized": True})


def _check(x: torch.Tensor, weight: torch.Tensor) -> None:
    require(x.dtype in _DT and weight.dtype == x.dtype, f"x / weight: bf16 or fp16 of one dtype, got {x.dtype} / "
            f"{weight.dtype}")
    require(weight.dim() == 2 and x.shape[-1] == weight.shape[1] and x.numel() == weight.shape[1],
            f"x [..., K] of one row and weight [N, K] expected, got {tuple(x.shape)} / {tuple(weight.shape)}")
    require(x.is_contiguous() and weight.is_contiguous(), "x / weight: contiguous")


def matvec_tilelang(x: torch.Tensor, weight: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """x [..., K] holding one row, weight [N, K] -> [..., N] (x's dtype); like ``F.linear(x, weight)``.
    bf16 / fp16, contiguous operands, tiles from ``pick_tiles``. ``out_dtype=torch.float32``: the
    same values widened in the store (``F.linear(x, weight).float()`` in one launch)."""
    _check(x, weight)
    _check_out_dtype(x, out_dtype)
    require_cuda(x=x, weight=weight)
    n, k = weight.shape
    out = torch.empty(*x.shape[:-1], n, dtype=out_dtype or x.dtype, device=x.device)
    _kernel(n, k, x.dtype, out_float32=_widens(x, out_dtype))(x.view(1, k), weight, out.view(1, n))
    return out


def serves_out_dtype(dtype: torch.dtype, out_dtype: torch.dtype | None) -> bool:
    """Whether the kernel stores ``out_dtype`` for rows of ``dtype``: their own dtype (None too) or
    float32 (the values widened in the store)."""
    return out_dtype in (None, dtype, torch.float32)


def _check_out_dtype(x: torch.Tensor, out_dtype: torch.dtype | None) -> None:
    require(serves_out_dtype(x.dtype, out_dtype), f"out_dtype: x's dtype or float32, got {out_dtype}")


def _widens(x: torch.Tensor, out_dtype: torch.dtype | None) -> bool:
    return out_dtype is not None and out_dtype != x.dtype


def rms_norm_matvec_tilelang(x: torch.Tensor, norm_weight: torch.Tensor, eps: float, weight: torch.Tensor,
                             residual: torch.Tensor | None = None, return_normed: bool = False,
                             out_dtype: torch.dtype | None = None):
    """``matvec_tilelang(rms_norm_tilelang(s, norm_weight, eps), weight)`` in one launch, bit for bit,
    with s = x, or ``x + residual`` rounded to x's dtype -> ``NormedProjection`` (y; s with a
    residual; the normed row u with ``return_normed``). x / residual one row [..., K], norm_weight
    [K] float32 or x's dtype, K a multiple of 32 up to 8192; ``out_dtype`` as in ``matvec_tilelang``."""
    _check(x, weight)
    _check_out_dtype(x, out_dtype)
    n, k = weight.shape
    require(norm_weight.dim() == 1 and norm_weight.shape[0] == k and norm_weight.dtype in (torch.float32, x.dtype),
            f"norm_weight: [{k}], float32 or x's dtype, got {norm_weight.dtype} {tuple(norm_weight.shape)}")
    require(k % 32 == 0 and 32 <= k <= 8192, f"K={k}: a multiple of 32 in [32, 8192] (the norm kernel's rows)")
    if residual is not None:
        require(residual.shape == x.shape and residual.dtype == x.dtype and residual.is_contiguous(),
                f"residual: contiguous {tuple(x.shape)} {x.dtype}, got {tuple(residual.shape)} {residual.dtype}")
    require_cuda(x=x, weight=weight, norm_weight=norm_weight, **({} if residual is None else {"residual": residual}))
    out = torch.empty(*x.shape[:-1], n, dtype=out_dtype or x.dtype, device=x.device)
    s = None if residual is None else torch.empty_like(x)
    u = torch.empty_like(x) if return_normed else None
    norm = (_NORM_DT[norm_weight.dtype], float(eps), residual is not None, return_normed)
    res = x if residual is None else residual
    kernel = _kernel(n, k, x.dtype, norm, out_float32=_widens(x, out_dtype))
    kernel(x.view(1, k), weight, out.view(1, n), norm_weight.contiguous(), res.view(1, k),
           (x if s is None else s).view(1, k), (x if u is None else u).view(1, k))
    return NormedProjection(out, s, u)
