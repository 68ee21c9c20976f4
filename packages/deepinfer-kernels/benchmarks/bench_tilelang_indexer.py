"""Benchmarks: lightning indexer scores + block max + top-k (fused) over FP4 keys.

Bytes = FP4 keys gathered (68 B per valid candidate) + indices + q + weights + output; time and
bandwidth also against the torch reference chain on the same GPU.
"""

import pytest

pytestmark = pytest.mark.gpu

pytest.importorskip("deepinfer_kernels.ops.indexer")
T = pytest.importorskip("deepinfer_kernels.testing")


@pytest.mark.parametrize("rows,heads,n,bs,topk", [(132, 8, 16384, 16, 16), (384, 8, 4096, 16, 16),
                                                  (64, 64, 8192, 64, 32)])
def test_bench_indexer_topk_tilelang(benchmark, rows, heads, n, bs, topk):
    from deepinfer_kernels.ops.indexer import (
        candidate_block_max_ref,
        indexer_scores_ref,
        select_topk_blocks_ref,
    )
    from deepinfer_kernels.tilelang.indexer import indexer_topk_blocks_tilelang

    c = T.make_indexer_case(rows, heads, 128, n, 500_000, "cuda", seed=rows, ragged=False)

    def fn():
        return indexer_topk_blocks_tilelang(c.q, c.weights, c.k_pool, c.indices, c.valid_lens, bs, topk)

    def ref_fn():
        s = indexer_scores_ref(c.q, c.weights, c.k_pool, c.indices)
        return select_topk_blocks_ref(*candidate_block_max_ref(s, c.valid_lens, bs), topk)

    nbytes = rows * n * (68 + 4) + c.q.numel() * 2 + c.weights.numel() * 4 + rows * topk * 4
    use_ref = rows * n * 128 * 4 < 1.5e9
    T.record_benchmark(benchmark, fn, bytes_moved=nbytes, flops=2.0 * rows * n * heads * 128,
                       ref_fn=ref_fn if use_ref else None, extra={"rows": rows, "n": n, "heads": heads})


def test_bench_indexer_scores_tilelang(benchmark):
    from deepinfer_kernels.ops.indexer import indexer_scores_ref
    from deepinfer_kernels.tilelang.indexer import indexer_scores_tilelang

    rows, heads, n = 132, 8, 16384
    c = T.make_indexer_case(rows, heads, 128, n, 500_000, "cuda", seed=1, ragged=False)
    T.record_benchmark(benchmark, lambda: indexer_scores_tilelang(c.q, c.weights, c.k_pool, c.indices),
                       bytes_moved=rows * n * (68 + 4 + 4), flops=2.0 * rows * n * heads * 128,
                       ref_fn=lambda: indexer_scores_ref(c.q, c.weights, c.k_pool, c.indices))


@pytest.mark.parametrize("heads,n,bs,topk", [(8, 224, 16, 16), (8, 896, 16, 16), (64, 224, 64, 32), (64, 896, 64, 32)],
                         ids=["mini-ratio4", "mini-ratio1", "flash-ratio4", "flash-ratio1"])
def test_bench_indexer_topk_batch1(benchmark, heads, n, bs, topk):
    """One decode row at the engine's shapes (`mini` / flash, max_model_len 1024: 224 ratio-4 and
    896 ratio-1 candidates): the scores and the top-k kernel, a latency-bound pair on the step's
    critical path."""
    from deepinfer_kernels.tilelang.indexer import indexer_topk_blocks_tilelang

    c = T.make_indexer_case(1, heads, 128, n, 500_000, "cuda", seed=n, ragged=False)
    T.record_benchmark(benchmark, lambda: indexer_topk_blocks_tilelang(c.q, c.weights, c.k_pool, c.indices,
                                                                      c.valid_lens, bs, topk),
                       bytes_moved=n * (68 + 4) + c.q.numel() * 2 + c.weights.numel() * 4 + topk * 4,
                       extra={"rows": 1, "n": n, "heads": heads})
