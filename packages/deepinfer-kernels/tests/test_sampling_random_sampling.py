"""random_sampling: batch invariant, never a zero-probability column, distributed as the row."""

from __future__ import annotations

import pytest
import torch
from scipy import stats

from deepinfer_kernels.ops.sampling import (
    EMPTY_ROW_SAMPLE,
    RngStream,
    counter_uniform,
    random_sampling,
    sample_from_uniform_ref,
)


def oracle_inverse_cdf(row: list[float], u: float) -> int:
    """Loop form of the documented rule: first column whose prefix sum exceeds u * row_sum."""
    total = 0.0
    for w in row:
        total += w
    if total <= 0:
        return EMPTY_ROW_SAMPLE
    acc = 0.0
    for c, w in enumerate(row):
        acc += w
        if acc > u * total:
            return c
    return max(c for c, w in enumerate(row) if w > 0)


def sparse_probs(rows: int, vocab: int, g: torch.Generator) -> torch.Tensor:
    p = torch.rand(rows, vocab, generator=g)
    p[torch.rand(rows, vocab, generator=g) < 0.6] = 0
    p[torch.arange(rows), torch.randint(0, vocab, (rows,), generator=g)] = 1.0
    return p / p.sum(1, keepdim=True)


def test_matches_loop_oracle():
    g = torch.Generator().manual_seed(1)
    probs = sparse_probs(300, 37, g) * torch.rand(300, 1, generator=g)  # rows sum to <= 1
    seeds = torch.randint(-(1 << 62), 1 << 62, (300,), generator=g)
    pos = torch.randint(0, 1 << 20, (300,), generator=g)
    nextn = torch.rand(300, generator=g) < 0.5
    out = random_sampling(probs, seeds, pos, nextn)
    assert out.dtype == torch.int64
    streams = torch.where(nextn, int(RngStream.DRAFT), int(RngStream.SAMPLE))
    u = counter_uniform(seeds, pos, streams)
    p64 = probs.double()
    assert out.tolist() == [oracle_inverse_cdf(p64[r].tolist(), float(u[r])) for r in range(300)]


def test_same_samples_across_batch_sizes_and_row_orders():
    g = torch.Generator().manual_seed(2)
    n, vocab = 64, 1000
    probs = torch.softmax(torch.randn(n, vocab, generator=g) * 3, dim=1)
    seeds = torch.randint(0, 1 << 60, (n,), generator=g)
    pos = torch.randint(0, 100_000, (n,), generator=g)
    nextn = torch.rand(n, generator=g) < 0.5
    full = random_sampling(probs, seeds, pos, nextn)
    for b in (1, 7, 64):
        assert torch.equal(random_sampling(probs[:b], seeds[:b], pos[:b], nextn[:b]), full[:b])
    for k in range(3):
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(k))
        assert torch.equal(random_sampling(probs[perm], seeds[perm], pos[perm], nextn[perm]), full[perm])
    # Single rows sampled one at a time agree too.
    for r in (0, 13, 63):
        assert int(random_sampling(probs[r:r + 1], seeds[r:r + 1], pos[r:r + 1], nextn[r:r + 1])[0]) == int(full[r])


def test_zero_probability_columns_never_sampled():
    g = torch.Generator().manual_seed(3)
    rows, vocab = 100_000, 12
    probs = torch.zeros(rows, vocab)
    allowed = torch.tensor([1, 4, 5, 11])  # zeros at both ends and in between
    probs[:, allowed] = torch.tensor([0.1, 0.2, 0.3, 0.4])
    out = random_sampling(probs, torch.arange(rows), torch.zeros(rows, dtype=torch.int64))
    assert torch.isin(out, allowed).all()
    # Boundary uniforms: u = 0 and the largest double below 1, plus tiny probabilities.
    edge = torch.tensor([[0.0, 0.0, 1e-30, 0.5, 0.0, 0.0], [0.0, 0.7, 0.0, 0.0, 1e-38, 0.0]]).repeat(2, 1)
    u = torch.tensor([0.0, 0.0, 1 - 2.0**-53, 1 - 2.0**-53], dtype=torch.float64)
    # Row 2: 1e-38 is below float64 resolution next to 0.7, so the top uniform still lands on 1.
    assert sample_from_uniform_ref(edge, u).tolist() == [2, 1, 3, 1]
    del g


