"""get_sum_smaller_probs vs a sort-based oracle; exact tie semantics."""

from __future__ import annotations

import pytest
import torch

from deepinfer_kernels.ops.sampling import get_sum_smaller_probs


def oracle(row: list[float], token: int) -> float:
    """Sort by (probability, column) ascending, then the inclusive prefix sum at the token."""
    order = sorted(range(len(row)), key=lambda c: (row[c], c))
    total = 0.0
    for c in order:
        total += row[c]
        if c == token:
            return total
    raise AssertionError


def test_matches_sort_oracle_with_many_ties():
    g = torch.Generator().manual_seed(0)
    rows, vocab = 200, 40
    probs = torch.randint(0, 6, (rows, vocab), generator=g).float()  # heavy ties, zeros included
    probs = probs / probs.sum(1, keepdim=True)
    tokens = torch.randint(0, vocab, (rows,), generator=g)
    out = get_sum_smaller_probs(probs, tokens)
    assert out.dtype == torch.float32
    p64 = probs.double()
    expected = torch.tensor([oracle(p64[r].tolist(), int(tokens[r])) for r in range(rows)], dtype=torch.float64)
    torch.testing.assert_close(out.double(), expected, atol=1e-6, rtol=0)


def test_tie_order_is_by_column_index_exactly():
    # Dyadic values: every partial sum is exact, so the tie rule is visible bit for bit.
    row = torch.tensor([[0.25, 0.125, 0.25, 0.125, 0.25]])
    cases = {1: 0.125, 3: 0.25, 0: 0.5, 2: 0.75, 4: 1.0}
    for tok, want in cases.items():
        assert float(get_sum_smaller_probs(row, torch.tensor([tok]))[0]) == want


def test_extremes():
    probs = torch.tensor([[0.0, 0.7, 0.3, 0.0], [1.0, 0.0, 0.0, 0.0]])
    assert get_sum_smaller_probs(probs, torch.tensor([1, 0])).tolist() == pytest.approx([1.0, 1.0])
    assert get_sum_smaller_probs(probs, torch.tensor([0, 3])).tolist() == [0.0, 0.0]  # zero columns first
    assert get_sum_smaller_probs(probs, torch.tensor([3, 1])).tolist() == [0.0, 0.0]
    assert get_sum_smaller_probs(torch.zeros(0, 5), torch.zeros(0, dtype=torch.int64)).shape == (0,)


def test_argument_errors():
    with pytest.raises(ValueError, match=r"token_ids must have shape \[rows\]"):
        get_sum_smaller_probs(torch.ones(2, 3), torch.zeros(3, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"token_ids must lie in \[0, 3\)"):
        get_sum_smaller_probs(torch.ones(2, 3), torch.tensor([0, 3]))
