"""The paged quantized store both KV formats share (kv_fp8 main/SWA records, kv_fp4 indexer keys):
row i of x is quantized to one record and written to pool[slot_mapping[i]]; slot -1 = skip.
``RecordFormat`` gives a format's checked public ops from its record size and torch references."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from deepinfer_kernels.ops._checks import (
    FLOAT_DTYPES,
    INDEX_DTYPES,
    check_dim,
    check_same_device,
    check_tensor,
)
from deepinfer_kernels.ops.capture import use_capturable, write_rows_capturable
from deepinfer_kernels.platform import select_backend, tilelang_launcher

Quantize = Callable[[torch.Tensor], torch.Tensor]   # x [n, D] -> uint8 records [n, record_bytes]
Dequantize = Callable[[torch.Tensor, int], torch.Tensor]   # (records [n, record_bytes], D) -> float32 [n, D]


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


@dataclass(frozen=True)
class RecordFormat:
    """One quantized record format and its public ops: ``quantize_<name>``, ``dequantize_<name>``,
    ``store_<name>`` (the op names the backend dispatch and the TileLang launchers know)."""

    name: str                         # "kv_fp8", "index_k_fp4"
    input_name: str                   # what the rows are called in errors: "kv", "k"
    record_bytes: Callable[[int], int]   # D -> bytes of one record (raises unless D fits the format)
    quantize_ref: Quantize
    dequantize_ref: Dequantize

    def quantize(self, x: torch.Tensor) -> torch.Tensor:
        """x [n, D] float32/bf16/fp16 -> uint8 records [n, record_bytes(D)]."""
        check_tensor(self.input_name, x, 2, FLOAT_DTYPES)
        self.record_bytes(x.shape[1])
        select_backend(f"quantize_{self.name}", x.device, has_kernel=False)
        return self.quantize_ref(x)

    def dequantize(self, records: torch.Tensor, dim: int) -> torch.Tensor:
        """uint8 records [n, record_bytes(dim)] -> float32 [n, dim]."""
        check_tensor("records", records, 2, (torch.uint8,))
        check_dim("records", records, 1, self.record_bytes(dim))
        select_backend(f"dequantize_{self.name}", records.device, has_kernel=False)
        return self.dequantize_ref(records, dim)

    def store(self, x: torch.Tensor, pool: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        """Quantize x [n, D] and write row i to pool[slot_mapping[i]] (uint8 [slots, record_bytes(D)]);
        slot -1 = skip."""
        store_quantized(f"store_{self.name}", self.input_name, x, pool, slot_mapping, self.record_bytes,
                        self.quantize_ref)

    def store_ref(self, x: torch.Tensor, pool: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        """pool[slot_mapping[i]] = quantize(x[i]) for every i with slot_mapping[i] >= 0 (in place)."""
        store_quantized_rows(pool, slot_mapping, x, self.quantize_ref, capturable=False)

    def store_capturable(self, x: torch.Tensor, pool: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        """``store_ref`` without a host sync: quantize every row (static shape), masked row write."""
        store_quantized_rows(pool, slot_mapping, x, self.quantize_ref, capturable=True)
