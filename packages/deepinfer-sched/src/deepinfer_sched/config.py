"""User-facing parameter sets. Validated again in C++ (ValueError naming the field)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from . import _core


@dataclass(frozen=True)
class SchedulerConfig:
    block_size: int = 128  # tokens per KV block; the prefix-cache grain is one block
    num_blocks: int = 4096  # KV pool capacity in blocks
    max_num_seqs: int = 256  # running sequences at most; also the MTP info slot pool size
    max_num_batched_tokens: int = 8192  # rows per step (prefill chunk budget, decode rows)
    max_model_len: int = 4096  # prompt + output limit; longer prompts are ignored
    nextn: int = 0  # draft rows per decode step, upper bound (0 = no speculation)
    min_final_chunk_tokens: int = 128  # YOCO: last prefill chunk holds >= min(this, prefill) tokens
    enable_prefix_caching: bool = True
    swa_snapshot_tokens: int = 0  # SWA tier grain A (SPEC §5: 128): with window rings a hit needs a
    #   snapshot of the window at its point, registered by add_swa_snapshot; 0 = any block hit
    eos_token_ids: Sequence[int] = (2,)
    engram_vocab_map: Sequence[int] | None = None  # token id -> compressed (Engram) id

    def to_core(self) -> _core.SchedulerConfig:
        c = _core.SchedulerConfig()
        c.block_size = self.block_size
        c.num_blocks = self.num_blocks
        c.max_num_seqs = self.max_num_seqs
        c.max_num_batched_tokens = self.max_num_batched_tokens
        c.max_model_len = self.max_model_len
        c.nextn = self.nextn
        c.min_final_chunk_tokens = self.min_final_chunk_tokens
        c.enable_prefix_caching = self.enable_prefix_caching
        c.swa_snapshot_tokens = self.swa_snapshot_tokens
        c.eos_token_ids = [int(t) for t in self.eos_token_ids]
        c.engram_vocab_map = [] if self.engram_vocab_map is None else [int(t) for t in self.engram_vocab_map]
        c.validate()
        return c


@dataclass(frozen=True)
class RequestParams:
    max_tokens: int = 16  # output tokens at most (>= 1)
    min_tokens: int = 0  # EOS and stop ids are not honoured before this many output tokens
    stop_token_ids: Sequence[int] = field(default_factory=tuple)
    ignore_eos: bool = False

    def to_core(self) -> _core.RequestParams:
        p = _core.RequestParams()
        p.max_tokens = self.max_tokens
        p.min_tokens = self.min_tokens
        p.stop_token_ids = [int(t) for t in self.stop_token_ids]
        p.ignore_eos = self.ignore_eos
        return p
