"""Dense SwiGLU feed-forward: `down(silu(gate(x)) * up(x))`."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class SwiGLU(nn.Module):
    def __init__(self, hidden: int, inter: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [N, H] -> [N, H]
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

    forward_reference = forward
