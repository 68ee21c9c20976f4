"""CUDA graphs for decode steps, bucketed by graph size (total rows of the step).

A decode step of `total_q` rows over `R` requests replays the graph of the smallest bucket
`G >= total_q`. Buckets: 1, 2, 4, 8, then every DEEPINFER_CUDAGRAPH_BATCH_SIZE_INTERVAL (8) up to
the largest decode step the scheduler can emit. Every graph reads fixed-address buffers:

    rows      [0, total_q)        the step's rows
              [total_q, G)        padding rows: slot -1 (never written), position 0.., owned by
                                  the padding request
    requests  [0, R)              the step's requests
              [R, G)              empty requests (seqlen 0)
              G                   the padding request (seqlen G - total_q, block table all -1)

so the graph of G has G rows and G + 1 requests whatever the batch. What a graph replays is the
target forward and the DFlash main-key write (with speculation); the sampler and the draft head
run eagerly after it. Steps larger than the largest bucket, and prefill steps, run eagerly.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from deepinfer_model.metadata import ForwardMetadata, ForwardOutput

logger = logging.getLogger("deepinfer")


def graph_sizes(max_rows: int, interval: int) -> list[int]:
    sizes = [s for s in (1, 2, 4) if s < max_rows]
    sizes += list(range(interval, max_rows, interval))
    sizes.append(max_rows)
    return sorted(set(sizes))


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    meta: ForwardMetadata          # views of the static buffers for this bucket
    out: ForwardOutput             # outputs written by replays


class DecodeGraphRunner:
    def __init__(self, model, kv_cache, max_rows: int, max_blocks: int, block_size: int, interval: int,
                 write_main_keys: bool):
        self.model, self.kv_cache = model, kv_cache
        self.block_size, self.max_blocks = block_size, max_blocks
        self.write_main_keys = write_main_keys
        self.sizes = graph_sizes(max_rows, interval)
        dev = model.device
        g, r = self.sizes[-1], self.sizes[-1] + 1
        self.input_ids = torch.zeros(g, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(g, dtype=torch.int64, device=dev)
        self.slot_mapping = torch.full((g,), -1, dtype=torch.int64, device=dev)
        self.logit_rows = torch.arange(g, dtype=torch.int64, device=dev)
        self.seqlens = torch.zeros(r, dtype=torch.int32, device=dev)
        self.ftp = torch.zeros(r, dtype=torch.int32, device=dev)
        self.context_lens = torch.zeros(r, dtype=torch.int32, device=dev)
        self.block_tables = torch.full((r, max_blocks), -1, dtype=torch.int32, device=dev)
        self.is_last_chunk = torch.ones(r, dtype=torch.bool, device=dev)
        self.graphs: dict[int, _Graph] = {}

    @property
    def max_rows(self) -> int:
        return self.sizes[-1]

    def _meta(self, g: int) -> ForwardMetadata:
        return ForwardMetadata(
            input_ids=self.input_ids[:g], positions=self.positions[:g], seqlens_q=self.seqlens[: g + 1],
            first_token_pos=self.ftp[: g + 1], context_lens=self.context_lens[: g + 1],
            block_tables=self.block_tables[: g + 1], slot_mapping=self.slot_mapping[:g], block_size=self.block_size,
            is_prefill=False, is_last_chunk=self.is_last_chunk[: g + 1], logit_rows=self.logit_rows[:g],
            return_dspark_features=self.write_main_keys, max_context_len=self.max_blocks * self.block_size)

    def _run(self, meta: ForwardMetadata) -> ForwardOutput:
        out = self.model.forward(meta, self.kv_cache)
        if self.write_main_keys:
            self.model.dspark_write_main_keys(meta, out, self.kv_cache)
        return out

    def _fill(self, g: int, meta: ForwardMetadata | None) -> None:
        """Copy a step's metadata into the static buffers, padded to bucket g (device copies only)."""
        t = 0 if meta is None else meta.total_q
        r = 0 if meta is None else meta.num_reqs
        if meta is not None:
            self.input_ids[:t].copy_(meta.input_ids)
            self.positions[:t].copy_(meta.positions)
            self.slot_mapping[:t].copy_(meta.slot_mapping)
            self.seqlens[:r].copy_(meta.seqlens_q)
            self.ftp[:r].copy_(meta.first_token_pos)
            self.context_lens[:r].copy_(meta.context_lens)
            w = meta.block_tables.shape[1]
            self.block_tables[:r, :w].copy_(meta.block_tables)
            self.block_tables[:r, w:].fill_(-1)
        pad = g - t
        self.input_ids[t:g].zero_()
        self.positions[t:g].copy_(torch.arange(pad, device=self.positions.device))
        self.slot_mapping[t:g].fill_(-1)
        self.seqlens[r:g].zero_()
        self.ftp[r:g + 1].fill_(t)
        self.context_lens[r:g].zero_()
        self.block_tables[r:g + 1].fill_(-1)
        self.seqlens[g] = pad
        self.context_lens[g] = pad

    @torch.no_grad()
    def capture(self) -> None:
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream()
        for g in reversed(self.sizes):  # largest first: later graphs reuse its pool memory
            meta = self._meta(g)
            self._fill(g, None)
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                self._run(meta)  # warm-up outside the graph (allocator, lazy inits, kernel compiles)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                out = self._run(meta)
            self.graphs[g] = _Graph(graph, meta, out)
        torch.cuda.synchronize()
        logger.info("captured %d decode graphs (sizes %s)", len(self.graphs), self.sizes)

    def bucket(self, total_q: int) -> int | None:
        for g in self.sizes:
            if g >= total_q:
                return g
        return None

    def run(self, meta: ForwardMetadata) -> ForwardOutput | None:
        """Replay the bucket's graph for this decode step; None when no bucket fits."""
        g = self.bucket(meta.total_q)
        if g is None or meta.block_tables.shape[1] > self.max_blocks:
            return None
        entry = self.graphs[g]
        self._fill(g, meta)
        entry.graph.replay()
        t = meta.total_q
        feats = entry.out.dspark_features
        return ForwardOutput(logits=entry.out.logits[:t], full_rows=torch.arange(t, device=self.input_ids.device),
                             dspark_features=None if feats is None else feats[:t])
