"""Shared key lists of row groups (pairs or quads) in one launch (TileLang, SM90).

Same function as ``deepinfer_kernels.ops.shared_keys.shared_key_lists_ref`` (integer arithmetic:
equal bit for bit). One CTA per group, no sort: each row's valid slots go into a shared-memory
hash set (open addressing, linear probing, ``atomicCAS`` inserts; a slot found already there marks
the group as repeating), then every column of the group's output order (the last row's, then the
one before, ...; row 0's first for a repeating group) looks its slot up in the other rows' sets,
keeps or drops it and tags it, and a block-wide scan of the per-thread counts places the kept
entries. ~3 columns per thread at the engine's widths: a few microseconds for a 32K-row chunk.
"""

import torch

from deepinfer_kernels.layouts import ROWS_PER_GROUP, num_groups, row_bits_shift
from deepinfer_kernels.tilelang._common import PDL, compile_cached, pdl_sync, require, require_cuda

# No `from __future__ import annotations` (TileLang evaluates prim_func annotations).

MAX_WIDTH = 2048          # index row width the kernel pairs (hash sets of 4,096 slots)
HASH_MUL = 0x9E3779B1     # Fibonacci hashing of the slot


def _build(table: int, rows: int = ROWS_PER_GROUP):
    """``table``: hash-set size per row (a power of two >= 2 x the index width); ``rows``: 2 or 4."""
    import tilelang.language as T

    NT = 256
    LOGT = table.bit_length() - 1
    SEQ = rows * table // 2    # output columns walked: rows x W <= SEQ
    PER = SEQ // NT            # consecutive output columns per thread in the compaction
    SHIFT = row_bits_shift(rows)
    assert table >= NT and PER * NT == SEQ
    R = T.dynamic("R")
    W = T.dynamic("W")
    G = T.dynamic("G")
    WN = T.dynamic("WN")       # rows * W

    def home(slot):
        # the slot's first probe position in a set
        return T.cast((T.cast(slot, T.uint32) * T.uint32(HASH_MUL)) >> T.uint32(32 - LOGT), T.int32)

    @T.prim_func
    def main(
        Idx: T.Tensor((R, W), T.int32),
        Keys: T.Tensor((G, WN), T.int32),
        Counts: T.Tensor((G,), T.int32),
    ):
        with T.Kernel(G, threads=NT) as g:
            if PDL:   # wait for the previous kernel before touching memory (_common.PDL)
                T.evaluate(pdl_sync())
            # one buffer for both phases: row j's hash set (valid slots, -1 = free) at [j * table, ...)
            # and each output column's entry (-1 = dropped) at [rows * table, ...). As two buffers, the
            # memory planner overlapped them when the column loop has a single iteration (table 256):
            # the entries overwrote sets that other threads were still probing (H200, 2026-12-01)
            work = T.alloc_shared((rows * table + SEQ,), T.int32)
            kept = T.alloc_shared((NT,), T.int32)
            flags = T.alloc_shared((1,), T.int32)           # 1: a row repeats a slot
            tx = T.get_thread_binding()
            v = T.alloc_var(T.int32)
            h = T.alloc_var(T.int32)
            old = T.alloc_var(T.int32)
            busy = T.alloc_var(T.int32)
            found = T.alloc_var(T.int32)
            later = T.alloc_var(T.int32)
            bits = T.alloc_var(T.int32)
            row = T.alloc_var(T.int32)
            rep = T.alloc_var(T.int32)
            cnt = T.alloc_var(T.int32)
            pos = T.alloc_var(T.int32)
            for i in T.serial(rows * table // NT):
                work[i * NT + tx] = -1
            if tx == 0:
                flags[0] = 0
            T.sync_threads()
            # ------------------------------------------------ every row's slots into its set
            for i in T.serial(T.ceildiv(rows * W, NT)):
                e = i * NT + tx
                row = e // T.max(W, 1)
                v = -1
                if (e < rows * W) and (g * rows + row < R):
                    v = Idx[g * rows + row, e - row * W]
                if v >= 0:
                    h = home(v)
                    busy = 1
                    while busy == 1:
                        old = T.call_extern("int32", "atomicCAS", T.address_of(work[row * table + h]), -1, v)
                        if old == -1:
                            busy = 0
                        elif old == v:
                            busy = 0
                            flags[0] = 1
                        else:
                            h = (h + 1) & (table - 1)
            T.sync_threads()
            rep = flags[0]
            T.sync_threads()          # every thread has read the flag: its bytes may be reused below
            # ------------------------------------------------ each output column's entry
            # column c: row rows - 1 - c // W's column c % W (row c // W's for a repeating group)
            for i in T.serial(SEQ // NT):
                c = i * NT + tx
                row = T.if_then_else(rep == 1, c // T.max(W, 1), rows - 1 - c // T.max(W, 1))
                v = -1
                if (c < rows * W) and (g * rows + row < R):
                    v = Idx[g * rows + row, c - (c // T.max(W, 1)) * W]
                later = 0
                bits = 1 << row
                if (v >= 0) and (rep == 0):                  # which other rows' sets hold the slot?
                    for k in T.serial(rows):
                        if k != row:
                            found = 0
                            h = home(v)
                            busy = 1
                            while busy == 1:
                                old = work[k * table + h]
                                if old == v:
                                    found = 1
                                    busy = 0
                                elif old == -1:
                                    busy = 0
                                else:
                                    h = (h + 1) & (table - 1)
                            if found == 1:
                                if k > row:                  # a later row lists it: its entry is there
                                    later = 1
                                else:
                                    bits = bits | (1 << k)
                work[rows * table + c] = -1
                if (v >= 0) and (later == 0):
                    work[rows * table + c] = v | (bits << SHIFT)
            T.sync_threads()
            # ------------------------------------------------ compaction: thread tx owns PER columns
            cnt = 0
            for j in T.serial(PER):
                if work[rows * table + tx * PER + j] >= 0:
                    cnt = cnt + 1
            kept[tx] = cnt
            T.sync_threads()
            T.cumsum(src=kept, dim=0)
            T.sync_threads()
            pos = kept[tx] - cnt
            for j in T.serial(PER):
                v = work[rows * table + tx * PER + j]
                if v >= 0:
                    Keys[g, pos] = v
                    pos = pos + 1
            for j in T.serial(PER):
                c = tx * PER + j
                if (c >= kept[NT - 1]) & (c < rows * W):
                    Keys[g, c] = -1
            if tx == 0:
                Counts[g] = kept[NT - 1]

    return main


def _kernel(table: int, rows: int):
    # explicit syncs only: the automatic pass put a block barrier inside the divergent probe loops
    key = (table,) if rows == ROWS_PER_GROUP else (table, rows)
    return compile_cached("shared_key_lists", key, lambda: _build(table, rows),
                          pass_configs={"tl.disable_thread_storage_sync": True})


def get_kernel(width: int, rows: int = ROWS_PER_GROUP):
    """The compiled kernel for index rows of ``width`` columns in groups of ``rows``."""
    return _kernel(table_size(width), rows)


def table_size(width: int) -> int:
    """Hash-set slots per row for index rows of ``width`` columns (a power of two >= 2 x width, >= 256)."""
    return max(256, 1 << max(0, (2 * width - 1).bit_length()))


def shared_key_lists_tilelang(indices: torch.Tensor, group_rows: int = ROWS_PER_GROUP
                              ) -> tuple[torch.Tensor, torch.Tensor]:
    """Same arguments and result as ``shared_key_lists_ref``."""
    require(indices.dim() == 2, f"indices: expected [rows, width], got {tuple(indices.shape)}")
    device = require_cuda(indices=indices)
    rows, width = indices.shape
    row_bits_shift(group_rows)          # checks the group size
    require(width <= MAX_WIDTH, f"indices: width {width} > {MAX_WIDTH}, the widest rows the kernel groups")
    groups = num_groups(rows, group_rows)
    keys = torch.empty(groups, group_rows * width, dtype=torch.int32, device=device)
    counts = torch.empty(groups, dtype=torch.int32, device=device)
    if groups == 0 or width == 0:
        counts.zero_()
        return keys, counts
    get_kernel(width, group_rows)(indices.to(torch.int32).contiguous(), keys, counts)
    return keys, counts
