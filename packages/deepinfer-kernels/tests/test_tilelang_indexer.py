"""GPU tests: TileLang lightning indexer vs ``deepinfer_kernels.ops.indexer`` references."""

import pytest
import torch

pytestmark = pytest.mark.gpu

ref = pytest.importorskip("deepinfer_kernels.ops.indexer")
T = pytest.importorskip("deepinfer_kernels.testing")


@pytest.mark.parametrize("rows,heads,di,n", [(3, 8, 128, 1000), (5, 64, 128, 700), (4, 2, 32, 77), (2, 8, 64, 512)])
def test_indexer_scores(rows, heads, di, n):
    from deepinfer_kernels.tilelang.indexer import indexer_scores_tilelang

    c = T.make_indexer_case(rows, heads, di, n, 3000, "cuda", seed=n, empty_frac=0.1)
    got = indexer_scores_tilelang(c.q, c.weights, c.k_pool, c.indices)
    want = ref.indexer_scores_ref(c.q, c.weights, c.k_pool, c.indices)
    torch.cuda.synchronize()
    assert torch.equal(torch.isneginf(got), torch.isneginf(want))
    fin = torch.isfinite(want)
    scale = want[fin].abs().max().clamp(min=1.0)
    torch.testing.assert_close(got[fin] / scale, want[fin] / scale, atol=1e-4, rtol=1e-3)


@pytest.mark.parametrize("block_size", [1, 3, 16, 64])
def test_candidate_block_max_exact(block_size):
    from deepinfer_kernels.tilelang.indexer import candidate_block_max_tilelang

    g = torch.Generator().manual_seed(block_size)
    rows, n = 6, 333
    logits = torch.randn(rows, n, generator=g)
    logits[0, 5] = 3.4e38 if block_size > 1 else 1.0       # finite in fp32, above the bf16 max: clamps
    logits[1, :40] = float("-inf")
    logits = logits.cuda()
    vlen = torch.tensor([n, 0, 1, 100, 332, 57], dtype=torch.int32, device="cuda")
    s, nv = candidate_block_max_tilelang(logits, vlen, block_size)
    rs, rnv = ref.candidate_block_max_ref(logits, vlen, block_size)
    torch.cuda.synchronize()
    assert torch.equal(nv, rnv.to(torch.int32))
    assert torch.equal(s, rs)


@pytest.mark.parametrize("nb,topk", [(1, 4), (7, 3), (64, 16), (1000, 16), (3000, 32)])
def test_select_topk_blocks_exact(nb, topk):
    from deepinfer_kernels.tilelang.indexer import select_topk_blocks_tilelang

    g = torch.Generator().manual_seed(nb)
    rows = 5
    scores = torch.randn(rows, nb, generator=g).round()                 # many exact ties
    nvalid = torch.randint(0, nb + 1, (rows,), generator=g)
    nvalid[0] = nb
    col = torch.arange(nb).unsqueeze(0)
    scores = scores.masked_fill(col >= nvalid.unsqueeze(1), float("-inf"))
    scores = torch.where(col == (nvalid - 1).unsqueeze(1), float("inf"), scores)
    scores, nvalid = scores.cuda(), nvalid.to(torch.int32).cuda()
    got = select_topk_blocks_tilelang(scores, nvalid, topk)
    want = ref.select_topk_blocks_ref(scores, nvalid, topk)
    torch.cuda.synchronize()
    assert torch.equal(got, want)


@pytest.mark.parametrize("rows,heads,di,n,bs,topk", [(4, 8, 128, 2000, 16, 16), (3, 64, 128, 1500, 64, 8),
                                                     (6, 2, 32, 90, 2, 4), (2, 8, 128, 40, 16, 16)])
