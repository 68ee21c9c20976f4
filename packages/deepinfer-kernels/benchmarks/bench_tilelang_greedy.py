"""Benchmark: greedy pick (argmax + its logprob per request) against the torch reference
(``log_softmax`` + ``argmax`` + gathers) on the same GPU; bytes = the logits read once.

    pytest packages/deepinfer-kernels/benchmarks/bench_tilelang_greedy.py --benchmark-only
"""

import pytest
import torch

pytestmark = pytest.mark.gpu

pytest.importorskip("deepinfer_kernels.ops.sampling.greedy")
T = pytest.importorskip("deepinfer_kernels.testing")


@pytest.mark.parametrize("impl", ["tilelang", "torch"])
@pytest.mark.parametrize("vocab", [32000, 129280])
@pytest.mark.parametrize("rows", [1, 64])
def test_bench_greedy_pick(benchmark, rows, vocab, impl):
    """Both inside a CUDA graph, as the decode step runs them (the torch one: 8 kernels)."""
    from deepinfer_kernels.ops.sampling.greedy import greedy_pick_ref
    from deepinfer_kernels.tilelang.greedy import greedy_pick_tilelang

    logits = torch.randn(rows, vocab, device="cuda") * 3
    ftp = torch.arange(rows, dtype=torch.int32, device="cuda")
    seqlens_q = torch.ones(rows, dtype=torch.int32, device="cuda")
    fn = greedy_pick_tilelang if impl == "tilelang" else greedy_pick_ref
    T.record_benchmark(benchmark, lambda: fn(logits, ftp, seqlens_q), bytes_moved=rows * vocab * 4,
                       extra={"rows": rows, "vocab": vocab, "impl": impl})
