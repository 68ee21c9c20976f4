"""LLMEngine: the engine loop. One step = schedule -> forward + sample -> ledger -> outputs.

    out = scheduler.schedule()                       # C++: admission, chunking, KV blocks
    res = runner.execute(out, sampling batch)        # device: forward + sampler
    pushed = scheduler.process_outputs(out, ...)     # C++ ledger: append tokens, stop checks
    handles = scheduler.build_request_outputs(...)   # C++: pooled RequestOutputs
    pool.gather(handles) -> per-request GenerationOutput; handles released one step later

A request with invalid input is rejected at add_request with InvalidRequestError naming the field;
nothing already accepted is affected.
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from deepinfer_engine import request_failure
from deepinfer_engine.config import EngineConfig
from deepinfer_engine.envs import Envs
from deepinfer_engine.errors import InvalidRequestError
from deepinfer_engine.host_copy import arrays_to_device
from deepinfer_engine.kernel_builds import describe_kernel_builds, kernel_build_seconds
from deepinfer_engine.kv_sizing import num_kv_blocks, profile_activation_bytes
from deepinfer_engine.model_loader import load_model, resolve_device
from deepinfer_engine.model_runner import ModelRunner, StepResult
from deepinfer_engine.output_path import OutputPath
from deepinfer_engine.outputs import GenerationOutput
from deepinfer_engine.request_state import RequestState
from deepinfer_engine.sampler import SamplingBatch, SamplingHost
from deepinfer_engine.sampling_params import UINT64_MAX, SamplingParams
from deepinfer_engine.speculation import acceptance_by_position
from deepinfer_engine.stats import EngineStats
from deepinfer_engine.stop_strings import make_stop_matcher
from deepinfer_engine.verify_budget import VerifyBudgetPolicy
from deepinfer_sched import (
    RequestOutputPool,
    Scheduler,
    SchedulerConfig,
    StepKind,
)

logger = logging.getLogger("deepinfer")

_FINISHED_PLACEHOLDER = RequestState(-1, SamplingParams(temperature=0), 0, GenerationOutput(-1, None, []))


def _as_int64_bits(seed: int) -> int:
    """uint64 seed -> the int64 with the same bits (what the sampling kernels take)."""
    return seed - (1 << 64) if seed >= (1 << 63) else seed


class LLMEngine(OutputPath):
    def __init__(self, config: EngineConfig):
        config.validate()
        self.config = config
        kernel_builds_before = kernel_build_seconds()
        self.envs = Envs.from_environ()
        self.device = resolve_device(config.device)
        loaded = load_model(config.model, self.device, config.random_init_seed, config.dtype)
        self.model, self.tokenizer, self.model_source = loaded.model, loaded.tokenizer, loaded.source
        mcfg = self.model.config
        self.vocab_size = mcfg.vocab_size
        self.max_model_len = min(config.max_model_len or mcfg.max_position_embeddings, mcfg.max_position_embeddings)
        # YOCO: the last prefill chunk must hold the decoder bounded-replay tokens (docs/model.md).
        min_final_chunk = mcfg.sliding_window if mcfg.topology.yoco_enabled else 1
        self.max_num_batched_tokens = config.batched_tokens_for(self.device.type)
        if self.max_num_batched_tokens < min_final_chunk:
            raise ValueError(f"max_num_batched_tokens: must be >= {min_final_chunk} (the model's decoder "
                             f"bounded-replay length), got {self.max_num_batched_tokens}")
        requested = self.envs.use_nextn_decode if config.num_speculative_tokens is None else config.num_speculative_tokens
        self.nextn = min(requested, mcfg.nextn)  # a model without a draft head cannot speculate
        varlen = self.envs.enable_mtp_varlen if config.enable_mtp_varlen is None else config.enable_mtp_varlen
        self.budget = VerifyBudgetPolicy(self.nextn, varlen)
        activations = 0
        if self.device.type == "cuda" and config.num_kv_blocks is None:   # before the pool takes the memory
            activations = profile_activation_bytes(self.model, config.block_size, self.max_num_batched_tokens,
                                                   self.max_model_len)
        blocks = num_kv_blocks(self.model, config, self.max_model_len, activations)
        self.scheduler = Scheduler(SchedulerConfig(
            block_size=config.block_size, num_blocks=blocks, max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens, max_model_len=self.max_model_len,
            nextn=self.nextn, min_final_chunk_tokens=min_final_chunk,
            enable_prefix_caching=config.enable_prefix_caching, eos_token_ids=loaded.eos_token_ids))
        self.model.decode_streams = self.envs.decode_streams if config.decode_streams is None else config.decode_streams
        self.runner = ModelRunner(self.model, blocks, config.block_size, config.max_num_seqs, self.nextn)
        if config.cuda_graphs and self.device.type == "cuda":
            max_rows = min(self.max_num_batched_tokens, config.max_num_seqs * (self.nextn + 1))
            compile_decode = self.envs.compile_decode if config.compile_decode is None else config.compile_decode
            compile_spec = self.envs.compile_speculation if config.compile_speculation is None \
                else config.compile_speculation
            if compile_spec and self.runner.spec is not None and not compile_decode:
                if self.envs.batch_invariant:
                    logger.warning("compile_speculation is ignored with DEEPINFER_BATCH_INVARIANT=1")
                else:
                    self.runner.spec.compile()   # before the capture, whose warm-up runs compile
            self.runner.enable_cuda_graphs(max_rows, self.max_model_len, self.envs.cudagraph_batch_size_interval,
                                           compile=compile_decode)
        self.pool = RequestOutputPool()
        self._requests: dict[int, RequestState] = {}
        self._next_request_id = 0
        self._seed_rng = np.random.default_rng(config.seed)
        self._handles_to_release: np.ndarray | None = None
        self._prefill_started: set[int] = set()
        self.zos = self.envs.zero_overhead_scheduling if config.zero_overhead_scheduling is None \
            else config.zero_overhead_scheduling
        self._inflight: tuple | None = None  # (SchedulerOutput, InFlightStep | None) launched, not collected
        self.stats = EngineStats()
        self._init_output_path()  # issue 9: structured output, text stops, streaming, batch invariance
        logger.info("engine: model %s on %s, %d KV blocks of %d tokens, max_model_len %d", self.model_source,
                    self.device, blocks, config.block_size, self.max_model_len)
        builds = describe_kernel_builds(kernel_builds_before, kernel_build_seconds())
        if builds is not None:   # the GPU: the activation profile and the graph captures built the kernels
            logger.info(builds)

    # ------------------------------------------------------------------ requests
    def encode(self, prompt: str) -> list[int]:
        if self.tokenizer is None:
            raise InvalidRequestError("prompt", "this model has no tokenizer; pass prompt_token_ids")
        return self.tokenizer.encode(prompt)

    def validate_request(self, prompt: str | None, prompt_token_ids: list[int] | None,
                         params: SamplingParams) -> list[int]:
        """Token ids of a valid request; raises InvalidRequestError naming the field and the limit."""
        if prompt_token_ids is None:
            if not isinstance(prompt, str) or not prompt:
                raise InvalidRequestError("prompt", "must be a non-empty string")
            prompt_token_ids = self.encode(prompt)
            if not prompt_token_ids:
                raise InvalidRequestError("prompt", "encodes to zero tokens")
        else:
            prompt_token_ids = list(prompt_token_ids)
            if not prompt_token_ids:
                raise InvalidRequestError("prompt_token_ids", "must contain at least 1 token")
            for i, t in enumerate(prompt_token_ids):
                if not isinstance(t, (int, np.integer)) or isinstance(t, bool) or not (0 <= int(t) < self.vocab_size):
                    raise InvalidRequestError(
                        "prompt_token_ids", f"token id {t!r} at index {i} is outside the vocabulary [0, {self.vocab_size})")
            prompt_token_ids = [int(t) for t in prompt_token_ids]
        if not isinstance(params, SamplingParams):
            raise InvalidRequestError("sampling_params", f"expected SamplingParams, got {type(params).__name__}")
        params.validate(self.vocab_size)
        if (params.structured_output is not None or params.stop) and self.tokenizer is None:
            field = "structured_output" if params.structured_output is not None else "stop"
            raise InvalidRequestError(field, "needs a model with a tokenizer (text-level constraint)")
        return prompt_token_ids

    def add_request(self, prompt: str | None = None, prompt_token_ids: list[int] | None = None,
                    params: SamplingParams | None = None) -> int:
        """Validate and queue a request. A request with structured output is held on the Python side
        until its grammar compiles (off the engine loop) and only then enters the scheduler; a grammar
        that fails to compile or times out finishes that request alone with finish_reason "error".
        Raises InvalidRequestError (bad input) or RequestFailedError; either leaves no state behind."""
        return request_failure.guarded_add(self, self._add_request, prompt, prompt_token_ids, params)

    def _add_request(self, prompt: str | None, prompt_token_ids: list[int] | None,
                     params: SamplingParams | None) -> int:
        params = params or SamplingParams()
        token_ids = self.validate_request(prompt, prompt_token_ids, params)
        request_id = self._next_request_id
        self._next_request_id += 1
        seed = params.seed if params.seed is not None else int(self._seed_rng.integers(0, UINT64_MAX, dtype=np.uint64))
        out = GenerationOutput(request_id=request_id, prompt=prompt, prompt_token_ids=token_ids)
        state = RequestState(request_id, params, seed, out)
        if self.tokenizer is not None:
            state.detokenizer = self._new_detokenizer()
            state.stops = make_stop_matcher(params, prompt, token_ids, self.tokenizer)
        self._requests[request_id] = state
        if params.structured_output is not None:
            self._structured_output().submit(request_id, params.structured_output)
            self._held[request_id] = token_ids
        else:
            self._admit(request_id, token_ids)
        return request_id

    def abort_request(self, request_id: int) -> bool:
        return self.scheduler.abort_request(request_id)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished() or self._inflight is not None or bool(self._held)

    # ------------------------------------------------------------------ the loop
    def _sampling_batch(self, request_ids: np.ndarray, needs_masks: bool) -> SamplingBatch:
        # A request can finish (ledger stop under ZOS, text stop, grammar end) after it was scheduled
        # for this step: it still has rows, whose results the ledger discards (pushes 0). Greedy.
        states = [self._requests.get(int(r), _FINISHED_PLACEHOLDER) for r in request_ids]
        host = SamplingHost(np.array([s.params.temperature for s in states], np.float32),
                            np.array([_as_int64_bits(s.seed) for s in states], np.int64))
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
        )

    def step(self) -> list[GenerationOutput]:
        """Run one step; returns the requests that finished in it. A step that raises fails the
        requests it ran (finish_reason "error") and the engine keeps serving (request_failure.py)."""
        return request_failure.guarded_step(self, self._step)

    def _step(self) -> list[GenerationOutput]:
        """Run one step; returns the requests that finished in it.

        Without ZOS: schedule(N) -> launch(N) -> collect(N) -> ledger(N).
        With ZOS: schedule(N+1) -> launch(N+1) (inputs fixed up on the device from N) ->
        collect(N) -> ledger(N): the host work of N overlaps the device work of N+1, outputs
        arrive one step late, and the last in-flight step is flushed when nothing is left.
        """
        finished = self._admit_compiled()  # requests whose grammar compiled enter the scheduler
        if not self.zos:
            if self.scheduler.has_unfinished():
                out = self._schedule()
                res = StepResult.empty(out.req_cnt) if out.step_kind == StepKind.IDLE else self.runner.execute(
                    out, self._sampling_batch(out.request_ids, self._has_grammar(out.request_ids)))
                finished += self._finish_step(out, res)
            return finished
        launched = None
        if self.scheduler.has_unfinished():
            out = self._schedule()
            prev_state = None if self._inflight is None or self._inflight[1] is None else self._inflight[1].state
            constrained = self._has_grammar(out.request_ids)
            batch = self._sampling_batch(out.request_ids, constrained)
            deferred = constrained and self.runner.defers_masks(out, batch)
            if constrained and not deferred:
                # A step with a structured-output request cannot sample ahead of the previous step's
                # ledger: its grammar masks need the matchers advanced by the in-flight step. Settle
                # it first (the ledger already handles schedule(N+1) before process(N)).
                finished += self._finish_inflight()
            handle = None if out.step_kind == StepKind.IDLE else self.runner.launch(out, batch, prev_state)
            if deferred:   # the forward of N+1 runs while the ledger of N advances the matchers
                finished += self._finish_inflight()
                handle = self.runner.complete(handle)
            launched = (out, handle)
        finished += self._finish_inflight()
        self._inflight = launched
        return finished

    def _finish_inflight(self) -> list[GenerationOutput]:
        prev, self._inflight = self._inflight, None
        if prev is None:
            return []
        out, handle = prev
        return self._finish_step(out, StepResult.empty(out.req_cnt) if handle is None else self.runner.collect(handle))

    def _has_grammar(self, request_ids) -> bool:
        """Some request of the step is grammar-constrained (structured output)."""
        grammars = self._structured.grammars if self._structured is not None else ()
        return bool(grammars) and any(int(r) in grammars for r in request_ids)

    def _schedule(self):
        out = self.scheduler.schedule()
        self._record(out)
        return out

    def _finish_step(self, out, res: StepResult) -> list[GenerationOutput]:
        """The ledger half of a step: commit samples, build outputs, plan the next drafts."""
        if out.step_kind == StepKind.DECODE:
            self.budget.step_time.add(out.total_q, res.device_ms)
            self._record_speculation(out, res)
        pushed = self.scheduler.process_outputs(out, res.token_ids, res.verified_token_ids, None,
                                                out.first_token_pos)
        handles = self.scheduler.build_request_outputs(out, pushed, self.pool, res.token_logprobs,
                                                       res.verified_logprobs, out.first_token_pos)
        if res.confidence is not None:  # how many drafts each request verifies next
            live = pushed > 0
            if live.any():
                self.scheduler.set_num_drafts(out.request_ids[live], self.budget.plan(res.confidence[live]))
        if self._handles_to_release is not None:  # the previous step's outputs: consumed by now
            self.pool.release(self._handles_to_release)
        self._handles_to_release = handles
        return self._consume(out.request_ids, res, self.pool.gather(handles))

    def _record(self, out) -> None:
        self.stats.num_steps += 1
        if out.step_kind == StepKind.PREFILL:
            first = np.array([int(r) not in self._prefill_started for r in out.request_ids], dtype=bool)
            self._prefill_started.update(int(r) for r in out.request_ids)
            self.stats.record_prefill(out.num_computed_tokens, out.seqlens_q, first)
        elif out.step_kind == StepKind.DECODE:
            self.stats.num_decode_steps += 1

    def _record_speculation(self, out, res: StepResult) -> None:
        if res.num_accepted is None or self.nextn == 0:
            return
        drafts = out.seqlens_q - 1
        verified, accepted = acceptance_by_position(res.num_accepted, drafts, self.nextn)
        st = self.stats
        if not st.verified_per_position:
            st.verified_per_position, st.accepted_per_position = [0] * self.nextn, [0] * self.nextn
        st.verified_per_position = [a + int(b) for a, b in zip(st.verified_per_position, verified)]
        st.accepted_per_position = [a + int(b) for a, b in zip(st.accepted_per_position, accepted)]
        st.num_draft_tokens += int(drafts.sum())
        st.num_decode_request_steps += out.req_cnt
