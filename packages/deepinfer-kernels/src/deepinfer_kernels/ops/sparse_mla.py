"""Sparse MLA attention over a paged FP8 KV pool, driven by an index array.

One shared KV head: the cached latent of a token is both its key and its value (MQA over the
latent). For query row r and head h, over the pool slots `indices[r, :]` (`-1` = empty column)::

    s_j   = sm_scale * q[r, h] . kv[indices[r, j]]
    out   = sum_j softmax(s)_j kv[indices[r, j]]        lse = log(sum_j exp(s_j))

Rows whose indices are all `-1` give `out = 0`, `lse = -inf`. Rows are independent: decode
(many verification rows per request) and prefill use the same op; the caller builds the
index array (window slots + selected compressed entries). Computed in float32; `out` has the
dtype of `q`. Duplicate indices count twice (callers never produce them).
"""

from __future__ import annotations

import torch

from deepinfer_kernels.envs import (  # noqa: F401  (the knobs' readers, re-exported)
    SPARSE_MLA_KERNEL_VARIANTS as KERNEL_VARIANTS,
)
from deepinfer_kernels.envs import (  # noqa: F401
    SPARSE_MLA_SHARED_KEYS_ENV,
    SPARSE_MLA_VARIANT_ENV,
    kernel_variant,
    shared_key_group_rows,
    shared_keys_enabled,
)
from deepinfer_kernels.ops._checks import (
    FLOAT_DTYPES,
    INDEX_DTYPES,
    check_dim,
    check_same_device,
    check_tensor,
)
from deepinfer_kernels.ops.capture import host_checks
from deepinfer_kernels.ops.kv_fp8 import dequantize_kv_fp8_ref, fp8_record_bytes
from deepinfer_kernels.platform import tilelang_launcher
from deepinfer_kernels.tilelang.torch_ops import register_cpu_reference

VARIANT_ENV = SPARSE_MLA_VARIANT_ENV
SHARED_KEYS_ENV = SPARSE_MLA_SHARED_KEYS_ENV


def sparse_mla_attention_ref(q: torch.Tensor, kv_pool: torch.Tensor, indices: torch.Tensor,
                             sm_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """q [rows, heads, D], kv_pool uint8 [slots, D + D/32], indices [rows, width]
    -> (out [rows, heads, D] q.dtype, lse float32 [rows, heads])."""
    rows, heads, d = q.shape
    width = indices.shape[1]
    valid = indices >= 0                                                       # [rows, width]
    kv = dequantize_kv_fp8_ref(kv_pool[indices.clamp(min=0).long().reshape(-1)], d)
    kv = kv.reshape(rows, width, d)                                            # [rows, width, D]
    s = torch.einsum("rhd,rwd->rhw", q.float(), kv) * sm_scale                 # [rows, heads, width]
    s = s.masked_fill(~valid.unsqueeze(1), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)                                           # [rows, heads]
    p = torch.exp(s - lse.unsqueeze(-1)).nan_to_num(0.0)                       # empty rows -> 0
    out = torch.einsum("rhw,rwd->rhd", p, kv)
    return out.to(q.dtype), lse


@register_cpu_reference("sparse_mla_attention")
def _(q, kv_pool, indices, sm_scale, variant, shared_keys=False):
    out, lse = sparse_mla_attention_ref(q, kv_pool, indices, sm_scale)
    return out.contiguous(), lse.contiguous()


def sparse_mla_attention(q: torch.Tensor, kv_pool: torch.Tensor, indices: torch.Tensor,
                         sm_scale: float, *, shared_keys: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """q [rows, heads, D], kv_pool uint8 [slots, D + D/32], indices int32 [rows, width] (-1 = empty)
    -> (out [rows, heads, D], lse float32 [rows, heads]).

    ``shared_keys`` is a hint, not a change of result: rows 2i and 2i + 1 attend nearly the same
    keys (consecutive positions of a request: prefill chunks, verification rows). The GPU kernel
    then attends each pair's union once (``ops.shared_keys``); equal up to float rounding."""
    check_tensor("q", q, 3, FLOAT_DTYPES)
    check_tensor("kv_pool", kv_pool, 2, (torch.uint8,))
    check_tensor("indices", indices, 2, INDEX_DTYPES)
    check_dim("kv_pool", kv_pool, 1, fp8_record_bytes(q.shape[2]))
    check_dim("indices", indices, 0, q.shape[0])
    device = check_same_device(q=q, kv_pool=kv_pool, indices=indices)
    if host_checks(indices) and indices.numel() and int(indices.max()) >= kv_pool.shape[0]:
        raise ValueError(f"indices: max {int(indices.max())} out of range for {kv_pool.shape[0]} slots")
    kernel = tilelang_launcher("sparse_mla_attention", device,
                               supported=q.dtype == torch.bfloat16 and q.shape[2] % 64 == 0)
    if kernel is not None:
        return kernel(q, kv_pool, indices, sm_scale, variant=kernel_variant(), shared_keys=shared_keys)
    return sparse_mla_attention_ref(q, kv_pool, indices, sm_scale)
