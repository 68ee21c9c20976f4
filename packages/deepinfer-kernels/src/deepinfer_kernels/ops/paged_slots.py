"""Pool slots of token positions through a block table.

    slot[n, k] = block_tables[req[n], vpos[n, k] // B] * B + (vpos[n, k] % B) // stride

``stride`` 1 (default): a token's slot. ``stride`` r: the packed slot of a compressed entry of ratio
r closing at position ``vpos`` (a block's B / r entries fill its first B / r slots, so consecutive
entries are consecutive records: one copy per run in the attention kernel).

-1 where the position is -1, past the table's width, or its block entry is -1 (not allocated).
``vpos`` are positions of request ``req[n]`` (window positions, compressed-entry positions,
Engram n-gram positions...). On the GPU the torch formula is ~7 small kernels per call, several
calls per step; ``paged_slots`` is one TileLang launch on SM90.
"""

from __future__ import annotations

import torch

from deepinfer_kernels.ops._checks import INDEX_DTYPES, check_dim, check_same_device, check_tensor
from deepinfer_kernels.ops.swa_index import window_positions
from deepinfer_kernels.platform import MAX_GRID_Y, tilelang_launcher


def paged_slots_ref(block_tables: torch.Tensor, req: torch.Tensor, vpos: torch.Tensor,
                    block_size: int, stride: int = 1) -> torch.Tensor:
    """block_tables [R, MB], req [N], vpos [N, K] (-1 = empty) -> slots int64 [N, K] (-1 = none)."""
    v = vpos.long().clamp(min=0)
    blk_raw = v // block_size
    width = block_tables.shape[1]
    blk = block_tables.long()[req.long().unsqueeze(1).expand_as(v), blk_raw.clamp(max=width - 1)]
    ok = (vpos >= 0) & (blk >= 0) & (blk_raw < width)
    return torch.where(ok, blk * block_size + (v % block_size) // stride, -1)


def check_lookup_args(block_tables: torch.Tensor, req: torch.Tensor, rows_name: str, rows: torch.Tensor,
                      rows_dim: int, block_size: int) -> torch.device:
    """The block-table lookup's arguments: tables [R, MB >= 1], req [N], the rows' positions
    (`rows_name`, N first) and block_size >= 1; -> their common device."""
    check_tensor("block_tables", block_tables, 2, INDEX_DTYPES)
    check_tensor("req", req, 1, INDEX_DTYPES)
    check_tensor(rows_name, rows, rows_dim, INDEX_DTYPES)
    check_dim("req", req, 0, rows.shape[0])
    if block_size < 1:
        raise ValueError(f"block_size={block_size}: must be >= 1")
    if block_tables.shape[1] < 1:
        raise ValueError("block_tables: needs at least one column")
    return check_same_device(block_tables=block_tables, req=req, **{rows_name: rows})


def paged_slots(block_tables: torch.Tensor, req: torch.Tensor, vpos: torch.Tensor, block_size: int,
                stride: int = 1) -> torch.Tensor:
    """block_tables int [R, MB] (-1 = unallocated, MB >= 1), req int [N] in [0, R), vpos int [N, K]
    (-1 = empty), stride dividing block_size -> int64 [N, K]."""
    device = check_lookup_args(block_tables, req, "vpos", vpos, 2, block_size)
    if stride < 1 or block_size % stride:
        raise ValueError(f"stride={stride}: must be a positive divisor of block_size={block_size}")
    kernel = tilelang_launcher("paged_slots", device, supported=vpos.shape[0] <= MAX_GRID_Y)
    if kernel is not None:
        return kernel(block_tables, req, vpos, block_size, stride)
    return paged_slots_ref(block_tables, req, vpos, block_size, stride)


# ---------------------------------------------------------------- the decode rows' slot lists
#
# A row at position p attends its window (positions max(p - width + 1, lo) .. p) and the
# compressed entries of ratio r closed entirely before that window (entry j closes at position
# j * r + r - 1, for j < (p - width + 1) // r). Their slots are lists of runs: on the GPU the torch
# formula is ~25 launches for the window and ~13 per ratio, every decode step; each op below is one.


def window_slots_ref(block_tables: torch.Tensor, req: torch.Tensor, positions: torch.Tensor, lo: torch.Tensor,
                     width: int, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """-> slots of each row's window, int64 [N, width] and the same as int32 (-1 = none)."""
    slots = paged_slots_ref(block_tables, req, window_positions(positions.long(), lo.long(), width), block_size)
    return slots, slots.to(torch.int32)


def num_far_entries(positions: torch.Tensor, width: int, ratio: int) -> torch.Tensor:
    """Complete ratio-`ratio` entries entirely before each row's window of `width`: int64 [N]."""
    return (positions.long() - (width - 1)).clamp(min=0) // ratio


def far_entry_slots_ref(block_tables: torch.Tensor, req: torch.Tensor, positions: torch.Tensor, width: int,
                        ratio: int, max_far: int, block_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> (n_far int64 [N]: entries before the window, clamped to max_far; packed slots of those
    entries int64 [N, max_far] and the same as int32, -1 padded)."""
    n_far = num_far_entries(positions, width, ratio).clamp(max=max_far)
    j = torch.arange(max_far, device=positions.device)
    vpos = torch.where(j < n_far.unsqueeze(1), j * ratio + (ratio - 1), -1)
    slots = paged_slots_ref(block_tables, req, vpos, block_size, stride=ratio)
    return n_far, slots, slots.to(torch.int32)


def window_slots(block_tables: torch.Tensor, req: torch.Tensor, positions: torch.Tensor, lo: torch.Tensor,
                 width: int, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """block_tables [R, MB], req [N], positions [N], lo [N] (each row's first existing position)
    -> the slots of positions max(p - width + 1, lo) .. p, int64 [N, width] and int32, -1 padded."""
    device = check_lookup_args(block_tables, req, "positions", positions, 1, block_size)
    check_tensor("lo", lo, 1, INDEX_DTYPES)
    check_dim("lo", lo, 0, positions.shape[0])
    if width < 1:
        raise ValueError(f"width={width}: must be >= 1")
    kernel = tilelang_launcher("window_slots", device, supported=positions.shape[0] <= MAX_GRID_Y)
    if kernel is not None:
        return kernel(block_tables, req, positions, lo, width, block_size)
    return window_slots_ref(block_tables, req, positions, lo, width, block_size)


def far_entry_slots(block_tables: torch.Tensor, req: torch.Tensor, positions: torch.Tensor, width: int,
                    ratio: int, max_far: int, block_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """block_tables [R, MB], req [N], positions [N] -> (n_far int64 [N], packed slots int64
    [N, max_far], the same int32) of the ratio-`ratio` entries before each row's window of `width`."""
    device = check_lookup_args(block_tables, req, "positions", positions, 1, block_size)
    if width < 1 or max_far < 1:
        raise ValueError(f"width={width}, max_far={max_far}: must be >= 1")
    if ratio < 1 or block_size % ratio:
        raise ValueError(f"ratio={ratio}: must be a positive divisor of block_size={block_size}")
    kernel = tilelang_launcher("far_entry_slots", device, supported=positions.shape[0] <= MAX_GRID_Y)
    if kernel is not None:
        return kernel(block_tables, req, positions, width, ratio, max_far, block_size)
    return far_entry_slots_ref(block_tables, req, positions, width, ratio, max_far, block_size)
