"""One-row linear layer ``y [1, N] = x [1, K] . W [N, K]^T`` (TileLang, SM90): a batch-1 decode
step's projections.

cuBLAS gives a one-row GEMM tiles of 8 x 64 or 64 x 8 outputs (some with a split-K reduce kernel
after them) and takes 4.5-7.3 us per projection of a `mini` batch-1 step on the H200 whatever its
weight bytes (0.8-17 MB: 0.2-4 us at copy bandwidth). Here each CTA streams ``bn`` rows of W
through a software pipeline of ``bk``-wide stages (16 KB each), multiplies them by x on CUDA cores in
float32 and reduces over K; the tiles are picked so that the grid has >= 2 CTAs per SM.
Same values as ``F.linear`` up to float32 summation order (rounded to x's dtype once).
"""

import torch

from deepinfer_kernels.tilelang._common import PDL, compile_cached, pdl_sync, require, require_cuda

# No `from __future__ import annotations` (TileLang evaluates prim_func annotations).

NT = 128
STAGE_ELEMENTS = 8192     # bn * bk: one pipeline stage of W is 16 KB of bf16
MIN_CTAS = 264            # two per SM of the H200
STAGES = 4
_DT = {torch.bfloat16: "bfloat16", torch.float16: "float16"}


def pick_tiles(n: int, k: int) -> tuple[int, int] | None:
    """(bn, bk) for W [n, k], or None when no tile divides it (the caller uses cuBLAS)."""
    bk = next((b for b in (2048, 1024, 512, 256, 128, 64) if k % b == 0), 0)
    if not bk:
        return None
    bn = STAGE_ELEMENTS // bk
    while bn > 4 and (n % bn or n // bn < MIN_CTAS):
        bn //= 2
    return (bn, bk) if n % bn == 0 else None


def _build(n: int, k: int, bn: int, bk: int, stages: int, dtype: str):
    import tilelang.language as T

    @T.prim_func
    def main(
        X: T.Tensor((1, k), dtype),
        W: T.Tensor((n, k), dtype),
        Y: T.Tensor((1, n), dtype),
    ):
        with T.Kernel(n // bn, threads=NT) as bx:
            if PDL:   # wait for the previous kernel before touching memory (_common.PDL)
                T.evaluate(pdl_sync())
            x_s = T.alloc_shared((1, bk), dtype)
            w_s = T.alloc_shared((bn, bk), dtype)
            acc = T.alloc_fragment((bn, bk), T.float32)
            y = T.alloc_fragment((bn,), T.float32)
            T.clear(acc)
            for ko in T.Pipelined(k // bk, num_stages=stages):
                T.copy(X[0:1, ko * bk:(ko + 1) * bk], x_s)
                T.copy(W[bx * bn:(bx + 1) * bn, ko * bk:(ko + 1) * bk], w_s)
                for i, j in T.Parallel(bn, bk):
                    acc[i, j] += T.cast(w_s[i, j], T.float32) * T.cast(x_s[0, j], T.float32)
            T.reduce_sum(acc, y, dim=1)
            for i in T.Parallel(bn):
                Y[0, bx * bn + i] = T.cast(y[i], dtype)

    return main


def _kernel(n: int, k: int, dtype: torch.dtype):
    tiles = pick_tiles(n, k)
    require(tiles is not None, f"W [{n}, {k}]: no matrix-vector tile divides it")
    bn, bk = tiles
    # a software pipeline of 128 threads, not TileLang's producer / consumer warpgroups: their
    # register split (240 + 24 per thread) leaves room for one CTA per SM, too few bytes in flight
    return compile_cached("matvec", (n, k, bn, bk, STAGES, _DT[dtype]),
                          lambda: _build(n, k, bn, bk, STAGES, _DT[dtype]),
                          pass_configs={"tl.disable_warp_specialized": True})


def matvec_tilelang(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [..., K] holding one row, weight [N, K] -> [..., N] (x's dtype); like ``F.linear(x, weight)``.
    bf16 / fp16, contiguous operands, tiles from ``pick_tiles``."""
    require(x.dtype in _DT and weight.dtype == x.dtype, f"x / weight: bf16 or fp16 of one dtype, got {x.dtype} / "
            f"{weight.dtype}")
    require(weight.dim() == 2 and x.shape[-1] == weight.shape[1] and x.numel() == weight.shape[1],
            f"x [..., K] of one row and weight [N, K] expected, got {tuple(x.shape)} / {tuple(weight.shape)}")
    require(x.is_contiguous() and weight.is_contiguous(), "x / weight: contiguous")
    require_cuda(x=x, weight=weight)
    n, k = weight.shape
    out = torch.empty(*x.shape[:-1], n, dtype=x.dtype, device=x.device)
    _kernel(n, k, x.dtype)(x.view(1, k), weight, out.view(1, n))
    return out
