"""Test and benchmark support: a random `tiny` model and a minimal paged-cache driver that stands in
for the scheduler (block allocation, ForwardMetadata for prefill chunks and decode steps)."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace

import torch

from deepinfer_model.metadata import DraftMetadata, ForwardMetadata
from deepinfer_model.model import V41ForCausalLM
from deepinfer_model.paged_cache import PagedKVCache, WindowRing
from deepinfer_model.presets import tiny


@functools.lru_cache(maxsize=4)
def tiny_model(seed: int = 0) -> V41ForCausalLM:
    torch.manual_seed(seed)
    return V41ForCausalLM(tiny()).init_random_weights(seed).eval()


def clone_cache(cache: PagedKVCache) -> PagedKVCache:
    """An independent copy of every paged cache tensor."""
    return replace(cache, kv=cache.kv.clone(), index_k=cache.index_k.clone(), comp_stage=cache.comp_stage.clone(),
                   engram_ids=cache.engram_ids.clone())


def caches_equal(a: PagedKVCache, b: PagedKVCache) -> bool:
    return all(torch.equal(getattr(a, f), getattr(b, f)) for f in ("kv", "index_k", "comp_stage", "engram_ids"))


@dataclass
class Seq:
    tokens: list[int]                    # every token with a position (prompt + committed outputs)
    prompt_len: int
    blocks: list[int] = field(default_factory=list)
    num_computed: int = 0
    state_slot: int = 0                  # ring state slot (caches with rings; 0 = not yet given)

    def slot(self, position: int, block_size: int, ratio: int = 1) -> int:
        """The pool slot of a token position; ratio r: the plane slot of the compressed entry of
        ratio r closing there (`paged/indexing.py`: bs / r records per block)."""
        per_block = block_size // ratio
        return self.blocks[position // block_size] * per_block + (position % block_size) // ratio


class Driver:
    """Allocates blocks, builds ForwardMetadata for prefill chunks / decode steps, runs the model."""

    def __init__(self, model, num_blocks=64, block_size=8, shuffle_seed=0, ring: WindowRing | None = None):
        self.model = model
        self.device = model.device
        self.block_size = block_size
        self.cache = model.allocate_kv_cache(num_blocks, block_size, ring=ring)
        g = torch.Generator().manual_seed(shuffle_seed)
        self.free = torch.randperm(num_blocks, generator=g).tolist()   # scattered block ids
        self.free_states = [] if ring is None else torch.randperm(ring.num_seqs, generator=g).add(1).tolist()

    def ensure(self, seq: Seq, upto: int) -> None:
        while len(seq.blocks) * self.block_size < upto:
            seq.blocks.append(self.free.pop())
        if self.cache.layout.ring is not None and seq.state_slot == 0:
            seq.state_slot = self.free_states.pop()

    def _states(self, seqs: list[Seq]) -> list[int] | None:
        return None if self.cache.layout.ring is None else [s.state_slot for s in seqs]

    def prefill_meta(self, seqs: list[Seq], chunk_lens: list[int], features=False) -> ForwardMetadata:
        """Metadata of one prefill step: the next `chunk_lens[i]` prompt tokens of each sequence
        (blocks allocated; nothing run, `num_computed` unchanged)."""
        rows, last = [], []
        for s, n in zip(seqs, chunk_lens, strict=False):
            self.ensure(s, s.num_computed + n)
            rows.append(s.tokens[s.num_computed: s.num_computed + n])
            last.append(s.num_computed + n == s.prompt_len)
        meta = ForwardMetadata.build(rows, [s.num_computed for s in seqs], [s.blocks for s in seqs],
                                     self.block_size, True, last, "last", features, device=self.device,
                                     state_slots=self._states(seqs))
        meta.validate()
        return meta

    def prefill(self, seqs: list[Seq], chunk_lens: list[int], features=False):
        meta = self.prefill_meta(seqs, chunk_lens, features)
        out = self.model.forward(meta, self.cache)
        for s, n in zip(seqs, chunk_lens, strict=False):
            s.num_computed += n
        return meta, out

    def decode_meta(self, seqs: list[Seq], drafts: list[list[int]], features=False,
                    max_blocks: int | None = None) -> ForwardMetadata:
        """Metadata of one decode step (rows = last committed token + drafts; logits of every row),
        block tables padded to `max_blocks` columns (default: the longest table)."""
        rows = []
        for s, d in zip(seqs, drafts, strict=False):
            rows.append([s.tokens[-1]] + d)
            self.ensure(s, len(s.tokens) + len(d))
        tables = [s.blocks for s in seqs]
        if max_blocks is not None:
            tables = [list(t) + [-1] * (max_blocks - len(t)) for t in tables]
        meta = ForwardMetadata.build(rows, [len(s.tokens) - 1 for s in seqs], tables,
                                     self.block_size, False, None, "all", features, device=self.device,
                                     state_slots=self._states(seqs))
        meta.validate()
        return meta

    def decode(self, seqs: list[Seq], drafts: list[list[int]], features=False):
        """One decode step: rows = last committed token + drafts; returns logits of every row."""
        meta = self.decode_meta(seqs, drafts, features)
        return meta, self.model.forward(meta, self.cache)

    def draft_meta(self, seqs: list[Seq], main_tokens: list[int], max_blocks: int | None = None) -> DraftMetadata:
        width = max(len(s.blocks) for s in seqs) if max_blocks is None else max_blocks
        tables = torch.tensor([s.blocks + [-1] * (width - len(s.blocks)) for s in seqs], dtype=torch.int32)
        return DraftMetadata(positions=torch.tensor([len(s.tokens) - 1 for s in seqs], device=self.device),
                             main_token_ids=torch.tensor(main_tokens, device=self.device),
                             block_tables=tables.to(self.device), block_size=self.block_size,
                             state_slots=None if self.cache.layout.ring is None else
                             torch.tensor(self._states(seqs), dtype=torch.int32, device=self.device))
