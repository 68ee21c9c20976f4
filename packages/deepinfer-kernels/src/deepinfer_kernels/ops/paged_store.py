"""The paged quantized store both KV formats share (kv_fp8 main/SWA records, kv_fp4 indexer keys):
row i of x is quantized to one record and written to pool[slot_mapping[i]]; slot -1 = skip."""

from __future__ import annotations

from collections.abc import Callable

import torch

from deepinfer_kernels.ops._checks import (
    FLOAT_DTYPES,
    INDEX_DTYPES,
    check_dim,
    check_same_device,
    check_tensor,
)
from deepinfer_kernels.ops.capture import use_capturable, write_rows_capturable
from deepinfer_kernels.platform import tilelang_launcher

Quantize = Callable[[torch.Tensor], torch.Tensor]   # x [n, D] -> uint8 records [n, record_bytes]


def store_quantized_rows(pool: torch.Tensor, slot_mapping: torch.Tensor, x: torch.Tensor, quantize: Quantize,
                         capturable: bool) -> None:
    """pool[slot_mapping[i]] = quantize(x[i]) where slot_mapping[i] >= 0. The reference quantizes
    the kept rows only (a boolean selection: syncs on CUDA); the capturable variant quantizes every
    row (static shapes) and writes through `write_rows_capturable`."""
    if capturable:
        write_rows_capturable(pool, slot_mapping, quantize(x))
        return
    keep = slot_mapping >= 0
    if bool(keep.any()):
        pool[slot_mapping[keep].long()] = quantize(x[keep])


def store_quantized(op: str, name: str, x: torch.Tensor, pool: torch.Tensor, slot_mapping: torch.Tensor,
                    record_bytes: Callable[[int], int], quantize: Quantize) -> None:
    """Checked public store: x [n, D] float, pool uint8 [slots, record_bytes(D)], slot_mapping [n] int.
    The op's TileLang kernel for bf16/fp16/fp32 on SM90, else the torch path (capturable off the CPU)."""
    check_tensor(name, x, 2, FLOAT_DTYPES)
    check_tensor("pool", pool, 2, (torch.uint8,))
    check_tensor("slot_mapping", slot_mapping, 1, INDEX_DTYPES)
    check_dim("pool", pool, 1, record_bytes(x.shape[1]))
    check_dim("slot_mapping", slot_mapping, 0, x.shape[0])
    device = check_same_device(**{name: x, "pool": pool, "slot_mapping": slot_mapping})
    kernel = tilelang_launcher(op, device, supported=x.dtype in (torch.bfloat16, torch.float16, torch.float32))
    if kernel is not None:
        kernel(x, pool, slot_mapping)
    else:
        store_quantized_rows(pool, slot_mapping, x, quantize, capturable=use_capturable(pool))
