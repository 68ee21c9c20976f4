"""Rotary position embedding on the last `dr` dims (half-split layout, computed in float32).

`x[..., :dr/2]` and `x[..., dr/2:]` are the two halves of each rotated pair; the frequency of
pair i is `theta^(-2i/dr)`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from deepinfer_kernels.ops.rope import rope_inplace


@dataclass(frozen=True)
class RopeTable:
    """cos / sin of the rotation angles of N positions, computed once and shared by every
    projection that rotates the same positions (the engine path: all layers of one step)."""

    cos: torch.Tensor         # [N, dr/2] float32
    sin: torch.Tensor         # [N, dr/2] float32
    dim: int                  # dr
    theta: float
    cos_full: torch.Tensor    # [N, dr] (cos, cos)
    sin_signed: torch.Tensor  # [N, dr] (-sin, sin)


def rope_table(positions: torch.Tensor, dim: int, theta: float) -> RopeTable:
    """positions [N] -> the table of `apply_rope(x [N, ..., dim], positions, theta)`."""
    # theta^(-2i/dim): (2i) / (-dim) is exactly -(2i) / dim (IEEE division is sign-symmetric),
    # in 3 kernels (arange of the even numbers, div, pow) instead of 5
    inv = theta ** (torch.arange(0, dim - 1, 2, device=positions.device, dtype=torch.float32) / -dim)   # [dim/2]
    ang = positions.to(torch.float32).unsqueeze(-1) * inv                                       # [N, half]
    cos, sin = ang.cos(), ang.sin()
    return RopeTable(cos, sin, dim, theta, torch.cat([cos, cos], dim=-1), torch.cat([-sin, sin], dim=-1))


def apply_rope(x: torch.Tensor, positions: torch.Tensor | RopeTable, theta: float) -> torch.Tensor:
    """x [N, ..., dr], positions [N] (or their `RopeTable`) -> same shape as x."""
    dr = x.shape[-1]
    half = dr // 2
    table = positions if isinstance(positions, RopeTable) else rope_table(positions, dr, theta)
    if table.dim != dr or table.theta != theta:
        raise ValueError(f"rope table for dim {table.dim}, theta {table.theta}; applied to dim {dr}, theta {theta}")
    shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (dr,)
    xf = x.float()
    # (x1 cos - x2 sin, x2 cos + x1 sin) as x * (cos, cos) + (x2, x1) * (-sin, sin): the same
    # products and sums (a - b == a + (-b) exactly), in 5 kernels instead of 8
    rotated = torch.cat([xf[..., half:], xf[..., :half]], dim=-1)
    return (xf * table.cos_full.reshape(shape) + rotated * table.sin_signed.reshape(shape)).to(x.dtype)


def apply_rope_inplace(x: torch.Tensor, table: RopeTable, theta: float) -> torch.Tensor:
    """x [N, H, D] contiguous: its last `table.dim` dims rotated in place, bit-identical to
    `apply_rope` on that slice (one launch on SM90 instead of the formula's kernels)."""
    if table.theta != theta or table.dim > x.shape[-1]:
        raise ValueError(f"rope table for dim {table.dim}, theta {table.theta}; applied to the last {table.dim} of "
                         f"{x.shape[-1]} dims, theta {theta}")
    return rope_inplace(x, table.cos_full, table.sin_signed)
