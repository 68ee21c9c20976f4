"""Benchmarks: fused quantize + scatter of KV records (FP8 528 B) and indexer keys (FP4 68 B).

Bytes = input read + records written + slot ids; reported against 4.29 TB/s and against the
torch reference (``store_*_ref``) time on the same GPU.
"""

import pytest
import torch

pytestmark = pytest.mark.gpu

pytest.importorskip("deepinfer_kernels.ops.kv_fp8")
T = pytest.importorskip("deepinfer_kernels.testing")


# format -> (reference module, kernel, input width D, record bytes); ids keep the old test names' words
FORMATS = {"kv_fp8": ("kv_fp8", "store_kv_fp8", 512, 528), "index_k_fp4": ("kv_fp4", "store_index_k_fp4", 128, 68)}


@pytest.mark.parametrize("fmt,n", [("kv_fp8", 256), ("kv_fp8", 8192), ("kv_fp8", 65536),
                                   ("index_k_fp4", 256), ("index_k_fp4", 65536)])
def test_bench_store_tilelang(benchmark, fmt, n):
    """One store of n rows [n, D] bf16 into random slots of the pool [slots, record bytes]."""
    import importlib

    from deepinfer_kernels.tilelang import kv_store

    module, op, d, rec = FORMATS[fmt]
    ref = getattr(importlib.import_module(f"deepinfer_kernels.ops.{module}"), f"{op}_ref")
    kernel = getattr(kv_store, f"{op}_tilelang")
    slots = max(4 * n, 100_000)
    x = torch.randn(n, d, device="cuda").to(torch.bfloat16)
    pool = torch.zeros(slots, rec, dtype=torch.uint8, device="cuda")
    slot_map = torch.randperm(slots, device="cuda")[:n]
    T.record_benchmark(benchmark, lambda: kernel(x, pool, slot_map), bytes_moved=n * (d * 2 + rec + 8),
                       ref_fn=lambda: ref(x, pool, slot_map), extra={"n": n})
