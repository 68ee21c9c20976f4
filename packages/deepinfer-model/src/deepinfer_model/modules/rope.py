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

    dim: int                  # dr
    theta: float
    cos_full: torch.Tensor    # [N, dr] (cos, cos) float32
    sin_signed: torch.Tensor  # [N, dr] (-sin, sin) float32

    @property
    def cos(self) -> torch.Tensor:   # [N, dr/2]
        return self.cos_full[:, : self.dim // 2]

    @property
    def sin(self) -> torch.Tensor:   # [N, dr/2]
        return self.sin_signed[:, self.dim // 2:]


# (dim, theta, device) -> (the inverse frequencies twice [dr], the signs (-1, .., 1, ..) [dr]):
# constants of every step, made once outside graph capture instead of in 4 launches per table
_FREQUENCIES: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def _frequencies(dim: int, theta: float, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    key = (dim, float(theta), device)
    if key in _FREQUENCIES:
        return _FREQUENCIES[key]
    # theta^(-2i/dim): (2i) / (-dim) is exactly -(2i) / dim (IEEE division is sign-symmetric)
    inv = theta ** (torch.arange(0, dim - 1, 2, device=device, dtype=torch.float32) / -dim)   # [dim/2]
    signs = torch.ones(dim, device=device, dtype=torch.float32)
    signs[: dim // 2] = -1.0
    out = (torch.cat([inv, inv]), signs)
    capturing = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
    if not capturing and not torch.compiler.is_compiling():   # a captured tensor lives in the graph's pool
        _FREQUENCIES[key] = out
    return out


def rope_table(positions: torch.Tensor, dim: int, theta: float) -> RopeTable:
    """positions [N] -> the table of `apply_rope(x [N, ..., dim], positions, theta)`."""
    inv_twice, signs = _frequencies(dim, theta, positions.device)
    # both halves of the angle row at once: cos / sin of equal inputs are equal and sin * -1 == -sin
    # exactly, so this is bit for bit cat([cos, cos]), cat([-sin, sin]) of the half row
    ang = positions.to(torch.float32).unsqueeze(-1) * inv_twice                  # [N, dim]
    return RopeTable(dim, theta, ang.cos(), ang.sin() * signs)


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
