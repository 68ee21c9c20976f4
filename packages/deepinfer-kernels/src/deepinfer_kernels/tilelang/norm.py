"""RMSNorm in one launch (TileLang, SM90): bf16 / fp16 rows, float32 (or same-dtype) weight.

Same function as ``deepinfer_kernels.ops.norm.rms_norm_ref``: ``y = (x * rsqrt(mean(x^2) + eps)) * w``
in float32, rounded to x's dtype. One warp per row: lane l holds elements l, l + 32, ... (coalesced
loads), sums their squares, and a butterfly of shuffles gives every lane the row's sum. Rows of
WIDE_ROW or more values get a whole CTA (4 warps, their sums added through shared memory): one
warp walking a 3,072-wide row took 6.3 us per call at batch 1 (add variant, H200). Its float32
summation order differs from torch's mean, so results agree with the reference to rounding, not
bit for bit (like torch's own fused CUDA norm).
"""

import torch

from deepinfer_kernels.tilelang._common import PDL, compile_cached, pdl_sync, require, require_cuda

# No `from __future__ import annotations` (TileLang evaluates prim_func annotations).

NT = 128              # threads per CTA: 4 warps, one row each (narrow rows) or one row in all
WIDE_ROW = 2048       # from this width (a multiple of NT) a row gets the whole CTA
_DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}


def threads_per_row(d: int) -> int:
    """Threads that share one row of d values: a warp, or the whole CTA from WIDE_ROW."""
    return NT if d >= WIDE_ROW and d % NT == 0 else 32


