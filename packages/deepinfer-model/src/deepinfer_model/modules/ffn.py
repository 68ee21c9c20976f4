"""Dense SwiGLU feed-forward: `down(silu(gate(x)) * up(x))`.

`forward` computes gate and up as one GEMM (see fused_projection.py) unless the owner fuses them
into a wider one (the MoE: router + shared expert, `fused=False` here, then `from_gate_up`);
`forward_reference` is the formula projection by projection (the oracle).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from deepinfer_kernels.ops.activation import silu_mul
from deepinfer_model.modules.fused_projection import FusedProjection
from deepinfer_model.modules.linear import Linear


class SwiGLU(nn.Module):
    def __init__(self, hidden: int, inter: int, fused: bool = True):
        super().__init__()
        self.gate_proj = Linear(hidden, inter, bias=False)
        self.up_proj = Linear(hidden, inter, bias=False)
        self.down_proj = Linear(inter, hidden, bias=False)
        self.gate_up = FusedProjection([self.gate_proj, self.up_proj]) if fused else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [N, H] -> [N, H]
        if self.gate_up is None:
            return self.forward_reference(x)
        gate, up = self.gate_up.split(self.gate_up(x))
        return self.from_gate_up(gate, up)

    def from_gate_up(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        """gate = W_gate x, up = W_up x [N, I] -> [N, H] (silu * up: one launch on SM90)."""
        return self.down_proj(silu_mul(gate, up))

    def forward_reference(self, x: torch.Tensor) -> torch.Tensor:  # [N, H] -> [N, H]
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
