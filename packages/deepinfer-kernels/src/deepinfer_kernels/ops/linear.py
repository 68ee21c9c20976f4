"""Bias-free linear layer ``y = x . W^T``: ``F.linear``, except a single row on SM90.

A batch-1 decode step multiplies one row by each projection's weight; cuBLAS takes 4.5-7.3 us per
such GEMM on the H200 whatever the weight's size (H200, 2026-12-01; docs/benchmarks.md). On SM90, bf16 /
fp16, one row and a weight ``matvec_serves`` go to the TileLang matrix-vector
kernel (``deepinfer_kernels.tilelang.matvec``; same values up to float32 summation order).
Everything else, and batch-invariant mode, autograd, ``torch.compile`` and ``DEEPINFER_MATVEC=0``
(read once per process), runs ``F.linear``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from deepinfer_kernels.batch_invariant import batch_invariant_enabled
from deepinfer_kernels.envs import MATVEC_ENV, env_flag
from deepinfer_kernels.layouts import NormedProjection  # noqa: F401  (rms_norm_linear's result, re-exported)
from deepinfer_kernels.platform import tilelang_launcher
from deepinfer_kernels.tilelang.matvec import pick_tiles, serves_out_dtype

MATVEC_ENABLED = env_flag(MATVEC_ENV, True)   # read once per process
MATVEC_MAX_WEIGHT_BYTES = 32 << 20   # every tileable weight up to this size
MATVEC_LARGE_MIN_STEPS = 3           # larger weights: only with >= this many pipeline steps per CTA


def matvec_serves(n: int, k: int, weight_bytes: int) -> bool:
    """Whether W [n, k] goes to the matrix-vector kernel: tiles divide it, and it is at most
    ``MATVEC_MAX_WEIGHT_BYTES`` or its CTAs each stream >= ``MATVEC_LARGE_MIN_STEPS`` pipeline steps
    of K on the tiles the kernel runs (``pick_tiles``, one-wave). H200, 2026-12-02, in a graph, L2
    flushed, median of 10, matvec (one-wave tiles) vs cuBLAS: `mini`'s lm_head [32000, 1024] 38.2 vs
    49.8 us, flash's q_b [32768, 1024] 39.4 vs 46.1, o_proj [3072, 32768] 71.2 vs 86.9, dense gate/up
    [53760, 3072] 100.8 vs 118.6, lm_head [129280, 3072] 197.8 vs 228.8. On the tiles before the
    one-wave rule a K = 1024 CTA streamed its whole K in one step and cuBLAS won (q_b 30.3 vs 24.9 us,
    H200, 2026-12-02): those weights now stream 16 steps of 64."""
    tiles = pick_tiles(n, k)
    return tiles is not None and (weight_bytes <= MATVEC_MAX_WEIGHT_BYTES or k // tiles[1] >= MATVEC_LARGE_MIN_STEPS)


def linear_ref(x: torch.Tensor, weight: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """x [..., K], weight [N, K] -> [..., N] in x's dtype, then converted to ``out_dtype`` if given."""
    y = F.linear(x, weight)
    return y if out_dtype is None or out_dtype == y.dtype else y.to(out_dtype)


def _one_row_kernel(x: torch.Tensor, weight: torch.Tensor):
    """The matrix-vector launcher when this call is one it serves, else None."""
    if not (MATVEC_ENABLED and x.is_cuda and x.dtype in (torch.bfloat16, torch.float16)
            and weight.dtype == x.dtype and weight.dim() == 2 and x.numel() == x.shape[-1] == weight.shape[1]
            and x.is_contiguous() and weight.is_contiguous()):
        return None
    if batch_invariant_enabled() or (torch.is_grad_enabled() and (weight.requires_grad or x.requires_grad)):
        return None
    return tilelang_launcher("linear", x.device,
                             supported=matvec_serves(*weight.shape, weight.numel() * weight.element_size()))


def linear(x: torch.Tensor, weight: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """x [..., K], weight [N, K] -> [..., N] in x's dtype (``F.linear`` without a bias); with
    ``out_dtype=torch.float32`` those values widened (``.float()``), in the kernel's store where the
    matrix-vector kernel serves the call (the logits: one launch fewer)."""
    kernel = _one_row_kernel(x, weight)
    if kernel is not None and serves_out_dtype(x.dtype, out_dtype):
        return kernel(x, weight, out_dtype)
    return linear_ref(x, weight, out_dtype)


def rms_norm_linear_ref(x: torch.Tensor, norm_weight: torch.Tensor, eps: float, weight: torch.Tensor,
                        residual: torch.Tensor | None = None, return_normed: bool = False,
                        out_dtype: torch.dtype | None = None) -> NormedProjection:
    """x [..., K] (+ residual) -> linear(rms_norm(s, norm_weight, eps), weight, out_dtype) with s = x,
    or `x + residual` in x's dtype: each op as its public self."""
    from deepinfer_kernels.ops.norm import add_rms_norm, rms_norm

    if residual is None:
        s, u = None, rms_norm(x, norm_weight, eps)
    else:
        s, u = add_rms_norm(x, residual, norm_weight, eps)
    return NormedProjection(linear(u, weight, out_dtype), s, u if return_normed else None)


def rms_norm_linear(x: torch.Tensor, norm_weight: torch.Tensor, eps: float, weight: torch.Tensor,
                    residual: torch.Tensor | None = None, return_normed: bool = False,
                    out_dtype: torch.dtype | None = None) -> NormedProjection:
    """`rms_norm_linear_ref` (a layer's input norm and the projection after it; with `residual`, the
    residual add before the norm too) in one launch where the matrix-vector kernel serves the
    projection and the norm is the kernels package's (one bf16 / fp16 row, norm_weight float32 or
    x's dtype, K a multiple of 32 up to 8192): the norm runs in each CTA's prologue, bit-identical to
    the two kernels, while the CTA's first weight stages are in flight (s and, with `return_normed`,
    u are written by its first CTA). Elsewhere the two ops. ``out_dtype`` as in `linear` (the final
    norm + lm_head + ``.float()`` of a batch-1 step in one launch)."""
    d = x.shape[-1]
    fused = (_one_row_kernel(x, weight) is not None and norm_weight.dim() == 1 and norm_weight.shape[0] == d
             and norm_weight.dtype in (torch.float32, x.dtype) and norm_weight.device == x.device
             and d % 32 == 0 and 32 <= d <= 8192 and serves_out_dtype(x.dtype, out_dtype)
             and (residual is None or (residual.shape == x.shape and residual.dtype == x.dtype
                                       and residual.device == x.device and residual.is_contiguous())))
    kernel = tilelang_launcher("rms_norm_linear", x.device, supported=fused) if fused else None
    if kernel is not None:
        return kernel(x, norm_weight, eps, weight, residual, return_normed, out_dtype)
    return rms_norm_linear_ref(x, norm_weight, eps, weight, residual, return_normed, out_dtype)
