"""RMSNorm with a float32 weight over bf16 / fp16 / fp32 activations.

    y = (x_f32 * rsqrt(mean(x_f32^2) + eps)) * w_f32, rounded to x's dtype

The models keep their norm weights in float32 while activations are bf16. torch's fused RMSNorm
needs one dtype for both ("Cannot dispatch to fused implementation"), so on CUDA a mixed call was
three kernels: a cast, the norm, a cast back. `rms_norm` dispatches to a one-launch TileLang kernel
for that case on SM90 (`deepinfer_kernels.tilelang.norm`) and to `rms_norm_ref` elsewhere. Under
torch.compile the reference runs (not a custom op): inductor fuses a norm with its neighbours.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from deepinfer_kernels.ops._checks import FLOAT_DTYPES, check_same_device, check_tensor
from deepinfer_kernels.platform import tilelang_launcher


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., D], weight [D] -> x's dtype, computed in float32."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * weight.float()).to(x.dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., D] (bf16 / fp16 / fp32), weight [D] (fp32 or x's dtype) -> x's dtype."""
    if x.dim() < 1:
        raise ValueError("x: expected [..., D]")
    check_tensor("weight", weight, 1, FLOAT_DTYPES)
    if weight.shape[0] != x.shape[-1]:
        raise ValueError(f"weight: expected [{x.shape[-1]}] (x's last dim), got {list(weight.shape)}")
    device = check_same_device(x=x, weight=weight)
    d = x.shape[-1]
    kernel = tilelang_launcher("rms_norm", device, supported=x.dtype in (torch.bfloat16, torch.float16)
                               and weight.dtype in (torch.float32, x.dtype) and d % 32 == 0 and 32 <= d <= 8192)
    if kernel is not None:
        return kernel(x, weight, eps)
    if x.is_cuda:   # torch's fused norm in float32: three launches with the casts, not the formula's five
        return F.rms_norm(x.float(), (d,), weight.float(), eps).to(x.dtype)
    return rms_norm_ref(x, weight, eps)


def add_rms_norm_ref(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """x, residual [..., D] -> (s = x + residual in x's dtype, rms_norm(s, weight, eps))."""
    s = x + residual
    return s, rms_norm(s, weight, eps)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual add and the norm after it (a decoder layer's `x + attn(x)` then its
    post-attention norm): one launch on SM90 for 2-D bf16 / fp16 rows, `add_rms_norm_ref` elsewhere.
    Same values as the two calls (s rounded to x's dtype before it is normalised)."""
    if residual.shape != x.shape or residual.dtype != x.dtype:
        raise ValueError(f"residual: expected {list(x.shape)} {x.dtype} (x's), got {list(residual.shape)} "
                         f"{residual.dtype}")
    check_tensor("weight", weight, 1, FLOAT_DTYPES)
    d = x.shape[-1]
    device = check_same_device(x=x, residual=residual, weight=weight)
    kernel = tilelang_launcher("add_rms_norm", device, supported=x.dim() == 2 and x.dtype in (torch.bfloat16, torch.float16)
                               and weight.dtype in (torch.float32, x.dtype) and d % 32 == 0 and 32 <= d <= 8192)
    if kernel is not None:
        return kernel(x, residual, weight, eps)
    return add_rms_norm_ref(x, residual, weight, eps)
