"""The all-greedy, draft-free sampler path (plain greedy decoding) against the general path."""

import pytest
import torch

from deepinfer_engine.sampler import Sampler, SamplingBatch
from deepinfer_kernels.ops.verification import VERIFIED_END


def _batch(req_cnt: int, all_greedy: bool, num_top_logprobs: list[int] | None = None) -> SamplingBatch:
    return SamplingBatch(torch.zeros(req_cnt), torch.full((req_cnt,), -1, dtype=torch.int32),
                         torch.ones(req_cnt), torch.arange(req_cnt, dtype=torch.int64),
                         num_top_logprobs or [0] * req_cnt, all_greedy=all_greedy, filters=False)


@pytest.mark.parametrize("seqlens", [[1, 1, 1, 1], [1, 0, 1, 1, 0]])   # one row each; the padded layout
def test_greedy_fast_path_equals_general_path(seqlens):
    g = torch.Generator().manual_seed(len(seqlens))
    seqlens_q = torch.tensor(seqlens, dtype=torch.int32)
    ftp = (torch.cumsum(seqlens_q, 0) - seqlens_q).to(torch.int32)
    rows = max(int(seqlens_q.sum()), 1)
    logits = torch.randn(rows, 50, generator=g).to(torch.bfloat16).float()
    logits[0, 7] = logits[0, 11] = logits[0].max() + 1   # a tie: both paths take the lower column
    positions = torch.arange(rows, dtype=torch.int64) + 40
    sampler = Sampler()
    fast = sampler.sample(logits.clone(), _batch(len(seqlens), True), ftp, seqlens_q, positions, checked=False)
    general = sampler.sample(logits.clone(), _batch(len(seqlens), False), ftp, seqlens_q, positions, checked=False)
    assert int(fast.token_ids[0]) == 7
    for field in ("token_ids", "token_logprobs", "verified_token_ids", "verified_logprobs", "num_accepted",
                  "final_row"):
        got, want = getattr(fast, field), getattr(general, field)
        assert got.dtype == want.dtype and got.shape == want.shape, field
        torch.testing.assert_close(got, want, rtol=0, atol=0, msg=field)
    assert bool((fast.verified_token_ids == VERIFIED_END).all())
    assert fast.top_values is None and fast.top_ids is None


def test_greedy_fast_path_not_taken_for_top_logprobs_and_rejects_several_rows():
    sampler = Sampler()
    logits = torch.randn(3, 20)
    ftp, seqlens_q = torch.tensor([0, 1, 2], dtype=torch.int32), torch.ones(3, dtype=torch.int32)
    out = sampler.sample(logits, _batch(3, True, [0, 2, 0]), ftp, seqlens_q, torch.arange(3))
    assert out.top_values is not None and out.top_values.shape == (3, 2)   # the general path served it
    with pytest.raises(ValueError, match="seqlens_q: at most 1"):
        Sampler.sample_greedy_without_drafts(logits, torch.tensor([0], dtype=torch.int32),
                                             torch.tensor([3], dtype=torch.int32))


@pytest.mark.parametrize("all_greedy", [True, False])
def test_sample_tokens_is_what_sample_gives_without_the_verification_outputs(all_greedy):
    """A decode step without speculation asks only for the main tokens (`Sampler.sample_tokens`, what
    the whole step runs): the tokens and logprobs `sample` gives, greedy (the pick alone) or not."""
    g = torch.Generator().manual_seed(9)
    seqlens_q = torch.tensor([1, 0, 1, 1], dtype=torch.int32)
    ftp = (torch.cumsum(seqlens_q, 0) - seqlens_q).to(torch.int32)
    logits = torch.randn(3, 64, generator=g)
    positions = torch.arange(3, dtype=torch.int64) + 9
    batch = _batch(4, all_greedy)
    sampler = Sampler()
    tok, lp = sampler.sample_tokens(logits.clone(), batch, ftp, seqlens_q, positions, checked=False)
    want = sampler.sample(logits.clone(), batch, ftp, seqlens_q, positions, checked=False)
    assert tok.dtype == torch.int32 and torch.equal(tok, want.token_ids)
    torch.testing.assert_close(lp, want.token_logprobs, rtol=0, atol=0)
