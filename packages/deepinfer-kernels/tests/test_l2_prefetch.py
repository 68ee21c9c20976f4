"""L2 prefetch (ops.l2_prefetch): the region it warms (CPU), the CPU path's no-op and argument
checks; on the GPU the kernel over every region shape, eager and captured on a side stream."""

import pytest
import torch

from deepinfer_kernels.ops.l2_prefetch import (
    CHUNK_BYTES,
    MAX_ROW_PREFIX,
    PrefetchRegion,
    l2_prefetch,
    l2_prefetch_ref,
    prefetch_region,
)

MB = 1 << 20


def _meta(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, dtype=dtype, device="meta")


def test_wide_rows_get_a_prefix_of_every_row():
    """flash's o_proj [3072, 32768]: every CTA of a one-row projection streams its rows along K, so
    the first 8 KB of each of the 3,072 rows (24 MB) are what it reads first."""
    region = prefetch_region(_meta(3072, 32768), 24 * MB)
    assert region == PrefetchRegion(rows=3072, row_bytes=8192, stride_bytes=65536)
    assert not region.whole_rows and region.nbytes == 24 * MB


def test_narrow_rows_and_small_weights_get_a_contiguous_prefix():
    # lm_head [129280, 3072]: 194 bytes a row would be too many small requests -> the first 24 MB
    region = prefetch_region(_meta(129280, 3072), 24 * MB)
    assert region == PrefetchRegion(1, 24 * MB, 24 * MB) and region.whole_rows
    # a weight inside the budget: all of it, in CHUNK_BYTES pieces (the tail under one piece left)
    w = _meta(2248, 3072)
    assert prefetch_region(w, 24 * MB).row_bytes == w.numel() * 2 // CHUNK_BYTES * CHUNK_BYTES
    # under one piece: the whole weight, to 16 bytes
    assert prefetch_region(_meta(100, 24), 24 * MB) == PrefetchRegion(1, 4800, 4800)
    # a per-row prefix is capped at what the kernel issues per row
    assert prefetch_region(_meta(16, 1 << 20), 8 * MB).row_bytes == MAX_ROW_PREFIX


def test_sizes_are_request_granules_and_bad_budgets_fail():
    for shape, budget in (((3072, 26880), 20 * MB + 7), ((1024, 8192), 3 * MB + 5), ((9,), 1000)):
        region = prefetch_region(_meta(*shape), budget)
        assert region.row_bytes % 16 == 0 and region.stride_bytes % 16 == 0 and region.nbytes <= budget
    assert prefetch_region(_meta(64, 64), 0) is None and prefetch_region(_meta(0, 64), MB) is None
    assert prefetch_region(_meta(7), MB) is None   # under one 16-byte granule
    with pytest.raises(ValueError, match="budget_bytes=-1: must be >= 0"):
        prefetch_region(_meta(64, 64), -1)


def test_cpu_path_changes_nothing_and_checks_its_arguments():
    w = torch.randn(64, 128).to(torch.bfloat16)
    before = w.clone()
    assert l2_prefetch(w, MB) is None and l2_prefetch_ref(w, MB) is None
    assert torch.equal(w, before)
    with pytest.raises(ValueError, match="weight: expected 1 or 2 dims"):
        l2_prefetch(torch.zeros(2, 2, 2), MB)
    with pytest.raises(ValueError, match="weight: must be contiguous"):
        l2_prefetch(w.t(), MB)
    with pytest.raises(ValueError, match="budget_bytes=-3"):
        l2_prefetch(w, -3)


@pytest.mark.gpu
@pytest.mark.parametrize("shape,budget", [((3072, 32768), 24 * MB), ((3072, 32768), 4 * MB),   # row prefixes
                                          ((129280, 3072), 24 * MB), ((2248, 3072), 24 * MB),   # contiguous
                                          ((100, 24), MB), ((16, 1 << 20), 8 * MB), ((513,), 4096)])
def test_kernel_warms_every_region_shape_and_writes_nothing(shape, budget):
    """Every region shape (a prefix of every row, 1-4 requests a row; a contiguous prefix in pieces,
    or shorter than one piece; a whole 1-D weight) issues without a fault, including requests that
    end at the tensor's last byte, and leaves the weight as it was."""
    from deepinfer_kernels.tilelang.l2_prefetch import l2_prefetch_tilelang

    g = torch.Generator(device="cuda").manual_seed(sum(shape))
    w = torch.randn(*shape, generator=g, device="cuda").to(torch.bfloat16)
    before = w.clone()
    l2_prefetch_tilelang(w, budget)
    l2_prefetch(w, budget)   # the public op dispatches to it on SM90
    torch.cuda.synchronize()
    assert torch.equal(w, before)


@pytest.mark.gpu
def test_kernel_in_a_captured_graph_on_a_side_stream():
    """As the decode step runs it: forked on a side stream inside a CUDA graph, joined at the end,
    beside a projection of the same weight; the replayed projection equals the eager one."""
    w = torch.randn(3072, 8192, device="cuda").to(torch.bfloat16)
    x = torch.randn(1, 8192, device="cuda").to(torch.bfloat16)
    want = torch.nn.functional.linear(x, w)
    side, out = torch.cuda.Stream(), torch.empty(1, 3072, dtype=torch.bfloat16, device="cuda")

    def step():
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            l2_prefetch(w, 8 * MB)
        out.copy_(torch.nn.functional.linear(x, w))
        torch.cuda.current_stream().wait_stream(side)

    step()   # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    out.zero_()
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, want)
