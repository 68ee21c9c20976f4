"""Pool slots of token positions through a block table, in one launch (TileLang, SM90).

Same function as ``deepinfer_kernels.ops.paged_slots.paged_slots_ref`` (integer arithmetic: equal
bit for bit). One thread per (row, position).
"""

import torch

from deepinfer_kernels.tilelang._common import PDL, compile_cached, pdl_sync, require, require_cuda

# No `from __future__ import annotations` (TileLang evaluates prim_func annotations).

NT = 128


def _build():
    import tilelang.language as T

    R = T.dynamic("R")
    MB = T.dynamic("MB")
    N = T.dynamic("N")
    K = T.dynamic("K")

    @T.prim_func
    def main(
        Tables: T.Tensor((R, MB), T.int32),
        Req: T.Tensor((N,), T.int64),
        VPos: T.Tensor((N, K), T.int64),
        Out: T.Tensor((N, K), T.int64),
        block_size: T.int64,
        stride: T.int64,           # positions per record within a block (packed compressed entries)
    ):
        with T.Kernel(T.ceildiv(K, NT), N, threads=NT) as (bx, n):
            if PDL:   # wait for the previous kernel before touching memory (_common.PDL)
                T.evaluate(pdl_sync())
            k = bx * NT + T.get_thread_binding()
            if k < K:
                vp = VPos[n, k]
                v = T.max(vp, T.int64(0))
                blk_raw = v // block_size
                # clamped read: the select below evaluates both sides
                blk = T.cast(Tables[Req[n], T.cast(T.min(blk_raw, T.cast(MB, T.int64) - 1), T.int32)], T.int64)
                ok = (vp >= 0) & (blk >= 0) & (blk_raw < T.cast(MB, T.int64))
                Out[n, k] = T.if_then_else(ok, blk * block_size + (v % block_size) // stride, T.int64(-1))

    return main


def _kernel():
    return compile_cached("paged_slots", (), _build)


def paged_slots_tilelang(block_tables: torch.Tensor, req: torch.Tensor, vpos: torch.Tensor,
                         block_size: int, stride: int = 1) -> torch.Tensor:
    """Same arguments and result as ``paged_slots_ref`` (int64 [N, K])."""
    require_cuda(block_tables=block_tables, req=req, vpos=vpos)
    require(block_size >= 1 and block_tables.shape[1] >= 1, "block_size and the table width must be >= 1")
    require(stride >= 1 and block_size % stride == 0, f"stride={stride}: must divide block_size={block_size}")
    out = torch.empty(vpos.shape, dtype=torch.int64, device=vpos.device)
    if out.numel():
        _kernel()(block_tables.to(torch.int32).contiguous(), req.to(torch.int64).contiguous(),
                  vpos.to(torch.int64).contiguous(), out, int(block_size), int(stride))
    return out
