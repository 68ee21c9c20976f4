"""Shared key lists of row groups: the union of 2 or 4 consecutive sparse-attention index rows,
each key tagged with the rows that attend it.

Rows ``n g .. n g + n - 1`` of a prefill chunk (or of a request's verification rows) are
consecutive positions of one request: their windows differ in a few keys and their far entries
mostly coincide. A sparse MLA kernel that attends the group's *union* once, with all its rows'
queries in one wgmma (n x 16 heads), reads and dequantizes each shared key once instead of n times.

An entry is ``slot | row_bits << row_bits_shift(n)`` (29 for pairs, 27 for quads: the bits sit
just below the sign bit); bit j of ``row_bits`` = row ``n g + j`` attends the slot. Rows past the
end of the chunk are empty. For a group of rows 0 .. n - 1:

    keys[g, :counts[g]]  row n-1's valid slots in its order, then row n-2's valid slots that no
                         later row lists, ..., then row 0's that no later row lists; an entry
                         taken from row j carries bit j and the bit of every earlier row (< j)
                         that lists the slot too
    keys[g, counts[g]:]  -1

For pairs (A = row 0, B = row 1): B's slots (bits 2, or 3 when A lists the slot too), then A's
slots B lacks (bits 1). The lists keep the rows' own order, so runs of consecutive slots (a KV
block of the window, packed compressed entries) stay runs for the kernel's bulk copies. A row that
lists a slot twice attends it twice (``ops.sparse_mla``); such a group (callers never produce one)
gets its rows' lists whole, row 0's entries (bit 0) first, no entry shared. Slots must be below
``max_shared_key_slot(n)`` (2^29 for pairs: 283 GB of 528-byte records; 2^27 for quads: 70 GB).
"""

from __future__ import annotations

import torch

from deepinfer_kernels.layouts import (  # noqa: F401  (the encoding, re-exported)
    GROUP_SIZES,
    MAX_SHARED_KEY_SLOT,
    ROWS_PER_GROUP,
    max_shared_key_slot,
    num_groups,
    row_bits_shift,
)
from deepinfer_kernels.ops._checks import INDEX_DTYPES, check_tensor
from deepinfer_kernels.ops.capture import host_checks
from deepinfer_kernels.platform import tilelang_launcher

def _has_repeats(rows: torch.Tensor) -> torch.Tensor:
    """rows int64 [G, W] (-1 = empty) -> bool [G]: a valid slot appears twice in the row."""
    srt = rows.sort(dim=1).values
    return ((srt[:, 1:] == srt[:, :-1]) & (srt[:, 1:] >= 0)).any(dim=1)


def _listed_in(values: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """values, rows int64 [G, W] -> bool [G, W]: values[g, i] is a valid slot that rows[g] lists."""
    srt = torch.where(rows >= 0, rows, torch.iinfo(torch.int64).max).sort(dim=1).values
    at = torch.searchsorted(srt, values.contiguous()).clamp(max=srt.shape[1] - 1)
    return (values >= 0) & (srt.gather(1, at) == values)


def shared_key_lists_ref(indices: torch.Tensor, group_rows: int = ROWS_PER_GROUP) -> tuple[torch.Tensor, torch.Tensor]:
    """indices int [R, W] (-1 = empty) -> (keys int32 [ceil(R / n), n W], counts int32 [ceil(R / n)]),
    n = ``group_rows``."""
    n = group_rows
    shift = row_bits_shift(n)
    rows, width = indices.shape
    groups = num_groups(rows, n)
    device = indices.device
    if width == 0 or groups == 0:
        return torch.full((groups, 0), -1, dtype=torch.int32, device=device), torch.zeros(groups, dtype=torch.int32,
                                                                                          device=device)
    idx = torch.full((groups * n, width), -1, dtype=torch.int64, device=device)
    idx[:rows] = indices.long()
    members = [idx[j::n] for j in range(n)]                                      # row j of every group, [G, W]
    repeats = torch.zeros(groups, 1, dtype=torch.bool, device=device)
    for m in members:
        repeats |= _has_repeats(m).unsqueeze(1)                                  # [G, 1]
    parts = []
    for j, m in enumerate(members):
        later = torch.zeros_like(m, dtype=torch.bool)
        bits = torch.full_like(m, 1 << j)
        for k, other in enumerate(members):
            if k > j:
                later |= _listed_in(m, other)
            elif k < j:
                bits |= _listed_in(m, other).long() << k
        kept = (m >= 0) & (repeats | ~later)
        parts.append(torch.where(kept, m | (torch.where(repeats, 1 << j, bits) << shift), -1))
    seq = torch.where(repeats, torch.cat(parts, 1), torch.cat(parts[::-1], 1))  # [G, n W]
    emit = seq >= 0
    pos = torch.where(emit, emit.long().cumsum(dim=1) - 1, n * width)           # dropped: a spare column
    out = torch.full((groups, n * width + 1), -1, dtype=torch.int64, device=device)
    out.scatter_(1, pos, seq)
    return out[:, :-1].to(torch.int32), emit.sum(dim=1).to(torch.int32)


def shared_key_lists(indices: torch.Tensor, group_rows: int = ROWS_PER_GROUP) -> tuple[torch.Tensor, torch.Tensor]:
    """indices int32/int64 [R, W] of pool slots < ``max_shared_key_slot(group_rows)`` (-1 = empty)
    -> (keys int32 [ceil(R / n), n W], counts int32 [ceil(R / n)]), n = ``group_rows`` (2 or 4);
    see the module docstring."""
    check_tensor("indices", indices, 2, INDEX_DTYPES)
    limit = max_shared_key_slot(group_rows)
    if host_checks(indices) and indices.numel() and int(indices.max()) >= limit:
        raise ValueError(f"indices: max slot {int(indices.max())} >= {limit} (2^{row_bits_shift(group_rows)}), "
                         f"the largest a shared key list of {group_rows} rows can tag")
    kernel = tilelang_launcher("shared_key_lists", indices.device)
    if kernel is not None:
        return kernel(indices, group_rows)
    return shared_key_lists_ref(indices, group_rows)


def split_shared_keys(keys: torch.Tensor, group_rows: int = ROWS_PER_GROUP) -> tuple[torch.Tensor, torch.Tensor]:
    """keys int32 [G, K] -> (slots int64 [G, K] (-1 where empty), row bits int64 [G, K] (0 where empty))."""
    shift = row_bits_shift(group_rows)
    k = keys.long()
    empty = k < 0
    return torch.where(empty, -1, k & ((1 << shift) - 1)), torch.where(empty, 0, k >> shift)
