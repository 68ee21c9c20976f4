"""Structure derived from a config: layer kinds, the cross-layer source map, YOCO, planes.

```
layers:   0 ........ n_prefill_layer | n_prefill_layer+1 ........ n_layer-1
          encoder (prefill side)     | YOCO consumer (decoder) layers
```
- `n_prefill_layer` = first layer with ratio 1; none -> YOCO off (every layer is an encoder layer).
- `layer_map[l] = max(s in kv_source_layer_ids, s <= l)` for `l >= min(ids)`, else `l`;
  `layer_map[l] == l` marks a source. Only compressed layers read through the map.
- The compressor input of a compressed source is `u_l` (its attention-normed input) on the
  encoder side and the YOCO shared hidden `s` (the first consumer's attention-norm of the
  encoder output) on the consumer side.
- The attention-module list: `n_layer` backbone layers + 1 lm-head placeholder (None) +
  `nextn` DFlash layers.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class LayerKind(enum.Enum):
    WINDOW = "window"          # ratio 0: sliding window only
    COMPRESSED = "compressed"  # ratio >= 1: window + far compressed background via the indexer
    DFLASH = "dflash"          # draft block layer: window only, keys from target features


@dataclass(frozen=True)
class AttentionSpec:
    kind: LayerKind
    ratio: int        # 0 for window-only / DFlash layers
    source: int       # layer whose compressed entries this layer reads (itself for sources)


def source_map(source_ids: list[int] | tuple[int, ...], n_layer: int) -> list[int]:
    """Each layer -> nearest source not later than itself; identity below the first source."""
    ids = sorted(source_ids)
    out = list(range(n_layer))
    for layer in range(ids[0] if ids else n_layer, n_layer):
        out[layer] = max(s for s in ids if s <= layer)
    return out


@dataclass(frozen=True)
class Topology:
    n_layer: int
    ratios: tuple[int, ...]
    n_prefill_layer: int | None          # None: YOCO off
    layer_map: tuple[int, ...]
    compressed_sources: tuple[int, ...]  # compressed layers with layer_map[l] == l, ascending
    attention_modules: tuple[AttentionSpec | None, ...]
    engram_tables: tuple[tuple[int, int], ...]   # (layer, n) for every Engram n-gram table, n = 2..N

    @classmethod
    def build(cls, c) -> Topology:
        n = c.num_hidden_layers
        ratios = tuple(c.compress_ratios)
        n_prefill = next((i for i, r in enumerate(ratios) if r == 1), None)
        lmap = tuple(source_map(c.kv_source_layer_ids, n))
        sources = tuple(l for l in range(n) if ratios[l] > 0 and lmap[l] == l)
        specs: list[AttentionSpec | None] = [
            AttentionSpec(LayerKind.WINDOW, 0, l) if ratios[l] == 0
            else AttentionSpec(LayerKind.COMPRESSED, ratios[l], lmap[l])
            for l in range(n)
        ]
        specs.append(None)  # lm-head placeholder
        specs += [AttentionSpec(LayerKind.DFLASH, 0, n + 1 + k) for k in range(c.nextn)]
        tables = tuple((l, k) for l in sorted(c.engram_layer_ids) for k in range(2, c.engram_max_ngram_size + 1))
        return cls(n, ratios, n_prefill, lmap, sources, tuple(specs), tables)

    # ---- YOCO
    @property
    def yoco_enabled(self) -> bool:
        return self.n_prefill_layer is not None and self.n_prefill_layer < self.n_layer - 1

    @property
    def num_encoder_layers(self) -> int:
        return self.n_layer if not self.yoco_enabled else self.n_prefill_layer + 1

    @property
    def first_consumer_layer(self) -> int | None:
        return self.num_encoder_layers if self.yoco_enabled else None

    def is_consumer(self, layer: int) -> bool:
        return layer >= self.num_encoder_layers

    @property
    def encoder_layers(self) -> range:
        return range(self.num_encoder_layers)

    @property
    def consumer_layers(self) -> range:
        return range(self.num_encoder_layers, self.n_layer)

    @property
    def consumer_sources(self) -> tuple[int, ...]:
        """Compressed sources on the consumer side: their entries come from the shared hidden."""
        return tuple(s for s in self.compressed_sources if self.is_consumer(s))

    @property
    def encoder_sources(self) -> tuple[int, ...]:
        return tuple(s for s in self.compressed_sources if not self.is_consumer(s))

    def kind(self, layer: int) -> LayerKind:
        return LayerKind.WINDOW if self.ratios[layer] == 0 else LayerKind.COMPRESSED

    def is_source(self, layer: int) -> bool:
        return layer in self.compressed_sources
