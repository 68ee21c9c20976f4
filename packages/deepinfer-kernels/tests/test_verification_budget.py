"""compute_seqlens_q_by_confidence_rates: exact budget, remap scatter, optimal allocation."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from deepinfer_kernels.ops.verification import (
    FRESH_SEQUENCE,
    clamp_verification_budget,
    compute_seqlens_q_by_confidence_rates,
)


def run(total_q: int, remap: list[int], prev: torch.Tensor) -> list[int]:
    out = torch.full((len(remap),), -7, dtype=torch.int32)
    ret = compute_seqlens_q_by_confidence_rates(total_q, torch.tensor(remap, dtype=torch.int32), prev, out)
    assert ret is out
    return out.tolist()


def confidences(remap: list[int], prev: torch.Tensor) -> list[list[float]]:
    nextn = prev.shape[1]
    return [[0.0] * nextn if r == FRESH_SEQUENCE else [min(max(float(v), 0.0), 1.0) for v in prev[r]] for r in remap]


def expected_accepted(seqlens: list[int], conf: list[list[float]]) -> float:
    """E[accepted drafts] = sum over verified drafts of the probability that all drafts up to it pass."""
    total = 0.0
    for s, c in zip(seqlens, conf, strict=True):
        run_prod = 1.0
        for j in range(s - 1):
            run_prod *= c[j]
            total += run_prod
    return total


def brute_force_best(budget: int, conf: list[list[float]], nextn: int) -> float:
    best = -1.0
    for alloc in itertools.product(range(1, nextn + 2), repeat=len(conf)):
        if sum(alloc) == budget:
            best = max(best, expected_accepted(list(alloc), conf))
    return best


@settings(max_examples=250, deadline=None)
@given(
    num_seqs=st.integers(0, 5),
    nextn=st.integers(0, 4),
    n_prev=st.integers(0, 5),
    data=st.data(),
)
def test_allocation_is_optimal_and_exact(num_seqs, nextn, n_prev, data):
    # Coarse confidences make ties common, which is where prefix-breaking bugs hide.
    levels = st.sampled_from([0.0, 0.25, 0.5, 0.75, 0.9, 1.0])
    prev = torch.tensor(
        [[data.draw(levels) for _ in range(nextn)] for _ in range(n_prev)], dtype=torch.float32
    ).reshape(n_prev, nextn)
    remap = [data.draw(st.integers(FRESH_SEQUENCE, n_prev - 1)) for _ in range(num_seqs)]
    total_q = data.draw(st.integers(0, num_seqs * (nextn + 1) + 3))
    seqlens = run(total_q, remap, prev)
    budget = clamp_verification_budget(total_q, num_seqs, nextn)
    assert sum(seqlens) == budget
    assert all(1 <= s <= nextn + 1 for s in seqlens)
    if num_seqs <= total_q <= num_seqs * (nextn + 1):
        assert sum(seqlens) == total_q
    conf = confidences(remap, prev)
    got = expected_accepted(seqlens, conf)
    assert got == pytest.approx(brute_force_best(budget, conf, nextn), abs=1e-6)


def test_fresh_sequences_get_confidence_zero():
    prev = torch.tensor([[0.9, 0.9, 0.9], [0.8, 0.8, 0.8]])
    # Seq 0 is fresh, seq 1 was batch row 1 (gains .8 .64 .512), seq 2 was row 0 (gains .9 .81 .729):
    # the 4 extra rows take .9, .81, .8, .729.
    assert run(3 + 4, [FRESH_SEQUENCE, 1, 0], prev) == [1, 2, 4]
    # Only fresh sequences: the budget is still spent exactly, breadth first (j, then sequence).
    assert run(7, [FRESH_SEQUENCE] * 3, prev) == [3, 2, 2]


def test_remap_scatter_follows_the_previous_rows():
    prev = torch.tensor([[0.1, 0.1], [0.95, 0.9], [0.5, 0.2]])
    assert run(4, [0, 1, 2], prev) == [1, 2, 1]   # 1 extra row: the best first draft is row 1's
    assert run(4, [1, 0, 2], prev) == [2, 1, 1]   # the same sequences permuted
    assert run(5, [2, 2, 0], prev) == [2, 2, 1]   # two sequences may remap to one previous row


def test_budget_clamping_and_degenerate_shapes():
    prev = torch.full((4, 2), 0.5)
    assert run(0, [0, 1, 2], prev) == [1, 1, 1]        # below num_seqs: everybody still gets a row
    assert run(100, [0, 1, 2], prev) == [3, 3, 3]      # above num_seqs * (nextn + 1): capped
    assert run(5, [], prev) == []
    assert run(9, [0, 1], torch.zeros(4, 0)) == [1, 1]  # nextn = 0
    assert run(4, [FRESH_SEQUENCE, FRESH_SEQUENCE], torch.zeros(0, 3)) == [2, 2]  # no previous batch
    assert clamp_verification_budget(7, 3, 2) == 7 and clamp_verification_budget(1, 3, 2) == 3


def test_bad_confidences_are_clamped():
    prev = torch.tensor([[float("nan"), 1.0], [1.5, -2.0], [0.6, 0.6]])
    # nan -> 0 and 1.5 -> 1: seq 1's first draft (gain 1) wins, then seq 2's (0.6), then 0.36.
    assert run(5, [0, 1, 2], prev) == [1, 2, 2]


def test_large_batch_is_fast_and_exact():
    g = torch.Generator().manual_seed(0)
    prev = torch.rand(300, 5, generator=g)
    remap = torch.randperm(300, generator=g)[:256].to(torch.int32)
    remap[::10] = FRESH_SEQUENCE
    out = torch.empty(256, dtype=torch.int32)
    compute_seqlens_q_by_confidence_rates(900, remap, prev, out)
    assert int(out.sum()) == 900
    # Greedy optimality certificate: every chosen gain >= every unchosen gain.
    conf = torch.where((remap == FRESH_SEQUENCE).unsqueeze(1), 0.0, prev[remap.clamp_min(0).long()])
    gains = torch.cumprod(conf, 1)
    chosen = torch.arange(5).unsqueeze(0) < (out - 1).unsqueeze(1)
    assert float(gains[chosen].min()) >= float(gains[~chosen].max())


def test_argument_errors():
    prev = torch.zeros(2, 3)
    out = torch.zeros(2, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"remap must be -1 \(fresh\) or in \[0, n_prev=2\)"):
        compute_seqlens_q_by_confidence_rates(4, torch.tensor([0, 2], dtype=torch.int32), prev, out)
    with pytest.raises(ValueError, match=r"seqlens_q must have shape \[num_seqs\]"):
        compute_seqlens_q_by_confidence_rates(4, torch.tensor([0, 1], dtype=torch.int32), prev, out[:1])
    with pytest.raises(TypeError, match="prev_confidence_rates must have dtype float32"):
        compute_seqlens_q_by_confidence_rates(4, torch.tensor([0, 1], dtype=torch.int32), prev.double(), out)
    with pytest.raises(ValueError, match="total_q must be >= 0"):
        compute_seqlens_q_by_confidence_rates(-1, torch.tensor([0, 1], dtype=torch.int32), prev, out)
