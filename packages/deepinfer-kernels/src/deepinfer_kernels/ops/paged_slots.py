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
from deepinfer_kernels.platform import tilelang_launcher


def paged_slots_ref(block_tables: torch.Tensor, req: torch.Tensor, vpos: torch.Tensor,
                    block_size: int, stride: int = 1) -> torch.Tensor:
    """block_tables [R, MB], req [N], vpos [N, K] (-1 = empty) -> slots int64 [N, K] (-1 = none)."""
    v = vpos.long().clamp(min=0)
    blk_raw = v // block_size
    width = block_tables.shape[1]
    blk = block_tables.long()[req.long().unsqueeze(1).expand_as(v), blk_raw.clamp(max=width - 1)]
    ok = (vpos >= 0) & (blk >= 0) & (blk_raw < width)
    return torch.where(ok, blk * block_size + (v % block_size) // stride, -1)


def paged_slots(block_tables: torch.Tensor, req: torch.Tensor, vpos: torch.Tensor, block_size: int,
                stride: int = 1) -> torch.Tensor:
    """block_tables int [R, MB] (-1 = unallocated, MB >= 1), req int [N] in [0, R), vpos int [N, K]
    (-1 = empty), stride dividing block_size -> int64 [N, K]."""
    check_tensor("block_tables", block_tables, 2, INDEX_DTYPES)
    check_tensor("req", req, 1, INDEX_DTYPES)
    check_tensor("vpos", vpos, 2, INDEX_DTYPES)
    check_dim("req", req, 0, vpos.shape[0])
    if block_size < 1:
        raise ValueError(f"block_size={block_size}: must be >= 1")
    if stride < 1 or block_size % stride:
        raise ValueError(f"stride={stride}: must be a positive divisor of block_size={block_size}")
    if block_tables.shape[1] < 1:
        raise ValueError("block_tables: needs at least one column")
    device = check_same_device(block_tables=block_tables, req=req, vpos=vpos)
    kernel = tilelang_launcher("paged_slots", device)
    if kernel is not None:
        return kernel(block_tables, req, vpos, block_size, stride)
    return paged_slots_ref(block_tables, req, vpos, block_size, stride)
