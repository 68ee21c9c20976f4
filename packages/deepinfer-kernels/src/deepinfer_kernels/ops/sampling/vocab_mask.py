"""Structured-output masks: set the logits of tokens a grammar forbids to ``-inf``, in place.

The mask is xgrammar's packed bitmask: ``vocab_mask [num_masks, mask_width] int32``, bit ``t % 32``
of word ``t // 32`` set  <=>  token ``t`` allowed (``mask_width >= ceil(vocab / 32)``; bits past
``vocab`` are ignored)::

    word 0 = 0b...0101   -> tokens 0 and 2 allowed, 1 and 3 forbidden, ...

Two entry points:

- ``apply_vocab_mask_inplace(logits, vocab_mask, row_mask_ids)``: any row to any mask;
  ``row_mask_ids[r] == NO_VOCAB_MASK`` leaves row ``r`` untouched.
- ``apply_vocab_mask_by_step_inplace(logits, vocab_mask, indices, ftp, step)``: the grammar
  state of request ``i`` after ``step`` accepted tokens constrains its row at local step
  ``step`` (flat row ``ftp[i] + step``), one verification step at a time as the matcher
  advances over the drafts.
"""

from __future__ import annotations

import torch

from deepinfer_kernels.ops.capture import use_capturable
from deepinfer_kernels.ops.sampling._checks import FLOAT_DTYPES, check_tensor, is_host
from deepinfer_kernels.platform import select_backend

# Mask index meaning "this row / request has no grammar": its logits are left untouched.
NO_VOCAB_MASK = -1

_BITS = 32


def unpack_vocab_mask(vocab_mask: torch.Tensor, vocab: int) -> torch.Tensor:
    """``[n, mask_width] int32`` packed bits -> ``[n, vocab]`` bool (True = allowed)."""
    shifts = torch.arange(_BITS, dtype=torch.int32, device=vocab_mask.device)
    bits = (vocab_mask.unsqueeze(-1) >> shifts) & 1  # arithmetic shift is fine: only bit 0 is kept
    return bits.reshape(vocab_mask.shape[0], -1)[:, :vocab].bool()


def apply_vocab_mask_inplace_ref(
    logits: torch.Tensor,        # [rows, vocab] float (modified)
    vocab_mask: torch.Tensor,    # [num_masks, mask_width] int32
    row_mask_ids: torch.Tensor,  # [rows] int32, NO_VOCAB_MASK = untouched
) -> None:
    vocab = logits.shape[1]
    constrained = row_mask_ids != NO_VOCAB_MASK
    rows = torch.nonzero(constrained).squeeze(1)
    if rows.numel() == 0:
        return
    allowed = unpack_vocab_mask(vocab_mask[row_mask_ids[rows].to(torch.int64)], vocab)
    logits[rows] = logits[rows].masked_fill(~allowed, float("-inf"))


def apply_vocab_mask_inplace_capturable(logits: torch.Tensor, vocab_mask: torch.Tensor,
                                        row_mask_ids: torch.Tensor) -> None:
    """`apply_vocab_mask_inplace_ref` without the data-dependent row selection (no host sync, static
    shapes: CUDA graphs): every row's mask is unpacked, unconstrained rows keep all tokens."""
    if logits.shape[0] == 0 or vocab_mask.shape[0] == 0:
        return
    constrained = row_mask_ids != NO_VOCAB_MASK                                        # [rows]
    allowed = unpack_vocab_mask(vocab_mask[row_mask_ids.clamp(min=0).long()], logits.shape[1])  # [rows, vocab]
    logits.masked_fill_(constrained.unsqueeze(1) & ~allowed, float("-inf"))


def by_step_row_mask_ids_ref(
    total_q: int,
    indices: torch.Tensor,           # [req_cnt] int32
    ftp: torch.Tensor | None,        # [req_cnt] int32, None: row i is request i
    seqlens_q: torch.Tensor | None,  # [req_cnt] int32, None: every request has row `step`
    step: int,
) -> torch.Tensor:                   # [total_q] int32
    """Per-row mask ids that select request ``i``'s row at local step ``step``."""
    req_cnt = indices.shape[0]
    out = torch.full((total_q,), NO_VOCAB_MASK, dtype=torch.int32, device=indices.device)
    first = torch.arange(req_cnt, device=indices.device) if ftp is None else ftp.to(torch.int64)
    has_row = torch.ones(req_cnt, dtype=torch.bool, device=indices.device)
    if seqlens_q is not None:
        has_row = step < seqlens_q
    use = has_row & (indices != NO_VOCAB_MASK)
    return out.index_put_((first[use] + step,), indices[use].to(torch.int32))


