"""Benchmarks: a weight's one-row projection after a latency-bound stretch, with the weight's head
warmed in L2 during that stretch (``ops.l2_prefetch`` on a side stream) or not (budget 0), as a
batch-1 decode step runs it: in a CUDA graph, L2 flushed before each call.

The stretch is ``torch.cuda._sleep`` on the main stream (one thread spinning for ``gap_us``): HBM
idles there as it does under the indexer chain or sparse attention over a few hundred keys. Each
row's time counts the stretch and the projection; the saving is the budget-0 row minus the row.
Weights: flash's o_proj [3072, 32768] after the attention (the gap before it is ~15-25 us at
`flash-slice` batch 1), lm_head [129280, 3072] and the layer input projection [2248, 3072] after
the experts' combine (~5 us)."""

import pytest
import torch

pytestmark = pytest.mark.gpu

T = pytest.importorskip("deepinfer_kernels.tilelang.testing")

MB = 1 << 20


def _cycles(us: float) -> int:
    return int(us * 1e-6 * torch.cuda.get_device_properties(0).clock_rate * 1e3)   # clock_rate: kHz


@pytest.mark.parametrize("region_kind", ["auto", "contiguous"])
@pytest.mark.parametrize("budget_mb", [0, 8, 16, 24, 32, 48])
@pytest.mark.parametrize("n,k,gap_us", [(3072, 32768, 20.0), (129280, 3072, 5.0), (2248, 3072, 5.0)])
def test_bench_projection_after_a_gap(benchmark, n, k, gap_us, budget_mb, region_kind):
    """``region_kind``: the op's region (``auto``: a prefix of every row of o_proj) or the weight's
    first bytes whatever its rows (``contiguous``: the flat weight), on o_proj at 24 MB."""
    from deepinfer_kernels.ops.l2_prefetch import l2_prefetch, prefetch_region
    from deepinfer_kernels.ops.linear import linear

    if budget_mb > 24 and n != 3072:
        pytest.skip("the budget sweep runs on o_proj")
    if region_kind == "contiguous" and (n != 3072 or budget_mb != 24):
        pytest.skip("the region comparison runs on o_proj at 24 MB")
    x = torch.randn(1, k, device="cuda").to(torch.bfloat16)
    w = (torch.randn(n, k, device="cuda") * k ** -0.5).to(torch.bfloat16)
    side, cycles, budget = torch.cuda.Stream(), _cycles(gap_us), budget_mb * MB

    def fn():
        if budget:
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                l2_prefetch(w if region_kind == "auto" else w.view(-1), budget)
        torch.cuda._sleep(cycles)
        y = linear(x, w)
        if budget:
            torch.cuda.current_stream().wait_stream(side)
        return y

    region = prefetch_region(w if region_kind == "auto" else w.view(-1), budget)
    T.record_benchmark(benchmark, fn, bytes_moved=w.numel() * 2, reps=30,
                       extra={"n": n, "k": k, "gap_us": gap_us, "budget_mb": budget_mb, "region_kind": region_kind,
                              "warmed_bytes": 0 if region is None else region.nbytes,
                              "whole_rows": None if region is None else region.whole_rows})
