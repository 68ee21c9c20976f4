"""The rows of one paged forward and the index arithmetic every layer shares (computed once).

`StepRows` holds the rows' positions, requests, cache slots and window lower bounds; what depends
only on them (window slots, far-entry slots per compress ratio, RoPE tables, Engram buckets) is
memoized here, since on the GPU each of those elementwise ops would be a launch per layer.
"""

from __future__ import annotations

import torch

from deepinfer_kernels.ops.engram import ngram_buckets, paged_ngram_buckets
from deepinfer_kernels.ops.paged_slots import far_entry_slots, num_far_entries, window_slots
from deepinfer_model.metadata import ForwardMetadata
from deepinfer_model.modules.engram import PAD_ID
from deepinfer_model.modules.rope import RopeTable, rope_table
from deepinfer_model.paged.indexing import far_entry_positions
from deepinfer_model.paged.ring import RingRows


class StepRows:
    """The rows a layer processes: positions, requests, slots, window lower bound (all [N]).

    The index arithmetic that depends only on the rows (window slots, far-entry slots per
    ratio) is computed once per forward and shared by every layer: it is the same for all of
    them, and on the GPU each of its ~15 elementwise ops is a kernel launch per layer."""

    def __init__(self, positions, req, slots, lo, windows, ring: RingRows | None = None):
        self.positions, self.req, self.slots, self.lo, self.windows = positions, req, slots, lo, windows
        self.ring = ring   # the rows' ring facts when the cache has rings (paged/ring.py)
        self._memo: dict = {}

    def subset(self, idx, lo=None):
        w = None if self.windows is None else self.windows[idx]
        return StepRows(self.positions[idx], self.req[idx], self.slots[idx],
                     self.lo[idx] if lo is None else lo, w, None if self.ring is None else self.ring.subset(idx))

    def rope(self, dim: int, theta: float) -> RopeTable:
        """The rows' RoPE table (cos / sin of their positions), shared by every layer."""
        key = ("rope", dim, theta)
        if key not in self._memo:
            self._memo[key] = rope_table(self.positions, dim, theta)
        return self._memo[key]

    def entry_rope(self, ratio: int, dim: int, theta: float) -> RopeTable:
        """The RoPE table of the compressed entries the rows would close at `ratio` (each at its last
        token's position, `(p // ratio) * ratio + ratio - 1`; ratio 1: the rows' own table), shared
        by the step's compressed sources of that ratio."""
        if ratio == 1:
            return self.rope(dim, theta)
        key = ("entry_rope", ratio, dim, theta)
        if key not in self._memo:
            self._memo[key] = rope_table((self.positions // ratio) * ratio + ratio - 1, dim, theta)
        return self._memo[key]

    def engram_buckets(self, table_size: int) -> torch.Tensor:
        """[N, n_max - 1] hashed n-gram buckets of the rows' Engram windows, shared by the Engram layers."""
        key = ("engram", table_size)
        if key not in self._memo:
            self._memo[key] = ngram_buckets(self.windows, table_size)
        return self._memo[key]

    def window_slots(self, meta: ForwardMetadata, width: int) -> torch.Tensor:
        """[N, W] slots of each row's window positions (-1 = empty)."""
        return self._window(meta, width)[0]

    def window_slots_int32(self, meta: ForwardMetadata, width: int) -> torch.Tensor:
        """`window_slots` as the attention kernel's int32 indices into one plane, shared by every
        window-only layer (each reads its own plane of the pool: no per-layer index arithmetic)."""
        return self._window(meta, width)[1]

    def _window(self, meta: ForwardMetadata, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        if "window" not in self._memo and self.ring is not None:   # ring and scratch rows (paged/ring.py)
            self._memo["window"] = self.ring.window_rows(self.lo, width, self.ring_len)
        if "window" not in self._memo:   # one launch on SM90 (both dtypes)
            self._memo["window"] = window_slots(meta.block_tables, self.req, self.positions, self.lo, width,
                                                meta.block_size)
        return self._memo["window"]

    ring_len = 0   # window ring length (set with `ring`)

    def store_slots(self) -> torch.Tensor:
        """[N] where a window layer stores the rows' records: their slots, or their scratch rows."""
        return self.slots if self.ring is None else self.ring.scratch_rows(self.ring_len)

    def far_entry_slots(self, meta: ForwardMetadata, width: int, ratio: int,
                        max_far: int | None) -> tuple[torch.Tensor, torch.Tensor, int]:
        """-> (n_far [N], packed slots [N, max_far] of the far entries, max_far)."""
        key = ("far", ratio, max_far)
        if key not in self._memo:
            if max_far is None:   # prefill: the batch's widest list, read on the host
                n_far = num_far_entries(self.positions, width, ratio)
                max_far = int(n_far.max()) if n_far.numel() else 0
            if max_far == 0:
                self._memo[key] = (torch.zeros_like(self.positions), None, None, 0)
            else:   # one launch on SM90 (counts, int64 and int32 slots)
                # the count as the op's positions: it lists entries j < count at their plane slots
                n_far, ent, ent32 = far_entry_slots(meta.block_tables, self.req,
                                                    far_entry_positions(self.positions, width, ratio), 1, 1,
                                                    max_far, meta.block_size // ratio)
                self._memo[key] = (n_far, ent, ent32, max_far)
        n_far, ent, _, width_far = self._memo[key]
        return n_far, ent, width_far

    def precompute_rope(self, model) -> None:
        """The RoPE tables of a decode forward's layers, up front (on side stream "rows"): five
        element-wise launches that would otherwise precede the first layer's GEMM on the main stream."""
        for layer in model.model.layers:
            self.rope(layer.self_attn.rope_dim, layer.self_attn.theta)

    def precompute_window(self, model, meta: ForwardMetadata) -> None:
        """The window slots of a decode forward, up front (on side stream "rows", streams.py): what
        every layer's attention reads first."""
        self.window_slots_int32(meta, model.config.sliding_window)

    def engram_memory(self, engram, l: int) -> torch.Tensor:
        """[N, H] layer l's Engram lookups, projected (`Engram.memory`): at decode computed up front
        on side stream "rows" (`precompute_engram`), else where the layer reads it."""
        key = ("engram_memory", l)
        if key not in self._memo:
            self._memo[key] = engram.memory(self.engram_buckets(engram.table_size))
        return self._memo[key]

    def precompute_engram(self, model, meta: ForwardMetadata, cache) -> None:
        """Decode: the Engram buckets of every Engram layer, read straight from the id pool (one
        launch per table size on SM90; no `windows`), and each layer's projected lookups, up front:
        the layer's main-stream chain keeps only the gate, which reads x."""
        n_max = model.config.engram_max_ngram_size
        for l in model.config.engram_layer_ids:
            engram = model.model.layers[l].engram
            if ("engram", engram.table_size) not in self._memo:
                self._memo[("engram", engram.table_size)] = paged_ngram_buckets(
                    meta.block_tables, self.req, self.positions, cache.engram_ids, n_max, engram.table_size,
                    meta.block_size, PAD_ID)
            self.engram_memory(engram, l)

    def precompute_far(self, model, meta: ForwardMetadata) -> None:
        """The far-entry slots of every compressed ratio, up front (the indexers read them)."""
        cfg = model.config
        for r in sorted({layer.ratio for layer in model.model.layers} - {0}):
            max_far = static_max_far(meta, cfg.sliding_window, r)
            if self.far_entry_slots(meta, cfg.sliding_window, r, max_far)[2]:
                self.far_entry_slots_int32(r, max_far)

    def far_entry_slots_int32(self, ratio: int, max_far: int) -> torch.Tensor:
        """The slots of `far_entry_slots(..., ratio, max_far)` (called first) as the indexer's int32
        indices into one plane, shared by every layer of that ratio."""
        return self._memo[("far", ratio, max_far)][2]


def static_max_far(meta: ForwardMetadata, width: int, ratio: int) -> int:
    """Far entries a row can have when every position is < meta.context_bound (no tensor read)."""
    return max(0, meta.context_bound - width) // ratio