def _check_mask(op: str, logits, vocab_mask) -> None:
    check_tensor(op, "logits", logits, [None, None], "[rows, vocab]", FLOAT_DTYPES)
    check_tensor(op, "vocab_mask", vocab_mask, [None, None], "[num_masks, ceil(vocab/32)]", [torch.int32],
                 logits.device)
    need = -(-logits.shape[1] // _BITS)
    if vocab_mask.shape[1] < need:
        raise ValueError(f"{op}: vocab_mask must have shape [num_masks, >= ceil(vocab/32) = {need}], "
                         f"got {list(vocab_mask.shape)}")


def _check_mask_ids(op: str, name: str, ids: torch.Tensor, num_masks: int) -> None:
    if is_host(ids) and ids.numel() and bool(((ids < NO_VOCAB_MASK) | (ids >= num_masks)).any()):
        raise ValueError(f"{op}: {name} must be {NO_VOCAB_MASK} (no mask) or in [0, num_masks={num_masks})")


def apply_vocab_mask_inplace(
    logits: torch.Tensor,        # [rows, vocab] float, modified in place
    vocab_mask: torch.Tensor,    # [num_masks, ceil(vocab/32)] int32 packed bitmask (1 = allowed)
    row_mask_ids: torch.Tensor,  # [rows] int32: mask of each row, NO_VOCAB_MASK (-1) = none
) -> None:
    """Disallowed tokens of every constrained row get ``-inf``."""
    op = "apply_vocab_mask_inplace"
    _check_mask(op, logits, vocab_mask)
    check_tensor(op, "row_mask_ids", row_mask_ids, [logits.shape[0]], "[rows]", [torch.int32], logits.device)
    _check_mask_ids(op, "row_mask_ids", row_mask_ids, vocab_mask.shape[0])
    select_backend(op, logits.device, has_kernel=False)
    if use_capturable(logits):
        apply_vocab_mask_inplace_capturable(logits, vocab_mask, row_mask_ids)
    else:
        apply_vocab_mask_inplace_ref(logits, vocab_mask, row_mask_ids)


def apply_vocab_mask_by_step_inplace(
    logits: torch.Tensor,                   # [total_q, vocab] float, modified in place
    vocab_mask: torch.Tensor,               # [num_masks, ceil(vocab/32)] int32 packed bitmask
    indices: torch.Tensor,                  # [req_cnt] int32: mask of request i, NO_VOCAB_MASK = none
    ftp: torch.Tensor | None = None,        # [req_cnt] int32 first row of each request; None: row i
    step: int = 0,                          # local step whose rows are masked
    seqlens_q: torch.Tensor | None = None,  # [req_cnt] int32: requests with seqlens_q <= step skipped
) -> None:
    """Mask row ``ftp[i] + step`` of every request ``i`` with ``vocab_mask[indices[i]]``.

    Without ``seqlens_q`` every request must own a row at ``step`` (checked on the CPU); with it,
    requests shorter than ``step + 1`` rows are skipped.
    """
    op = "apply_vocab_mask_by_step_inplace"
    _check_mask(op, logits, vocab_mask)
    dev, total_q = logits.device, logits.shape[0]
    check_tensor(op, "indices", indices, [None], "[req_cnt]", [torch.int32], dev)
    req_cnt = indices.shape[0]
    if ftp is not None:
        check_tensor(op, "ftp", ftp, [req_cnt], "[req_cnt]", [torch.int32], dev)
    elif req_cnt != total_q:
        raise ValueError(f"{op}: without ftp, logits must have one row per request ([req_cnt={req_cnt}, vocab])")
    if seqlens_q is not None:
        check_tensor(op, "seqlens_q", seqlens_q, [req_cnt], "[req_cnt]", [torch.int32], dev)
    if step < 0:
        raise ValueError(f"{op}: step must be >= 0, got {step}")
    _check_mask_ids(op, "indices", indices, vocab_mask.shape[0])
    if is_host(indices) and req_cnt:
        first = torch.arange(req_cnt) if ftp is None else ftp.to(torch.int64)
        rows = first + step
        active = indices != NO_VOCAB_MASK
        if seqlens_q is not None:
            active &= step < seqlens_q
        if bool((active & (rows >= total_q)).any()):
            raise ValueError(f"{op}: row ftp[i] + step falls outside logits [total_q={total_q}, vocab]")
    select_backend(op, dev, has_kernel=False)
    row_mask_ids = by_step_row_mask_ids_ref(total_q, indices, ftp, seqlens_q, step)
    apply_vocab_mask_inplace_ref(logits, vocab_mask, row_mask_ids)
