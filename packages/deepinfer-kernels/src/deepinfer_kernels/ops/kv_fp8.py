"""The FP8 KV record: D e4m3 values + D/32 ue8m0 scale bytes, token-interleaved.

Record of one token (528 bytes for D = 512)::

    byte  0 .. D-1        e4m3 values            (value_i = e4m3_i * 2^(scale_{i//32} - 127))
    byte  D .. D+D/32-1   ue8m0 scale exponents  (one per group of 32 values, bias 127)

Scale rule (exact, the oracle for kernels): for a group with absolute maximum `amax`,
`e = ceil(log2(amax / 448))` clamped to [-127, 127] (`amax == 0` gives -127), stored as the byte
`e + 127`; values are `x / 2^e` rounded to nearest-even e4m3 (saturating at +-448).
No BF16 part: the record is the whole cached KV of a token.
"""

from __future__ import annotations

import torch

from deepinfer_kernels.ops._checks import (
    FLOAT_DTYPES,
    INDEX_DTYPES,
    check_dim,
    check_same_device,
    check_tensor,
)
from deepinfer_kernels.ops.paged_store import RecordFormat
from deepinfer_kernels.platform import tilelang_launcher
from deepinfer_kernels.tilelang.torch_ops import register_cpu_reference

GROUP = 32            # values per ue8m0 scale
E4M3_MAX = 448.0
UE8M0_BIAS = 127


def fp8_record_bytes(dim: int) -> int:
    """Bytes of one token's record: D e4m3 + D/32 scale bytes (528 for D = 512)."""
    if dim % GROUP:
        raise ValueError(f"dim={dim}: must be a multiple of {GROUP}")
    return dim + dim // GROUP


def ue8m0_exponent(amax: torch.Tensor, qmax: float) -> torch.Tensor:
    """Power-of-two scale exponent `ceil(log2(amax / qmax))`, clamped to [-127, 127]; int32."""
    amax = amax.float()
    safe = torch.where(amax > 0, amax / qmax, torch.full_like(amax, 2.0 ** -127))
    e = torch.ceil(torch.log2(safe))
    return e.clamp(-UE8M0_BIAS, UE8M0_BIAS).to(torch.int32)


