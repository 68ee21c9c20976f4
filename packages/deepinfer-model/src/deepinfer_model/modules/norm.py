"""RMSNorm, computed in float32."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from deepinfer_kernels.batch_invariant import batch_invariant_enabled
from deepinfer_kernels.ops.norm import add_rms_norm
from deepinfer_kernels.ops.norm import rms_norm as mixed_dtype_rms_norm


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., dim] -> [..., dim]
        return rms_norm(x, self.weight, self.eps)

    def add_forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(s = x + residual, self(s)): one launch on CUDA for bf16 rows with the float32 weight,
        the add then `forward` elsewhere (the same values)."""
        if (x.is_cuda and x.dim() == 2 and self.weight.dim() == 1 and x.dtype != self.weight.dtype
                and not batch_invariant_enabled()):
            return add_rms_norm(x, residual, self.weight, self.eps)
        s = x + residual
        return s, self(s)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., dim], weight broadcastable to x (several norms at once: [K, 1, dim] against x [K, N, dim])
    -> x's dtype, computed in float32.

    On CUDA with one weight vector (not in batch-invariant mode, whose last-dim reductions run on
    fixed row tiles), one launch instead of five: for x and weight of one dtype torch's fused
    RMSNorm, which computes in float32 inside; for bf16 x with the float32 weights the models keep,
    the kernels package's mixed-dtype norm (a TileLang kernel on SM90; torch's norm with casts
    elsewhere)."""
    if x.is_cuda and weight.dim() == 1 and not batch_invariant_enabled():
        if x.dtype == weight.dtype:
            return F.rms_norm(x, (x.shape[-1],), weight, eps)
        return mixed_dtype_rms_norm(x, weight, eps)
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * weight.float()).to(x.dtype)
