"""The two per-row decisions of speculative decoding: accept a draft, and sample the main token.

Notation for one flat row ``r`` of request ``i``: ``p = target_probs[r]`` is the target's
distribution for the token at sequence position ``n = positions[r] + 1``; ``x = draft_ids[r]`` is
the draft proposed for position ``n`` (the token of row ``r + 1``); ``q = draft_probs[r]`` is the
draft distribution ``x`` was drawn from (``None``: drafts were proposed deterministically, i.e.
``q`` is one-hot at ``x``). Uniforms are ``U(s, n, stream) = counter_uniform(seeds[i], n, stream)``.

Accept (``speculative_accept_ref``)::

    greedy request:    accept  <=>  x == argmax(p)           (lowest column on ties)
    sampling request:  accept  <=>  U(s, n, ACCEPT) * q(x) < p(x)
                       i.e. with probability min(1, p(x)/q(x)); never if p(x) == 0

Main token at the request's final row ``f`` (``sample_main_token_ref``)::

    greedy request:                  argmax(p_f)
    f rejected its draft (verify row): inverse CDF of  max(0, p_f - q_f)  at U(s, n_f, RESIDUAL)
                                       (falls back to p_f if the residual has no mass)
    f is the request's last row:       inverse CDF of  p_f  at U(s, n_f, SAMPLE)

With ``x ~ q`` drawn independently of the ACCEPT/RESIDUAL uniforms (the draft head uses the
DRAFT stream), every emitted token at position ``n`` is distributed exactly as ``p`` given the
prefix (Leviathan et al. 2023, Chen et al. 2023). That also needs the decision *whether*
position ``n`` is verified to be independent of the draft at ``n`` given the prefix. Fixed lengths
satisfy it; so does ``compute_seqlens_q_by_confidence_rates`` as long as the confidence of draft
``j`` depends only on drafts before ``j`` (DSpark's Markov input is draft ``j - 1``), because its
tie rule selects draft ``j`` from gains ranked at or above it. tests/test_verification_varlen_exactness.py
checks both that and the bias when a confidence sees its own draft.
"""

from __future__ import annotations

import torch

from deepinfer_kernels.ops.sampling._checks import may_be_true
from deepinfer_kernels.ops.sampling.random_sampling import sample_from_uniform_ref
from deepinfer_kernels.ops.sampling.rng import RngStream, counter_uniform_ref


def _stream(rows: int, stream: RngStream, device: torch.device) -> torch.Tensor:
    return torch.full((rows,), int(stream), dtype=torch.int64, device=device)


def _draft_prob(draft_probs: torch.Tensor | None, draft_ids: torch.Tensor) -> torch.Tensor:  # [rows] f64
    if draft_probs is None:
        return torch.ones(draft_ids.shape, dtype=torch.float64, device=draft_ids.device)
    return draft_probs.gather(1, draft_ids.unsqueeze(1)).squeeze(1).to(torch.float64)


def speculative_accept_ref(
    target_probs: torch.Tensor,        # [rows, vocab] float
    draft_ids: torch.Tensor,           # [rows] int64 in [0, vocab)
    draft_probs: torch.Tensor | None,  # [rows, vocab] float, or None (one-hot q)
    seeds: torch.Tensor,               # [rows] int64 (the row's request seed)
    token_positions: torch.Tensor,     # [rows] int64: position n of the token being decided
    is_greedy: torch.Tensor,           # [rows] bool
    all_greedy: bool = False,          # host fact: every row is greedy (no uniforms drawn)
) -> torch.Tensor:                     # [rows] bool
    """Raw accept decision of every row (meaningless on final rows; get_accept_result ignores it)."""
    if all_greedy:
        return draft_ids == target_probs.argmax(dim=1)
    rows, dev = target_probs.shape[0], target_probs.device
    p_x = target_probs.gather(1, draft_ids.unsqueeze(1)).squeeze(1).to(torch.float64)
    q_x = _draft_prob(draft_probs, draft_ids)
    u = counter_uniform_ref(seeds, token_positions, _stream(rows, RngStream.ACCEPT, dev))
    sampled_accept = u * q_x < p_x
    if not may_be_true(is_greedy):
        return sampled_accept
    greedy_accept = draft_ids == target_probs.argmax(dim=1)
    return torch.where(is_greedy, greedy_accept, sampled_accept)


def residual_probs_ref(
    target_probs: torch.Tensor,        # [rows, vocab] float
    draft_ids: torch.Tensor,           # [rows] int64
    draft_probs: torch.Tensor | None,  # [rows, vocab] float, or None (one-hot q)
) -> torch.Tensor:                     # [rows, vocab] float64, unnormalised max(0, p - q); p if it has no mass
    p = target_probs.to(torch.float64)
    if draft_probs is None:
        residual = p.scatter(1, draft_ids.unsqueeze(1), 0.0)
    else:
        residual = (p - draft_probs.to(torch.float64)).clamp_min_(0.0)
    empty = (residual.sum(dim=1) <= 0).unsqueeze(1)
    return torch.where(empty, p, residual)


def sample_main_token_ref(
    target_probs: torch.Tensor,        # [req_cnt, vocab] float: p at each request's final row
    draft_ids: torch.Tensor,           # [req_cnt] int64: draft checked at the final row (if rejected)
    draft_probs: torch.Tensor | None,  # [req_cnt, vocab] float, or None (one-hot q)
    rejected: torch.Tensor,            # [req_cnt] bool: the final row is a rejecting verify row
    seeds: torch.Tensor,               # [req_cnt] int64
    token_positions: torch.Tensor,     # [req_cnt] int64: position of the main token
    is_greedy: torch.Tensor,           # [req_cnt] bool
    all_greedy: bool = False,          # host fact: every request is greedy (no residual, no uniforms)
) -> torch.Tensor:                     # [req_cnt] int64
    if all_greedy:
        return target_probs.argmax(dim=1)
    dist = target_probs.to(torch.float64)
    if may_be_true(rejected):
        residual = residual_probs_ref(target_probs, draft_ids, draft_probs)
        dist = torch.where(rejected.unsqueeze(1), residual, dist)
    streams = torch.where(rejected, int(RngStream.RESIDUAL), int(RngStream.SAMPLE)).to(torch.int64)
    u = counter_uniform_ref(seeds, token_positions, streams)
    sampled = sample_from_uniform_ref(dist, u)
    if not may_be_true(is_greedy):
        return sampled
    return torch.where(is_greedy, target_probs.argmax(dim=1), sampled)
