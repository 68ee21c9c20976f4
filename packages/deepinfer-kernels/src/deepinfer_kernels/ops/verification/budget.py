"""compute_seqlens_q_by_confidence_rates: spend a fixed verification budget where drafts survive.

The CPU fixes the step's total rows ``total_q``; this op splits them across sequences. Inputs are
last step's draft confidences (``c[i, j]`` = predicted probability that draft ``j`` is accepted
given drafts ``< j`` were), aligned to this step's batch by ``remap``.

1. Remap scatter (fused): ``c[i] = prev_confidence_rates[remap[i]]`` if ``remap[i] >= 0``, else
   zeros (fresh sequence: nothing known, no draft worth verifying). Values are clamped to
   [0, 1], NaN -> 0.
2. Gains: ``g[i, j] = c[i, 0] * ... * c[i, j]`` = probability that draft ``j`` is accepted =
   marginal expected accepted tokens of verifying ``j + 1`` drafts instead of ``j``. A cumulative
   product of values in [0, 1] never increases along ``j``.
3. Every sequence gets its final row (``seqlens_q >= 1``); the remaining
   ``R = budget - num_seqs`` rows go to the ``R`` largest gains over all ``(i, j)``, ties by
   smaller ``j`` then smaller ``i``. Gains do not increase along ``j`` and ties prefer smaller
   ``j``, so the chosen ``(i, j)`` of each sequence are a prefix ``j = 0 .. s_i - 2`` and
   ``seqlens_q[i] = 1 + #chosen``. The sum of the R largest gains bounds every allocation, so
   this maximises ``E[accepted] = sum_i sum_{j < s_i - 1} g[i, j]``.

Selecting draft ``j`` depends only on the gains ranked at or above it, i.e. on ``c[i, :j + 1]``
(and on other sequences). With DSpark confidences (``c[i, j]`` sees drafts before ``j`` only)
whether a draft is verified never depends on the draft itself, which keeps speculative sampling
exact (see verification/speculative.py).

Budget: ``budget = clamp(total_q, num_seqs, num_seqs * (nextn + 1))`` (every sequence needs one
row and can use at most ``nextn + 1``); ``sum(seqlens_q) == budget`` always, so
``sum(seqlens_q) == total_q`` whenever the CPU asks for a feasible budget
(``clamp_verification_budget`` gives the value). Zero gains are spent too (budget is exact),
breadth-first by the tie rule.
"""

from __future__ import annotations

import torch

from deepinfer_kernels.ops.sampling._checks import check_tensor, is_host
from deepinfer_kernels.platform import select_backend

FRESH_SEQUENCE = -1  # remap value of a sequence that was not in the previous batch (confidence 0)


def clamp_verification_budget(total_q: int, num_seqs: int, nextn: int) -> int:
    """The number of rows ``compute_seqlens_q_by_confidence_rates`` actually hands out."""
    return max(num_seqs, min(int(total_q), num_seqs * (nextn + 1)))


def gather_confidence_ref(
    remap: torch.Tensor,                  # [num_seqs] int32
    prev_confidence_rates: torch.Tensor,  # [n_prev, nextn] float32
) -> torch.Tensor:                        # [num_seqs, nextn] float32 in [0, 1]
    fresh = (remap == FRESH_SEQUENCE).unsqueeze(1)
    if prev_confidence_rates.shape[0] == 0:
        return torch.zeros(remap.shape[0], prev_confidence_rates.shape[1], device=remap.device)
    rows = prev_confidence_rates[remap.clamp_min(0).to(torch.int64)]
    rows = torch.nan_to_num(rows.to(torch.float32), nan=0.0).clamp(0.0, 1.0)
    return torch.where(fresh, 0.0, rows)


def compute_seqlens_q_by_confidence_rates_ref(
    total_q: int,
    remap: torch.Tensor,                  # [num_seqs] int32
    prev_confidence_rates: torch.Tensor,  # [n_prev, nextn] float32
    seqlens_q: torch.Tensor,              # [num_seqs] int32 (out)
) -> torch.Tensor:
    num_seqs, nextn = remap.shape[0], prev_confidence_rates.shape[1]
    budget = clamp_verification_budget(total_q, num_seqs, nextn)
    extra = budget - num_seqs
    if extra == 0:
        return seqlens_q.fill_(1)
    gains = torch.cumprod(gather_confidence_ref(remap, prev_confidence_rates), dim=1)
    # j-major flattening: flat = j * num_seqs + i, so a stable descending sort breaks ties by (j, i).
    flat = gains.t().reshape(-1)
    order = torch.sort(flat, descending=True, stable=True).indices[:extra]
    counts = torch.bincount(order % num_seqs, minlength=num_seqs)
    return seqlens_q.copy_(counts + 1)


def compute_seqlens_q_by_confidence_rates(
    total_q: int,                         # verification budget (rows) for this step
    remap: torch.Tensor,                  # [num_seqs] int32: previous-batch index, FRESH_SEQUENCE (-1) if new
    prev_confidence_rates: torch.Tensor,  # [n_prev, nextn] float32: last step's per-position confidences
    seqlens_q: torch.Tensor,              # [num_seqs] int32 (out): rows per sequence, each in [1, nextn + 1]
) -> torch.Tensor:
    """Fill ``seqlens_q`` to maximise expected accepted tokens; returns it. Rules: module docstring."""
    op = "compute_seqlens_q_by_confidence_rates"
    check_tensor(op, "remap", remap, [None], "[num_seqs]", [torch.int32])
    num_seqs, dev = remap.shape[0], remap.device
    check_tensor(op, "prev_confidence_rates", prev_confidence_rates, [None, None], "[n_prev, nextn]",
                 [torch.float32], dev)
    check_tensor(op, "seqlens_q", seqlens_q, [num_seqs], "[num_seqs]", [torch.int32], dev)
    if total_q < 0:
        raise ValueError(f"{op}: total_q must be >= 0, got {total_q}")
    n_prev = prev_confidence_rates.shape[0]
    if is_host(remap) and num_seqs and bool(((remap < FRESH_SEQUENCE) | (remap >= n_prev)).any()):
        raise ValueError(f"{op}: remap must be {FRESH_SEQUENCE} (fresh) or in [0, n_prev={n_prev})")
    select_backend(op, dev, has_kernel=False)
    return compute_seqlens_q_by_confidence_rates_ref(int(total_q), remap, prev_confidence_rates, seqlens_q)
