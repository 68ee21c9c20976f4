"""greedy_pick: the reference against torch's argmax / log_softmax, its argument checks (CPU), and
the TileLang kernel against the reference (GPU)."""

import pytest
import torch

from deepinfer_kernels.ops.sampling.greedy import greedy_pick, greedy_pick_ref


def _layout(seqlens):
    seqlens_q = torch.tensor(seqlens, dtype=torch.int32)
    ftp = (torch.cumsum(seqlens_q, 0) - seqlens_q).to(torch.int32)
    return ftp, seqlens_q, max(int(seqlens_q.sum()), 1)


def test_reference_is_argmax_and_log_softmax_at_each_final_row():
    ftp, seqlens_q, rows = _layout([1, 0, 1, 1])
    logits = torch.randn(rows, 300, generator=torch.Generator().manual_seed(0))
    logits[1, 17] = logits[1, 250] = logits[1].max() + 2          # a tie: the lower column
    tok, lp, final = greedy_pick(logits, ftp, seqlens_q)
    assert final.tolist() == [0, 0, 1, 2] and tok.dtype == torch.int32 and final.dtype == torch.int32
    assert tok[2] == 17
    for q, r in enumerate(final.tolist()):
        assert tok[q] == int(logits[r].argmax())
        assert lp[q] == torch.log_softmax(logits[r], 0)[tok[q]]


def test_argument_errors_name_the_field():
    logits = torch.randn(2, 10)
    ftp, seqlens_q, _ = _layout([1, 1])
    with pytest.raises(ValueError, match="seqlens_q must be 0 or 1"):
        greedy_pick(logits, ftp, torch.tensor([1, 2], dtype=torch.int32))
    with pytest.raises(ValueError, match=r"ftp \+ seqlens_q - 1 must lie in \[0, 2\)"):
        greedy_pick(logits, torch.tensor([0, 2], dtype=torch.int32), seqlens_q)
    with pytest.raises(ValueError, match="seqlens_q must have shape"):
        greedy_pick(logits, ftp, seqlens_q[:1])
    with pytest.raises(TypeError, match="logits must have dtype"):
        greedy_pick(logits.to(torch.int32), ftp, seqlens_q)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("vocab", [50, 4096, 4097, 32000, 129280])
def test_kernel_matches_the_reference(vocab, dtype):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    from deepinfer_kernels.tilelang.greedy import greedy_pick_tilelang

    g = torch.Generator(device="cuda").manual_seed(vocab)
    seqlens = [1, 0, 1, 1, 1, 0, 1] + [1] * 60
    ftp, seqlens_q, rows = _layout(seqlens)
    ftp, seqlens_q = ftp.cuda(), seqlens_q.cuda()
    logits = (torch.randn(rows, vocab, device="cuda", generator=g) * 3).to(dtype)
    top = logits.float().max() + 1
    # requests 0, 2, 3 read rows 0, 1, 2 (request 1 has no row: it reads row 0)
    logits[0, vocab - 1] = top                       # the last column
    logits[1, vocab // 3] = logits[1, vocab - 2] = top   # a tie across chunks: the lower column
    logits[2, :] = -float("inf")                     # nothing finite but one column
    logits[2, min(7, vocab - 1)] = 0.0
    got = greedy_pick_tilelang(logits, ftp, seqlens_q)
    want = greedy_pick_ref(logits, ftp, seqlens_q)
    assert got[2][:4].tolist() == [0, 0, 1, 2]
    assert torch.equal(got[0], want[0]) and torch.equal(got[2], want[2])
    assert got[0][0] == vocab - 1 and got[0][2] == min(vocab // 3, vocab - 2) and got[0][3] == min(7, vocab - 1)
    torch.testing.assert_close(got[1], want[1], rtol=2e-5, atol=2e-5)
    assert got[1][3] == 0.0                         # the only finite logit: probability 1
    assert torch.equal(greedy_pick(logits, ftp.long(), seqlens_q.long())[0], want[0])   # int64 layout, dispatch
