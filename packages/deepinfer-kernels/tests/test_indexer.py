import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from deepinfer_kernels.ops.indexer import (
    BF16_MAX,
    candidate_block_max,
    indexer_scores,
    indexer_topk_blocks,
    select_topk_blocks,
)
from deepinfer_kernels.ops.kv_fp4 import dequantize_index_k_fp4, quantize_index_k_fp4


def test_indexer_scores_match_loop():
    g = torch.Generator().manual_seed(0)
    rows, heads, di, slots = 3, 2, 32, 10
    q = torch.randn(rows, heads, di, generator=g)
    w = torch.randn(rows, heads, generator=g)
    pool = quantize_index_k_fp4(torch.randn(slots, di, generator=g))
    idx = torch.tensor([[0, 3, -1], [9, -1, -1], [2, 2, 5]], dtype=torch.int32)
    s = indexer_scores(q, w, pool, idx)
    keys = dequantize_index_k_fp4(pool, di)
    for r in range(rows):
        for j in range(3):
            if idx[r, j] < 0:
                assert s[r, j] == float("-inf")
            else:
                want = sum(float(w[r, h]) * max(0.0, float(q[r, h] @ keys[idx[r, j]])) for h in range(heads))
                assert math.isclose(float(s[r, j]), want, rel_tol=1e-5, abs_tol=1e-5)


def test_candidate_block_max_rules():
    logits = torch.tensor([[1.0, 5.0, 2.0, 3e39, 0.5, 7.0, 9.0],
                           [4.0, -1.0, 8.0, 2.0, 0.0, 0.0, 0.0]])
    scores, nvalid = candidate_block_max(logits, torch.tensor([6, 3]), 2)
    assert nvalid.tolist() == [3, 2]
    # row 0: blocks [1,5] [2,3e39->bf16 max] [0.5,7] (last valid -> inf), block 3 invalid
    assert scores[0].tolist() == [5.0, BF16_MAX, float("inf"), float("-inf")]
    # row 1: valid entries 4,-1,8 -> blocks [4,-1] [8] -> last valid forced inf
    assert scores[1].tolist() == [4.0, float("inf"), float("-inf"), float("-inf")]


def _brute_force(scores_row, valid_len, block_size, topk):
    nb_valid = (valid_len + block_size - 1) // block_size
    blocks = []
    for b in range(nb_valid):
        vals = scores_row[b * block_size: min((b + 1) * block_size, valid_len)]
        s = min(max(vals), BF16_MAX)
        if b == nb_valid - 1:
            s = math.inf
        blocks.append((s, b))
    blocks.sort(key=lambda sb: (-sb[0], sb[1]))
    chosen = [b for _, b in blocks[:topk]]
    return chosen + [-1] * (topk - len(chosen))


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 6), st.integers(1, 40), st.integers(1, 5), st.integers(1, 6), st.integers(0, 2**31 - 1),
       st.booleans())
def test_topk_selection_equals_brute_force(rows, n, block_size, topk, seed, coarse):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, n, generator=g)
    if coarse:  # many exact ties
        logits = logits.round()
    valid = torch.randint(0, n + 1, (rows,), generator=g)
    scores, nvalid = candidate_block_max(logits, valid, block_size)
    sel = select_topk_blocks(scores, nvalid, topk)
    for r in range(rows):
        want = _brute_force(logits[r].tolist(), int(valid[r]), block_size, topk)
        assert sel[r].tolist() == want
        if int(valid[r]) > 0:  # the most recent block is always selected
            assert (int(valid[r]) - 1) // block_size in sel[r].tolist()


def test_fused_topk_blocks_equal_the_chain():
    """`indexer_topk_blocks` (one call, what the model uses) == scores -> block max -> top-k, with a
    row that has no far entry and -1 candidates."""
    g = torch.Generator().manual_seed(3)
    rows, heads, di, n, slots = 5, 2, 32, 23, 40
    q = torch.randn(rows, heads, di, generator=g).bfloat16()
    w = torch.randn(rows, heads, generator=g)
    pool = quantize_index_k_fp4(torch.randn(slots, di, generator=g))
    idx = torch.randint(-1, slots, (rows, n), generator=g, dtype=torch.int32)
    valid = torch.tensor([23, 0, 7, 1, 16])
    got = indexer_topk_blocks(q, w, pool, idx, valid, 4, 3)
    want = select_topk_blocks(*candidate_block_max(indexer_scores(q, w, pool, idx), valid, 4), 3)
    assert got.dtype == torch.int32 and torch.equal(got, want)
    assert got[1].tolist() == [-1, -1, -1] and got[3].tolist() == [0, -1, -1]


def test_indexer_topk_blocks_weight_scale_is_the_scaled_float_weights():
    """weight_scale multiplies the (any-dtype, possibly strided) head weights in float32 first."""
    from deepinfer_kernels.ops.indexer import indexer_topk_blocks
    from deepinfer_kernels import testing as TT

    c = TT.make_indexer_case(5, 4, 64, 120, 500, "cpu", seed=4, empty_frac=0.05)
    wide = torch.randn(5, 12).to(torch.bfloat16)
    view = wide[:, 4:8]
    got = indexer_topk_blocks(c.q, view, c.k_pool, c.indices, c.valid_lens, 4, 6, weight_scale=0.5)
    want = indexer_topk_blocks(c.q, view.float() * 0.5, c.k_pool, c.indices, c.valid_lens, 4, 6)
    assert torch.equal(got, want)
