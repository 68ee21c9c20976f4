"""A layer's sparse-attention index list in one launch (TileLang, SM90).

Same function as ``deepinfer_kernels.ops.attention_indices.attention_indices_ref`` (integer
arithmetic: equal bit for bit). One thread per output column: window columns add the window
plane's base to their slot, far columns expand their selected block into entry ids, check them
against the row's far count and read the entry's slot.
"""

import torch

from deepinfer_kernels.tilelang._common import PDL, compile_cached, pdl_sync, require, require_cuda

# No `from __future__ import annotations` (TileLang evaluates prim_func annotations).

NT = 128


def _build():
    import tilelang.language as T

    N = T.dynamic("N")
    W = T.dynamic("W")
    K = T.dynamic("K")
    F = T.dynamic("F")
    WT = T.dynamic("WT")      # W + K * block_size

    @T.prim_func
    def main(
        WindowSlots: T.Tensor((N, W), T.int64),
        Blocks: T.Tensor((N, K), T.int32),
        NFar: T.Tensor((N,), T.int64),
        EntrySlots: T.Tensor((N, F), T.int64),
        Out: T.Tensor((N, WT), T.int32),
        window_base: T.int64,
        entry_base: T.int64,
        block_size: T.int32,
    ):
        with T.Kernel(T.ceildiv(WT, NT), N, threads=NT) as (bx, n):
            if PDL:   # wait for the previous kernel before touching memory (_common.PDL)
                T.evaluate(pdl_sync())
            col = bx * NT + T.get_thread_binding()
            if col < WT:
                if col < W:
                    s = WindowSlots[n, col]
                    Out[n, col] = T.if_then_else(s >= 0, T.cast(s + window_base, T.int32), -1)
                else:
                    j = col - W
                    b = T.cast(Blocks[n, j // block_size], T.int64)
                    e = b * T.cast(block_size, T.int64) + T.cast(j % block_size, T.int64)
                    ok = (b >= 0) & (e < NFar[n]) & (e < T.cast(F, T.int64))
                    # clamped read: the select below evaluates both sides
                    s = EntrySlots[n, T.cast(T.max(T.min(e, T.cast(F, T.int64) - 1), T.int64(0)), T.int32)]
                    Out[n, col] = T.if_then_else(ok & (s >= 0), T.cast(s + entry_base, T.int32), -1)

    return main


def _kernel():
    return compile_cached("attention_indices", (), _build)


def attention_indices_tilelang(window_slots: torch.Tensor, window_base: int, blocks: torch.Tensor,
                               n_far: torch.Tensor, entry_slots: torch.Tensor, entry_base: int,
                               block_size: int) -> torch.Tensor:
    """Same arguments and result as ``attention_indices_ref`` (int32 [N, W + K * B])."""
    require_cuda(window_slots=window_slots, blocks=blocks, n_far=n_far, entry_slots=entry_slots)
    require(block_size >= 1, f"block_size={block_size}: must be >= 1")
    n, w = window_slots.shape
    k = blocks.shape[1]
    out = torch.empty(n, w + k * block_size, dtype=torch.int32, device=window_slots.device)
    if out.numel() == 0:
        return out
    if entry_slots.shape[1] == 0:      # no far entries at all: every far column reads as -1
        entry_slots = torch.full((n, 1), -1, dtype=torch.int64, device=window_slots.device)
        n_far = torch.zeros_like(n_far)
    _kernel()(window_slots.to(torch.int64).contiguous(), blocks.to(torch.int32).contiguous(),
              n_far.to(torch.int64).contiguous(), entry_slots.to(torch.int64).contiguous(), out,
              int(window_base), int(entry_base), int(block_size))
    return out
