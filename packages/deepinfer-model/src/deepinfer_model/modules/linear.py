"""The model's projections: ``nn.Linear`` without a bias whose forward is the kernels package's
``linear`` (a one-row call on SM90, the batch-1 decode step, runs a matrix-vector kernel instead
of cuBLAS). Same parameter, name and checkpoint layout as ``nn.Linear``."""

from __future__ import annotations

import torch
from torch import nn

from deepinfer_kernels.ops.linear import linear


class Linear(nn.Linear):
    def __init__(self, in_features: int, out_features: int, bias: bool = False, **kwargs):
        if bias:
            raise ValueError("Linear: the model's projections have no bias (bias=True given)")
        super().__init__(in_features, out_features, bias=False, **kwargs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:   # [..., in] -> [..., out]
        return linear(x, self.weight)
