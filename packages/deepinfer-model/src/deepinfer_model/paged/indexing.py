"""Index arithmetic of the engine path: virtual positions -> slots -> flat pool rows.

```
virtual position v of request i  ->  slot = block_tables[i, v // bs] * bs + v % bs
slot s of plane p                 ->  flat row plane_base[p] + s   (planes back to back, paged_cache.py)
window of a row at position p     ->  positions max(lo, p - W + 1) .. p      (swa_index.window_positions)
far entries of a row              ->  j < n_far = max(0, p - W + 1) // r     entry j at position j*r + r - 1
entry j = v // r closing at v       ->  slot = block_tables[i, v // bs] * (bs / r) + j % (bs / r)
```
A block owns bs / r consecutive records of each ratio-r plane (the plane has bs / r rows per block,
1/r of the tokens): consecutive entries are consecutive records, so the attention and indexer
kernels copy a run of them at once. The entry slot is the token slot of entry index j in a
table of blocks of bs / r "tokens" (`paged_slots(tables, req, j, bs // r)`).
An entry stays in the block of its tokens (bs is a multiple of r), so prefix-shared blocks keep
owning their entries.
`-1` marks an empty column everywhere and survives every mapping.
The rows' window and far-entry slot lists come from `deepinfer_kernels.ops.paged_slots.window_slots`
and `far_entry_slots` (the two lines above, one launch each on SM90).
"""

from __future__ import annotations

import torch

from deepinfer_kernels.ops.paged_slots import paged_slots


def slots_of(block_tables: torch.Tensor, req: torch.Tensor, vpos: torch.Tensor, block_size: int) -> torch.Tensor:
    """block_tables [R, MB] int32, req [N], vpos [N, K] int64 (-1 = empty) -> slots int64 [N, K]
    (`deepinfer_kernels.ops.paged_slots`: one launch on SM90)."""
    return paged_slots(block_tables, req, vpos, block_size)


def entry_slots_of(block_tables: torch.Tensor, req: torch.Tensor, vpos: torch.Tensor, block_size: int,
                   ratio: int) -> torch.Tensor:
    """Plane slots [N, K] int64 of the compressed entries of ratio `ratio` closing at positions
    vpos [N, K] (-1 = empty) of requests req [N] (one launch on SM90, after the entry index)."""
    entry = vpos if ratio == 1 else torch.where(vpos >= 0, vpos // ratio, -1)
    return paged_slots(block_tables, req, entry, block_size // ratio)


def far_entry_positions(positions: torch.Tensor, width: int, ratio: int) -> torch.Tensor:
    """[N] the far-entry count max(0, p - width + 1) // ratio of each row, as the `positions` of
    `far_entry_slots(tables, req, ., width=1, ratio=1, max_far, block_size // ratio)`: that op then
    lists entries j < count at plane slot `tables[j // (bs / r)] * (bs / r) + j % (bs / r)`."""
    return (positions - (width - 1)).clamp(min=0) // ratio
