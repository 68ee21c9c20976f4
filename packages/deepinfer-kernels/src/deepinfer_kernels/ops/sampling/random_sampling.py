"""random_sampling: one column per row by inverse CDF at a counter-based uniform.

Row ``r`` draws ``u = counter_uniform(seed[r], position[r], DRAFT if is_nextn[r] else SAMPLE)``
and returns the first column ``c`` whose inclusive prefix sum exceeds ``u * row_sum``::

    probs   0.0   0.2   0.0   0.5   0.3        row_sum = 1.0, u = 0.35
    cdf     0.0   0.2   0.2   0.7   1.0        first cdf > 0.35 -> column 3
                        ^ zero column: cdf does not grow, so it can never be the first to exceed

Rows may sum to less than 1 (mass removed by top-k/top-p without renormalising): sampling is
proportional to the row. Zero-probability columns are never returned, not even at the
boundaries: ``u = 0`` selects the first positive column, and a threshold that rounding pushed to
``row_sum`` selects the last positive column. A row with no positive entry returns
``EMPTY_ROW_SAMPLE``. Prefix sums run in float64.

Across devices the uniforms are bit-identical; a float64 prefix sum computed in a different
order (a parallel scan) can round differently, so CPU and CUDA samples can differ only when
``u * row_sum`` lands within rounding (~1e-16 relative) of a CDF boundary.
"""

from __future__ import annotations

import torch

from deepinfer_kernels.ops.sampling._checks import FLOAT_DTYPES, check_tensor, may_be_true
from deepinfer_kernels.ops.sampling.rng import RngStream, counter_uniform_ref
from deepinfer_kernels.platform import select_backend

# Returned for a row whose probabilities are all zero (nothing can be sampled). Callers that
# guarantee a positive entry per row (every softmax output does) never see it.
EMPTY_ROW_SAMPLE = -1


def sample_from_uniform_ref(
    probs: torch.Tensor,  # [rows, vocab] float, >= 0
    u: torch.Tensor,      # [rows] float64 in [0, 1)
) -> torch.Tensor:        # [rows] int64
    """Inverse-CDF sampling of each row at its uniform ``u`` (the rule in the module docstring)."""
    rows, vocab = probs.shape
    if vocab == 0:
        return torch.full((rows,), EMPTY_ROW_SAMPLE, dtype=torch.int64, device=probs.device)
    cdf = torch.cumsum(probs.to(torch.float64), dim=1)
    total = cdf[:, -1]
    threshold = (u * total).unsqueeze(1)
    idx = torch.searchsorted(cdf, threshold, right=True).squeeze(1)  # first c with cdf[c] > threshold
    past_end = idx >= vocab
    if may_be_true(past_end):  # threshold rounded up to row_sum: take the last positive column
        cols = torch.arange(vocab, device=probs.device)
        last_positive = torch.where(probs > 0, cols, -1).amax(dim=1)
        idx = torch.where(past_end, last_positive, idx)
    return torch.where(total > 0, idx, torch.full_like(idx, EMPTY_ROW_SAMPLE))


def random_sampling_ref(
    probs: torch.Tensor,             # [rows, vocab] float
    seq_seeds: torch.Tensor,         # [rows] int64
    sample_positions: torch.Tensor,  # [rows] int64
    is_nextn_predict: torch.Tensor,  # [rows] bool
) -> torch.Tensor:                   # [rows] int64
    streams = torch.where(is_nextn_predict, int(RngStream.DRAFT), int(RngStream.SAMPLE)).to(torch.int64)
    u = counter_uniform_ref(seq_seeds, sample_positions, streams)
    return sample_from_uniform_ref(probs, u)


def random_sampling(
    probs: torch.Tensor,                        # [rows, vocab] float, >= 0, row sums <= 1
    seq_seeds: torch.Tensor,                    # [rows] int64 (uint64 seeds as int64 bits)
    sample_positions: torch.Tensor,             # [rows] int32 or int64
    is_nextn_predict: torch.Tensor | bool = False,  # [rows] bool, or one flag for all rows
) -> torch.Tensor:                              # [rows] int64 column ids
    """Sample one column per row, deterministic in (seed, position, is_nextn_predict) alone.

    Independent of batch size and row order; zero-probability columns are never sampled.
    ``is_nextn_predict`` selects the draft-head stream (``RngStream.DRAFT``) instead of the target
    stream (``RngStream.SAMPLE``), so a draft and the target token at one position use
    independent uniforms.
    """
    op = "random_sampling"
    check_tensor(op, "probs", probs, [None, None], "[rows, vocab]", FLOAT_DTYPES)
    rows, dev = probs.shape[0], probs.device
    check_tensor(op, "seq_seeds", seq_seeds, [rows], "[rows]", [torch.int64], dev)
    check_tensor(op, "sample_positions", sample_positions, [rows], "[rows]", [torch.int32, torch.int64], dev)
    if isinstance(is_nextn_predict, torch.Tensor):
        check_tensor(op, "is_nextn_predict", is_nextn_predict, [rows], "[rows]", [torch.bool], dev)
        nextn = is_nextn_predict
    else:
        nextn = torch.full((rows,), bool(is_nextn_predict), dtype=torch.bool, device=dev)
    select_backend(op, dev, has_kernel=False)
    return random_sampling_ref(probs, seq_seeds, sample_positions.to(torch.int64), nextn)
