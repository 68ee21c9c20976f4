"""Rotary position embedding applied in place to the last ``r`` dims of each head.

    x[n, h, D-r:] <- x * cos_full[n] + swap_halves(x) * sin_signed[n]      (float32, rounded to x's dtype)

``cos_full[n] = (cos, cos)`` and ``sin_signed[n] = (-sin, sin)`` of row n's angles (the
half-split pair layout: element i pairs with i + r/2). Each product and the sum round to float32
separately, exactly as the three torch kernels of the out-of-place formula do, so the in-place
op is bit-identical to it on every device. On the GPU the formula plus the concatenations around it
are ~8 launches per projection; ``rope_inplace`` is one TileLang launch on SM90.
"""

from __future__ import annotations

import torch

from deepinfer_kernels.ops._checks import FLOAT_DTYPES, check_dim, check_same_device, check_tensor
from deepinfer_kernels.platform import tilelang_launcher


def rope_inplace_ref(x: torch.Tensor, cos_full: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """x [N, H, D], cos_full / sin_signed float32 [N, r] -> x, its last r dims rotated in place."""
    r = cos_full.shape[1]
    half = r // 2
    tail = x[..., x.shape[-1] - r:]
    xf = tail.float()
    rotated = torch.cat([xf[..., half:], xf[..., :half]], dim=-1)
    tail.copy_(xf * cos_full.unsqueeze(1) + rotated * sin_signed.unsqueeze(1))
    return x


def rope_inplace(x: torch.Tensor, cos_full: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """x [N, H, D] (bf16 / fp16 / fp32, contiguous), cos_full / sin_signed float32 [N, r]
    (r even, <= D) -> x, rotated in place."""
    check_tensor("x", x, 3, FLOAT_DTYPES)
    check_tensor("cos_full", cos_full, 2, (torch.float32,))
    check_tensor("sin_signed", sin_signed, 2, (torch.float32,))
    n, _, d = x.shape
    r = cos_full.shape[1]
    check_dim("cos_full", cos_full, 0, n)
    check_dim("sin_signed", sin_signed, 0, n)
    check_dim("sin_signed", sin_signed, 1, r)
    if r % 2 or not 0 < r <= d:
        raise ValueError(f"cos_full: rotary width {r} must be even and in (0, {d}] (x's head dim)")
    if not x.is_contiguous():
        raise ValueError("x: must be contiguous (rotated in place)")
    device = check_same_device(x=x, cos_full=cos_full, sin_signed=sin_signed)
    kernel = tilelang_launcher("rope_inplace", device,
                               supported=x.dtype in (torch.bfloat16, torch.float16, torch.float32))
    if kernel is not None:
        return kernel(x, cos_full, sin_signed)
    return rope_inplace_ref(x, cos_full, sin_signed)
