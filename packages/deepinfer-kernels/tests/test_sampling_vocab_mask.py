"""apply_vocab_mask_inplace / apply_vocab_mask_by_step_inplace on xgrammar-style packed bitmasks."""

from __future__ import annotations

import pytest
import torch

from deepinfer_kernels.ops.sampling import (
    NO_VOCAB_MASK,
    apply_vocab_mask_by_step_inplace,
    apply_vocab_mask_inplace,
    unpack_vocab_mask,
)

NEG = float("-inf")


def pack(allowed: list[list[bool]], width: int | None = None) -> torch.Tensor:
    """Pack like xgrammar: bit t % 32 of int32 word t // 32 set <=> token t allowed."""
    vocab = len(allowed[0])
    width = width or -(-vocab // 32)
    words = []
    for row in allowed:
        ws = []
        for w in range(width):
            v = 0
            for b in range(32):
                t = w * 32 + b
                if t < vocab and row[t]:
                    v |= 1 << b
            ws.append(v - (1 << 32) if v >= 1 << 31 else v)  # int32 two's complement (bit 31 -> negative)
        words.append(ws)
    return torch.tensor(words, dtype=torch.int32)


def random_allowed(n: int, vocab: int, g: torch.Generator) -> list[list[bool]]:
    return (torch.rand(n, vocab, generator=g) < 0.4).tolist()


def test_unpack_roundtrip_including_sign_bit():
    g = torch.Generator().manual_seed(0)
    allowed = random_allowed(5, 70, g)
    allowed[0] = [True] * 70  # every bit set: words are -1
    assert unpack_vocab_mask(pack(allowed), 70).tolist() == allowed


@pytest.mark.parametrize("capturable", [False, True], ids=["reference", "capturable"])
def test_rows_to_masks_oracle(capturable):
    """Both variants: the reference (CPU) and the sync-free one CUDA graphs capture."""
    from deepinfer_kernels.ops.capture import force_capturable

    g = torch.Generator().manual_seed(1)
    vocab, rows = 77, 9
    allowed = random_allowed(4, vocab, g)
    mask = pack(allowed, width=4)  # wider than needed: extra bits ignored
    logits = torch.randn(rows, vocab, generator=g)
    ids = torch.tensor([0, -1, 3, 3, 1, -1, 2, 0, -1], dtype=torch.int32)
    expected = logits.clone()
    for r, m in enumerate(ids.tolist()):
        if m != NO_VOCAB_MASK:
            for t in range(vocab):
                if not allowed[m][t]:
                    expected[r, t] = NEG
    with force_capturable(capturable):
        apply_vocab_mask_inplace(logits, mask, ids)
    assert torch.equal(logits, expected)


def test_by_step_masks_one_row_per_request():
    g = torch.Generator().manual_seed(2)
    vocab = 40
    seqlens = [3, 1, 4, 2]
    ftp = torch.tensor([0, 3, 4, 8], dtype=torch.int32)
    s = torch.tensor(seqlens, dtype=torch.int32)
    allowed = random_allowed(3, vocab, g)
    mask = pack(allowed)
    indices = torch.tensor([2, 0, NO_VOCAB_MASK, 1], dtype=torch.int32)
    for step in range(4):
        logits = torch.randn(10, vocab, generator=g)
        expected = logits.clone()
        for i, first in enumerate(ftp.tolist()):
            if step < seqlens[i] and indices[i] != NO_VOCAB_MASK:
                for t in range(vocab):
                    if not allowed[int(indices[i])][t]:
                        expected[first + step, t] = NEG
        apply_vocab_mask_by_step_inplace(logits, mask, indices, ftp, step, seqlens_q=s)
        assert torch.equal(logits, expected), step


def test_by_step_without_ftp_is_one_row_per_request():
    allowed = [[True, False, True], [False, True, False]]
    logits = torch.zeros(3, 3)
    apply_vocab_mask_by_step_inplace(logits, pack(allowed), torch.tensor([1, NO_VOCAB_MASK, 0], dtype=torch.int32))
    assert logits.tolist() == [[NEG, 0.0, NEG], [0.0, 0.0, 0.0], [0.0, NEG, 0.0]]


def test_argument_errors():
    logits = torch.zeros(4, 70)
    mask = torch.zeros(2, 3, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"vocab_mask must have shape \[num_masks, >= ceil\(vocab/32\) = 3\]"):
        apply_vocab_mask_inplace(logits, mask[:, :2], torch.zeros(4, dtype=torch.int32))
    with pytest.raises(TypeError, match="vocab_mask must have dtype int32"):
        apply_vocab_mask_inplace(logits, mask.long(), torch.zeros(4, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"row_mask_ids must be -1 \(no mask\) or in \[0, num_masks=2\)"):
        apply_vocab_mask_inplace(logits, mask, torch.full((4,), 2, dtype=torch.int32))
    with pytest.raises(ValueError, match="row ftp"):
        apply_vocab_mask_by_step_inplace(logits, mask, torch.zeros(2, dtype=torch.int32),
                                         torch.tensor([0, 2], dtype=torch.int32), step=2)
    with pytest.raises(ValueError, match="one row per request"):
        apply_vocab_mask_by_step_inplace(logits, mask, torch.zeros(2, dtype=torch.int32))
