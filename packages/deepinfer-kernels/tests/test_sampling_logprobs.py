"""compute_logprobs / gather_token_logprobs / top_logprobs."""

from __future__ import annotations

import pytest
import torch

from deepinfer_kernels.ops.sampling import compute_logprobs, gather_token_logprobs, top_logprobs


def test_logprobs_match_float64_log_softmax():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(10, 300, generator=g) * 5
    lp = compute_logprobs(logits.to(torch.bfloat16))
    assert lp.dtype == torch.float32
    torch.testing.assert_close(lp.double(), torch.log_softmax(logits.to(torch.bfloat16).double(), 1), atol=1e-5, rtol=0)
    tok = torch.randint(0, 300, (10,), generator=g)
    torch.testing.assert_close(gather_token_logprobs(lp, tok), lp[torch.arange(10), tok])


def test_masked_columns_are_minus_inf():
    lp = compute_logprobs(torch.tensor([[0.0, float("-inf"), 0.0]]))
    assert lp[0, 1] == float("-inf")
    torch.testing.assert_close(lp[0, [0, 2]], torch.log(torch.tensor([0.5, 0.5])))


def test_top_logprobs_descending_with_ties_by_id():
    lp = torch.tensor([[-1.0, -0.5, -1.0, -3.0, -0.5], [-2.0, -2.0, -2.0, -2.0, -2.0]])
    vals, ids = top_logprobs(lp, 3)
    assert ids.dtype == torch.int32
    assert ids.tolist() == [[1, 4, 0], [0, 1, 2]]
    assert vals.tolist() == [[-0.5, -0.5, -1.0], [-2.0, -2.0, -2.0]]
    v0, i0 = top_logprobs(lp, 0)
    assert v0.shape == (2, 0) and i0.shape == (2, 0)


def test_top_logprobs_match_loop_oracle():
    g = torch.Generator().manual_seed(1)
    lp = compute_logprobs(torch.randint(-3, 3, (50, 40), generator=g).float())
    vals, ids = top_logprobs(lp, 7)
    for r in range(50):
        order = sorted(range(40), key=lambda c: (-float(lp[r, c]), c))[:7]
        assert ids[r].tolist() == order
        assert vals[r].tolist() == [float(lp[r, c]) for c in order]


def test_argument_errors():
    with pytest.raises(ValueError, match=r"n must be in \[0, vocab=4\]"):
        top_logprobs(torch.zeros(2, 4), 5)
    with pytest.raises(ValueError, match=r"token_ids must lie in \[0, 4\)"):
        gather_token_logprobs(torch.zeros(2, 4), torch.tensor([0, 4]))
    with pytest.raises(ValueError, match=r"logits must have shape \[rows, vocab\]"):
        compute_logprobs(torch.zeros(4))


def test_top_logprobs_large_vocab_with_minus_inf_and_ties():
    g = torch.Generator().manual_seed(2)
    x = torch.randint(-50, 0, (8, 4000), generator=g).float()
    x[:, 100:3990] = float("-inf")          # fewer finite values than n in some rows
    x[0] = float("-inf")
    vals, ids = top_logprobs(x, 20)
    for r in range(8):
        order = sorted(range(4000), key=lambda c: (-float(x[r, c]), c))[:20]
        assert ids[r].tolist() == order
        assert vals[r].tolist() == [float(x[r, c]) for c in order]
