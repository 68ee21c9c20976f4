"""apply_sampling_params / probs_from_logits vs a per-row loop of the documented rules."""

from __future__ import annotations

import math

import pytest
import torch

from deepinfer_kernels.ops.sampling import (
    TOP_K_OFF,
    TOP_P_OFF,
    apply_sampling_params,
    probs_from_logits,
    random_sampling,
)


def oracle_row(logits: list[float], t: float, k: int, p: float) -> list[float]:
    vocab = len(logits)
    neg = -math.inf
    if t == 0:
        best = max(range(vocab), key=lambda c: (logits[c], -c))
        return [logits[c] if c == best else neg for c in range(vocab)]
    x = [v / t for v in logits]
    x32 = torch.tensor(x, dtype=torch.float32).tolist()  # the op scales in float32
    keep = [True] * vocab
    if k != TOP_K_OFF and k < vocab:
        kth = sorted(x32, reverse=True)[k - 1]
        keep = [v >= kth for v in x32]
    if p < TOP_P_OFF:
        masked = torch.tensor([v if kp else neg for v, kp in zip(x32, keep, strict=True)], dtype=torch.float32)
        q = torch.softmax(masked, 0).double().tolist()
        order = sorted(range(vocab), key=lambda c: (-q[c], c))
        before = 0.0
        for rank, c in enumerate(order):
            if rank > 0 and before >= p:
                keep[c] = False
            before += q[c]
    return [v if kp else neg for v, kp in zip(x32, keep, strict=True)]


def make_params(rows: int, vocab: int, g: torch.Generator):
    t = torch.rand(rows, generator=g) * 1.5 + 0.1
    t[torch.rand(rows, generator=g) < 0.2] = 0.0
    k = torch.randint(1, vocab + 3, (rows,), generator=g).to(torch.int32)
    k[torch.rand(rows, generator=g) < 0.3] = TOP_K_OFF
    p = torch.rand(rows, generator=g) * 0.95 + 0.05
    p[torch.rand(rows, generator=g) < 0.3] = TOP_P_OFF
    return t, k, p


@pytest.mark.parametrize("seed", range(5))
def test_matches_row_oracle(seed):
    g = torch.Generator().manual_seed(seed)
    rows, vocab = 40, 23
    logits = torch.randn(rows, vocab, generator=g) * 3
    logits[:, :4] = torch.round(logits[:, :4])  # some ties
    logits[0, :] = 1.0                           # a fully tied row
    t, k, p = make_params(rows, vocab, g)
    out = apply_sampling_params(logits, t, k, p)
    assert out.dtype == torch.float32
    for r in range(rows):
        exp = oracle_row(logits[r].tolist(), float(t[r]), int(k[r]), float(p[r]))
        assert out[r].tolist() == exp, (r, float(t[r]), int(k[r]), float(p[r]))


def test_off_values_leave_the_distribution_untouched():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(8, 50, generator=g)
    ones = torch.ones(8)
    out = probs_from_logits(logits, ones, torch.full((8,), TOP_K_OFF, dtype=torch.int32), torch.full((8,), TOP_P_OFF))
    torch.testing.assert_close(out, torch.softmax(logits, 1))
    out = probs_from_logits(logits, ones * 0.5, torch.full((8,), 50, dtype=torch.int32), ones)
    torch.testing.assert_close(out, torch.softmax(logits / 0.5, 1))


def test_greedy_rows_are_one_hot_at_first_argmax():
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0], [5.0, -1.0, 2.0, 5.0]])
    probs = probs_from_logits(logits, torch.zeros(2), torch.tensor([2, -1], dtype=torch.int32), torch.tensor([0.1, 1.0]))
    assert probs.tolist() == [[0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]]
    # Sampling a greedy row always returns its argmax.
    many = probs[:1].expand(1000, -1)
    assert (random_sampling(many, torch.arange(1000), torch.arange(1000)) == 1).all()