def test_threshold_rounded_up_to_row_sum_takes_last_positive_column():
    """If u * row_sum rounds up to row_sum, the last positive column (never a trailing zero) wins."""
    probs = torch.tensor([[0.25, 0.5, 0.25, 0.0, 0.0]], dtype=torch.float64)
    assert sample_from_uniform_ref(probs, torch.tensor([1.0], dtype=torch.float64)).tolist() == [2]


def test_empty_row_returns_sentinel():
    probs = torch.tensor([[0.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    out = random_sampling(probs, torch.tensor([1, 2]), torch.tensor([0, 0]))
    assert out.tolist() == [EMPTY_ROW_SAMPLE, 1]


@pytest.mark.parametrize("scale", [1.0, 0.37])
def test_empirical_distribution_matches(scale):
    """10^6 draws from one row with distinct (seed, position): chi-square against the row."""
    p = torch.tensor([0.05, 0.0, 0.15, 0.30, 0.0, 0.10, 0.25, 0.15, 0.0])
    n = 1_000_000
    probs = (p * scale).expand(n, -1)  # rows sum to `scale` <= 1: sampling is proportional
    seeds = torch.full((n,), 123, dtype=torch.int64)
    out = random_sampling(probs, seeds, torch.arange(n))
    counts = torch.bincount(out, minlength=p.numel()).double()
    support = p > 0
    assert counts[~support].sum() == 0
    p64 = p.double() / p.double().sum()
    assert stats.chisquare(counts[support].numpy(), (p64[support] * n).numpy()).pvalue > 0.01


def test_target_and_draft_streams_are_independent():
    n = 200_000
    p = torch.full((n, 4), 0.25)
    seeds = torch.arange(n)
    pos = torch.full((n,), 5)
    a = random_sampling(p, seeds, pos, False)
    b = random_sampling(p, seeds, pos, True)
    joint = torch.bincount(a * 4 + b, minlength=16).reshape(4, 4).numpy()
    assert stats.chi2_contingency(joint).pvalue > 0.01
    assert not torch.equal(a, b)


def test_low_precision_inputs():
    p = torch.softmax(torch.randn(16, 100, generator=torch.Generator().manual_seed(0)), 1)
    seeds, pos = torch.arange(16), torch.arange(16)
    ref = random_sampling(p.double(), seeds, pos)
    for dt in (torch.float16, torch.bfloat16):
        out = random_sampling(p.to(dt), seeds, pos)
        assert (out >= 0).all() and (out < 100).all()
        assert float((out == ref).float().mean()) > 0.7


def test_argument_errors():
    p = torch.full((3, 4), 0.25)
    with pytest.raises(ValueError, match=r"probs must have shape \[rows, vocab\]"):
        random_sampling(p[0], torch.zeros(3, dtype=torch.int64), torch.zeros(3, dtype=torch.int64))
    with pytest.raises(TypeError, match="seq_seeds must have dtype int64"):
        random_sampling(p, torch.zeros(3, dtype=torch.int32), torch.zeros(3, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"sample_positions must have shape \[rows\]"):
        random_sampling(p, torch.zeros(3, dtype=torch.int64), torch.zeros(4, dtype=torch.int64))
    with pytest.raises(TypeError, match="is_nextn_predict must have dtype bool"):
        random_sampling(p, torch.zeros(3, dtype=torch.int64), torch.zeros(3, dtype=torch.int64), torch.zeros(3))
    with pytest.raises(TypeError, match="probs must have dtype"):
        random_sampling(p.long(), torch.zeros(3, dtype=torch.int64), torch.zeros(3, dtype=torch.int64))
