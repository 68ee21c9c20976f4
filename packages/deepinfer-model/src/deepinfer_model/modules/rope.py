"""Rotary position embedding on the last `dr` dims (half-split layout, computed in float32).

`x[..., :dr/2]` and `x[..., dr/2:]` are the two halves of each rotated pair; the frequency of
pair i is `theta^(-2i/dr)`.
"""

from __future__ import annotations

import torch


def apply_rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """x [N, ..., dr], positions [N] -> same shape as x."""
    dr = x.shape[-1]
    half = dr // 2
    inv = theta ** (-torch.arange(half, device=x.device, dtype=torch.float32) * 2 / dr)   # [half]
    ang = positions.to(torch.float32).unsqueeze(-1) * inv                               # [N, half]
    shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (half,)
    cos, sin = ang.cos().reshape(shape), ang.sin().reshape(shape)
    xf = x.float()
    x1, x2 = xf[..., :half], xf[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)
