"""Speculative sampling stays exact under the confidence-scheduled verification budget.

Exactness needs the decision *whether* position n is verified to be independent of the draft at
n (given the prefix). compute_seqlens_q_by_confidence_rates selects draft j of a sequence from
gains that rank at or above it, i.e. from confidences c_0..c_j, and DSpark's c_j sees only the
drafts before j (the Markov embedding of draft j - 1). Here 200k sequences share one global
budget with c_j a function of the previous draft; the emitted token at every position is
distributed as p. The negative control lets c_j peek at draft j itself, and the bias shows.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from scipy import stats

from deepinfer_kernels.ops.sampling import random_sampling
from deepinfer_kernels.ops.verification import compute_seqlens_q_by_confidence_rates, verify_and_sample

sys.path.insert(0, str(Path(__file__).parent))  # --import-mode=importlib: make the sibling data module importable
from speculative_cases import P, Q  # noqa: E402

CONF_OF_TOKEN = torch.tensor([0.95, 0.05, 0.9, 0.1, 0.85, 0.2])  # confidence as a function of a token
NEXTN, START = 5, 1000


def simulate(num_seqs: int, conf_sees_own_draft: bool):
    seeds = torch.arange(num_seqs, dtype=torch.int64) + 31337
    drafts = torch.stack([
        random_sampling(Q[m].expand(num_seqs, -1), seeds, torch.full((num_seqs,), START + m + 1), True)
        for m in range(NEXTN)
    ], dim=1)  # drafts[:, m] = draft for position m + 1
    if conf_sees_own_draft:   # wrong: c_j depends on draft j itself
        conf = CONF_OF_TOKEN[drafts]
    else:                     # DSpark: c_j depends on the draft before it (c_0 on the anchor)
        conf = torch.cat([torch.full((num_seqs, 1), 0.8), CONF_OF_TOKEN[drafts[:, :-1]]], dim=1)
    seqlens = torch.empty(num_seqs, dtype=torch.int32)
    compute_seqlens_q_by_confidence_rates(3 * num_seqs, torch.arange(num_seqs, dtype=torch.int32), conf, seqlens)
    ftp = (torch.cumsum(seqlens, 0) - seqlens).to(torch.int32)
    total_q = int(seqlens.sum())
    req = torch.repeat_interleave(torch.arange(num_seqs), seqlens.long())
    k = torch.arange(total_q) - ftp.long()[req]  # local step: row k predicts position k + 1
    draft_rows = torch.cat([drafts, torch.zeros(num_seqs, 1, dtype=torch.int64)], 1)[req, k]
    q_rows = torch.cat([Q, torch.zeros(1, 6)])[k]
    out = verify_and_sample(P[k], draft_rows, q_rows, seeds, START + k, ftp, seqlens)
    return drafts, out, seqlens


def position_pvalues(drafts, out) -> list[float]:
    a = out.num_accepted.long()
    pvals = []
    for m in range(1, NEXTN + 2):
        reached = a >= m - 1
        token = drafts[:, m - 1] if m <= NEXTN else torch.zeros_like(a)
        token = torch.where(a >= m, token, out.token_ids.long())[reached]
        counts = torch.bincount(token, minlength=6).double()
        p = P[m - 1].double() / P[m - 1].double().sum()
        support = p > 0
        assert counts[~support].sum() == 0
        if counts.sum() < 1000:
            continue
        pvals.append(float(stats.chisquare(counts[support].numpy(), (p[support] * counts.sum()).numpy()).pvalue))
    return pvals


def test_confidence_budget_keeps_speculative_sampling_exact():
    drafts, out, seqlens = simulate(200_000, conf_sees_own_draft=False)
    assert int(seqlens.sum()) == 600_000 and len(set(seqlens.tolist())) >= 4  # really variable length
    pvals = position_pvalues(drafts, out)
    assert len(pvals) >= 4
    assert min(pvals) > 0.01, pvals


def test_budget_that_sees_the_draft_itself_is_biased():
    drafts, out, _ = simulate(200_000, conf_sees_own_draft=True)
    assert min(position_pvalues(drafts, out)) < 1e-6