def row_rstd_macro(T, d: int, eps: float):
    """A ``T.macro`` ``row_rstd(xv, rstd)``: rsqrt(mean of squares + eps) of one row whose values lane
    l of the row's ``threads_per_row(d)`` threads holds in ``xv`` (l, l + tpr, ...; float32), into
    ``rstd[0]`` on every thread of the row. The one summation order of this module's norm, which the
    kernels that normalise a row themselves (``matvec.py``'s prologue) share: per lane in order, a
    butterfly of shuffles within each warp, the warps' sums in warp order through shared memory."""
    tpr = threads_per_row(d)
    wpr, per_lane = tpr // 32, d // tpr

    @T.macro
    def row_rstd(xv, rstd):
        tx = T.get_thread_binding()
        total = T.alloc_var(T.float32)
        total = 0.0
        for k in T.serial(per_lane):
            total = total + xv[k] * xv[k]
        total = total + T.shfl_xor(total, 16)   # butterfly: every lane ends with its warp's sum
        total = total + T.shfl_xor(total, 8)
        total = total + T.shfl_xor(total, 4)
        total = total + T.shfl_xor(total, 2)
        total = total + T.shfl_xor(total, 1)
        if wpr > 1:                             # a row over several warps: their sums, in warp order
            part = T.alloc_shared((wpr,), T.float32)
            if tx % 32 == 0:
                part[tx // 32] = total
            T.sync_threads()
            total = part[0]
            for w in T.serial(wpr - 1):
                total = total + part[w + 1]
        rstd[0] = T.rsqrt(total / T.float32(d) + T.float32(eps))

    return row_rstd


def _build(d: int, x_dtype: str, w_dtype: str, eps: float, add: bool = False):
    """``add``: the row is ``X + Res`` rounded to x's dtype (torch's add), written to ``Sum`` and
    normalised; otherwise ``Res`` / ``Sum`` are not touched (the launcher passes X / Y)."""
    import tilelang.language as T

    TPR = threads_per_row(d)
    ROWS_PER_CTA = NT // TPR
    PER_LANE = d // TPR
    N = T.dynamic("N")
    SX = T.dynamic("SX")                # row stride of X: a column slice of a wider output reads in place
    row_rstd = row_rstd_macro(T, d, eps)

    @T.prim_func
    def main(
        X: T.StridedTensor((N, d), (SX, 1), x_dtype),
        W: T.Tensor((d,), w_dtype),
        Y: T.Tensor((N, d), x_dtype),
        Res: T.Tensor((N, d), x_dtype),
        Sum: T.Tensor((N, d), x_dtype),
    ):
        with T.Kernel(T.ceildiv(N, ROWS_PER_CTA), threads=NT) as bx:
            if PDL:   # wait for the previous kernel before touching memory (_common.PDL)
                T.evaluate(pdl_sync())
            tx = T.get_thread_binding()
            lane = tx % TPR                         # the thread's place in its row
            row = bx * ROWS_PER_CTA + tx // TPR
            xv = T.alloc_local((PER_LANE,), T.float32)
            rstd = T.alloc_local((1,), T.float32)
            safe_row = T.min(row, N - 1)
            for k in T.serial(PER_LANE):
                if add:
                    xv[k] = T.cast(T.cast(T.cast(X[safe_row, lane + TPR * k], T.float32)
                                          + T.cast(Res[safe_row, lane + TPR * k], T.float32), x_dtype), T.float32)
                else:
                    xv[k] = T.cast(X[safe_row, lane + TPR * k], T.float32)
            row_rstd(xv, rstd)
            if row < N:
                for k in T.serial(PER_LANE):
                    Y[row, lane + TPR * k] = T.cast(xv[k] * rstd[0] * T.cast(W[lane + TPR * k], T.float32), x_dtype)
                    if add:
                        Sum[row, lane + TPR * k] = T.cast(xv[k], x_dtype)

    return main


def _kernel(d: int, x_dtype: torch.dtype, w_dtype: torch.dtype, eps: float, add: bool = False):
    key = (d, _DTYPES[x_dtype], _DTYPES[w_dtype], float(eps), "strided", add, WIDE_ROW)
    return compile_cached("rms_norm", key, lambda: _build(d, _DTYPES[x_dtype], _DTYPES[w_dtype], float(eps), add))


def rms_norm_tilelang(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., D] bf16 / fp16, weight [D] float32 or x's dtype -> x's dtype; like ``rms_norm_ref``.
    D a multiple of 32 (one warp per row, D / 32 values per lane), at most 8192. A 2-D x whose rows
    are contiguous (a column slice of a fused projection's output) is read in place, not copied."""
    require(x.dtype in (torch.bfloat16, torch.float16), f"x: bf16 or fp16, got {x.dtype}")
    require(weight.dim() == 1 and weight.dtype in (torch.float32, x.dtype), "weight: [D], float32 or x's dtype")
    d = x.shape[-1]
    require(weight.shape[0] == d and d % 32 == 0 and 32 <= d <= 8192, f"D={d}: a multiple of 32 in [32, 8192]")
    require_cuda(x=x, weight=weight)
    rows = x if x.dim() == 2 and x.stride(1) == 1 else x.reshape(-1, d).contiguous()
    out = torch.empty(rows.shape, dtype=x.dtype, device=x.device)
    if rows.shape[0]:
        _kernel(d, x.dtype, weight.dtype, eps)(rows, weight.contiguous(), out, out, out)
    return out.view(x.shape)


def add_rms_norm_tilelang(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                          eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """x, residual [N, D] bf16 / fp16 -> (s = x + residual in x's dtype, rms_norm(s)); like
    ``add_rms_norm_ref`` (the same roundings as torch's add followed by ``rms_norm_tilelang``)."""
    require(x.dtype in (torch.bfloat16, torch.float16) and residual.dtype == x.dtype and residual.shape == x.shape
            and x.dim() == 2, f"x, residual: [N, D] of one dtype, bf16 or fp16, got {x.dtype} {tuple(x.shape)} / "
            f"{residual.dtype} {tuple(residual.shape)}")
    require(weight.dim() == 1 and weight.dtype in (torch.float32, x.dtype), "weight: [D], float32 or x's dtype")
    d = x.shape[-1]
    require(weight.shape[0] == d and d % 32 == 0 and 32 <= d <= 8192, f"D={d}: a multiple of 32 in [32, 8192]")
    require_cuda(x=x, residual=residual, weight=weight)
    rows = x if x.stride(1) == 1 else x.contiguous()
    s = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if x.shape[0]:
        _kernel(d, x.dtype, weight.dtype, eps, True)(rows, weight.contiguous(), y, residual.contiguous(), s)
    return s, y
