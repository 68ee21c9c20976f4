"""get_sum_smaller_probs: the probability mass "at or below" a token, in a fixed total order.

Order the columns of a row by ascending probability, equal probabilities by ascending column
index. The result for token ``t`` is the inclusive CDF at ``t`` in that order::

    S(t) = sum of p[c] over columns c with  p[c] < p[t]  or  (p[c] == p[t] and c <= t)

The order is total and independent of how a sort would place ties, so the value is the same on
every backend. The reference evaluates the predicate directly (no sort) and accumulates in
float64.
"""

from __future__ import annotations

import torch

from deepinfer_kernels.ops.sampling._checks import check_row_distributions
from deepinfer_kernels.platform import select_backend


def get_sum_smaller_probs_ref(
    probs: torch.Tensor,      # [rows, vocab] float
    token_ids: torch.Tensor,  # [rows] int
) -> torch.Tensor:            # [rows] float32
    p = probs.to(torch.float64)
    tok = token_ids.to(torch.int64).unsqueeze(1)
    p_tok = p.gather(1, tok)
    cols = torch.arange(p.shape[1], device=p.device).unsqueeze(0)
    at_or_below = (p < p_tok) | ((p == p_tok) & (cols <= tok))
    return torch.where(at_or_below, p, 0.0).sum(dim=1).to(torch.float32)


def get_sum_smaller_probs(
    probs: torch.Tensor,      # [rows, vocab] float
    token_ids: torch.Tensor,  # [rows] int32 or int64, in [0, vocab)
) -> torch.Tensor:            # [rows] float32
    """Inclusive CDF at ``token_ids`` after sorting by ascending probability, ties by column index."""
    op = "get_sum_smaller_probs"
    check_row_distributions(op, "probs", probs, token_ids)
    select_backend(op, probs.device, has_kernel=False)
    return get_sum_smaller_probs_ref(probs, token_ids)
