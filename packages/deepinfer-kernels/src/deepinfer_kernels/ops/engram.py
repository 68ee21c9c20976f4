"""Engram's hashed n-gram buckets (the lookup keys of its tables).

For n = 2..N over compressed token ids (positions before 0 use ``pad_id``)::

    h_n    = fold(cid_{t-n+1} .. cid_t)     fold: h = (h * 1000003 + cid + 1) mod (2^31 - 1), h0 = 0
    bucket = h_n mod table_size

``ngram_buckets`` hashes given id windows (the CPU path, prefill and the oracle);
``paged_ngram_buckets`` reads each decode row's window of ids from the paged id pool first. On
the GPU the torch formula is ~25 launches per decode step (window slots, gathers, one fold per
id); the TileLang kernel is one, integer arithmetic equal bit for bit.
"""

from __future__ import annotations

import torch

from deepinfer_kernels.layouts import HASH_MOD, HASH_MULT
from deepinfer_kernels.ops._checks import INDEX_DTYPES, check_same_device, check_tensor
from deepinfer_kernels.ops.paged_slots import check_lookup_args, paged_slots
from deepinfer_kernels.platform import tilelang_launcher


def ngram_buckets(windows: torch.Tensor, table_size: int) -> torch.Tensor:
    """windows int64 [N, N_max] = compressed ids of positions t-N_max+1 .. t (the pad id before 0)
    -> buckets int64 [N, N_max - 1] for n = 2..N_max."""
    n_max = windows.shape[1]
    shifted = windows.long() + 1   # cid + 1 of every position, once (int64: h * HASH_MULT + cid + 1 < 2^52)
    out = []
    for n in range(2, n_max + 1):
        h = shifted[:, n_max - n] % HASH_MOD   # the first fold from h0 = 0
        for k in range(n_max - n + 1, n_max):
            h = (h * HASH_MULT + shifted[:, k]) % HASH_MOD
        out.append(h % table_size)
    return torch.stack(out, dim=1)


def paged_id_windows(block_tables: torch.Tensor, req: torch.Tensor, positions: torch.Tensor, ids_pool: torch.Tensor,
                     n_max: int, block_size: int, pad_id: int) -> torch.Tensor:
    """-> int64 [N, n_max]: the ids of each row's positions p - n_max + 1 .. p, read from the paged
    id pool through the block table (`pad_id` before position 0 or without a block)."""
    vpos = positions.long().unsqueeze(1) - (n_max - 1) + torch.arange(n_max, device=positions.device)
    slots = paged_slots(block_tables, req, vpos, block_size)
    ids = ids_pool[slots.clamp(min=0)].long()
    return torch.where(slots >= 0, ids, pad_id)


def paged_ngram_buckets_ref(block_tables: torch.Tensor, req: torch.Tensor, positions: torch.Tensor,
                            ids_pool: torch.Tensor, n_max: int, table_size: int, block_size: int,
                            pad_id: int) -> torch.Tensor:
    """-> buckets int64 [N, n_max - 1] of each row's window of ids (positions p - n_max + 1 .. p)."""
    return ngram_buckets(paged_id_windows(block_tables, req, positions, ids_pool, n_max, block_size, pad_id),
                         table_size)


def paged_ngram_buckets(block_tables: torch.Tensor, req: torch.Tensor, positions: torch.Tensor,
                        ids_pool: torch.Tensor, n_max: int, table_size: int, block_size: int,
                        pad_id: int) -> torch.Tensor:
    """block_tables [R, MB], req [N], positions [N], ids_pool int [num_slots] (the compressed id
    of every slot) -> buckets int64 [N, n_max - 1]; a position before 0 or without a block reads
    ``pad_id``."""
    device = check_lookup_args(block_tables, req, "positions", positions, 1, block_size)
    check_tensor("ids_pool", ids_pool, 1, INDEX_DTYPES)
    check_same_device(positions=positions, ids_pool=ids_pool)
    if n_max < 2 or table_size < 1:
        raise ValueError(f"n_max={n_max}, table_size={table_size}: need n_max >= 2 and table_size >= 1")
    kernel = tilelang_launcher("paged_ngram_buckets", device)
    if kernel is not None:
        return kernel(block_tables, req, positions, ids_pool, n_max, table_size, block_size, pad_id)
    return paged_ngram_buckets_ref(block_tables, req, positions, ids_pool, n_max, table_size, block_size, pad_id)
