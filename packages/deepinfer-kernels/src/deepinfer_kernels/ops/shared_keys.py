"""Shared key lists of row pairs: the union of two sparse-attention index rows, each key tagged
with the rows that attend it.

Rows ``2g`` and ``2g + 1`` of a prefill chunk (or of a request's verification rows) are
consecutive positions of one request: their windows differ in one key and their far entries
mostly coincide. A sparse MLA kernel that attends the pair's *union* once, with both rows' queries
as the wgmma's N side (2 x 16 heads), reads and dequantizes each shared key once instead of twice.

An entry is ``slot | row_bits << 29``; bit j of ``row_bits`` = row ``2g + j`` attends the slot.
With rows A = ``2g`` and B = ``2g + 1`` (a missing B, odd row count, is empty):

    keys[g, :counts[g]]  B's valid slots in B's order (bits 2, or 3 when A also lists the slot),
                         then A's valid slots that B does not list, in A's order (bits 1)
    keys[g, counts[g]:]  -1

The lists keep the rows' own order, so runs of consecutive slots (a KV block of the window, packed
compressed entries) stay runs for the kernel's bulk copies. A row that lists a slot twice attends
it twice (``ops.sparse_mla``); such a pair (callers never produce one) gets both rows' lists whole,
A's entries (bits 1) then B's (bits 2), no entry shared. Slots must be below
``MAX_SHARED_KEY_SLOT`` (2^29: 283 GB of 528-byte records).
"""

from __future__ import annotations

import torch

from deepinfer_kernels.ops._checks import INDEX_DTYPES, check_tensor
from deepinfer_kernels.ops.capture import host_checks
from deepinfer_kernels.platform import tilelang_launcher

ROWS_PER_GROUP = 2
ROW_BITS_SHIFT = 29
MAX_SHARED_KEY_SLOT = 1 << ROW_BITS_SHIFT
SLOT_BITS = MAX_SHARED_KEY_SLOT - 1


def num_groups(rows: int) -> int:
    return (rows + ROWS_PER_GROUP - 1) // ROWS_PER_GROUP


def _has_repeats(rows: torch.Tensor) -> torch.Tensor:
    """rows int64 [G, W] (-1 = empty) -> bool [G]: a valid slot appears twice in the row."""
    srt = rows.sort(dim=1).values
    return ((srt[:, 1:] == srt[:, :-1]) & (srt[:, 1:] >= 0)).any(dim=1)


def _listed_in(values: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """values, rows int64 [G, W] -> bool [G, W]: values[g, i] is a valid slot that rows[g] lists."""
    srt = torch.where(rows >= 0, rows, torch.iinfo(torch.int64).max).sort(dim=1).values
    at = torch.searchsorted(srt, values.contiguous()).clamp(max=srt.shape[1] - 1)
    return (values >= 0) & (srt.gather(1, at) == values)


def shared_key_lists_ref(indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """indices int [R, W] (-1 = empty) -> (keys int32 [ceil(R / 2), 2W], counts int32 [ceil(R / 2)])."""
    rows, width = indices.shape
    groups = num_groups(rows)
    device = indices.device
    idx = torch.full((groups * ROWS_PER_GROUP, width), -1, dtype=torch.int64, device=device)
    idx[:rows] = indices.long()
    a, b = idx[0::2], idx[1::2]                                                  # [G, W] each
    if width == 0 or groups == 0:
        return torch.full((groups, 0), -1, dtype=torch.int32, device=device), torch.zeros(groups, dtype=torch.int32,
                                                                                          device=device)
    repeats = (_has_repeats(a) | _has_repeats(b)).unsqueeze(1)                  # [G, 1]
    b_bits = torch.where(repeats, 2, torch.where(_listed_in(b, a), 3, 2))
    a_kept = (a >= 0) & (repeats | ~_listed_in(a, b))
    b_part = torch.where(b >= 0, b | (b_bits << ROW_BITS_SHIFT), -1)
    a_part = torch.where(a_kept, a | (1 << ROW_BITS_SHIFT), -1)
    seq = torch.where(repeats, torch.cat([a_part, b_part], 1), torch.cat([b_part, a_part], 1))   # [G, 2W]
    emit = seq >= 0
    pos = torch.where(emit, emit.long().cumsum(dim=1) - 1, 2 * width)           # dropped: a spare column
    out = torch.full((groups, 2 * width + 1), -1, dtype=torch.int64, device=device)
    out.scatter_(1, pos, seq)
    return out[:, :-1].to(torch.int32), emit.sum(dim=1).to(torch.int32)


def shared_key_lists(indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """indices int32/int64 [R, W] of pool slots < 2^29 (-1 = empty)
    -> (keys int32 [ceil(R / 2), 2W], counts int32 [ceil(R / 2)]); see the module docstring."""
    check_tensor("indices", indices, 2, INDEX_DTYPES)
    if host_checks(indices) and indices.numel() and int(indices.max()) >= MAX_SHARED_KEY_SLOT:
        raise ValueError(f"indices: max slot {int(indices.max())} >= {MAX_SHARED_KEY_SLOT} (2^{ROW_BITS_SHIFT}), "
                         "the largest a shared key list can tag")
    kernel = tilelang_launcher("shared_key_lists", indices.device)
    if kernel is not None:
        return kernel(indices)
    return shared_key_lists_ref(indices)


def split_shared_keys(keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """keys int32 [G, K] -> (slots int64 [G, K] (-1 where empty), row bits int64 [G, K] (0 where empty))."""
    k = keys.long()
    empty = k < 0
    return torch.where(empty, -1, k & SLOT_BITS), torch.where(empty, 0, k >> ROW_BITS_SHIFT)
