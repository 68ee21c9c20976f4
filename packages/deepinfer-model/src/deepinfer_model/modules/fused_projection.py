"""Bias-free projections of one input as one GEMM.

At decode batch sizes a GEMM's time is its launch (~4 us on the H200 whatever its size), so the
projections that read the same activation run as one `x · W^T` with the members' weights stacked
by rows, `W [sum_i out_i, in]`, and the callers take column slices of the output.

Memory and the source of truth: each member's `weight` parameter is re-pointed at its rows of
`W` (a contiguous view), so the weights exist once, the members keep their names, shapes and
checkpoint layout, and every in-place write to a member (checkpoint loading, `load_state_dict`,
random init, an optimizer step) is a write to `W`. Anything that *replaces* a member's storage
(`module.to(...)`, `load_state_dict(assign=True)`, `param.data = ...`, a deep copy) leaves it
outside `W`; `weight()` notices (the member no longer sits at its rows' address: a host-side
check, no device sync) and rebuilds `W` from the members before the next use, so a stale copy is
never read.

Alignment: `W` carries zero rows up to a multiple of `ROW_ALIGN` (8): an output row of an odd width
(a source layer's 1,545 columns, a compressor's 641) is not 16-byte aligned, and cuBLAS then runs
an align-1 kernel, 5.7x slower at a 32K-row prefill on the H200 (974 us against ~170 us for its
aligned neighbours, 2026-11-30). The zero rows sit at the end, or before member `pad_before`
(the attention input keeps its KV projection last, see `mla.py`); `offsets` locates each member.

Autograd: `W` is not a parameter. While autograd records and a member requires grad, `__call__`
runs the members one by one (the same output layout) so that gradients reach them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from deepinfer_kernels.ops.linear import linear

ROW_ALIGN = 8   # rows of the stacked weight: a multiple of 8 keeps bf16 output rows 16-byte aligned


class FusedProjection:
    """`members`: modules with a bias-free `weight [out_i, in]` (nn.Linear, the MoE router), all of
    one dtype and device. Output columns follow the members' order, with the zero padding columns
    before member `pad_before` (default: at the end). Not an nn.Module: the members stay registered
    where they are (state dict and parameter names unchanged)."""

    def __init__(self, members: Sequence[nn.Module], pad_before: int | None = None):
        if len(members) < 2:
            raise ValueError("FusedProjection: needs at least two members")
        self.members = tuple(members)
        self.pad_before = len(self.members) if pad_before is None else pad_before
        if not 0 <= self.pad_before <= len(self.members):
            raise ValueError(f"FusedProjection: pad_before={pad_before} must lie in [0, {len(self.members)}]")
        self.widths = tuple(m.weight.shape[0] for m in self.members)
        self._fused: torch.Tensor | None = None
        self.rebuild()

    @property
    def out_features(self) -> int:
        """Output columns, padding included (a multiple of ROW_ALIGN)."""
        return sum(self.widths) + self.pad

    @property
    def pad(self) -> int:
        return -sum(self.widths) % ROW_ALIGN

    @property
    def offsets(self) -> tuple[int, ...]:
        """First output column (= row of the stacked weight) of each member."""
        out, start = [], 0
        for i, width in enumerate(self.widths):
            start += self.pad if i == self.pad_before else 0
            out.append(start)
            start += width
        return tuple(out)

    def weight(self) -> torch.Tensor:
        """The stacked weight [out_features, in] (zero padding rows included), rebuilt first if a member left it.

        Under torch.compile (dynamo cannot trace `data_ptr`) the check is skipped: callers that
        compile or capture a step call `refresh_fused_projections` first, and a step captured in a
        CUDA graph cannot survive replaced weights anyway (it holds their old addresses)."""
        if not torch.compiler.is_compiling() and not self.is_current():
            self.rebuild()
        return self._fused

    def is_current(self) -> bool:
        """Every member's weight is still the contiguous view of its rows of the stacked weight."""
        w = self._fused
        if w is None:
            return False
        row_bytes = w.stride(0) * w.element_size()
        for m, width, start in zip(self.members, self.widths, self.offsets, strict=True):
            p = m.weight
            if (p.device != w.device or p.dtype != w.dtype or tuple(p.shape) != (width, w.shape[1])
                    or not p.is_contiguous() or p.data_ptr() != w.data_ptr() + start * row_bytes):
                return False
        return True

    @torch.no_grad()
    def rebuild(self) -> None:
        """Stack the members' current weights and re-point each member at its rows."""
        weights = [m.weight for m in self.members]
        if len({(p.dtype, p.device, p.shape[1]) for p in weights}) != 1:
            raise ValueError("FusedProjection: members must share dtype, device and input width, got "
                             f"{[(p.dtype, p.device, tuple(p.shape)) for p in weights]}")
        self.widths = tuple(p.shape[0] for p in weights)
        parts = [p.detach() for p in weights]
        parts.insert(self.pad_before, weights[0].new_zeros(self.pad, weights[0].shape[1]))
        fused = torch.cat(parts)
        for p, width, start in zip(weights, self.widths, self.offsets, strict=True):
            p.data = fused[start: start + width]
        self._fused = fused

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x [N, in] -> [N, out_features] (contiguous; the padding columns are zero); member i's
        output is `split(y)[i]`."""
        if torch.is_grad_enabled() and any(m.weight.requires_grad for m in self.members):
            outs = [F.linear(x, m.weight) for m in self.members]
            outs.insert(self.pad_before, x.new_zeros(*x.shape[:-1], self.pad))
            return torch.cat(outs, dim=-1)
        return linear(x, self.weight())   # one row on SM90: the matrix-vector kernel

    def normed(self, x: torch.Tensor, norm) -> torch.Tensor:
        """`self(norm(x))` for an `RMSNorm` norm; one launch for one row on SM90 (`RMSNorm.linear`)."""
        if torch.is_grad_enabled() and any(m.weight.requires_grad for m in self.members):
            return self(norm(x))
        return norm.linear(x, self.weight())

    def split(self, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """y [N, out_features] -> each member's columns [N, out_i] (views)."""
        return tuple(y[..., start: start + width] for start, width in zip(self.offsets, self.widths, strict=True))


@torch.no_grad()
def refresh_fused_projections(module: nn.Module) -> None:
    """Rebuild every stale FusedProjection owned by `module` or its submodules (after a `.to()`, an
    assigning load...): the next forward then finds them current (no rebuild inside a CUDA graph
    capture's warm-up, no old copy kept alive until then)."""
    for m in module.modules():
        for value in vars(m).values():
            if isinstance(value, FusedProjection) and not value.is_current():
                value.rebuild()
