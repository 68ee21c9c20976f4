"""ModelRunner: SchedulerOutput -> ForwardMetadata -> model forward -> sampler (-> draft head).

Owns the paged KV cache and, with speculation, the MTP info pool. The scheduler speaks numpy;
the model speaks torch tensors on its device; this file is the only translation between them.

A step is `launch` (enqueue everything on the device, start the copies of its results to the
host) then `collect` (wait for those copies); the types that cross here are in runner_step.py.
`launch` takes one of three paths (`LaunchPath`): the whole-step graph, the eager (piecewise)
step, or, for a grammar step that replays graphs, the forward graph only (`DeferredStep`, which
`complete` finishes once the grammar masks can be built). Without zero-overhead scheduling the
engine collects right away; with ZOS it launches step N+1 before collecting step N, and step
N+1's inputs are fixed up on the device from step N's results (`decode_step.apply_remap`: inside
the graph for whole decode steps, through `apply_zos_fixup` for the others).
"""

from __future__ import annotations

import time

import numpy as np
import torch

from deepinfer_engine.cuda_graphs import DecodeGraphRunner
from deepinfer_engine.decode_step import DecodeStepOutputs, StepCarry, apply_remap, carry_row_maps
from deepinfer_engine.graph_inputs import StagedStep
from deepinfer_engine.host_copy import array_to_device, arrays_to_device
from deepinfer_engine.runner_step import (
    DeferredStep,
    DeviceStepState,
    LaunchedStep,
    LaunchPath,
    StepResult,
    StepTensors,
    numpy_or_none,
)
from deepinfer_engine.sampler import Sampler, SamplingBatch, SamplingHost, top_logprobs_per_request
from deepinfer_engine.speculation import SpeculativeDecoder
from deepinfer_engine.structured_output.mask_provider import MaskProvider, VocabMasks
from deepinfer_engine.swa_tier import RingSnapshots
from deepinfer_model.metadata import ForwardMetadata
from deepinfer_model.paged.prefill_plan import plan_prefill_rows
from deepinfer_model.paged_cache import WindowRing
from deepinfer_sched import SchedulerOutput, StepKind


