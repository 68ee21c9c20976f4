"""Benchmarks: one-row projections (a batch-1 decode step's GEMMs at `mini`'s shapes) as the
TileLang matrix-vector kernel and as cuBLAS (`F.linear`), both replayed from a CUDA graph with the
L2 flushed: weight bytes / time against copy bandwidth."""

import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.gpu

T = pytest.importorskip("deepinfer_kernels.testing")


@pytest.mark.parametrize("path", ["matvec", "matvec_multiwave", "cublas"])
@pytest.mark.parametrize("n,k", [(1024, 8192), (8192, 384), (5632, 1024), (1552, 1024), (1088, 1024), (1024, 2816),
                                 (1024, 512), (32000, 1024)])
def test_bench_one_row_linear(benchmark, n, k, path):
    _bench_one_row(benchmark, n, k, path)


def _bench_one_row(benchmark, n, k, path, reps=30):
    """x [1, k] . W [n, k]^T on the matrix-vector kernel (``matvec``: its tiles; ``matvec_multiwave``:
    the tiles without the one-wave rule) or cuBLAS, weight bytes / time."""
    from deepinfer_kernels.tilelang.matvec import _kernel, pick_tiles

    x = torch.randn(1, k, device="cuda").to(torch.bfloat16)
    w = (torch.randn(n, k, device="cuda") * k ** -0.5).to(torch.bfloat16)
    if path == "cublas":
        def fn():
            return F.linear(x, w)
        tiles = None
    else:
        one_wave = path == "matvec"
        kernel, tiles = _kernel(n, k, torch.bfloat16, one_wave=one_wave), pick_tiles(n, k, one_wave)
        out = torch.empty(1, n, dtype=torch.bfloat16, device="cuda")

        def fn():
            kernel(x, w, out)
            return out
    T.record_benchmark(benchmark, fn, bytes_moved=w.numel() * 2 + k * 2 + n * 2, flops=2.0 * n * k,
                       extra={"n": n, "k": k, "path": path, "tiles": tiles}, reps=reps)


@pytest.mark.parametrize("path", ["matvec", "matvec_multiwave", "cublas"])
@pytest.mark.parametrize("n,k", [(3072, 32768), (32768, 1024), (8192, 1024), (8064, 3072), (53760, 3072),
                                 (3072, 26880), (129280, 3072)])
def test_bench_one_row_linear_flash(benchmark, n, k, path):
    """flash's batch-1 projections (o_proj, q_b, the indexer query, the MoE input (router + shared
    gate/up), the dense FFN of `flash-slice`'s layer 0, lm_head): above 32 MB ``linear`` takes the
    kernel only with >= 3 pipeline steps of K (``ops.linear.matvec_serves``), which these rows show
    side by side; ``matvec_multiwave`` is the kernel on the tiles of before the one-wave rule
    (``pick_tiles(..., one_wave=False)``; the same tiles where that rule changes nothing)."""
    _bench_one_row(benchmark, n, k, path, reps=20)


@pytest.mark.parametrize("path", ["fused", "norm_then_matvec"])
@pytest.mark.parametrize("n,k", [(1552, 1024), (3072, 3072)])
def test_bench_rms_norm_matvec(benchmark, n, k, path):
    """A layer's input norm + its fused input projection at batch 1 (`mini`: [1552, 1024]; a flash-width
    row, K = 3072): one launch with the norm in the prologue vs the norm kernel then the matrix-vector
    kernel, both timed in a CUDA graph (what a decode step replays)."""
    from deepinfer_kernels.tilelang.matvec import matvec_tilelang, rms_norm_matvec_tilelang
    from deepinfer_kernels.tilelang.norm import rms_norm_tilelang

    x = torch.randn(1, k, device="cuda").to(torch.bfloat16)
    nw = torch.rand(k, device="cuda") + 0.5
    w = (torch.randn(n, k, device="cuda") * k ** -0.5).to(torch.bfloat16)
    if path == "fused":
        def fn():
            return rms_norm_matvec_tilelang(x, nw, 1e-6, w).y
    else:
        def fn():
            return matvec_tilelang(rms_norm_tilelang(x, nw, 1e-6), w)
    T.record_benchmark(benchmark, fn, bytes_moved=w.numel() * 2 + k * 6 + n * 2, flops=2.0 * n * k,
                       extra={"n": n, "k": k, "path": path}, reps=30)
