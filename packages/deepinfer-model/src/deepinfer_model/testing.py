"""Test and benchmark support: a random `tiny` model and a minimal paged-cache driver that stands in
for the scheduler (block allocation, ForwardMetadata for prefill chunks and decode steps)."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch

from deepinfer_model.metadata import DraftMetadata, ForwardMetadata
from deepinfer_model.model import V41ForCausalLM
from deepinfer_model.presets import tiny


@functools.lru_cache(maxsize=4)
def tiny_model(seed: int = 0) -> V41ForCausalLM:
    torch.manual_seed(seed)
    return V41ForCausalLM(tiny()).init_random_weights(seed).eval()


@dataclass
class Seq:
    tokens: list[int]                    # every token with a position (prompt + committed outputs)
    prompt_len: int
    blocks: list[int] = field(default_factory=list)
    num_computed: int = 0


class Driver:
    """Allocates blocks, builds ForwardMetadata for prefill chunks / decode steps, runs the model."""

    def __init__(self, model, num_blocks=64, block_size=8, shuffle_seed=0):
        self.model = model
        self.block_size = block_size
        self.cache = model.allocate_kv_cache(num_blocks, block_size)
        g = torch.Generator().manual_seed(shuffle_seed)
        self.free = torch.randperm(num_blocks, generator=g).tolist()   # scattered block ids

    def ensure(self, seq: Seq, upto: int) -> None:
        while len(seq.blocks) * self.block_size < upto:
            seq.blocks.append(self.free.pop())

    def prefill(self, seqs: list[Seq], chunk_lens: list[int], features=False):
        rows, last = [], []
        for s, n in zip(seqs, chunk_lens, strict=False):
            self.ensure(s, s.num_computed + n)
            rows.append(s.tokens[s.num_computed: s.num_computed + n])
            last.append(s.num_computed + n == s.prompt_len)
        meta = ForwardMetadata.build(rows, [s.num_computed for s in seqs], [s.blocks for s in seqs],
                                     self.block_size, True, last, "last", features)
        meta.validate()
        out = self.model.forward(meta, self.cache)
        for s, n in zip(seqs, chunk_lens, strict=False):
            s.num_computed += n
        return meta, out

    def decode(self, seqs: list[Seq], drafts: list[list[int]], features=False):
        """One decode step: rows = last committed token + drafts; returns logits of every row."""
        rows = []
        for s, d in zip(seqs, drafts, strict=False):
            rows.append([s.tokens[-1]] + d)
            self.ensure(s, len(s.tokens) + len(d))
        meta = ForwardMetadata.build(rows, [len(s.tokens) - 1 for s in seqs], [s.blocks for s in seqs],
                                     self.block_size, False, None, "all", features)
        meta.validate()
        return meta, self.model.forward(meta, self.cache)

    def draft_meta(self, seqs: list[Seq], main_tokens: list[int]) -> DraftMetadata:
        width = max(len(s.blocks) for s in seqs)
        tables = torch.tensor([s.blocks + [-1] * (width - len(s.blocks)) for s in seqs], dtype=torch.int32)
        return DraftMetadata(positions=torch.tensor([len(s.tokens) - 1 for s in seqs]),
                             main_token_ids=torch.tensor(main_tokens), block_tables=tables,
                             block_size=self.block_size)
