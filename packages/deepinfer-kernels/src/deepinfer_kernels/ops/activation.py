"""SwiGLU's activation: `silu(gate) * up`.

    y = (silu(gate) rounded to the activations' dtype) * up, rounded again

the two roundings of torch's `F.silu(gate) * up` (what the dense FFN and the shared expert run).
`silu_mul` dispatches to a one-launch TileLang kernel on SM90 (`deepinfer_kernels.tilelang.activation`;
torch runs two element-wise kernels) and to `silu_mul_ref` elsewhere. gate and up may be column
slices of one wider output (the fused gate/up GEMM): rows contiguous, any row stride.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from deepinfer_kernels.ops._checks import FLOAT_DTYPES, check_same_device
from deepinfer_kernels.platform import tilelang_launcher


def silu_mul_ref(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """gate, up [..., I] -> [..., I] in their dtype: torch's `F.silu(gate) * up`."""
    return F.silu(gate) * up


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """gate, up [..., I] (one float dtype) -> [..., I] = silu(gate) * up (the kernel: 2-D operands)."""
    if not isinstance(gate, torch.Tensor) or gate.dim() < 1 or gate.dtype not in FLOAT_DTYPES:
        raise ValueError(f"gate: expected a float tensor [..., I], got {getattr(gate, 'dtype', type(gate).__name__)}")
    if not isinstance(up, torch.Tensor) or up.dtype != gate.dtype:
        raise ValueError(f"up: expected gate's dtype {gate.dtype}, got {getattr(up, 'dtype', type(up).__name__)}")
    if up.shape != gate.shape:
        raise ValueError(f"up: expected {list(gate.shape)} (gate's shape), got {list(up.shape)}")
    device = check_same_device(gate=gate, up=up)
    grad = torch.is_grad_enabled() and (gate.requires_grad or up.requires_grad)   # the kernel has no backward
    kernel = tilelang_launcher("silu_mul", device, supported=gate.dtype in (torch.bfloat16, torch.float16)
                               and gate.dim() == 2 and gate.shape[1] % 8 == 0 and gate.stride(1) == 1 and up.stride(1) == 1 and not grad)
    if kernel is not None:
        return kernel(gate, up)
    return silu_mul_ref(gate, up)
