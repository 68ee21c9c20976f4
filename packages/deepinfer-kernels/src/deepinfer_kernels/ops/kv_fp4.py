"""The FP4 indexer-key record: D e2m1 values packed two per byte + D/32 ue8m0 scale bytes.

Record of one key (68 bytes for D = 128), token-interleaved::

    byte 0 .. D/2-1        packed e2m1: element 2i in the low nibble, 2i+1 in the high nibble
    byte D/2 .. D/2+D/32-1 ue8m0 scale exponents (bias 127), one per group of 32 values

Nibble = sign bit (8) | magnitude code (0..7) for magnitudes {0, .5, 1, 1.5, 2, 3, 4, 6}.
Scale rule: `e = ceil(log2(amax / 6))` clamped to [-127, 127]; values `x / 2^e` round to the
nearest magnitude, ties to the even code (down at .25, 1.25, 2.5, 5; up at .75, 1.75, 3.5).
"""

from __future__ import annotations

import torch

from deepinfer_kernels.ops.kv_fp8 import GROUP, UE8M0_BIAS, ue8m0_exponent
from deepinfer_kernels.ops.paged_store import RecordFormat
from deepinfer_kernels.tilelang.torch_ops import register_cpu_reference

E2M1_MAX = 6.0
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# Midpoints between consecutive magnitudes; a value equal to a midpoint goes to the even code.
_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


def fp4_record_bytes(dim: int) -> int:
    """Bytes of one indexer key: D/2 packed e2m1 + D/32 scale bytes (68 for D = 128)."""
    if dim % GROUP:
        raise ValueError(f"dim={dim}: must be a multiple of {GROUP}")
    return dim // 2 + dim // GROUP


def _e2m1_codes(x: torch.Tensor) -> torch.Tensor:
    """float (already scaled into [-6, 6]) -> uint8 nibble codes.

    code = number of midpoints below the magnitude; a magnitude equal to midpoint i (between codes
    i and i+1) counts it only when i + 1 is the even code. Comparisons with Python scalars only:
    no constant tensor is copied to the device (a host->device copy cannot be captured).
    """
    mag = x.abs()
    code = torch.zeros_like(mag, dtype=torch.int32)
    for i, mid in enumerate(_MIDPOINTS):
        code += (mag >= mid if (i + 1) % 2 == 0 else mag > mid).to(torch.int32)
    sign = (x < 0) & (code > 0)
    return (code + sign.to(code.dtype) * 8).to(torch.uint8)


def _e2m1_values(codes: torch.Tensor) -> torch.Tensor:
    """magnitude codes 0..7 -> E2M1_VALUES[code] as float32, computed (exp = code >> 1, mantissa =
    code & 1: subnormal 0.5 * m for exp 0, else (1 + m / 2) * 2^(exp - 1)); no constant table."""
    e = (codes >> 1).float()
    m = (codes & 1).float()
    return torch.where(e == 0, 0.5 * m, (1.0 + 0.5 * m) * torch.exp2(e - 1.0))


def quantize_index_k_fp4_ref(k: torch.Tensor) -> torch.Tensor:
    """k [n, D] float -> records uint8 [n, D/2 + D/32]."""
    n, d = k.shape
    x = k.float().reshape(n, d // GROUP, GROUP)
    e = ue8m0_exponent(x.abs().amax(-1), E2M1_MAX)
    scaled = (x * torch.exp2(-e.float()).unsqueeze(-1)).clamp(-E2M1_MAX, E2M1_MAX).reshape(n, d)
    codes = _e2m1_codes(scaled)                                          # [n, D]
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)                      # [n, D/2]
    return torch.cat([packed, (e + UE8M0_BIAS).to(torch.uint8)], dim=1)


def dequantize_index_k_fp4_ref(records: torch.Tensor, dim: int) -> torch.Tensor:
    """records uint8 [n, D/2 + D/32] -> float32 [n, D]."""
    n = records.shape[0]
    packed = records[:, : dim // 2]
    codes = torch.stack([packed & 0xF, packed >> 4], dim=-1).reshape(n, dim).long()
    vals = _e2m1_values(codes & 7) * torch.where(codes >= 8, -1.0, 1.0)
    e = records[:, dim // 2:].to(torch.int32) - UE8M0_BIAS
    return (vals.reshape(n, dim // GROUP, GROUP) * torch.exp2(e.float()).unsqueeze(-1)).reshape(n, dim)


INDEX_K_FP4 = RecordFormat("index_k_fp4", "k", fp4_record_bytes, quantize_index_k_fp4_ref,
                           dequantize_index_k_fp4_ref)
quantize_index_k_fp4 = INDEX_K_FP4.quantize       # k [n, D] -> uint8 [n, D/2 + D/32]
dequantize_index_k_fp4 = INDEX_K_FP4.dequantize   # (records uint8 [n, D/2 + D/32], D) -> float32 [n, D]
store_index_k_fp4 = INDEX_K_FP4.store             # (k [n, D], pool [slots, D/2 + D/32], slot_mapping [n])
store_index_k_fp4_ref = INDEX_K_FP4.store_ref
register_cpu_reference("store_index_k_fp4")(store_index_k_fp4_ref)
