"""Per-row temperature / top-k / top-p as a logits transform, and the probabilities it implies.

For row ``r`` with parameters ``(T, k, p)`` (rules applied in this order):

1. ``T == 0`` (greedy): keep only the argmax of the raw logits (lowest column on ties); every
   other column becomes ``-inf``. Steps 2-4 are skipped, so sampling from the result is argmax.
2. ``T > 0``: ``logits / T`` (float32).
3. ``k == TOP_K_OFF`` (-1) or ``k >= vocab``: off. Else keep the columns whose scaled logit is
   ``>=`` the k-th largest one; ties at the boundary are all kept (so more than k can survive).
4. ``p >= 1.0`` (``TOP_P_OFF``): off. Else, with ``q = softmax`` of the step-3 logits and the
   columns ranked by descending ``q``, equal ``q`` by ascending column: keep a column iff the
   mass of the columns ranked strictly before it is ``< p`` (the smallest prefix reaching ``p``;
   the top-1 column always survives). Masses accumulate in float64.

Removed columns are ``-inf``; ``probs_from_logits`` is the float32 softmax of the result, so
removed columns have probability exactly 0 and the survivors are renormalised.
"""

from __future__ import annotations

import torch

from deepinfer_kernels.ops.sampling._checks import FLOAT_DTYPES, check_tensor, is_host
from deepinfer_kernels.platform import select_backend

TOP_K_OFF = -1    # top_k value that disables top-k for a row
TOP_P_OFF = 1.0   # top_p value (or anything >= it) that disables top-p for a row
GREEDY_TEMPERATURE = 0.0  # temperature that selects greedy (argmax) decoding for a row


def _greedy_mask(logits: torch.Tensor) -> torch.Tensor:  # [rows, vocab] bool, True = keep
    keep = torch.zeros_like(logits, dtype=torch.bool)
    return keep.scatter_(1, logits.argmax(dim=1, keepdim=True), True)


def _top_k_keep(scaled: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:  # [rows, vocab] bool
    rows, vocab = scaled.shape
    active = (top_k != TOP_K_OFF) & (top_k < vocab)
    if not bool(active.any()):
        return torch.ones_like(scaled, dtype=torch.bool)
    k = torch.where(active, top_k, vocab).clamp(1, vocab).to(torch.int64)
    sorted_desc = scaled.sort(dim=1, descending=True).values
    kth = sorted_desc.gather(1, (k - 1).unsqueeze(1))
    return (scaled >= kth) | ~active.unsqueeze(1)


def _top_p_keep(scaled: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:  # [rows, vocab] bool
    active = top_p < TOP_P_OFF
    if not bool(active.any()):
        return torch.ones_like(scaled, dtype=torch.bool)
    q = torch.softmax(scaled, dim=1).to(torch.float64)
    q_sorted, order = q.sort(dim=1, descending=True, stable=True)  # stable: ties by column index
    mass_before = torch.cumsum(q_sorted, dim=1) - q_sorted
    keep_sorted = mass_before < top_p.to(torch.float64).unsqueeze(1)
    keep_sorted[:, 0] = True
    keep = torch.empty_like(keep_sorted).scatter_(1, order, keep_sorted)
    return keep | ~active.unsqueeze(1)


def apply_sampling_params_ref(
    logits: torch.Tensor,       # [rows, vocab] float
    temperature: torch.Tensor,  # [rows] float32
    top_k: torch.Tensor,        # [rows] int32
    top_p: torch.Tensor,        # [rows] float32
) -> torch.Tensor:              # [rows, vocab] float32
    logits = logits.to(torch.float32)
    greedy = (temperature == GREEDY_TEMPERATURE).unsqueeze(1)
    scaled = logits / torch.where(greedy.squeeze(1), 1.0, temperature).unsqueeze(1)
    keep = _top_k_keep(scaled, top_k)
    scaled = scaled.masked_fill(~keep, float("-inf"))
    keep = keep & _top_p_keep(scaled, top_p)
    keep = torch.where(greedy, _greedy_mask(logits), keep)
    out = torch.where(greedy, logits, scaled)
    return out.masked_fill(~keep, float("-inf"))


def _check_params(op: str, logits, temperature, top_k, top_p) -> None:
    check_tensor(op, "logits", logits, [None, None], "[rows, vocab]", FLOAT_DTYPES)
    rows, dev = logits.shape[0], logits.device
    check_tensor(op, "temperature", temperature, [rows], "[rows]", [torch.float32], dev)
    check_tensor(op, "top_k", top_k, [rows], "[rows]", [torch.int32], dev)
    check_tensor(op, "top_p", top_p, [rows], "[rows]", [torch.float32], dev)
    if logits.shape[1] == 0:
        raise ValueError(f"{op}: logits must have vocab >= 1 columns")
    if is_host(logits) and rows:
        if bool((~(temperature >= 0)).any()):
            raise ValueError(f"{op}: temperature must be >= 0 (0 = greedy)")
        if bool(((top_k < 1) & (top_k != TOP_K_OFF)).any()):
            raise ValueError(f"{op}: top_k must be >= 1 or {TOP_K_OFF} (off)")
        if bool((~(top_p > 0)).any()):
            raise ValueError(f"{op}: top_p must be in (0, 1] ({TOP_P_OFF} = off)")


def apply_sampling_params(
    logits: torch.Tensor,       # [rows, vocab] float
    temperature: torch.Tensor,  # [rows] float32, 0 = greedy
    top_k: torch.Tensor,        # [rows] int32, TOP_K_OFF (-1) = off
    top_p: torch.Tensor,        # [rows] float32, TOP_P_OFF (1.0) = off
) -> torch.Tensor:              # [rows, vocab] float32, removed columns = -inf
    """Processed logits of each row under its sampling parameters (rules in the module docstring)."""
    op = "apply_sampling_params"
    _check_params(op, logits, temperature, top_k, top_p)
    select_backend(op, logits.device, has_kernel=False)
    return apply_sampling_params_ref(logits, temperature, top_k, top_p)


def probs_from_logits(
    logits: torch.Tensor,       # [rows, vocab] float
    temperature: torch.Tensor,  # [rows] float32, 0 = greedy
    top_k: torch.Tensor,        # [rows] int32, -1 = off
    top_p: torch.Tensor,        # [rows] float32, 1.0 = off
) -> torch.Tensor:              # [rows, vocab] float32, rows sum to 1, removed columns exactly 0
    """Sampling distribution of each row: ``softmax(apply_sampling_params(...))``.

    Greedy rows come out one-hot at the argmax, so every sampler (random_sampling, the
    speculative accept test) treats them exactly as argmax decoding.
    """
    op = "probs_from_logits"
    _check_params(op, logits, temperature, top_k, top_p)
    select_backend(op, logits.device, has_kernel=False)
    return torch.softmax(apply_sampling_params_ref(logits, temperature, top_k, top_p), dim=1)