def quantize_kv_fp8_ref(kv: torch.Tensor) -> torch.Tensor:
    """kv [n, D] float -> records uint8 [n, D + D/32]."""
    n, d = kv.shape
    x = kv.float().reshape(n, d // GROUP, GROUP)
    e = ue8m0_exponent(x.abs().amax(-1), E4M3_MAX)                      # [n, D/32]
    scaled = (x * torch.exp2(-e.float()).unsqueeze(-1)).clamp(-E4M3_MAX, E4M3_MAX)
    q = scaled.reshape(n, d).to(torch.float8_e4m3fn).view(torch.uint8)  # [n, D]
    sf = (e + UE8M0_BIAS).to(torch.uint8)                               # [n, D/32]
    return torch.cat([q, sf], dim=1)


def dequantize_kv_fp8_ref(records: torch.Tensor, dim: int) -> torch.Tensor:
    """records uint8 [n, D + D/32] -> float32 [n, D]."""
    n = records.shape[0]
    q = records[:, :dim].contiguous().view(torch.float8_e4m3fn).float().reshape(n, dim // GROUP, GROUP)
    e = records[:, dim:].to(torch.int32) - UE8M0_BIAS                   # [n, D/32]
    return (q * torch.exp2(e.float()).unsqueeze(-1)).reshape(n, dim)


KV_FP8 = RecordFormat("kv_fp8", "kv", fp8_record_bytes, quantize_kv_fp8_ref, dequantize_kv_fp8_ref)
quantize_kv_fp8 = KV_FP8.quantize        # kv [n, D] -> uint8 [n, D + D/32]
dequantize_kv_fp8 = KV_FP8.dequantize    # (records uint8 [n, D + D/32], D) -> float32 [n, D]
store_kv_fp8 = KV_FP8.store              # (kv [n, D], pool [slots, D + D/32], slot_mapping [n]); -1 = skip
store_kv_fp8_ref = KV_FP8.store_ref
register_cpu_reference("store_kv_fp8")(store_kv_fp8_ref)


def store_normed_kv_fp8_ref(kv: torch.Tensor, norm_weight: torch.Tensor, eps: float, norm_dim: int,
                            pool: torch.Tensor, slot_mapping: torch.Tensor,
                            rope: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
    """`store_kv_fp8` of [rms_norm(kv[:, :norm_dim]), kv[:, norm_dim:]] (the MLA latent: normed
    content, rotated tail), each op as its public self (the norm rounded to kv's dtype first).
    `rope` (cos_full, sin_signed): the tail's last r columns rotated first, as `rope_inplace` on a
    copy (kv itself is not written)."""
    from deepinfer_kernels.ops.norm import rms_norm
    from deepinfer_kernels.ops.rope import rope_inplace

    tail = kv[:, norm_dim:]
    if rope is not None:   # a copy (`.contiguous()` of a one-row slice would be kv itself)
        tail = rope_inplace(tail.clone().unsqueeze(1), *rope).squeeze(1)
    latent = torch.cat([rms_norm(kv[:, :norm_dim], norm_weight, eps), tail], dim=-1)
    store_kv_fp8(latent, pool, slot_mapping)


def store_normed_kv_fp8(kv: torch.Tensor, norm_weight: torch.Tensor, eps: float, norm_dim: int,
                        pool: torch.Tensor, slot_mapping: torch.Tensor,
                        rope: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
    """`store_normed_kv_fp8_ref` in one launch on SM90 (bf16 / fp16 kv with D = 512, read in place
    from a column slice of a wider row; bit-identical to the three ops): a decode layer's latent
    goes to the cache without its norm and concatenation as kernels of their own. `rope`
    (cos_full, sin_signed float32 [n, r], r even, <= D - norm_dim): the latent's RoPE in the same
    launch (the record equals `rope_inplace` of the tail, then the store; kv is not written)."""
    check_tensor("kv", kv, 2, FLOAT_DTYPES)
    check_tensor("norm_weight", norm_weight, 1, FLOAT_DTYPES)
    check_tensor("pool", pool, 2, (torch.uint8,))
    check_tensor("slot_mapping", slot_mapping, 1, INDEX_DTYPES)
    if not 0 < norm_dim < kv.shape[1]:
        raise ValueError(f"norm_dim: must lie in (0, {kv.shape[1]}) (kv's width), got {norm_dim}")
    check_dim("norm_weight", norm_weight, 0, norm_dim)
    check_dim("pool", pool, 1, fp8_record_bytes(kv.shape[1]))
    check_dim("slot_mapping", slot_mapping, 0, kv.shape[0])
    tables: dict[str, torch.Tensor] = {}
    if rope is not None:
        tables = {"cos_full": rope[0], "sin_signed": rope[1]}
        r = rope[0].shape[-1] if rope[0].dim() == 2 else -1
        for name, t in tables.items():
            check_tensor(name, t, 2, (torch.float32,))
            check_dim(name, t, 0, kv.shape[0])
            check_dim(name, t, 1, r)
        if r % 2 or not 0 < r <= kv.shape[1] - norm_dim:
            raise ValueError(f"cos_full: rotary width {r} must be even and in (0, {kv.shape[1] - norm_dim}] "
                             "(the columns after norm_dim)")
    device = check_same_device(kv=kv, norm_weight=norm_weight, pool=pool, slot_mapping=slot_mapping, **tables)
    kernel = tilelang_launcher("store_normed_kv_fp8", device, supported=kv.dtype in (torch.bfloat16, torch.float16)
                               and norm_weight.dtype in (torch.float32, kv.dtype) and kv.shape[1] == 512
                               and norm_dim % 32 == 0 and kv.stride(1) == 1 and pool.stride() == (pool.shape[1], 1))
    if kernel is not None:
        kernel(kv, norm_weight, eps, norm_dim, pool, slot_mapping, rope)
    else:
        store_normed_kv_fp8_ref(kv, norm_weight, eps, norm_dim, pool, slot_mapping, rope)
