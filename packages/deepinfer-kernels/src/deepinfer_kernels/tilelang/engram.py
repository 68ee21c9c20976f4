"""Engram's n-gram buckets of decode rows in one launch (TileLang, SM90).

Same function as ``deepinfer_kernels.ops.engram.paged_ngram_buckets_ref`` (integer arithmetic:
equal bit for bit). One thread per row: it reads the row's window of ids through the block table
(as ``paged_slots``) and folds each n-gram.
"""

import torch

from deepinfer_kernels.layouts import HASH_MOD, HASH_MULT
from deepinfer_kernels.tilelang._common import PDL, compile_cached, pdl_sync, require, require_cuda

# No `from __future__ import annotations` (TileLang evaluates prim_func annotations).

NT = 128


def _build(n_max: int, table_size: int, pad_id: int, ids_dtype: str):
    import tilelang.language as T

    R = T.dynamic("R")
    MB = T.dynamic("MB")
    N = T.dynamic("N")
    S = T.dynamic("S")

    @T.prim_func
    def main(
        Tables: T.Tensor((R, MB), T.int32),
        Req: T.Tensor((N,), T.int64),
        Pos: T.Tensor((N,), T.int64),
        Ids: T.Tensor((S,), ids_dtype),
        Out: T.Tensor((N, n_max - 1), T.int64),
        block_size: T.int64,
    ):
        with T.Kernel(T.ceildiv(N, NT), threads=NT) as bx:
            if PDL:   # wait for the previous kernel before touching memory (_common.PDL)
                T.evaluate(pdl_sync())
            shifted = T.alloc_local((n_max,), T.int64)   # id + 1 of positions p - n_max + 1 .. p
            vp = T.alloc_var(T.int64)
            slot = T.alloc_var(T.int64)
            h = T.alloc_var(T.int64)
            n = bx * NT + T.get_thread_binding()
            if n < N:
                for i in T.unroll(n_max):
                    vp = Pos[n] - (n_max - 1) + i
                    v = T.max(vp, T.int64(0))
                    blk_raw = v // block_size
                    blk = T.cast(Tables[Req[n], T.cast(T.min(blk_raw, T.cast(MB, T.int64) - 1), T.int32)], T.int64)
                    slot = T.if_then_else((vp >= 0) & (blk >= 0) & (blk_raw < T.cast(MB, T.int64)),
                                          blk * block_size + v % block_size, T.int64(-1))
                    shifted[i] = T.if_then_else(slot >= 0, T.cast(Ids[T.max(slot, T.int64(0))], T.int64),
                                                T.int64(pad_id)) + 1
                for m in T.unroll(n_max - 1):   # n = m + 2: fold positions n_max - n .. n_max - 1
                    h = shifted[n_max - 2 - m] % HASH_MOD
                    for k in T.unroll(m + 1):
                        h = (h * HASH_MULT + shifted[n_max - 1 - m + k]) % HASH_MOD
                    Out[n, m] = h % table_size

    return main


_IDS = {torch.int32: "int32", torch.int64: "int64"}


def _kernel(n_max: int, table_size: int, pad_id: int, ids_dtype: str):
    return compile_cached("engram_buckets", (n_max, table_size, pad_id, ids_dtype),
                          lambda: _build(n_max, table_size, pad_id, ids_dtype))


def paged_ngram_buckets_tilelang(block_tables: torch.Tensor, req: torch.Tensor, positions: torch.Tensor,
                                 ids_pool: torch.Tensor, n_max: int, table_size: int, block_size: int,
                                 pad_id: int) -> torch.Tensor:
    """Same arguments and result as ``paged_ngram_buckets_ref``."""
    require_cuda(block_tables=block_tables, req=req, positions=positions, ids_pool=ids_pool)
    require(ids_pool.dtype in _IDS, f"ids_pool: int32 or int64, got {ids_pool.dtype}")
    require(block_tables.shape[1] >= 1 and ids_pool.numel() >= 1, "block table and id pool must be non-empty")
    out = torch.empty(positions.shape[0], n_max - 1, dtype=torch.int64, device=positions.device)
    if positions.shape[0]:
        kernel = _kernel(n_max, table_size, pad_id, _IDS[ids_pool.dtype])
        kernel(block_tables.to(torch.int32).contiguous(), req.to(torch.int64).contiguous(),
               positions.to(torch.int64).contiguous(), ids_pool.contiguous(), out, int(block_size))
    return out
