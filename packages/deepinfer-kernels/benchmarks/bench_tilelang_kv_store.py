"""Benchmarks: fused quantize + scatter of KV records (FP8 528 B) and indexer keys (FP4 68 B).

Bytes = input read + records written + slot ids; reported against 4.29 TB/s and against the
torch reference (``store_*_ref``) time on the same GPU.
"""

import pytest
import torch

pytestmark = pytest.mark.gpu

pytest.importorskip("deepinfer_kernels.ops.kv_fp8")
T = pytest.importorskip("deepinfer_kernels.testing")


@pytest.mark.parametrize("n", [256, 8192, 65536])
def test_bench_store_kv_fp8_tilelang(benchmark, n):
    from deepinfer_kernels.ops.kv_fp8 import store_kv_fp8_ref
    from deepinfer_kernels.tilelang.kv_store import store_kv_fp8_tilelang

    slots = max(4 * n, 100_000)
    kv = torch.randn(n, 512, device="cuda").to(torch.bfloat16)
    pool = torch.zeros(slots, 528, dtype=torch.uint8, device="cuda")
    slot_map = torch.randperm(slots, device="cuda")[:n]
    T.record_benchmark(benchmark, lambda: store_kv_fp8_tilelang(kv, pool, slot_map),
                       bytes_moved=n * (512 * 2 + 528 + 8),
                       ref_fn=lambda: store_kv_fp8_ref(kv, pool, slot_map), extra={"n": n})


@pytest.mark.parametrize("n", [256, 65536])
def test_bench_store_index_k_fp4_tilelang(benchmark, n):
    from deepinfer_kernels.ops.kv_fp4 import store_index_k_fp4_ref
    from deepinfer_kernels.tilelang.kv_store import store_index_k_fp4_tilelang

    slots = max(4 * n, 100_000)
    k = torch.randn(n, 128, device="cuda").to(torch.bfloat16)
    pool = torch.zeros(slots, 68, dtype=torch.uint8, device="cuda")
    slot_map = torch.randperm(slots, device="cuda")[:n]
    T.record_benchmark(benchmark, lambda: store_index_k_fp4_tilelang(k, pool, slot_map),
                       bytes_moved=n * (128 * 2 + 68 + 8),
                       ref_fn=lambda: store_index_k_fp4_ref(k, pool, slot_map), extra={"n": n})
