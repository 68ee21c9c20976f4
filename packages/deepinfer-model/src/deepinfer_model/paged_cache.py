"""The paged caches of the engine path and their layout (which plane holds what).

```
kv          uint8   [num_kv_rows,    D + D/32]     FP8 records (528 B for D = 512), planes back to back:
              window KV of every backbone layer | window KV of every DFlash layer   (num_slots rows each)
              | compressed entries of every compressed source              (num_blocks * bs / r rows each)
index_k     uint8   [num_index_rows, Di/2 + Di/32] FP4 indexer keys, one plane per source (bs / r per block)
comp_stage  float   [num_stage_planes, num_slots, D + Di + 1]   compressor token terms (c, ik, g)
                      of sources with ratio > 1, keyed by the token's own slot
engram_ids  int32   [num_slots]                                 compressed token id of each token
```
Slot of virtual position v of a sequence: `block_table[v // block_size] * block_size + v % block_size`.
Window planes and the stage are keyed by token position. Compressed entry j of ratio r (covering
positions `j*r .. j*r+r-1`) lives in the block of its tokens, at the plane slot
`block_table[j*r // bs] * (bs / r) + j % (bs / r)` (`paged/indexing.py`): a block owns bs / r
consecutive records of each ratio-r plane, so the compressed planes and the index keys take 1/r of
the tokens, and prefix-shared blocks are never written by another sequence (`block_size % r == 0`).
Flat row of plane p's slot s: `plane_base[p] + s` (`kv_flat`, what the attention kernel indexes).
Without a `WindowRing` the window planes keep every position and the stage is a full-size float
plane (capacity.py: `paged_kv_footprint` vs `spec_kv_footprint`); the engine allocates rings by
default (window_kv="ring") and keeps this layout selectable for A/B.
Every write of a step happens before any read of the same layer; rejected draft rows are
overwritten by the next step (optimistic KV writes; all writes are idempotent per slot).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from deepinfer_kernels.ops.kv_fp4 import fp4_record_bytes
from deepinfer_kernels.ops.kv_fp8 import fp8_record_bytes


@dataclass(frozen=True)
class WindowRing:
    """Window planes and compressor stages as per-request rings (paged/ring.py): `num_seqs` state
    slots (1..num_seqs; slot 0 = padding requests) of `ring_len` window rows (W + nextn + 1) and
    `stage_len` stage rows (max_ratio + nextn), plus `max_step_rows` scratch rows (a step's rows)."""
    num_seqs: int
    ring_len: int
    stage_len: int
    max_step_rows: int

    @classmethod
    def for_config(cls, cfg, num_seqs: int, max_step_rows: int) -> WindowRing:
        ratios = [cfg.compress_ratios[s] for s in cfg.topology.compressed_sources]
        return cls(num_seqs=num_seqs, ring_len=cfg.sliding_window + cfg.nextn + 1,
                   stage_len=max(ratios, default=1) + cfg.nextn, max_step_rows=max_step_rows)

    @property
    def window_rows(self) -> int:       # rows of one window plane
        return (self.num_seqs + 1) * self.ring_len + self.max_step_rows

    @property
    def stage_rows(self) -> int:        # rows of one stage plane
        return (self.num_seqs + 1) * self.stage_len + self.max_step_rows


@dataclass(frozen=True)
class CacheLayout:
    window_planes: tuple[int, ...]     # backbone layer -> kv plane of its window KV
    comp_planes: dict[int, int]        # compressed source layer -> kv plane of its entries
    index_planes: dict[int, int]       # compressed source layer -> index_k plane
    stage_planes: dict[int, int]       # compressed source layer with ratio > 1 -> comp_stage plane
    dflash_planes: tuple[int, ...]     # DFlash layer k -> kv plane
    ratios: dict[int, int]             # compressed source layer -> its compress ratio r
    record_bytes: int                  # D + D/32
    index_record_bytes: int            # Di/2 + Di/32
    stage_width: int                   # D + Di + 1
    max_ratio: int
    ring: WindowRing | None = None     # None: window planes and stages keep every position (slots)

    @property
    def num_kv_planes(self) -> int:
        return len(self.window_planes) + len(self.comp_planes) + len(self.dflash_planes)

    @property
    def num_token_planes(self) -> int:
        """kv planes with one record per token (window planes, then DFlash planes)."""
        return len(self.window_planes) + len(self.dflash_planes)

    @property
    def num_index_planes(self) -> int:
        return len(self.index_planes)

    @property
    def num_stage_planes(self) -> int:
        return len(self.stage_planes)

    @classmethod
    def from_config(cls, cfg, ring: WindowRing | None = None) -> CacheLayout:
        topo = cfg.topology
        n = cfg.num_hidden_layers
        sources = topo.compressed_sources
        stage_sources = [s for s in sources if cfg.compress_ratios[s] > 1]
        return cls(
            window_planes=tuple(range(n)), dflash_planes=tuple(n + k for k in range(cfg.nextn)),
            comp_planes={s: n + cfg.nextn + i for i, s in enumerate(sources)},
            index_planes={s: i for i, s in enumerate(sources)},
            stage_planes={s: i for i, s in enumerate(stage_sources)},
            ratios={s: int(cfg.compress_ratios[s]) for s in sources},
            record_bytes=fp8_record_bytes(cfg.head_dim), index_record_bytes=fp4_record_bytes(cfg.index_head_dim),
            stage_width=cfg.head_dim + cfg.index_head_dim + 1,
            max_ratio=max([cfg.compress_ratios[s] for s in sources], default=1), ring=ring)

    def plane_rows(self, num_blocks: int, block_size: int) -> tuple[int, ...]:
        """Rows of each kv plane, in plane order: num_slots per token plane, bs / r per block per source."""
        token_rows = num_blocks * block_size if self.ring is None else self.ring.window_rows
        by_plane = {p: token_rows for p in self.window_planes + self.dflash_planes}
        by_plane.update({p: num_blocks * (block_size // self.ratios[s]) for s, p in self.comp_planes.items()})
        return tuple(by_plane[p] for p in range(self.num_kv_planes))

    def index_rows(self, num_blocks: int, block_size: int) -> tuple[int, ...]:
        """Rows of each index_k plane, in plane order (bs / r per block)."""
        by_plane = {p: num_blocks * (block_size // self.ratios[s]) for s, p in self.index_planes.items()}
        return tuple(by_plane[p] for p in range(self.num_index_planes))

    def stage_rows(self, num_blocks: int, block_size: int) -> int:
        """Rows of each comp_stage plane: one per slot, or the rings' (`WindowRing.stage_rows`)."""
        return num_blocks * block_size if self.ring is None else self.ring.stage_rows

    def bytes_per_block(self, block_size: int, stage_dtype: torch.dtype = torch.bfloat16) -> int:
        """Bytes that grow with the pool's blocks (with rings: compressed + index planes, Engram ids)."""
        stage = self.num_stage_planes * self.stage_width * torch.empty((), dtype=stage_dtype).element_size()
        comp = sum(block_size // self.ratios[s] for s in self.comp_planes) * self.record_bytes
        index = sum(self.index_rows(1, block_size)) * self.index_record_bytes
        if self.ring is None:
            return self.num_token_planes * block_size * self.record_bytes + comp + index + block_size * (stage + 4)
        return comp + index + block_size * 4

    def fixed_bytes(self, stage_dtype: torch.dtype = torch.bfloat16) -> int:
        """Bytes independent of the pool's blocks: the rings and their scratch (0 without rings)."""
        if self.ring is None:
            return 0
        stage = self.num_stage_planes * self.stage_width * torch.empty((), dtype=stage_dtype).element_size()
        return self.num_token_planes * self.ring.window_rows * self.record_bytes + self.ring.stage_rows * stage


def _bases(rows: tuple[int, ...]) -> tuple[int, ...]:
    out, acc = [], 0
    for n in rows:
        out.append(acc)
        acc += n
    return tuple(out)


@dataclass
class PagedKVCache:
    layout: CacheLayout
    block_size: int
    num_blocks: int
    kv: torch.Tensor          # uint8 [num_kv_rows, D + D/32]: planes back to back (plane_base)
    index_k: torch.Tensor     # uint8 [num_index_rows, Di/2 + Di/32]: planes back to back (index_base)
    comp_stage: torch.Tensor  # float [num_stage_planes, num_slots (rings: stage_rows), D + Di + 1]
    engram_ids: torch.Tensor  # int32 [num_slots]

    @property
    def num_slots(self) -> int:
        return self.num_blocks * self.block_size

    @functools.cached_property
    def plane_rows(self) -> tuple[int, ...]:   # kv plane p -> its rows
        return self.layout.plane_rows(self.num_blocks, self.block_size)

    @functools.cached_property
    def plane_base(self) -> tuple[int, ...]:   # kv plane p -> flat row of its slot 0
        return _bases(self.plane_rows)

    @functools.cached_property
    def index_rows(self) -> tuple[int, ...]:   # index_k plane p -> its rows
        return self.layout.index_rows(self.num_blocks, self.block_size)

    @functools.cached_property
    def index_base(self) -> tuple[int, ...]:   # index_k plane p -> flat row of its slot 0
        return _bases(self.index_rows)

    @property
    def kv_flat(self) -> torch.Tensor:        # [num_kv_rows, rec]: plane p, slot s -> plane_base[p] + s
        return self.kv

    def kv_plane(self, plane: int) -> torch.Tensor:
        """uint8 [plane rows, rec] view of kv plane `plane` (its slots index it)."""
        base = self.plane_base[plane]
        return self.kv[base: base + self.plane_rows[plane]]

    def window_plane(self, layer: int) -> torch.Tensor:
        """uint8 [num_slots, rec] window KV of backbone layer `layer`."""
        return self.kv_plane(self.layout.window_planes[layer])

    def comp_plane(self, src: int) -> torch.Tensor:
        """uint8 [num_blocks * bs / r, rec] compressed entries of source `src`."""
        return self.kv_plane(self.layout.comp_planes[src])

    def index_plane(self, src: int) -> torch.Tensor:
        """uint8 [num_blocks * bs / r, rec4] FP4 index keys of source `src`."""
        p = self.layout.index_planes[src]
        base = self.index_base[p]
        return self.index_k[base: base + self.index_rows[p]]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.kv, self.index_k, self.comp_stage, self.engram_ids))


def allocate_kv_cache(cfg, num_blocks: int, block_size: int, device: torch.device | str = "cpu",
                      stage_dtype: torch.dtype = torch.float32, ring: WindowRing | None = None) -> PagedKVCache:
    """Zero-filled paged caches for `num_blocks` blocks of `block_size` tokens; `ring`: window
    planes and stages as per-request rings (the metadata then carries `state_slots`)."""
    layout = CacheLayout.from_config(cfg, ring)
    for s in cfg.topology.compressed_sources:
        r = cfg.compress_ratios[s]
        if block_size % r:
            raise ValueError(f"block_size={block_size}: must be a multiple of every compress ratio (layer {s}: {r})")
    slots = num_blocks * block_size
    return PagedKVCache(
        layout=layout, block_size=block_size, num_blocks=num_blocks,
        kv=torch.zeros(sum(layout.plane_rows(num_blocks, block_size)), layout.record_bytes, dtype=torch.uint8,
                       device=device),
        index_k=torch.zeros(sum(layout.index_rows(num_blocks, block_size)), layout.index_record_bytes,
                            dtype=torch.uint8, device=device),
        comp_stage=torch.zeros(layout.num_stage_planes, layout.stage_rows(num_blocks, block_size), layout.stage_width,
                               dtype=stage_dtype, device=device),
        engram_ids=torch.full((slots,), -1, dtype=torch.int32, device=device))
