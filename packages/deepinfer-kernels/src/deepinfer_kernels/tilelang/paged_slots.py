"""Pool slots of token positions through a block table, in one launch (TileLang, SM90).

Same function as ``deepinfer_kernels.ops.paged_slots.paged_slots_ref`` (integer arithmetic: equal
bit for bit). One thread per (row, position).
"""

import torch

from deepinfer_kernels.tilelang._common import PDL, compile_cached, pdl_sync, require, require_cuda

# No `from __future__ import annotations` (TileLang evaluates prim_func annotations).

NT = 128


def _table_dims(T):
    """Both kernels' dynamic sizes: block tables [R, MB] (R requests), N rows of K positions each."""
    return T.dynamic("R"), T.dynamic("MB"), T.dynamic("N"), T.dynamic("K")


def _build():
    import tilelang.language as T

    R, MB, N, K = _table_dims(T)

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


def _build_runs(ratio: int):
    """The decode rows' slot lists (``ops.paged_slots.window_slots`` for ratio 0, ``far_entry_slots``
    for ratio r >= 1): each thread derives its (row, column)'s position from the row's position
    and writes the slot as int64 and int32; column 0 of a far list also writes the row's count."""
    import tilelang.language as T

    R, MB, N, K = _table_dims(T)
    stride = max(ratio, 1)

    @T.prim_func
    def main(
        Tables: T.Tensor((R, MB), T.int32),
        Req: T.Tensor((N,), T.int64),
        Pos: T.Tensor((N,), T.int64),
        Lo: T.Tensor((N,), T.int64),          # window: each row's first existing position; far: unused
        Out: T.Tensor((N, K), T.int64),
        Out32: T.Tensor((N, K), T.int32),
        NFar: T.Tensor((N,), T.int64),        # far: entries before the window (clamped to K); window: unused
        width: T.int64,
        block_size: T.int64,
    ):
        with T.Kernel(T.ceildiv(K, NT), N, threads=NT) as (bx, n):
            if PDL:   # wait for the previous kernel before touching memory (_common.PDL)
                T.evaluate(pdl_sync())
            vp = T.alloc_var(T.int64)     # the column's position (-1: none); a variable, so that the
            slot = T.alloc_var(T.int64)   # slot expression does not inline the position's formula
            k = bx * NT + T.get_thread_binding()
            if k < K:
                p = Pos[n]
                if ratio == 0:
                    start = T.max(p - (width - 1), Lo[n])
                    vp = T.if_then_else(T.cast(k, T.int64) < p - start + 1, start + T.cast(k, T.int64), T.int64(-1))
                else:
                    nf = T.min(T.max(p - (width - 1), T.int64(0)) // ratio, T.cast(K, T.int64))
                    if k == 0:
                        NFar[n] = nf
                    vp = T.if_then_else(T.cast(k, T.int64) < nf, T.cast(k, T.int64) * ratio + (ratio - 1),
                                        T.int64(-1))
                v = T.max(vp, T.int64(0))
                blk_raw = v // block_size
                blk = T.cast(Tables[Req[n], T.cast(T.min(blk_raw, T.cast(MB, T.int64) - 1), T.int32)], T.int64)
                ok = (vp >= 0) & (blk >= 0) & (blk_raw < T.cast(MB, T.int64))
                slot = T.if_then_else(ok, blk * block_size + (v % block_size) // stride, T.int64(-1))
                Out[n, k] = slot
                Out32[n, k] = T.cast(slot, T.int32)

    return main


def _runs_kernel(ratio: int):
    return compile_cached("paged_runs", (ratio,), lambda: _build_runs(ratio))


def _runs(block_tables, req, positions, lo, width, k, block_size, ratio):
    require_cuda(block_tables=block_tables, req=req, positions=positions)
    require(block_size >= 1 and block_tables.shape[1] >= 1, "block_size and the table width must be >= 1")
    n, device = positions.shape[0], positions.device
    out = torch.empty(n, k, dtype=torch.int64, device=device)
    out32 = torch.empty(n, k, dtype=torch.int32, device=device)
    n_far = torch.empty(n, dtype=torch.int64, device=device)
    if out.numel():
        pos = positions.to(torch.int64).contiguous()
        _runs_kernel(ratio)(block_tables.to(torch.int32).contiguous(), req.to(torch.int64).contiguous(), pos,
                            pos if lo is None else lo.to(torch.int64).contiguous(), out, out32, n_far,
                            int(width), int(block_size))
    elif ratio:
        n_far.zero_()
    return n_far, out, out32


def window_slots_tilelang(block_tables: torch.Tensor, req: torch.Tensor, positions: torch.Tensor, lo: torch.Tensor,
                          width: int, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Same arguments and results as ``window_slots_ref``."""
    _, out, out32 = _runs(block_tables, req, positions, lo, width, width, block_size, 0)
    return out, out32


def far_entry_slots_tilelang(block_tables: torch.Tensor, req: torch.Tensor, positions: torch.Tensor, width: int,
                             ratio: int, max_far: int, block_size: int):
    """Same arguments and results as ``far_entry_slots_ref``."""
    require(ratio >= 1 and block_size % ratio == 0, f"ratio={ratio}: must divide block_size={block_size}")
    return _runs(block_tables, req, positions, None, width, max_far, block_size, ratio)
