"""Encodings and small torch helpers that the references (``ops/``) and the kernels
(``tilelang/``) share. A leaf module: it imports torch only, so ``ops`` may import ``tilelang``
and both may import this without an import loop.

* Engram's n-gram hash: ``h = (h * HASH_MULT + cid + 1) mod HASH_MOD`` (``ops.engram``).
* Shared key lists (``ops.shared_keys``): an entry is ``slot | row_bits << row_bits_shift(n)``,
  the row bits of a group of ``n`` rows just below the sign bit.
* The routed experts' row orders (``ops.moe``): flat ``t * k + slot`` indices sorted by expert.
* ``NormedProjection``: what ``rms_norm_linear`` returns (``ops.linear``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

HASH_MULT = 1000003
HASH_MOD = 2**31 - 1

ROWS_PER_GROUP = 2           # the pairs' default
GROUP_SIZES = (2, 4)


def row_bits_shift(group_rows: int = ROWS_PER_GROUP) -> int:
    """Where an entry's row bits start: ``group_rows`` bits just below the sign bit."""
    if group_rows not in GROUP_SIZES:
        raise ValueError(f"group_rows: {group_rows}, expected one of {GROUP_SIZES}")
    return 31 - group_rows


def max_shared_key_slot(group_rows: int = ROWS_PER_GROUP) -> int:
    return 1 << row_bits_shift(group_rows)


MAX_SHARED_KEY_SLOT = max_shared_key_slot()   # pairs': 2^29


def num_groups(rows: int, group_rows: int = ROWS_PER_GROUP) -> int:
    return (rows + group_rows - 1) // group_rows


def permute_by_expert(ids: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """ids [T, k] -> (order [T*k] int64: flat (t*k + slot) indices sorted by expert, stable;
    expert_offsets [E+1] int64)."""
    flat = ids.reshape(-1).long()
    order = torch.sort(flat, stable=True).indices
    counts = torch.bincount(flat, minlength=num_experts)
    offsets = torch.zeros(num_experts + 1, dtype=torch.long, device=ids.device)
    offsets[1:] = torch.cumsum(counts, 0)
    return order, offsets


def grouped_mm_order(ids: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """ids [T, k] -> (order [T*k] int64: flat (t*k + slot) indices sorted by expert, stable;
    ends [E] int32: cumulative rows per expert, `torch._grouped_mm`'s `offs`). Static shapes, no sync."""
    sorted_ids, order = torch.sort(ids.reshape(-1).long(), stable=True)
    ends = torch.searchsorted(sorted_ids, torch.arange(num_experts, device=ids.device), right=True, out_int32=True)
    return order, ends


@dataclass
class NormedProjection:
    """What `rms_norm_linear` returns: the projection and, where asked, the rows it normalised."""

    y: torch.Tensor                # [..., N] linear(u, weight)
    s: torch.Tensor | None = None  # [..., K] x + residual in x's dtype (None without a residual)
    u: torch.Tensor | None = None  # [..., K] rms_norm(s) (None unless return_normed)
