"""LLMEngine: the engine loop. One step = schedule -> launch -> collect -> outputs.

    scheduled = scheduler.schedule()                     # C++: admission, chunking, KV blocks
    launched = runner.launch(scheduled, sampling batch)  # device: forward + sampler, copies started
    res = runner.collect(launched)                       # host: wait for those copies (StepResult)
    pushed = scheduler.process_outputs(scheduled, ...)   # C++ ledger: append tokens, stop checks
    handles = scheduler.build_request_outputs(...)       # C++: pooled RequestOutputs
    output_processor.consume(pool.gather(handles))       # text, stops, grammar, streaming -> finished

With zero-overhead scheduling (ZOS) the launch of step N+1 comes before the collect of step N.

The engine's parts, each its own object: `scheduler` (deepinfer_sched), `runner` (ModelRunner),
`output_processor` (OutputProcessor: request bookkeeping and the text level), `stats`
(EngineStats), `tokenizer`; `resolved` is the configuration with every knob decided.

A request with invalid input is rejected at add_request with InvalidRequestError naming the field;
nothing already accepted is affected.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch

from deepinfer_engine import request_failure
from deepinfer_engine.config import EngineConfig
from deepinfer_engine.envs import Envs
from deepinfer_engine.host_copy import arrays_to_device
from deepinfer_engine.kernel_builds import describe_kernel_builds, kernel_build_seconds
from deepinfer_engine.kv_sizing import num_kv_blocks, profile_activation_bytes
from deepinfer_engine.model_loader import load_model, resolve_device
from deepinfer_engine.model_runner import ModelRunner
from deepinfer_engine.output_processor import OutputProcessor
from deepinfer_engine.outputs import GenerationOutput, StreamDelta
from deepinfer_engine.request_state import RequestState
from deepinfer_engine.request_validation import CheckedPrompt, encode_prompt, validate_request
from deepinfer_engine.runner_step import DeferredStep, DeviceStepState, LaunchedStep, StepResult
from deepinfer_engine.sampler import SamplingBatch, SamplingHost
from deepinfer_engine.sampling_params import UINT64_MAX, SamplingParams
from deepinfer_engine.stats import EngineGauges, EngineStats
from deepinfer_engine.stop_strings import make_stop_matcher
from deepinfer_engine.swa_tier import RingSnapshots, SwaHostStore, swa_snapshot_grain
from deepinfer_engine.verify_budget import VerifyBudgetPolicy
from deepinfer_kernels.ops.sampling.rng import as_int64_bits
from deepinfer_model.paged_cache import WindowRing
from deepinfer_sched import (
    RequestOutputPool,
    Scheduler,
    SchedulerConfig,
    SchedulerOutput,
    StepKind,
)

logger = logging.getLogger("deepinfer")

_FINISHED_PLACEHOLDER = RequestState(-1, SamplingParams(temperature=0), 0, GenerationOutput(-1, None, []))


@dataclass(slots=True)
class InFlightStep:
    """A step scheduled and launched, not yet collected (ZOS keeps one across `step` calls)."""

    scheduled: SchedulerOutput
    launched: LaunchedStep | None   # None: an IDLE step, nothing ran on the device

    @property
    def device_state(self) -> DeviceStepState | None:
        """What the step leaves on the device for the next step's inputs (the next launch's `prev`)."""
        return None if self.launched is None else self.launched.state


class LLMEngine:
    """The engine loop over one model. What serving layers (an async server, data-parallel
    workers) build on: `add_request` / `abort_request` / `has_unfinished` / `step` (one step; the
    requests finished in it) / `validate_request` / `encode`, streaming (`start_streaming`,
    `set_stream_indices`, `pop_stream_deltas`, `stop_streaming`), and the parts `scheduler`,
    `runner`, `output_processor` (live requests: `output_processor.requests`), `tokenizer`,
    `stats`, `resolved` (the configuration, every knob decided). Not thread-safe: one caller
    drives it."""

    def __init__(self, config: EngineConfig):
        config.validate()
        self.config = config   # as the user gave it; the engine reads `resolved`
        kernel_builds_before = kernel_build_seconds()
        self.envs = Envs.from_environ()
        self.device = resolve_device(config.device)
        self.resolved = cfg = config.resolve(self.envs, self.device.type)
        loaded = load_model(cfg.model, self.device, cfg.random_init_seed, cfg.dtype)
        self.model, self.tokenizer, self.model_source = loaded.model, loaded.tokenizer, loaded.source
        mcfg = self.model.config
        self.vocab_size = mcfg.vocab_size
        self.max_model_len = min(cfg.max_model_len or mcfg.max_position_embeddings, mcfg.max_position_embeddings)
        # YOCO: the last prefill chunk holds the decoder bounded-replay tokens (W, docs/model.md) and,
        # where the step budget allows, the speculative backtracking too (SPEC §5: a hit stops >= W +
        # backtracking tokens short of the prompt, 134 for flash; DEEPINFER_YOCO_PREFILL_KEEP_TOKENS may
        # keep more, 140 recommended)
        self.max_num_batched_tokens = cfg.max_num_batched_tokens
        min_final_chunk = 1
        if mcfg.topology.yoco_enabled:
            keep = max(mcfg.sliding_window + self.envs.max_backtracking_tokens,
                       self.envs.yoco_prefill_keep_tokens)
            min_final_chunk = max(mcfg.sliding_window, min(keep, self.max_num_batched_tokens))
        if self.max_num_batched_tokens < min_final_chunk:
            raise ValueError(f"max_num_batched_tokens: must be >= {min_final_chunk} (the model's decoder "
                             f"bounded-replay length), got {self.max_num_batched_tokens}")
        self.nextn = min(cfg.num_speculative_tokens, mcfg.nextn)  # a model without a draft head cannot speculate
        self.budget = VerifyBudgetPolicy(self.nextn, cfg.enable_mtp_varlen)
        activations = 0
        if self.device.type == "cuda" and cfg.num_kv_blocks is None:   # before the pool takes the memory
            activations = profile_activation_bytes(self.model, cfg.block_size, self.max_num_batched_tokens,
                                                   self.max_model_len)
        ring = None   # window KV as per-request rings (SPEC's layout) unless window_kv="paged"
        if cfg.window_kv == "ring":
            ring = WindowRing.for_config(mcfg, cfg.max_num_seqs, self.max_num_batched_tokens)
        blocks = num_kv_blocks(self.model, cfg, self.max_model_len, activations, ring)
        swa_grain = swa_snapshot_grain(cfg, mcfg) if ring is not None and cfg.enable_prefix_caching else 0
        self.scheduler = Scheduler(SchedulerConfig(
            block_size=cfg.block_size, num_blocks=blocks, max_num_seqs=cfg.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens, max_model_len=self.max_model_len,
            nextn=self.nextn, min_final_chunk_tokens=min_final_chunk,
            enable_prefix_caching=cfg.enable_prefix_caching, eos_token_ids=loaded.eos_token_ids,
            swa_snapshot_tokens=swa_grain))
        self.model.decode_streams = cfg.decode_streams
        self.runner = ModelRunner(self.model, blocks, cfg.block_size, cfg.max_num_seqs, self.nextn, ring=ring)
        if swa_grain:   # the SWA tier: host snapshots of the rings, the scheduler hits on their keys
            store = SwaHostStore(cfg.swa_host_cache_bytes, self.scheduler.add_swa_snapshot,
                                 self.scheduler.remove_swa_snapshot)
            self.runner.snapshots = RingSnapshots(self.runner.kv_cache, mcfg, swa_grain, self.nextn, store)
        if cfg.cuda_graphs and self.device.type == "cuda":
            max_rows = min(self.max_num_batched_tokens, cfg.max_num_seqs * (self.nextn + 1))
            if cfg.compile_speculation and self.runner.spec is not None and not cfg.compile_decode:
                if cfg.batch_invariant:
                    logger.warning("compile_speculation is ignored with DEEPINFER_BATCH_INVARIANT=1")
                else:
                    self.runner.spec.compile()   # before the capture, whose warm-up runs compile
            self.runner.enable_cuda_graphs(max_rows, self.max_model_len, cfg.cudagraph_batch_size_interval,
                                           compile=cfg.compile_decode)
        self.pool = RequestOutputPool()
        self._next_request_id = 0
        self._seed_rng = np.random.default_rng(cfg.seed)
        self._handles_to_release: np.ndarray | None = None   # the previous step's pooled outputs
        self.zos = cfg.zero_overhead_scheduling
        self._inflight: InFlightStep | None = None   # ZOS: launched, not yet collected
        self.stats = EngineStats()
        self.output_processor = OutputProcessor(self.scheduler, self.tokenizer, self.model, self.vocab_size,
                                                self.stats)
        if cfg.batch_invariant:   # DEEPINFER_BATCH_INVARIANT=1 (draft lengths fixed by `resolve`)
            from deepinfer_engine import batch_invariant
            batch_invariant.install(self.model)
        logger.info("engine: model %s on %s, %d KV blocks of %d tokens, max_model_len %d", self.model_source,
                    self.device, blocks, cfg.block_size, self.max_model_len)
        builds = describe_kernel_builds(kernel_builds_before, kernel_build_seconds())
        if builds is not None:   # the GPU: the activation profile and the graph captures built the kernels
            logger.info(builds)

    # ------------------------------------------------------------------ requests
    def encode(self, prompt: str) -> list[int]:
        """The prompt's token ids (InvalidRequestError without a tokenizer)."""
        return encode_prompt(self.tokenizer, prompt)

    def validate_request(self, prompt: str | None, prompt_token_ids: list[int] | CheckedPrompt | None,
                         params: SamplingParams) -> CheckedPrompt:
        """The prompt of a valid request; raises InvalidRequestError naming the field and the limit."""
        return validate_request(prompt, prompt_token_ids, params, tokenizer=self.tokenizer, vocab_size=self.vocab_size)

    def add_request(self, prompt: str | None = None, prompt_token_ids: list[int] | CheckedPrompt | None = None,
                    params: SamplingParams | None = None) -> int:
        """Validate and queue a request. A request with structured output is held on the Python side
        until its grammar compiles (off the engine loop) and only then enters the scheduler; a grammar
        that fails to compile or times out finishes that request alone with finish_reason "error".
        Raises InvalidRequestError (bad input) or RequestFailedError; either leaves no state behind.
        `prompt_token_ids` may be `validate_request`'s CheckedPrompt: its ids are not checked again."""
        return request_failure.guarded_add(self, self._add_request, prompt, prompt_token_ids, params)

    def _add_request(self, prompt: str | None, prompt_token_ids: list[int] | CheckedPrompt | None,
                     params: SamplingParams | None) -> int:
        params = params or SamplingParams()
        checked = self.validate_request(prompt, prompt_token_ids, params)
        token_ids = checked.token_ids
        request_id = self._next_request_id
        self._next_request_id += 1
        seed = params.seed if params.seed is not None else int(self._seed_rng.integers(0, UINT64_MAX, dtype=np.uint64))
        out = GenerationOutput(request_id=request_id, prompt=prompt, prompt_token_ids=token_ids)
        state = RequestState(request_id, params, seed, out)
        if self.tokenizer is not None:
            state.detokenizer = self.output_processor.new_detokenizer()
            state.stops = make_stop_matcher(params, prompt, token_ids, self.tokenizer)
        if params.structured_output is not None:
            self._structured_output()   # the grammar manager, made on the first grammar request
        self.output_processor.add_request(state, checked)
        return request_id

    def abort_request(self, request_id: int) -> bool:
        """Finish a live request now: its KV blocks and slot are freed at once; its final output
        ("abort") comes out of the next step. A request still waiting for its grammar to compile
        never enters the scheduler."""
        if self.output_processor.abort_held(request_id):
            return True
        return self.scheduler.abort_request(request_id)

    def discard_request(self, request_id: int) -> None:
        """Remove every piece of state a request has, wherever it got to, without an output. Idempotent."""
        self.output_processor.discard_request(request_id)

    def fail_request(self, request_id: int, message: str) -> GenerationOutput:
        """Finish a live request now with `finish_reason == "error"` and remove its state."""
        return self.output_processor.fail_request(request_id, message)

    def has_unfinished(self) -> bool:
        """Something is left to run: scheduled requests, a step in flight, or requests whose grammar compiles."""
        return self.scheduler.has_unfinished() or self._inflight is not None or self.output_processor.has_held

    @property
    def structured_output(self):
        """The StructuredOutputManager (None until the first grammar request)."""
        return self.output_processor.structured

    def _structured_output(self):
        """The StructuredOutputManager, made on first use: the output processor advances its matchers,
        the runner asks it for each step's masks (its MaskProvider)."""
        processor = self.output_processor
        if processor.structured is None:
            from deepinfer_engine.structured_output.manager import StructuredOutputManager
            cfg = self.resolved
            processor.structured = StructuredOutputManager(
                processor.token_table().token_bytes, self.vocab_size, list(self.tokenizer.eos_token_ids), self.nextn,
                compile_timeout_s=cfg.structured_output_compile_timeout_s,
                cache_bytes=cfg.structured_output_cache_bytes, max_workers=cfg.structured_output_compile_threads)
            self.runner.set_mask_provider(processor.structured)
        return processor.structured

    def gauges(self) -> EngineGauges:
        """Occupancy and counters now (the server's metrics); drains the grammar compile log. `stats`
        is the live EngineStats (copy it to keep it)."""
        sched, structured = self.scheduler, self.output_processor.structured
        compiles = []
        while structured is not None and structured.compile_log:
            compiles.append(structured.compile_log.popleft())
        return EngineGauges(sched.num_running(), sched.num_waiting(), self.output_processor.num_held,
                            sched.config.num_blocks, sched.num_free_blocks(), sched.num_used_mtp_slots(),
                            self.stats, compiles,
                            {str(k): int(v) for k, v in sched.prefix_cache_stats().num_by_reason.items()})

    # ------------------------------------------------------------------ streaming
    def start_streaming(self, index_of: dict[int, int] | None = None) -> None:
        """Collect StreamDeltas from now on (`pop_stream_deltas` after each step); `index_of`: request
        id -> StreamDelta.index (more with `set_stream_indices`)."""
        self.output_processor.start_streaming(index_of)

    def set_stream_indices(self, index_of: dict[int, int]) -> None:
        """Request id -> StreamDelta.index of the requests streamed (replaces the map)."""
        self.output_processor.stream_index = dict(index_of)

    def pop_stream_deltas(self) -> list[StreamDelta]:
        """The StreamDeltas since the last call."""
        return self.output_processor.pop_stream_deltas()

    def stop_streaming(self) -> None:
        self.output_processor.stop_streaming()

    # ------------------------------------------------------------------ the loop
    def step(self) -> list[GenerationOutput]:
        """Run one step; returns the requests that finished in it. A step that raises fails the
        requests it ran (finish_reason "error") and the engine keeps serving (request_failure.py)."""
        return request_failure.guarded_step(self, self._step)

    def _step(self) -> list[GenerationOutput]:
        """One step, unguarded.

        Without ZOS: schedule(N) -> launch(N) -> collect(N) -> outputs(N).
        With ZOS: schedule(N+1) -> launch(N+1) (inputs fixed up on the device from N) ->
        collect(N) -> outputs(N): the host work of N overlaps the device work of N+1, outputs
        arrive one step late, and the last in-flight step is flushed when nothing is left.
        """
        processor = self.output_processor
        # requests aborted while their grammar compiled finish; compiled ones enter the scheduler
        finished = processor.finish_aborted_held() + processor.admit_compiled()
        finished += self._step_overlapped() if self.zos else self._step_synchronous()
        return finished

    def _step_synchronous(self) -> list[GenerationOutput]:
        if not self.scheduler.has_unfinished():
            return []
        scheduled = self._schedule()
        if scheduled.step_kind == StepKind.IDLE:
            res = StepResult.empty(scheduled.req_cnt)
        else:   # launch -> complete a deferred step at once -> collect
            res = self.runner.execute(scheduled, self._step_sampling_batch(scheduled))
        return self._process_outputs(scheduled, res)

    def _step_overlapped(self) -> list[GenerationOutput]:
        finished: list[GenerationOutput] = []
        launched = None
        if self.scheduler.has_unfinished():
            scheduled = self._schedule()                                         # N+1
            prev = self._inflight.device_state if self._inflight is not None else None
            batch = self._step_sampling_batch(scheduled)
            if batch.needs_masks and not self.runner.defers_masks(scheduled, batch):
                # A step with a structured-output request cannot sample ahead of the previous step's
                # ledger: its grammar masks need the matchers advanced by the in-flight step. Settle
                # it first (the ledger already handles schedule(N+1) before process(N)).
                finished += self._finish_inflight()
            step = None if scheduled.step_kind == StepKind.IDLE else self.runner.launch(scheduled, batch, prev)
            if isinstance(step, DeferredStep):   # the forward of N+1 runs while the ledger of N advances the matchers
                finished += self._finish_inflight()
                step = self.runner.complete(step)
            launched = InFlightStep(scheduled, step)
        finished += self._finish_inflight()                                      # collect(N) -> outputs(N)
        self._inflight = launched
        return finished

    def _finish_inflight(self) -> list[GenerationOutput]:
        """Collect the step in flight and process its outputs (nothing when none is in flight)."""
        inflight, self._inflight = self._inflight, None
        if inflight is None:
            return []
        return self._process_outputs(inflight.scheduled, self._collect(inflight.scheduled, inflight.launched))

    def _schedule(self) -> SchedulerOutput:
        out = self.scheduler.schedule()
        self._record_schedule(out)
        if self.runner.snapshots is not None:   # the step's restores: not evicted before its launch
            restores = np.asarray(out.restore_keys)[out.restore_tokens > 0]
            self.runner.snapshots.store.pinned.update(restores.tolist())
        return out

    def _step_sampling_batch(self, out: SchedulerOutput) -> SamplingBatch:
        return self._sampling_batch(out.request_ids, self.output_processor.has_grammar(out.request_ids))

    def _sampling_batch(self, request_ids: np.ndarray, needs_masks: bool) -> SamplingBatch:
        # A request can finish (ledger stop under ZOS, text stop, grammar end) after it was scheduled
        # for this step: it still has rows, whose results the ledger discards (pushes 0). Greedy.
        requests = self.output_processor.requests
        states = [requests.get(int(r), _FINISHED_PLACEHOLDER) for r in request_ids]
        host = SamplingHost(np.array([s.params.temperature for s in states], np.float32),
                            np.array([as_int64_bits(s.seed) for s in states], np.int64))
        temperature, top_k, top_p, seeds = arrays_to_device(
            [(host.temperature, torch.float32),
             (np.array([s.params.top_k for s in states], np.int32), torch.int32),
             (np.array([s.params.top_p for s in states], np.float32), torch.float32),
             (host.seeds, torch.int64)], self.device)
        return SamplingBatch(
            temperature=temperature, top_k=top_k, top_p=top_p, seeds=seeds,
            num_top_logprobs=[s.num_top_logprobs for s in states],
            all_greedy=all(s.params.is_greedy for s in states),
            filters=any(s.params.top_k != -1 or s.params.top_p < 1.0 for s in states),
            needs_masks=needs_masks, host=host,
            penalties=None if self.output_processor.penalties is None else self.output_processor.penalties.batch(
                request_ids, [s.params if s is not _FINISHED_PLACEHOLDER else None for s in states]),
        )

    def _collect(self, scheduled: SchedulerOutput, launched: LaunchedStep | None) -> StepResult:
        return StepResult.empty(scheduled.req_cnt) if launched is None else self.runner.collect(launched)

    def _process_outputs(self, out: SchedulerOutput, res: StepResult) -> list[GenerationOutput]:
        """The ledger half of a step: commit samples, build outputs, plan the next drafts, then the
        output processor's text level; returns the requests that finished."""
        if out.step_kind == StepKind.DECODE:
            self.budget.step_time.add(out.total_q, res.device_ms)
            if res.num_accepted is not None and self.nextn > 0:
                self.stats.record_speculation(res.num_accepted, out.seqlens_q - 1, self.nextn)
        pushed = self.scheduler.process_outputs(out, res.token_ids, res.verified_token_ids, None,
                                                out.first_token_pos)
        if self.runner.snapshots is not None:   # the SWA snapshots of the points this step committed past
            self.runner.snapshots.confirm(out)
        handles = self.scheduler.build_request_outputs(out, pushed, self.pool, res.token_logprobs,
                                                       res.verified_logprobs, out.first_token_pos)
        if res.confidence is not None:  # how many drafts each request verifies next
            live = pushed > 0
            if live.any():
                self.scheduler.set_num_drafts(out.request_ids[live], self.budget.plan(res.confidence[live]))
        if self._handles_to_release is not None:  # the previous step's outputs: consumed by now
            self.pool.release(self._handles_to_release)
        self._handles_to_release = handles
        return self.output_processor.consume(out.request_ids, res, self.pool.gather(handles))

    def _record_schedule(self, out: SchedulerOutput) -> None:
        self.stats.num_steps += 1
        self.stats.num_preemptions += len(out.preempted_request_ids)
        if out.step_kind == StepKind.PREFILL:
            # a request's first prefill chunk: what the prefix cache served it is counted once
            requests = self.output_processor.requests
            first = np.array([_starts_prefill(requests.get(int(r))) for r in out.request_ids], dtype=bool)
            self.stats.record_prefill(out.num_computed_tokens, out.seqlens_q, first)
            for rid, cached in zip(out.request_ids[first].tolist(), out.num_computed_tokens[first].tolist()):
                if rid in requests:   # prompt tokens served from the prefix cache (usage)
                    requests[rid].output.num_cached_tokens = cached
        elif out.step_kind == StepKind.DECODE:
            self.stats.num_decode_steps += 1


def _starts_prefill(state: RequestState | None) -> bool:
    """True the first time a request is scheduled for prefill (marks it); a finished request: True."""
    if state is None:
        return True
    first, state.prefill_started = not state.prefill_started, True
    return first
