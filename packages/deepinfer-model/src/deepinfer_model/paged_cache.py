"""The paged caches of the engine path and their layout (which plane holds what).

```
kv          uint8   [num_kv_planes,    num_slots, D + D/32]    FP8 records (528 B for D = 512)
              planes: window KV of every backbone layer | compressed entries of every compressed
                      source | window KV of every DFlash layer
index_k     uint8   [num_index_planes, num_slots, Di/2 + Di/32] FP4 indexer keys, one per source
comp_stage  float   [num_stage_planes, num_slots, D + Di + 1]   compressor token terms (c, ik, g)
                      of sources with ratio > 1, keyed by the token's own slot
engram_ids  int32   [num_slots]                                 compressed token id of each token
```
Slot of virtual position v of a sequence: `block_table[v // block_size] * block_size + v % block_size`.
Window planes and the stage are keyed by token position; the compressed entry j (covering
positions `j*r .. j*r+r-1`) lives at the slot of its *last* position `j*r + r - 1`, so it sits in
the block that holds its tokens: prefix-shared blocks are never written by another sequence
(requires `block_size % r == 0`). Compressed planes use 1/r of their rows and the stage only
matters for the last incomplete entry: a known waste until a per-ratio allocator replaces it.
Every write of a step happens before any read of the same layer; rejected draft rows are
overwritten by the next step (optimistic KV writes; all writes are idempotent per slot).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from deepinfer_kernels.ops.kv_fp4 import fp4_record_bytes
from deepinfer_kernels.ops.kv_fp8 import fp8_record_bytes


@dataclass(frozen=True)
class CacheLayout:
    window_planes: tuple[int, ...]     # backbone layer -> kv plane of its window KV
    comp_planes: dict[int, int]        # compressed source layer -> kv plane of its entries
    index_planes: dict[int, int]       # compressed source layer -> index_k plane
    stage_planes: dict[int, int]       # compressed source layer with ratio > 1 -> comp_stage plane
    dflash_planes: tuple[int, ...]     # DFlash layer k -> kv plane
    record_bytes: int                  # D + D/32
    index_record_bytes: int            # Di/2 + Di/32
    stage_width: int                   # D + Di + 1
    max_ratio: int

    @property
    def num_kv_planes(self) -> int:
        return len(self.window_planes) + len(self.comp_planes) + len(self.dflash_planes)

    @property
    def num_index_planes(self) -> int:
        return len(self.index_planes)

    @property
    def num_stage_planes(self) -> int:
        return len(self.stage_planes)

    @classmethod
    def from_config(cls, cfg) -> CacheLayout:
        topo = cfg.topology
        n = cfg.num_hidden_layers
        sources = topo.compressed_sources
        comp = {s: n + i for i, s in enumerate(sources)}
        dflash = tuple(n + len(sources) + k for k in range(cfg.nextn))
        stage_sources = [s for s in sources if cfg.compress_ratios[s] > 1]
        return cls(
            window_planes=tuple(range(n)), comp_planes=comp,
            index_planes={s: i for i, s in enumerate(sources)},
            stage_planes={s: i for i, s in enumerate(stage_sources)},
            dflash_planes=dflash, record_bytes=fp8_record_bytes(cfg.head_dim),
            index_record_bytes=fp4_record_bytes(cfg.index_head_dim),
            stage_width=cfg.head_dim + cfg.index_head_dim + 1,
            max_ratio=max([cfg.compress_ratios[s] for s in sources], default=1))

    def bytes_per_block(self, block_size: int, stage_dtype: torch.dtype = torch.bfloat16) -> int:
        per_slot = (self.num_kv_planes * self.record_bytes + self.num_index_planes * self.index_record_bytes
                    + self.num_stage_planes * self.stage_width * torch.empty((), dtype=stage_dtype).element_size()
                    + 4)
        return block_size * per_slot


@dataclass
class PagedKVCache:
    layout: CacheLayout
    block_size: int
    num_blocks: int
    kv: torch.Tensor          # uint8 [num_kv_planes, num_slots, D + D/32]
    index_k: torch.Tensor     # uint8 [num_index_planes, num_slots, Di/2 + Di/32]
    comp_stage: torch.Tensor  # float [num_stage_planes, num_slots, D + Di + 1]
    engram_ids: torch.Tensor  # int32 [num_slots]

    @property
    def num_slots(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def kv_flat(self) -> torch.Tensor:        # [num_kv_planes * num_slots, rec]: plane p, slot s -> p * num_slots + s
        return self.kv.view(-1, self.kv.shape[-1])

    @property
    def index_flat(self) -> torch.Tensor:     # [num_index_planes * num_slots, rec4]
        return self.index_k.view(-1, self.index_k.shape[-1])

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.kv, self.index_k, self.comp_stage, self.engram_ids))


def allocate_kv_cache(cfg, num_blocks: int, block_size: int, device: torch.device | str = "cpu",
                      stage_dtype: torch.dtype = torch.float32) -> PagedKVCache:
    """Zero-filled paged caches for `num_blocks` blocks of `block_size` tokens."""
    layout = CacheLayout.from_config(cfg)
    for s in cfg.topology.compressed_sources:
        r = cfg.compress_ratios[s]
        if block_size % r:
            raise ValueError(f"block_size={block_size}: must be a multiple of every compress ratio (layer {s}: {r})")
    slots = num_blocks * block_size
    return PagedKVCache(
        layout=layout, block_size=block_size, num_blocks=num_blocks,
        kv=torch.zeros(layout.num_kv_planes, slots, layout.record_bytes, dtype=torch.uint8, device=device),
        index_k=torch.zeros(layout.num_index_planes, slots, layout.index_record_bytes, dtype=torch.uint8,
                            device=device),
        comp_stage=torch.zeros(layout.num_stage_planes, slots, layout.stage_width, dtype=stage_dtype, device=device),
        engram_ids=torch.full((slots,), -1, dtype=torch.int32, device=device))
