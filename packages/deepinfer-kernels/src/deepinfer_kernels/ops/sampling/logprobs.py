"""Logprob helpers: full log-softmax, the logprob of chosen tokens, and the top-n per row.

Which logits to pass is the caller's choice (raw model logits for "model logprobs", processed
logits for "sampling logprobs"). Values may be ``-inf`` (masked columns); clamping for output
(-9999) belongs to the ledger, not here.
"""

from __future__ import annotations

import torch

from deepinfer_kernels.ops.sampling._checks import FLOAT_DTYPES, check_row_distributions, check_tensor
from deepinfer_kernels.platform import select_backend


def compute_logprobs_ref(logits: torch.Tensor) -> torch.Tensor:  # [rows, vocab] -> [rows, vocab] f32
    return torch.log_softmax(logits.to(torch.float32), dim=1)


def compute_logprobs(logits: torch.Tensor) -> torch.Tensor:
    """``log_softmax`` in float32 of ``logits [rows, vocab]``."""
    op = "compute_logprobs"
    check_tensor(op, "logits", logits, [None, None], "[rows, vocab]", FLOAT_DTYPES)
    select_backend(op, logits.device, has_kernel=False)
    return compute_logprobs_ref(logits)


def gather_token_logprobs(
    logprobs: torch.Tensor,   # [rows, vocab] float
    token_ids: torch.Tensor,  # [rows] int, in [0, vocab)
) -> torch.Tensor:            # [rows] float32
    """``logprobs[r, token_ids[r]]`` for every row."""
    op = "gather_token_logprobs"
    check_row_distributions(op, "logprobs", logprobs, token_ids)
    select_backend(op, logprobs.device, has_kernel=False)
    return logprobs.gather(1, token_ids.to(torch.int64).unsqueeze(1)).squeeze(1).to(torch.float32)


def top_logprobs_ref(logprobs: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact (value desc, id asc) top-n without sorting whole rows.

    The n-th largest value ``v`` is unique whatever order topk gives ties; the result is every
    column above ``v`` plus the lowest-id columns equal to ``v`` until n are taken.
    """
    x = logprobs.to(torch.float32)
    rows = x.shape[0]
    if n == 0 or rows == 0:
        return x.new_zeros(rows, n), torch.zeros(rows, n, dtype=torch.int32, device=x.device)
    v = x.topk(n, dim=1, sorted=True).values[:, -1:]
    above = x > v
    tied = x == v
    need = n - above.sum(dim=1, keepdim=True)
    take = above | (tied & (torch.cumsum(tied, dim=1) <= need))
    ids = torch.nonzero(take)[:, 1].reshape(rows, n)  # ascending column ids per row
    vals = x.gather(1, ids)
    order = vals.sort(dim=1, descending=True, stable=True).indices
    return vals.gather(1, order), ids.gather(1, order).to(torch.int32)


def top_logprobs(
    logprobs: torch.Tensor,  # [rows, vocab] float
    n: int,                  # 0 <= n <= vocab
) -> tuple[torch.Tensor, torch.Tensor]:  # values [rows, n] float32 descending, ids [rows, n] int32
    """The ``n`` largest logprobs of each row, descending; equal values ordered by ascending id."""
    op = "top_logprobs"
    check_tensor(op, "logprobs", logprobs, [None, None], "[rows, vocab]", FLOAT_DTYPES)
    if not 0 <= n <= logprobs.shape[1]:
        raise ValueError(f"{op}: n must be in [0, vocab={logprobs.shape[1]}], got {n}")
    select_backend(op, logprobs.device, has_kernel=False)
    return top_logprobs_ref(logprobs, n)
