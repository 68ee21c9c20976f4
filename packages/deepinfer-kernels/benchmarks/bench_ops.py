"""CPU benchmarks of the torch references (the baseline the TileLang kernels are measured against).

Run: pytest packages/deepinfer-kernels/benchmarks --benchmark-only
"""

import math

import pytest
import torch

from deepinfer_kernels.ops.indexer import candidate_block_max, indexer_scores, select_topk_blocks
from deepinfer_kernels.ops.kv_fp4 import quantize_index_k_fp4, store_index_k_fp4
from deepinfer_kernels.ops.kv_fp8 import quantize_kv_fp8, store_kv_fp8
from deepinfer_kernels.ops.moe import moe_route, routed_experts
from deepinfer_kernels.ops.sparse_mla import sparse_mla_attention
from deepinfer_kernels.ops.swa_index import expand_swa_index


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def test_bench_store_kv_fp8(benchmark):
    kv, pool = torch.randn(256, 512), torch.zeros(4096, 528, dtype=torch.uint8)
    slots = torch.randperm(4096)[:256]
    benchmark(store_kv_fp8, kv, pool, slots)
    assert torch.equal(pool[slots], quantize_kv_fp8(kv))


def test_bench_store_index_k_fp4(benchmark):
    k, pool = torch.randn(256, 128), torch.zeros(4096, 68, dtype=torch.uint8)
    slots = torch.randperm(4096)[:256]
    benchmark(store_index_k_fp4, k, pool, slots)
    assert torch.equal(pool[slots], quantize_index_k_fp4(k))


def test_bench_expand_swa_index(benchmark):
    n = 4096
    pivots = torch.stack([torch.arange(n), torch.full((n,), 128), torch.zeros(n, dtype=torch.long),
                          torch.full((n,), 64)], 1).int()
    out = benchmark(expand_swa_index, pivots, 192)
    assert out[:, 127].tolist() == list(range(127, 127 + n))


def test_bench_sparse_mla_decode(benchmark):
    rows, heads, d, width = 16, 16, 512, 256
    q = torch.randn(rows, heads, d)
    pool = quantize_kv_fp8(torch.randn(8192, d))
    idx = torch.randint(0, 8192, (rows, width), dtype=torch.int32)
    out, lse = benchmark(sparse_mla_attention, q, pool, idx, 1 / math.sqrt(d))
    assert bool(torch.isfinite(lse).all()) and out.shape == (rows, heads, d)


def test_bench_indexer_topk(benchmark):
    rows, heads, di, n = 16, 8, 128, 1024
    q, w = torch.randn(rows, heads, di), torch.randn(rows, heads)
    pool = quantize_index_k_fp4(torch.randn(4096, di))
    idx = torch.randint(0, 4096, (rows, n), dtype=torch.int32)
    valid = torch.full((rows,), n)

    def run():
        s = indexer_scores(q, w, pool, idx)
        bs, nv = candidate_block_max(s, valid, 64)
        return select_topk_blocks(bs, nv, 8)

    sel = benchmark(run)
    assert bool((sel[:, 0] == n // 64 - 1).all())  # the forced last block ranks first (+inf)


def test_bench_routed_experts(benchmark):
    t, h, inter, e, k = 64, 256, 128, 16, 4
    x = torch.randn(t, h)
    w13, w2 = torch.randn(e, 2 * inter, h) * 0.05, torch.randn(e, h, inter) * 0.05
    weights, ids = moe_route(torch.randn(t, e), torch.zeros(e), k)
    out = benchmark(routed_experts, x, weights, ids, w13, w2)
    assert out.shape == (t, h) and bool(torch.isfinite(out).all())


@pytest.mark.gpu
@pytest.mark.parametrize("path", ["grouped", "reference"])
@pytest.mark.parametrize("t", [64, 1024])
def test_bench_routed_experts_cuda(benchmark, path, t):
    """CUDA, bf16, flash widths (H 3072, I 3840, top-6) over 64 experts: torch._grouped_mm path
    (capturable) vs the per-expert reference (host-synced offsets)."""
    from deepinfer_kernels.ops.moe import grouped_mm_usable, routed_experts_grouped, routed_experts_ref
    h, inter, e, k = 3072, 3840, 64, 6
    dev, bf = "cuda", torch.bfloat16
    x = torch.randn(t, h, device=dev, dtype=bf)
    w13 = torch.randn(e, 2 * inter, h, device=dev, dtype=bf) * h ** -0.5
    w2 = torch.randn(e, h, inter, device=dev, dtype=bf) * inter ** -0.5
    weights, ids = moe_route(torch.randn(t, e, device=dev), torch.zeros(e, device=dev), k)
    if path == "grouped" and not grouped_mm_usable(x, w13, w2):
        pytest.skip("grouped-GEMM path unavailable here (needs SM90)")
    fn = routed_experts_grouped if path == "grouped" else routed_experts_ref

    def run():
        out = fn(x, weights, ids, w13, w2)
        torch.cuda.synchronize()
        return out

    out = benchmark(run)
    assert out.shape == (t, h) and bool(torch.isfinite(out).all())