class ModelRunner:
    def __init__(self, model, num_blocks: int, block_size: int, max_num_seqs: int, nextn: int = 0,
                 mask_provider: MaskProvider | None = None, ring: WindowRing | None = None):
        """`ring`: window planes and compressor stages as per-request rings (each request's state slot
        from the SchedulerOutput indexes them); None: the paged layout (every position in the blocks)."""
        self.model = model
        self.device = model.device
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.kv_cache = model.allocate_kv_cache(num_blocks, block_size, self.device, ring=ring)
        # the SWA tier over the rings (swa_tier.py), set by the engine with prefix caching on
        self.snapshots: RingSnapshots | None = None
        self.sampler = Sampler()
        self.nextn = nextn
        self.max_num_seqs = max_num_seqs
        self.spec = SpeculativeDecoder(model, max_num_seqs, nextn) if nextn > 0 else None
        self.graphs: DecodeGraphRunner | None = None
        self.timeline: list[tuple[torch.cuda.Event, torch.cuda.Event]] | None = None  # set to a list to record
        # Structured output: builds the masks of a step's logits rows (set_mask_provider; the engine
        # passes its grammar manager on the first grammar request).
        self.mask_provider: MaskProvider | None = mask_provider

    def enable_cuda_graphs(self, max_rows: int, max_model_len: int, interval: int, compile: bool = False) -> None:
        """Capture the whole decode step for every graph-size bucket up to `max_rows` rows
        (`compile`: through torch.compile first, see cuda_graphs.py)."""
        headroom = 2 * (self.nextn + 1)  # ZOS upper-bound rows beyond max_model_len (scheduler)
        max_blocks = -(-(max_model_len + headroom) // self.block_size)
        self.graphs = DecodeGraphRunner(self.model, self.kv_cache, max_rows, max_blocks, self.block_size, interval,
                                        spec=self.spec, compile=compile, max_reqs=self.max_num_seqs)
        self.graphs.capture()

    def _tensor(self, array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
        return array_to_device(array, dtype, self.device)

    def build_metadata(self, out: SchedulerOutput) -> ForwardMetadata:
        is_prefill = out.step_kind == StepKind.PREFILL
        ftp, seqlens = out.first_token_pos, out.seqlens_q
        if is_prefill:
            logit_rows = (ftp + seqlens - 1)[np.asarray(out.is_last_chunk, dtype=bool)]
        else:
            logit_rows = np.arange(out.total_q)
        # prefill: the step's row sets from these host arrays, so the forward reads no device value
        plan = plan_prefill_rows(self.model.config, out.positions, seqlens, out.context_lens, out.is_last_chunk,
                                 out.slot_mapping, out.block_tables, self.block_size, logit_rows) if is_prefill else None
        # one staging buffer and one copy per dtype for the 11 arrays (host time per step)
        i64, i32 = torch.int64, torch.int32
        plan_arrays = [(a, i64) for a in plan.arrays()] if plan is not None else []
        (input_ids, positions, slot_mapping, logit_rows_t, seqlens_q, first_token_pos, context_lens, block_tables,
         state_slots, is_last_chunk, *plan_tensors) = arrays_to_device(
            [(out.input_token_ids, i64), (out.positions, i64), (out.slot_mapping, i64), (logit_rows, i64),
             (seqlens, i32), (ftp, i32), (out.context_lens, i32), (out.block_tables, i32),
             (out.state_slots, i32),
             (np.asarray(out.is_last_chunk, dtype=bool), torch.bool)] + plan_arrays, self.device)
        return ForwardMetadata(
            input_ids=input_ids, positions=positions, seqlens_q=seqlens_q, first_token_pos=first_token_pos,
            context_lens=context_lens, block_tables=block_tables, slot_mapping=slot_mapping,
            state_slots=state_slots,
            block_size=self.block_size, is_prefill=is_prefill, is_last_chunk=is_last_chunk, logit_rows=logit_rows_t,
            return_dspark_features=self.spec is not None,
            # prefill: the exact bound, known here, sizes the far-entry candidates without a device read
            max_context_len=int(out.context_lens.max()) if is_prefill and out.req_cnt else None,
            row_plan=plan.from_tensors(plan_tensors) if plan is not None else None,
            logits_every_row=not is_prefill,   # decode: logit_rows is arange(total_q)
        )

    def apply_zos_fixup(self, meta: ForwardMetadata, out: SchedulerOutput, prev: DeviceStepState | None) -> None:
        """Step N's results into step N+1's rows (ZOS), on the device, for an eager step's
        metadata (in place): the rules of `decode_step.apply_remap`, with the host's row maps.

        For request i of this step with remap[i] = r (its index in step N):
          golden token (row 0, -1 from the scheduler)  <- main token sampled for r in step N
          positions / context / slots                  -= rows step N rejected for r
        The scheduler planned this step assuming step N kept all its rows (an upper bound with
        blocks allocated for it); the rejected-draft delta brings the rows to their true places.
        """
        self._check_remap(out, prev)
        if prev is None or not (out.remap >= 0).any():
            return
        if meta.row_plan is not None and prev.has_drafts:   # rows may move: the host's row sets may not hold
            meta.row_plan = None
        maps = carry_row_maps(out.input_token_ids, out.seqlens_q, out.first_token_pos, out.remap)
        remap, row_req, row_remap, prev_row = arrays_to_device(
            [(out.remap, torch.int64)] + [(m, torch.int64) for m in maps], self.device)
        carry = StepCarry(remap, prev_row, row_remap, row_req, prev.token_ids, prev.rejected_rows,
                          rows_move=prev.has_drafts)
        fixed = apply_remap(meta, carry)
        meta.input_ids, meta.positions = fixed.input_ids, fixed.positions
        meta.slot_mapping, meta.context_lens = fixed.slot_mapping, fixed.context_lens

    @staticmethod
    def _check_remap(out: SchedulerOutput, prev: DeviceStepState | None) -> None:
        golden_unknown = out.input_token_ids[out.first_token_pos] < 0 if out.req_cnt else np.zeros(0, bool)
        if golden_unknown.any() and (prev is None or (out.remap[golden_unknown] < 0).any()):
            raise RuntimeError("a step needs last step's sampled token but no previous step maps to it (remap)")

    # ------------------------------------------------------------------ launch / collect
    @torch.no_grad()
    def launch(self, out: SchedulerOutput, batch: SamplingBatch,
               prev: DeviceStepState | None = None) -> LaunchedStep | DeferredStep:
        """Enqueue the step on the device along one of three paths (LaunchPath) and start the copies
        of its results to the host. A grammar step that replays graphs stops after its forward
        (DeferredStep: `complete` it once the matchers are advanced); `defers_masks` says beforehand."""
        cpu_start = time.perf_counter()
        started = torch.cuda.Event(enable_timing=True) if self.device.type == "cuda" else None
        if self.snapshots is not None:   # restore this step's hits into the rings, plan its SWA snapshots
            self.snapshots.before_forward(out)
        graphed = self.runs_graphed(out, batch)
        if graphed and not batch.needs_masks:
            # the common decode step: host arrays straight into the graph's buffers, fix-up in the graph
            # (`started`: at the step's first device work, so the timeline's gaps are the device's idle)
            self._check_remap(out, prev)
            return self._launch_whole_step(out, batch, prev, started, cpu_start)
        if started is not None:
            started.record()
        meta = self.build_metadata(out)
        self.apply_zos_fixup(meta, out, prev)
        if graphed:
            return self._launch_forward_for_masks(out, meta, batch, started, cpu_start)
        return self._launch_eager(out, meta, batch, started, cpu_start)

    def set_mask_provider(self, provider: MaskProvider | None) -> None:
        """Who builds the grammar masks of a step's logits rows (None: no step is constrained)."""
        self.mask_provider = provider

    def _step_masks(self, out: SchedulerOutput, input_ids: torch.Tensor) -> VocabMasks | None:
        return self.mask_provider.step_masks(out, input_ids, self.device) if self.mask_provider is not None else None

    def _launch_eager(self, out: SchedulerOutput, meta: ForwardMetadata, batch: SamplingBatch,
                      started, cpu_start: float) -> LaunchedStep:
        """Piecewise: the target forward (a decode step's forward graph, or eager), then the sampler
        and the draft head eagerly. Every sampling feature works here."""
        is_prefill = out.step_kind == StepKind.PREFILL
        read_rows = None
        if self.spec is not None and not is_prefill:
            read_rows = self.spec.draft_rows(meta, self._tensor(out.mtp_slots, torch.int32))
            self.spec.fill_draft_inputs(meta, read_rows)
        fwd = self.graphs.run(meta) if self.graphs is not None and not is_prefill else None
        if fwd is None:  # prefill, no graphs, or a step larger than every bucket: eager
            fwd = self.model.forward(meta, self.kv_cache)
            if self.spec is not None:   # eager: not the compiled main keys (prefill shapes would recompile)
                self.model.dspark_write_main_keys(meta, fwd, self.kv_cache)
        masks = self._step_masks(out, meta.input_ids)

        req_cnt, dev = out.req_cnt, self.device
        if is_prefill and not np.asarray(out.is_last_chunk, dtype=bool).any():  # nothing samples
            zeros = torch.zeros(req_cnt, dtype=torch.int64, device=dev)
            results = StepTensors(zeros, torch.zeros(req_cnt, dtype=torch.float32, device=dev))
            return self._finish_launch(out, LaunchPath.EAGER, results, started, cpu_start, [0] * req_cnt,
                                       DeviceStepState(zeros, zeros, has_drafts=False))
        if is_prefill:  # one logits row per request whose prompt ends in this chunk
            sampled = np.flatnonzero(np.asarray(out.is_last_chunk, dtype=bool))
            idx = self._tensor(sampled, torch.int64)
            sub = batch.select(idx, sampled)
            n = sampled.size
            ftp = torch.arange(n, dtype=torch.int32, device=dev)
            seqlens = torch.ones(n, dtype=torch.int32, device=dev)
            positions = meta.positions[meta.logit_rows]
            res = self.sampler.sample(fwd.logits, sub, ftp, seqlens, positions, masks=masks)
        else:
            sampled, idx, sub = np.arange(req_cnt), None, batch
            ftp, seqlens, positions = meta.first_token_pos, meta.seqlens_q, meta.positions
            drafts = q = None
            if read_rows is not None:
                drafts, q = self.spec.verify_inputs(read_rows, need_probs=not batch.all_greedy)
            res = self.sampler.sample(fwd.logits, batch, ftp, seqlens, positions, drafts, q, masks=masks)

        if is_prefill:   # scatter the sampled requests' results into request order
            token_ids = torch.zeros(req_cnt, dtype=torch.int64, device=dev)
            token_logprobs = torch.zeros(req_cnt, dtype=torch.float32, device=dev)
            token_ids[idx] = res.token_ids.long()
            token_logprobs[idx] = res.token_logprobs
            rejected = torch.zeros(req_cnt, dtype=torch.int64, device=dev)
        else:
            token_ids, token_logprobs = res.token_ids.long(), res.token_logprobs
            rejected = seqlens.long() - 1 - res.num_accepted.long()
        results = StepTensors(token_ids, token_logprobs)
        if self.spec is not None and not is_prefill:   # without speculation nothing is verified: no copies of it
            results.verified_token_ids, results.verified_logprobs = res.verified_token_ids, res.verified_logprobs
            results.num_accepted = res.num_accepted
        if res.top_values is not None:
            results.top_values, results.top_ids = res.top_values, res.top_ids
            results.top_ftp, results.top_accepted = ftp, res.num_accepted

        if self.spec is not None:  # propose the next step's drafts after each request's final row
            final_row = ftp.long() + res.num_accepted.long()
            tables = meta.block_tables if idx is None else meta.block_tables[idx]
            slots = self._tensor(out.mtp_slots[sampled], torch.int32)
            states = meta.state_slots if idx is None else meta.state_slots[idx]
            proposal = self.spec.propose(self.kv_cache, positions[final_row], res.token_ids, tables,
                                         self.block_size, sub.seeds, sub.is_greedy, sub.all_greedy, slots,
                                         states)
            confidence = torch.zeros(req_cnt, self.nextn, dtype=torch.float32, device=dev)
            confidence[idx if idx is not None else self._tensor(sampled, torch.int64)] = proposal.confidence
            results.confidence = confidence

        return self._finish_launch(out, LaunchPath.EAGER, results, started, cpu_start, list(sub.num_top_logprobs),
                                   DeviceStepState(token_ids, rejected, has_drafts=not is_prefill))

    def _graphed_sampling(self, batch: SamplingBatch) -> bool:
        """The sampler runs inside a decode graph (no top-k / top-p pass, no top-n logprobs)."""
        return (self.graphs is not None and not batch.filters and not any(batch.num_top_logprobs)
                and batch.penalties is None)

    def runs_graphed(self, out: SchedulerOutput, batch: SamplingBatch) -> bool:
        """This step replays CUDA graphs end to end (whole step, or forward + tail with masks): a
        decode step with graph-compatible sampling that fits a bucket (rows and block-table width),
        decided from the host-side SchedulerOutput, the same way by `launch` and `defers_masks`."""
        return (out.step_kind == StepKind.DECODE and self._graphed_sampling(batch)
                and self.graphs.fitting_bucket(out.total_q, out.req_cnt, np.asarray(out.block_tables).shape[1])
                is not None)

    def defers_masks(self, out: SchedulerOutput, batch: SamplingBatch) -> bool:
        """`launch` of this grammar step stops after the forward graph (a DeferredStep) and `complete`
        builds the masks and samples: the engine may settle the previous step in between (its ledger
        advances the matchers the masks start from)."""
        return batch.needs_masks and self.runs_graphed(out, batch)

    def _launch_forward_for_masks(self, out: SchedulerOutput, meta: ForwardMetadata, batch: SamplingBatch,
                                  started, cpu_start: float) -> DeferredStep:
        """Grammar step, first half: drafts into the inputs, their copy to the host (ordered before
        the forward, so the host waits for the previous step only), then the bucket's forward graph."""
        slots = read_rows = ids_host = copied = None
        if self.spec is not None:
            slots = self._tensor(out.mtp_slots, torch.int32)
            read_rows = self.spec.draft_rows(meta, slots)
            self.spec.fill_draft_inputs(meta, read_rows)
            ids_host = meta.input_ids.to("cpu", non_blocking=True)
            if self.device.type == "cuda":
                copied = torch.cuda.Event()
                copied.record()
        self.graphs.run(meta)
        return DeferredStep(out, started, (time.perf_counter() - cpu_start) * 1e3, meta, batch, slots, read_rows,
                            ids_host, copied)

    def complete(self, step: DeferredStep) -> LaunchedStep:
        """Grammar step, second half: masks from the matchers (advanced by the previous step's
        ledger), built while the forward graph runs, then the bucket's tail graph."""
        cpu_start = time.perf_counter() - step.cpu_ms / 1e3
        if step.copied is not None:
            step.copied.synchronize()
        input_ids = step.input_ids_host if step.input_ids_host is not None else step.meta.input_ids
        masks = self._step_masks(step.out, input_ids)
        res = self.graphs.run_tail(step.meta, step.batch, step.mtp_slots, step.read_rows, masks)
        return self._graphed_result(step.out, LaunchPath.SPLIT, res, False, step.started, cpu_start)

    def _launch_whole_step(self, out: SchedulerOutput, batch: SamplingBatch, prev: DeviceStepState | None,
                           started, cpu_start: float) -> LaunchedStep:
        """Decode with plain sampling: one replay of the bucket's whole-step graph (decode_step.py),
        its inputs staged from the SchedulerOutput's host arrays (graph_inputs.py)."""
        remap = out.remap if prev is not None else np.full(out.req_cnt, -1, np.int64)
        host = batch.host if batch.host is not None else SamplingHost.of(batch)   # (a sync: not the engine's)
        step = StagedStep(
            input_ids=out.input_token_ids, positions=out.positions, slot_mapping=out.slot_mapping,
            seqlens_q=out.seqlens_q, first_token_pos=out.first_token_pos, context_lens=out.context_lens,
            block_tables=np.asarray(out.block_tables), remap=remap, temperature=host.temperature,
            seeds=host.seeds, mtp_slots=out.mtp_slots if self.spec is not None else None,
            state_slots=out.state_slots)
        carry = None if prev is None or prev.in_carry else (prev.token_ids, prev.rejected_rows)
        res = self.graphs.run_step(step, batch.all_greedy, carry, started)
        return self._graphed_result(out, LaunchPath.WHOLE_STEP, res, True, started, cpu_start)

    def _graphed_result(self, out: SchedulerOutput, path: LaunchPath, res: DecodeStepOutputs, in_carry: bool,
                        started, cpu_start: float) -> LaunchedStep:
        # without speculation the step verified nothing: its outputs are the tokens and logprobs only (None)
        results = StepTensors(res.token_ids, res.token_logprobs, res.verified_token_ids, res.verified_logprobs,
                              res.num_accepted, res.confidence)
        return self._finish_launch(out, path, results, started, cpu_start, [0] * out.req_cnt,
                                   DeviceStepState(res.token_ids, res.rejected_rows,
                                                   has_drafts=res.rejected_rows is not None, in_carry=in_carry))

    def _finish_launch(self, out: SchedulerOutput, path: LaunchPath, results: StepTensors, started,
                       cpu_start: float, top_counts: list[int], state: DeviceStepState) -> LaunchedStep:
        done = None
        if self.snapshots is not None:   # the forward is done: the step's SWA snapshots to the host
            self.snapshots.after_forward(out.step_id)
        if self.device.type == "cuda":  # start the copies now; collect() waits for them
            results = results.to_host()
            done = torch.cuda.Event(enable_timing=True)
            done.record()
            if self.timeline is not None:  # device start/end of every step (benchmarks: idle gaps)
                self.timeline.append((started, done))
        return LaunchedStep(out, path, results, done, started, (time.perf_counter() - cpu_start) * 1e3, top_counts,
                            state)

    def collect(self, step: LaunchedStep) -> StepResult:
        """Wait for the step's copies; its results as host arrays in request order."""
        device_ms = step.cpu_ms
        if step.done is not None:
            step.done.synchronize()
            device_ms = step.started.elapsed_time(step.done)
        h = step.results
        out, req_cnt = step.out, step.out.req_cnt
        top: list[list[dict[int, float]] | None] = [None] * req_cnt
        if h.top_values is not None:
            per = top_logprobs_per_request(h.top_values.numpy(), h.top_ids.numpy(), step.top_counts,
                                           h.top_ftp.numpy(), h.top_accepted.numpy())
            sampled = (np.flatnonzero(np.asarray(out.is_last_chunk, dtype=bool))
                       if out.step_kind == StepKind.PREFILL else np.arange(req_cnt))
            for j, i in enumerate(sampled):
                top[i] = per[j]
        has_drafts = h.verified_token_ids is not None and bool((out.seqlens_q > 1).any())
        return StepResult(
            token_ids=h.token_ids.numpy().astype(np.int32),
            token_logprobs=h.token_logprobs.numpy(),
            verified_token_ids=h.verified_token_ids.numpy() if has_drafts else None,
            verified_logprobs=h.verified_logprobs.numpy() if has_drafts else None,
            top_logprobs=top,
            num_accepted=numpy_or_none(h.num_accepted),
            confidence=numpy_or_none(h.confidence),
            device_ms=device_ms,
        )

    def execute(self, out: SchedulerOutput, batch: SamplingBatch) -> StepResult:
        """One step, synchronously (LLMEngine's step without ZOS): launch, then, nothing being in
        flight, complete a deferred step at once (its masks can be built now), then collect."""
        step = self.launch(out, batch)
        return self.collect(self.complete(step) if isinstance(step, DeferredStep) else step)
