"""RMSNorm, computed in float32."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from deepinfer_kernels.batch_invariant import batch_invariant_enabled
from deepinfer_kernels.ops.linear import linear, rms_norm_linear
from deepinfer_kernels.ops.norm import add_rms_norm
from deepinfer_kernels.ops.norm import rms_norm as mixed_dtype_rms_norm


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., dim] -> [..., dim]
        return rms_norm(x, self.weight, self.eps)

    def runs_kernels_op(self, x: torch.Tensor) -> bool:
        """Whether `self(x)` on these rows is the kernels package's mixed-dtype norm (CUDA, 2-D rows,
        a float32 weight against bf16 / fp16 rows, not batch-invariant): the ops that fuse the norm
        with its neighbours (`add_forward`, `linear`) compute exactly that norm."""
        return (x.is_cuda and x.dim() == 2 and self.weight.dim() == 1 and x.dtype != self.weight.dtype
                and not batch_invariant_enabled())

    def add_forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(s = x + residual, self(s)): one launch on CUDA for bf16 rows with the float32 weight,
        the add then `forward` elsewhere (the same values)."""
        if self.runs_kernels_op(x):
            return add_rms_norm(x, residual, self.weight, self.eps)
        s = x + residual
        return s, self(s)

    def linear(self, x: torch.Tensor, weight: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
        """`linear(self(x), weight, out_dtype)` (weight [N, dim]; ``out_dtype=torch.float32``: the
        projection's values widened, the logits): for one row where `runs_kernels_op`, one launch on
        SM90 (`rms_norm_linear`: the norm in the matrix-vector kernel's prologue, the same values);
        the two ops elsewhere."""
        if self.runs_kernels_op(x) and not torch.is_grad_enabled():
            return rms_norm_linear(x, self.weight, self.eps, weight, out_dtype=out_dtype).y
        return linear(self(x), weight, out_dtype)

    def add_linear(self, x: torch.Tensor, residual: torch.Tensor,
                   weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(s, u, y) = (x + residual, self(s), linear(u, weight)): for one row where `runs_kernels_op`,
        one launch on SM90 (`rms_norm_linear` with the residual, u written beside y); `add_forward`
        then the projection elsewhere (the same values)."""
        if self.runs_kernels_op(x) and not torch.is_grad_enabled():
            p = rms_norm_linear(x, self.weight, self.eps, weight, residual=residual, return_normed=True)
            return p.s, p.u, p.y
        s, u = self.add_forward(x, residual)
        return s, u, linear(u, weight)


class NormedRows:
    """Rows x [N, dim] and the RMSNorm before their projections (a layer's q latent: q_b and the
    indexer's query both read RMSNorm(x)). For one row where the norm is the kernels package's
    (`RMSNorm.runs_kernels_op`), each projection normalises x in its own launch (`RMSNorm.linear`)
    and the normed rows are not made; otherwise they are made once, here, before any side stream
    that projects them forks (every projection then reads that one tensor)."""

    def __init__(self, x: torch.Tensor, norm: RMSNorm):
        self.x, self.norm = x, norm
        self.per_projection = x.dim() == 2 and x.shape[0] == 1 and norm.runs_kernels_op(x) and not torch.is_grad_enabled()
        self.value = None if self.per_projection else norm(x)

    def normed(self) -> torch.Tensor:
        """RMSNorm(x) [N, dim] (made here when the projections norm their own rows)."""
        return self.norm(self.x) if self.value is None else self.value

    def project(self, weight: torch.Tensor) -> torch.Tensor:
        """linear(RMSNorm(x), weight) [N, out] (weight [out, dim])."""
        return self.norm.linear(self.x, weight) if self.per_projection else linear(self.value, weight)


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
