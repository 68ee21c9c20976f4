"""Index arithmetic of the engine path: virtual positions -> slots -> flat pool rows.

```
virtual position v of request i  ->  slot = block_tables[i, v // bs] * bs + v % bs
slot s of plane p                 ->  flat row p * num_slots + s   (pools are viewed [planes * slots, rec])
window of a row at position p     ->  positions max(lo, p - W + 1) .. p      (swa_index.window_positions)
far entries of a row              ->  j < n_far = max(0, p - W + 1) // r     entry j at position j*r + r - 1
entry closing at position v        ->  slot = block_tables[i, v // bs] * bs + (v % bs) // r   (packed)
```
A block's bs / r compressed entries of ratio r fill its first bs / r slots of the source's planes:
consecutive entries are consecutive records, so the attention and indexer kernels copy a run of
them at once (one slot per entry at its last token would put them r records apart: one copy each).
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
    """Packed slots [N, K] int64 of the compressed entries of ratio `ratio` closing at positions
    vpos [N, K] (-1 = empty) of requests req [N] (one launch on SM90)."""
    return paged_slots(block_tables, req, vpos, block_size, stride=ratio)


def to_flat(slots: torch.Tensor, plane: int, num_slots: int) -> torch.Tensor:
    """slots [...] (-1 = empty) -> flat pool rows int64 of `plane`."""
    return torch.where(slots >= 0, slots + plane * num_slots, -1)
