"""One layer's sparse-attention index list: its window slots, then the indexer's far entries.

    out[n, :W]                = window_slots[n, :] + window_base              (-1 stays -1)
    out[n, W + t * B + i]     = entry_slots[n, e] + entry_base,  e = blocks[n, t] * B + i,
                                if blocks[n, t] >= 0, e < n_far[n] and entry_slots[n, e] >= 0; else -1

The result is int32 rows of the whole KV pool (``base`` = plane x slots per plane): what
``sparse_mla_attention`` reads for a layer with compressed entries. ``blocks`` are the selected
blocks of ``B`` far entries (``indexer_topk_blocks``, -1 = none), ``entry_slots[n, j]`` the slot
of row n's far entry j (-1 = none), ``n_far[n]`` how many far entries row n has.

On the GPU the torch chain is about 20 small kernels per layer (block expansion, masks, a gather,
two offsets, a concatenation, a cast): ``attention_indices`` is one TileLang launch on SM90.
"""

from __future__ import annotations

import torch

from deepinfer_kernels.ops._checks import INDEX_DTYPES, check_dim, check_same_device, check_tensor
from deepinfer_kernels.platform import MAX_GRID_Y, tilelang_launcher


def attention_indices_ref(window_slots: torch.Tensor, window_base: int, blocks: torch.Tensor,
                          n_far: torch.Tensor, entry_slots: torch.Tensor, entry_base: int,
                          block_size: int) -> torch.Tensor:
    """window_slots [N, W], blocks [N, K], n_far [N], entry_slots [N, F] -> int32 [N, W + K * B]."""
    n, k = blocks.shape
    ent = (blocks.long().unsqueeze(2) * block_size
           + torch.arange(block_size, device=blocks.device)).reshape(n, k * block_size)   # [N, K * B]
    ok = (ent >= 0) & (ent < n_far.long().unsqueeze(1)) & (ent < entry_slots.shape[1])
    if entry_slots.shape[1]:
        slot = torch.gather(entry_slots.long(), 1, torch.where(ok, ent, 0))
        far = torch.where(ok & (slot >= 0), slot + entry_base, -1)
    else:
        far = torch.full_like(ent, -1)
    ws = window_slots.long()
    window = torch.where(ws >= 0, ws + window_base, -1)
    return torch.cat([window, far], dim=1).to(torch.int32)


def attention_indices(window_slots: torch.Tensor, window_base: int, blocks: torch.Tensor,
                      n_far: torch.Tensor, entry_slots: torch.Tensor, entry_base: int,
                      block_size: int) -> torch.Tensor:
    """window_slots int [N, W] (-1 = empty), blocks int [N, K] (-1 = none), n_far int [N],
    entry_slots int [N, F] (-1 = none); bases >= 0, block_size >= 1 -> int32 [N, W + K * B]."""
    check_tensor("window_slots", window_slots, 2, INDEX_DTYPES)
    check_tensor("blocks", blocks, 2, INDEX_DTYPES)
    check_tensor("n_far", n_far, 1, INDEX_DTYPES)
    check_tensor("entry_slots", entry_slots, 2, INDEX_DTYPES)
    n = window_slots.shape[0]
    check_dim("blocks", blocks, 0, n)
    check_dim("n_far", n_far, 0, n)
    check_dim("entry_slots", entry_slots, 0, n)
    if block_size < 1:
        raise ValueError(f"block_size={block_size}: must be >= 1")
    if window_base < 0 or entry_base < 0:
        raise ValueError(f"window_base={window_base}, entry_base={entry_base}: pool offsets must be >= 0")
    device = check_same_device(window_slots=window_slots, blocks=blocks, n_far=n_far, entry_slots=entry_slots)
    kernel = tilelang_launcher("attention_indices", device, supported=n <= MAX_GRID_Y)
    if kernel is not None:
        return kernel(window_slots, window_base, blocks, n_far, entry_slots, entry_base, block_size)
    return attention_indices_ref(window_slots, window_base, blocks, n_far, entry_slots, entry_base, block_size)
