"""RMSNorm, computed in float32."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from deepinfer_kernels.batch_invariant import batch_invariant_enabled


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., dim] -> [..., dim]
        return rms_norm(x, self.weight, self.eps)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., dim], weight broadcastable to x (several norms at once: [K, 1, dim] against x [K, N, dim])
    -> x's dtype, computed in float32.

    On CUDA with one weight vector: torch's fused RMSNorm kernel, one launch instead of five
    (not in batch-invariant mode, whose last-dim reductions run on fixed row tiles). For x and
    weight of one dtype it reads them as they are and computes in float32 inside (no cast kernels);
    otherwise both are cast to float32 first."""
    if x.is_cuda and weight.dim() == 1 and not batch_invariant_enabled():
        if x.dtype == weight.dtype:
            return F.rms_norm(x, (x.shape[-1],), weight, eps)
        return F.rms_norm(x.float(), (x.shape[-1],), weight.float(), eps).to(x.dtype)
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * weight.float()).to(x.dtype)
