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

from deepinfer_kernels.ops.sampling._checks import FLOAT_DTYPES, check_tensor, is_host, may_be_true
from deepinfer_kernels.platform import select_backend

TOP_K_OFF = -1    # top_k value that disables top-k for a row
TOP_P_OFF = 1.0   # top_p value (or anything >= it) that disables top-p for a row
GREEDY_TEMPERATURE = 0.0  # temperature that selects greedy (argmax) decoding for a row


def _greedy_mask(logits: torch.Tensor) -> torch.Tensor:  # [rows, vocab] bool, True = keep
    keep = torch.zeros_like(logits, dtype=torch.bool)
    return keep.scatter_(1, logits.argmax(dim=1, keepdim=True), True)


def _top_k_keep(scaled: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor | None:  # [rows, vocab] bool
    """Columns top-k keeps; None when no row filters (nothing to mask)."""
    rows, vocab = scaled.shape
    active = (top_k != TOP_K_OFF) & (top_k < vocab)
    if not bool(active.any()):
        return None
    k = torch.where(active, top_k, 1).clamp(1, vocab).to(torch.int64)
    # The k-th largest value is the same whichever way a selection orders ties, so topk of the
    # largest active k (cheap for the usual k << vocab) gives it exactly.
    k_max = int(k.max())
    kth = scaled.topk(k_max, dim=1, sorted=True).values.gather(1, (k - 1).unsqueeze(1))
    return (scaled >= kth) | ~active.unsqueeze(1)


TOP_P_WINDOWS = (64, 1024)  # candidate window sizes tried before a full sort of a row


def _nucleus_in_sorted(q_sorted: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Keep flags of columns already in (q desc, column asc) order; float64 masses."""
    mass_before = torch.cumsum(q_sorted, dim=1) - q_sorted
    keep = mass_before < top_p.unsqueeze(1)
    keep[:, 0] = True
    return keep


def _stable_desc(values: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Reorder (value, id) pairs of each row by value descending, then id ascending."""
    by_id = ids.sort(dim=1).indices
    values, ids = values.gather(1, by_id), ids.gather(1, by_id)
    order = values.sort(dim=1, descending=True, stable=True).indices
    return values.gather(1, order), ids.gather(1, order)


def _top_p_keep(scaled: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor | None:  # [rows, vocab] bool
    """Exact nucleus without sorting whole rows.

    Take the ``m`` largest ``q`` of a row (``v_m`` the smallest of them). If the columns with
    ``q > v_m`` already hold mass ``>= top_p``, every column with ``q <= v_m`` has at least that much
    mass ranked before it and is dropped, so the nucleus lies inside the candidates and their
    (q desc, column asc) order decides it with the same float64 prefix sums as a full sort. Rows
    not decided by any window in ``TOP_P_WINDOWS`` (very flat distributions) are sorted in full.
    ``q`` is ranked in float32 (its float64 values are exact conversions, so the order is the
    same). None when no row filters.
    """
    rows, vocab = scaled.shape
    active = top_p < TOP_P_OFF
    if not bool(active.any()):
        return None
    all_active = bool(active.all())
    act = None if all_active else torch.nonzero(active).squeeze(1)
    q = torch.softmax(scaled if all_active else scaled[act], dim=1)  # float32
    p = (top_p if all_active else top_p[act]).to(torch.float64)
    sub = torch.zeros_like(q, dtype=torch.bool)
    todo = torch.arange(q.shape[0], device=q.device)
    for m in (*(w for w in TOP_P_WINDOWS if w < vocab), vocab):
        qt, pt = q[todo], p[todo]
        if m < vocab:
            vals, ids = qt.topk(m, dim=1, sorted=True)
            vals, ids = _stable_desc(vals.to(torch.float64), ids)
            v_m = vals[:, -1:]
            decided = torch.where(vals > v_m, vals, 0.0).sum(dim=1) >= pt + 1e-9
        else:  # full sort: always decides
            vals, ids = qt.to(torch.float64).sort(dim=1, descending=True, stable=True)
            decided = torch.ones(todo.shape[0], dtype=torch.bool, device=q.device)
        keep_sorted = _nucleus_in_sorted(vals, pt) & decided.unsqueeze(1)
        sub[todo] = sub[todo].scatter(1, ids, keep_sorted)
        todo = todo[~decided]
        if todo.numel() == 0:
            break
    if all_active:
        return sub
    keep = torch.ones_like(scaled, dtype=torch.bool)
    keep[act] = sub
    return keep


def apply_sampling_params_ref(
    logits: torch.Tensor,       # [rows, vocab] float
    temperature: torch.Tensor,  # [rows] float32
    top_k: torch.Tensor,        # [rows] int32
    top_p: torch.Tensor,        # [rows] float32
    filters: bool = True,       # False: the caller knows every row has top-k and top-p off
) -> torch.Tensor:              # [rows, vocab] float32
    """`filters=False` skips the top-k / top-p passes, whose "does any row filter?" tests read the
    device (a sync): the engine knows the answer on the host, and a CUDA graph cannot sync."""
    logits = logits.to(torch.float32)
    greedy = temperature == GREEDY_TEMPERATURE
    out = logits / torch.where(greedy, 1.0, temperature).unsqueeze(1)
    for keep_fn, param in ((_top_k_keep, top_k), (_top_p_keep, top_p)) if filters else ():  # top-k, then top-p
        keep = keep_fn(out, param)
        if keep is not None:
            out = out.masked_fill(~keep, float("-inf"))
    if may_be_true(greedy):
        one_hot = logits.masked_fill(~_greedy_mask(logits), float("-inf"))
        out = torch.where(greedy.unsqueeze(1), one_hot, out)
    return out


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
    filters: bool = True,       # False: no row uses top-k or top-p (known on the host; no sync)
) -> torch.Tensor:              # [rows, vocab] float32, rows sum to 1, removed columns exactly 0
    """Sampling distribution of each row: ``softmax(apply_sampling_params(...))``.

    Greedy rows come out one-hot at the argmax, so every sampler (random_sampling, the
    speculative accept test) treats them exactly as argmax decoding.
    """
    op = "probs_from_logits"
    _check_params(op, logits, temperature, top_k, top_p)
    select_backend(op, logits.device, has_kernel=False)
    return torch.softmax(apply_sampling_params_ref(logits, temperature, top_k, top_p, filters), dim=1)