@pytest.mark.parametrize("vlen_dtype", [torch.int32, torch.int64])   # the engine passes int64 counts
def test_fused_indexer_topk(rows, heads, di, n, bs, topk, vlen_dtype):
    from deepinfer_kernels.tilelang.indexer import (
        candidate_block_max_tilelang,
        indexer_scores_tilelang,
        indexer_topk_blocks_tilelang,
        select_topk_blocks_tilelang,
    )

    c = T.make_indexer_case(rows, heads, di, n, 4000, "cuda", seed=n + bs, empty_frac=0.02)
    c.valid_lens[0] = 0                                                   # a row with no far entries
    fused = indexer_topk_blocks_tilelang(c.q, c.weights, c.k_pool, c.indices, c.valid_lens.to(vlen_dtype), bs, topk)
    # identical to the unfused TileLang chain (same score arithmetic)
    s = indexer_scores_tilelang(c.q, c.weights, c.k_pool, c.indices)
    unfused = select_topk_blocks_tilelang(*candidate_block_max_tilelang(s, c.valid_lens, bs), topk)
    torch.cuda.synchronize()
    assert torch.equal(fused, unfused)
    # and equivalent to the reference chain up to score rounding: same -1 padding, the forced last
    # block first, and the chosen blocks' reference scores equal the reference top-k scores
    rs = ref.indexer_scores_ref(c.q, c.weights, c.k_pool, c.indices)
    rb, rnv = ref.candidate_block_max_ref(rs, c.valid_lens, bs)
    want = ref.select_topk_blocks_ref(rb, rnv, topk)
    assert torch.equal(fused < 0, want < 0)
    has = rnv > 0
    assert torch.equal(fused[has, 0].long(), (rnv[has] - 1).long())
    for r in range(rows):
        k = int((want[r] >= 0).sum())
        got_s = rb[r, fused[r, :k].long()].sort(descending=True).values
        want_s = rb[r, want[r, :k].long()].sort(descending=True).values
        fin = torch.isfinite(want_s)
        assert torch.equal(torch.isfinite(got_s), fin)
        torch.testing.assert_close(got_s[fin], want_s[fin], atol=1e-3, rtol=1e-3)


def test_public_ops_pick_the_kernels_on_cuda():
    """The public wrappers dispatch to TileLang on SM90 (bf16 queries) and agree with the chained
    references; float32 queries keep the reference arithmetic exactly."""
    from deepinfer_kernels.ops.indexer import candidate_block_max, indexer_topk_blocks, select_topk_blocks

    c = T.make_indexer_case(6, 8, 128, 900, 3000, "cuda", seed=11, empty_frac=0.05)
    s = ref.indexer_scores_ref(c.q, c.weights, c.k_pool, c.indices)
    rb, rnv = ref.candidate_block_max_ref(s, c.valid_lens, 16)
    gb, gnv = candidate_block_max(s, c.valid_lens, 16)
    assert torch.equal(gb, rb) and torch.equal(gnv, rnv.to(torch.int32))
    assert torch.equal(select_topk_blocks(rb, rnv, 16), ref.select_topk_blocks_ref(rb, rnv, 16))
    fused = indexer_topk_blocks(c.q.bfloat16(), c.weights, c.k_pool, c.indices, c.valid_lens, 16, 16)
    want = ref.select_topk_blocks_ref(rb, rnv, 16)
    assert torch.equal(fused < 0, want < 0)
    assert torch.equal(fused[:, 0], want[:, 0])                      # the forced last block leads
    exact = indexer_topk_blocks(c.q.float(), c.weights, c.k_pool, c.indices, c.valid_lens, 16, 16)
    assert torch.equal(exact, ref.indexer_topk_blocks_ref(c.q.float(), c.weights, c.k_pool, c.indices,
                                                          c.valid_lens, 16, 16))


def test_fused_indexer_scales_strided_bf16_weights_like_torch():
    """Head weights as a bf16 column slice with a scale (the engine's fused GEMM output and
    n_heads ** -0.5): exactly the result of the float32 weights torch scales first."""
    from deepinfer_kernels.tilelang.indexer import indexer_topk_blocks_tilelang

    c = T.make_indexer_case(6, 8, 128, 300, 4000, "cuda", seed=9, empty_frac=0.02)
    wide = torch.randn(6, 24, device="cuda").to(torch.bfloat16)
    wide[:, 8:16] = c.weights.to(torch.bfloat16)
    view, scale = wide[:, 8:16], 8 ** -0.5
    got = indexer_topk_blocks_tilelang(c.q, view, c.k_pool, c.indices, c.valid_lens, 16, 16, scale)
    want = indexer_topk_blocks_tilelang(c.q, view.float() * scale, c.k_pool, c.indices, c.valid_lens, 16, 16)
    torch.cuda.synchronize()
    assert torch.equal(got, want)