def test_top_k_and_top_p_semantics():
    logits = torch.log(torch.tensor([[0.4, 0.3, 0.2, 0.1]]))
    one = torch.ones(1)
    off_k = torch.tensor([TOP_K_OFF], dtype=torch.int32)
    pr = probs_from_logits(logits, one, torch.tensor([2], dtype=torch.int32), torch.tensor([TOP_P_OFF]))
    torch.testing.assert_close(pr, torch.tensor([[4 / 7, 3 / 7, 0.0, 0.0]]))
    pr = probs_from_logits(logits, one, off_k, torch.tensor([0.7]))   # 0.4 + 0.3 reaches 0.7 (mass before 0.2 is 0.7)
    assert (pr[0, 2:] == 0).all() and (pr[0, :2] > 0).all()
    pr = probs_from_logits(logits, one, off_k, torch.tensor([0.05]))  # the top-1 always survives
    assert pr.tolist() == [[1.0, 0.0, 0.0, 0.0]]
    # Ties at the top-k boundary are all kept.
    tied = torch.tensor([[2.0, 1.0, 1.0, 0.0]])
    pr = probs_from_logits(tied, one, torch.tensor([2], dtype=torch.int32), torch.tensor([1.0]))
    assert (pr[0, :3] > 0).all() and pr[0, 3] == 0


def test_removed_columns_have_probability_exactly_zero():
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(16, 1000, generator=g) * 4
    t, k, p = make_params(16, 1000, g)
    proc = apply_sampling_params(logits, t, k, p)
    probs = probs_from_logits(logits, t, k, p)
    assert torch.equal(probs == 0, torch.isinf(proc) | (torch.softmax(proc, 1) == 0))
    torch.testing.assert_close(probs.sum(1), torch.ones(16))


def test_argument_errors():
    lg = torch.zeros(2, 5)
    t, k, p = torch.ones(2), torch.full((2,), -1, dtype=torch.int32), torch.ones(2)
    with pytest.raises(TypeError, match="top_k must have dtype int32"):
        apply_sampling_params(lg, t, k.long(), p)
    with pytest.raises(ValueError, match=r"temperature must have shape \[rows\]"):
        apply_sampling_params(lg, t[:1], k, p)
    with pytest.raises(ValueError, match="temperature must be >= 0"):
        apply_sampling_params(lg, -t, k, p)
    with pytest.raises(ValueError, match="top_k must be >= 1 or -1"):
        apply_sampling_params(lg, t, torch.zeros(2, dtype=torch.int32), p)
    with pytest.raises(ValueError, match="top_p must be in"):
        apply_sampling_params(lg, t, k, p * 0)


@pytest.mark.parametrize("window", [2, 5, 12])
def test_top_p_candidate_window_and_fallback_match_oracle(monkeypatch, window):
    """A small candidate window forces both the windowed nucleus and the full-sort fallback."""
    import deepinfer_kernels.ops.sampling.sampling_params as sp

    monkeypatch.setattr(sp, "TOP_P_WINDOWS", (window, 2 * window))
    g = torch.Generator().manual_seed(window)
    rows, vocab = 60, 23
    logits = torch.randn(rows, vocab, generator=g) * torch.rand(rows, 1, generator=g) * 6  # flat to peaked
    logits[:, :6] = torch.round(logits[:, :6])
    t = torch.ones(rows)
    k = torch.full((rows,), TOP_K_OFF, dtype=torch.int32)
    p = torch.rand(rows, generator=g) * 0.9 + 0.05
    out = apply_sampling_params(logits, t, k, p)
    for r in range(rows):
        assert out[r].tolist() == oracle_row(logits[r].tolist(), 1.0, TOP_K_OFF, float(p[r])), r


def test_large_vocab_top_k_top_p_match_oracle():
    g = torch.Generator().manual_seed(9)
    rows, vocab = 6, 5000
    logits = torch.randn(rows, vocab, generator=g) * torch.tensor([[0.1], [0.5], [1.0], [3.0], [6.0], [0.01]])
    t = torch.tensor([1.0, 0.7, 1.3, 1.0, 1.0, 1.0])
    k = torch.tensor([TOP_K_OFF, 3000, 100, TOP_K_OFF, 7, TOP_K_OFF], dtype=torch.int32)
    p = torch.tensor([0.95, 0.9, 0.5, 0.99, 0.3, 0.5])
    out = apply_sampling_params(logits, t, k, p)
    for r in range(rows):
        assert out[r].tolist() == oracle_row(logits[r].tolist(), float(t[r]), int(k[r]), float(p[r])), r
