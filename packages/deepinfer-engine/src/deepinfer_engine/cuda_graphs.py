"""CUDA graphs for decode steps, bucketed by graph size (total rows of the step).

A decode step of `total_q` rows over `R` requests replays the graph of the smallest bucket
`G >= total_q`. Buckets: 1, 2, 4, 8, then every DEEPINFER_CUDAGRAPH_BATCH_SIZE_INTERVAL (8) up to
the largest decode step the scheduler can emit. Bucket G has `S = min(G, max_reqs) + 1` request
slots (`max_reqs` = max_num_seqs: a step never has more requests, and with speculation G is up to
(1 + nextn) x larger than the request count, so per-request work such as the draft head runs
over S slots, not G + 1). Every graph reads fixed-address buffers:

    rows      [0, total_q)        the step's rows
              [total_q, G)        padding rows: slot -1 (never written), position 0.., owned by
                                  the padding request
    requests  [0, R)              the step's requests
              [R, S - 1)          empty requests (seqlen 0)
              S - 1               the padding request (seqlen G - total_q, block table all -1)

so the graph of G has G rows and S requests whatever the batch. The whole-step graphs take their
inputs from the host in one copy per dtype and one of the block tables (graph_inputs.py) and apply the ZOS fix-up themselves
(decode_step.apply_remap, from the carry the previous whole step wrote). Graphs per bucket:

- the *step* graph (captured up front): the whole decode step of decode_step.py, target forward,
  sampler and draft head, for steps with plain temperature / greedy sampling; a *greedy* variant
  (also captured up front) serves steps whose requests are all greedy: no uniforms are drawn, no
  residual distribution is built, no draft distribution is read. Both up front because a lazy
  capture stalls the step that needs it for tens of ms, and variable-length verification visits
  a different bucket almost every step;
- the *forward* graph (captured on first use): the target forward and the DFlash main-key write
  only, for steps whose sampling runs eagerly (top-n logprobs, top-k / top-p) and for grammar steps;
- the *tail* graph (captured on first use): sampler with grammar masks + draft head
  (`run_decode_tail`), replayed after the forward graph once the host has built the masks.

`compile=True` compiles the step function with `torch.compile` (inductor) before capture: it
fuses the hundreds of small elementwise and indexing ops of a step into a few dozen kernels; the
TileLang kernels enter the compiled graph as opaque custom ops (deepinfer_kernels.tilelang.torch_ops).
The smallest bucket is 2 rows when compiling, so that one dynamic-shape compile serves every
bucket (a 1-row bucket would be compiled again, specialised). Steps larger than the largest
bucket, and prefill steps, run eagerly.

On the CPU nothing is captured: a "replay" runs the same function eagerly on the padded buffers,
so the CPU tests exercise exactly the padded layout the graphs see.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from deepinfer_engine.decode_step import (
    DecodeStepInputs,
    DecodeStepOutputs,
    StepCarry,
    run_decode_step,
    run_decode_tail,
)
from deepinfer_engine.graph_inputs import GraphInputBuffers, StagedStep
from deepinfer_engine.sampler import Sampler, SamplingBatch
from deepinfer_kernels.ops.sampling import NO_VOCAB_MASK
from deepinfer_kernels.ops.verification import MTP_PADDING_ROW
from deepinfer_kernels.platform import current_platform
from deepinfer_model.metadata import ForwardMetadata, ForwardOutput
from deepinfer_model.modules.fused_projection import refresh_fused_projections

logger = logging.getLogger("deepinfer")


def graph_sizes(max_rows: int, interval: int, min_rows: int = 1) -> list[int]:
    max_rows = max(max_rows, min_rows)
    sizes = [s for s in (1, 2, 4) if min_rows <= s < max_rows]
    sizes += list(range(interval, max_rows, interval))
    sizes.append(max_rows)
    return sorted(set(sizes))


def _cut(o: DecodeStepOutputs, rows: int, requests: int) -> DecodeStepOutputs:
    """A padded step's outputs cut to the step's own rows and requests (None stays None)."""
    def cut(t: torch.Tensor | None, n: int) -> torch.Tensor | None:
        return None if t is None else t[:n]

    return DecodeStepOutputs(o.token_ids[:requests], o.token_logprobs[:requests], cut(o.verified_token_ids, rows),
                             cut(o.verified_logprobs, rows), cut(o.num_accepted, requests),
                             cut(o.confidence, requests), cut(o.rejected_rows, requests))


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    out: ForwardOutput | DecodeStepOutputs   # outputs written by replays


class DecodeGraphRunner:
    def __init__(self, model, kv_cache, max_rows: int, max_blocks: int, block_size: int, interval: int,
                 spec=None, compile: bool = False, max_reqs: int | None = None):
        self.model, self.kv_cache, self.spec = model, kv_cache, spec
        self.block_size, self.max_blocks = block_size, max_blocks
        self.write_main_keys = spec is not None
        self.compile = compile
        self.sampler = Sampler()
        self.sizes = graph_sizes(max_rows, interval, min_rows=2 if compile else 1)
        self.max_reqs = self.sizes[-1] if max_reqs is None else max_reqs   # requests of one step, at most
        dev = model.device
        g, r = self.sizes[-1], self.slots(self.sizes[-1])
        # the step's metadata, sampling parameters and MTP slots: one host copy per dtype (graph_inputs.py)
        self.inputs = GraphInputBuffers(g, r, max_blocks, dev)
        b = self.inputs
        self.input_ids, self.positions, self.slot_mapping = b.input_ids, b.positions, b.slot_mapping
        self.seqlens, self.ftp, self.context_lens, self.block_tables = b.seqlens, b.ftp, b.context_lens, b.block_tables
        self.temperature, self.seeds, self.mtp_slots = b.temperature, b.seeds, b.mtp_slots
        self.logit_rows = torch.arange(g, dtype=torch.int64, device=dev)
        self.is_last_chunk = torch.ones(r, dtype=torch.bool, device=dev)
        self.top_k = torch.full((r,), -1, dtype=torch.int32, device=dev)
        self.top_p = torch.ones(r, dtype=torch.float32, device=dev)
        # ZOS on the device: each whole step leaves its results here for the next (decode_step.StepCarry)
        self.carry_token_ids = torch.zeros(r, dtype=torch.int64, device=dev)
        self.carry_rejected_rows = torch.zeros(r, dtype=torch.int64, device=dev)
        # tail graph inputs: the rows' MTP read rows and the grammar masks (allocated on first use)
        self.read_rows = torch.full((g,), MTP_PADDING_ROW, dtype=torch.int64, device=dev)
        self.row_mask_ids = torch.full((g,), NO_VOCAB_MASK, dtype=torch.int32, device=dev)
        self.vocab_mask: torch.Tensor | None = None   # [max_rows, W] int32
        self.tail_graphs: dict[int, _Graph] = {}
        self._last_forward: ForwardOutput | None = None   # CPU: the eager forward the tail reads
        self.use_graphs = dev.type == "cuda"   # the CPU runs the padded functions eagerly (tests)
        self.step_graphs: dict[int, _Graph] = {}
        self.greedy_step_graphs: dict[int, _Graph] = {}
        self.forward_graphs: dict[int, _Graph] = {}
        self._pool = None
        self._step_fn = run_decode_step
        if compile:
            current_platform()   # detect outside the trace (dynamo cannot trace the detection)
            self._step_fn = torch.compile(run_decode_step, fullgraph=True)

    @property
    def max_rows(self) -> int:
        return self.sizes[-1]

    def slots(self, g: int) -> int:
        """Request slots of bucket g: at most max_reqs requests, then the padding request."""
        return min(g, self.max_reqs) + 1

    def _meta(self, g: int) -> ForwardMetadata:
        s = self.slots(g)
        return ForwardMetadata(
            input_ids=self.input_ids[:g], positions=self.positions[:g], seqlens_q=self.seqlens[:s],
            first_token_pos=self.ftp[:s], context_lens=self.context_lens[:s],
            block_tables=self.block_tables[:s], slot_mapping=self.slot_mapping[:g], block_size=self.block_size,
            state_slots=self.inputs.state_slots[:s],
            is_prefill=False, is_last_chunk=self.is_last_chunk[:s], logit_rows=self.logit_rows[:g],
            return_dspark_features=self.write_main_keys, max_context_len=self.max_blocks * self.block_size,
            row_req=self.inputs.row_req[:g],   # staged by the host (no repeat_interleave in the step)
            logits_every_row=True)             # logit_rows is the static arange(G)

    def _inputs(self, g: int, all_greedy: bool = False, carry: bool = False) -> DecodeStepInputs:
        s = self.slots(g)
        batch = SamplingBatch(self.temperature[:s], self.top_k[:s], self.top_p[:s],
                              self.seeds[:s], [], all_greedy=all_greedy, filters=False)  # [] = no top-n
        b = self.inputs
        step_carry = StepCarry(b.remap[:s], b.prev_row[:g], b.row_remap[:g], b.row_req[:g], self.carry_token_ids,
                               self.carry_rejected_rows, rows_move=self.spec is not None) if carry else None
        return DecodeStepInputs(self._meta(g), batch, self.mtp_slots[:s], carry=step_carry)

    def _run_forward(self, meta: ForwardMetadata) -> ForwardOutput:
        out = self.model.forward(meta, self.kv_cache)
        if self.write_main_keys:
            self.spec.write_main_keys(meta, out, self.kv_cache)
        return out

    def _run_step(self, inputs: DecodeStepInputs) -> DecodeStepOutputs:
        if self.compile:   # one dynamic-shape compile for every bucket: rows and requests vary
            m, b = inputs.meta, inputs.batch
            for t in (m.input_ids, m.positions, m.slot_mapping, m.logit_rows, m.seqlens_q, m.first_token_pos,
                      m.context_lens, m.block_tables, m.is_last_chunk, m.row_req, m.state_slots,
                      b.temperature,
                      b.top_k, b.top_p, b.seeds, inputs.mtp_slots):
                torch._dynamo.maybe_mark_dynamic(t, 0)
            if inputs.carry is not None:   # the ZOS carry's per-row / per-request views vary with them
                c = inputs.carry
                for t in (c.remap, c.prev_row, c.row_remap, c.row_req):
                    torch._dynamo.maybe_mark_dynamic(t, 0)
        return self._step_fn(self.model, self.kv_cache, self.spec, self.sampler, inputs)

    def _fill_sampling(self, g: int, batch: SamplingBatch | None, mtp_slots: torch.Tensor | None) -> None:
        """Copy a step's sampling parameters and MTP slots into the static buffers (None: padding only)."""
        r, s = (0 if batch is None else batch.temperature.shape[0]), self.slots(g)
        if batch is not None:
            self.temperature[:r].copy_(batch.temperature)
            self.seeds[:r].copy_(batch.seeds)
        self.temperature[r:s].zero_()
        self.seeds[r:s].zero_()
        if mtp_slots is not None:
            self.mtp_slots[:r].copy_(mtp_slots)
        self.mtp_slots[r:s].zero_()

    def _fill(self, g: int, meta: ForwardMetadata | None) -> None:
        """A step's device metadata into the static buffers, padded to bucket g: the padding staged
        on the host and uploaded (`GraphInputBuffers.stage_padding`, the layout the whole steps
        use), then the step's rows and request slots copied over it on the device (stream order)."""
        t = 0 if meta is None else meta.total_q
        r = 0 if meta is None else meta.num_reqs
        if meta is not None:
            self.inputs.note_table_width(meta.block_tables.shape[1])   # the uploads cover what this writes
        self.inputs.stage_padding(g, self.slots(g), t, r)
        self.inputs.upload()
        if meta is not None:
            self.input_ids[:t].copy_(meta.input_ids)
            self.positions[:t].copy_(meta.positions)
            self.slot_mapping[:t].copy_(meta.slot_mapping)
            self.inputs.row_req[:t].copy_(meta.row_to_req)
            self.seqlens[:r].copy_(meta.seqlens_q)
            self.ftp[:r].copy_(meta.first_token_pos)
            self.context_lens[:r].copy_(meta.context_lens)
            if meta.state_slots is not None:
                self.inputs.state_slots[:r].copy_(meta.state_slots)
            w = meta.block_tables.shape[1]
            self.block_tables[:r, :w].copy_(meta.block_tables)
            self.block_tables[:r, w:].fill_(-1)

    def _capture(self, g: int, fn, arg) -> _Graph:
        # stacked projection weights checked (rebuilt) here, eagerly: never inside a capture or a trace
        refresh_fused_projections(self.model)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        self.inputs.stage_padding(g, self.slots(g), 0, 0)   # the buffers hold no step
        self.inputs.upload()
        carried = (self.carry_token_ids.clone(), self.carry_rejected_rows.clone())  # a capture's runs write it
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn(arg)  # warm-up outside the graph (allocator, lazy inits, kernel and inductor compiles)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            out = fn(arg)
        self.carry_token_ids.copy_(carried[0])
        self.carry_rejected_rows.copy_(carried[1])
        return _Graph(graph, out)

    @torch.no_grad()
    def capture(self) -> None:
        """The step graphs of every bucket, general and all-greedy variants, largest first (later
        graphs reuse its pool memory)."""
        if not self.use_graphs:
            return
        # every engine's model is a new guard target for the one compiled function: lift the limit
        cfg = torch._dynamo.config
        limit = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"
        with cfg.patch(**{limit: max(getattr(cfg, limit), 256)}):
            for greedy in (False, True):
                for g in reversed(self.sizes):
                    self._step_graphs(g, greedy)
        torch.cuda.synchronize()
        logger.info("captured %d decode step graphs, general + all-greedy (sizes %s, compiled: %s)",
                    2 * len(self.sizes), self.sizes, self.compile)

    def bucket(self, total_q: int) -> int | None:
        for g in self.sizes:
            if g >= total_q:
                return g
        return None

    def fitting_bucket(self, total_q: int, num_reqs: int, table_width: int) -> int | None:
        """The bucket whose graphs can run a decode step of `total_q` rows over `num_reqs` requests
        with block tables `table_width` wide, None when none fits (rows, request slots, width)."""
        g = self.bucket(total_q) if table_width <= self.max_blocks else None
        return g if g is not None and num_reqs < self.slots(g) else None

    def bucket_for(self, meta: ForwardMetadata) -> int | None:
        """`fitting_bucket` of this decode step's metadata."""
        return self.fitting_bucket(meta.total_q, meta.num_reqs, meta.block_tables.shape[1])

    @torch.no_grad()
    def run(self, meta: ForwardMetadata) -> ForwardOutput | None:
        """Replay the bucket's forward graph for this decode step; None when no bucket fits."""
        g = self.bucket_for(meta)
        if g is None:
            return None
        if self.use_graphs and g not in self.forward_graphs:   # first piecewise step of this bucket
            self.forward_graphs[g] = self._capture(g, self._run_forward, self._meta(g))
        self._fill(g, meta)
        res = self._replay_or_run(self.forward_graphs, g, self._run_forward, self._meta)
        if not self.use_graphs:
            self._last_forward = res   # what the CPU's tail reads
        t = meta.total_q
        feats = res.dspark_features
        return ForwardOutput(logits=res.logits[:t], full_rows=torch.arange(t, device=self.input_ids.device),
                             dspark_features=None if feats is None else feats[:t])

    def run_step(self, step: StagedStep, all_greedy: bool, prev: tuple[torch.Tensor, torch.Tensor] | None = None,
                 started: torch.cuda.Event | None = None) -> DecodeStepOutputs | None:
        """Replay the bucket's whole-step graph from the step's host arrays (one copy per dtype and the block tables; the
        ZOS fix-up runs inside the graph from `step.remap` and the carry the previous whole step
        left). `prev`: (token_ids, rejected_rows) of a previous step that left no carry (an eager
        or piecewise step), copied into it first. `started`: recorded once the host work is done,
        right before the step's first device work. Outputs cut to the step's rows and requests."""
        t, r = step.input_ids.shape[0], step.seqlens_q.shape[0]
        g = self.fitting_bucket(t, r, step.block_tables.shape[1])
        if g is None:
            return None
        graphs = self._step_graphs(g, all_greedy)
        self.inputs.stage(g, self.slots(g), step)
        if started is not None:
            started.record()
        if prev is not None:
            n = prev[0].shape[0]
            self.carry_token_ids[:n].copy_(prev[0])
            if prev[1] is not None:   # None: that step rejected nothing (no drafts)
                self.carry_rejected_rows[:n].copy_(prev[1])
        self.inputs.upload()
        res = self._replay_or_run(graphs, g, self._run_step, lambda size: self._inputs(size, all_greedy, carry=True))
        return _cut(res, t, r)

    def _step_graphs(self, g: int, greedy: bool) -> dict[int, _Graph]:
        """The step graphs of the variant (general / all-greedy), bucket g's captured if missing
        (`capture` takes both up front; a bucket captured here is a stall of the step that needs it)."""
        graphs = self.greedy_step_graphs if greedy else self.step_graphs
        if self.use_graphs and g not in graphs:
            graphs[g] = self._capture(g, self._run_step, self._inputs(g, greedy, carry=True))
        return graphs

    def _tail_inputs(self, g: int) -> DecodeStepInputs:
        inputs = self._inputs(g)
        inputs.masks = (self.vocab_mask, self.row_mask_ids[:g])
        return inputs

    def _run_tail(self, inputs: DecodeStepInputs) -> DecodeStepOutputs:
        g = inputs.meta.total_q
        fwd = self.forward_graphs[g].out if self.use_graphs else self._last_forward
        read_rows = self.read_rows[:g] if self.spec is not None else None
        return run_decode_tail(self.kv_cache, self.spec, self.sampler, inputs, fwd.logits, read_rows)

    @torch.no_grad()
    def run_tail(self, meta: ForwardMetadata, batch: SamplingBatch, mtp_slots: torch.Tensor | None,
                 read_rows: torch.Tensor | None, masks: tuple[torch.Tensor, torch.Tensor] | None
                 ) -> DecodeStepOutputs:
        """After `run(meta)` of the same step: sampler with the grammar masks and the draft head,
        replayed from the bucket's tail graph. read_rows [total_q]; masks (vocab_mask [n, W],
        row_mask_ids [total_q]) or None (no row constrained)."""
        g, t, r = self.bucket_for(meta), meta.total_q, meta.num_reqs
        if self.vocab_mask is None or (masks is not None and masks[0].shape[1] != self.vocab_mask.shape[1]):
            width = masks[0].shape[1] if masks is not None else -(-self.model.config.vocab_size // 32)
            self.vocab_mask = torch.zeros(self.max_rows, width, dtype=torch.int32, device=self.input_ids.device)
            self.tail_graphs.clear()
        self.row_mask_ids.fill_(NO_VOCAB_MASK)   # a capture's warm-up run must not mask this step's logits
        if self.use_graphs and g not in self.tail_graphs:   # first grammar step of this bucket
            self.tail_graphs[g] = self._capture(g, self._run_tail, self._tail_inputs(g))
            self._fill(g, meta)                               # capture reset the step's buffers
        self._fill_sampling(g, batch, mtp_slots)
        if read_rows is not None:
            self.read_rows[:t].copy_(read_rows)
            self.read_rows[t:g].fill_(MTP_PADDING_ROW)
        if masks is not None:
            self.vocab_mask[: masks[0].shape[0]].copy_(masks[0], non_blocking=True)
            self.row_mask_ids[:t].copy_(masks[1], non_blocking=True)
        return _cut(self._replay_or_run(self.tail_graphs, g, self._run_tail, self._tail_inputs), t, r)

    def _replay_or_run(self, graphs: dict[int, _Graph], g: int, fn, inputs_of):
        """Replay bucket g's graph from `graphs` (its outputs), or on the CPU run fn(inputs_of(g))."""
        if not self.use_graphs:
            return fn(inputs_of(g))
        entry = graphs[g]
        entry.graph.replay()
        return entry.out
