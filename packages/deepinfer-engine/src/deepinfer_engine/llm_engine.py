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

from deepinfer_engine.config import EngineConfig
from deepinfer_engine.envs import Envs
from deepinfer_engine.errors import InvalidRequestError
from deepinfer_engine.kv_sizing import num_kv_blocks
from deepinfer_engine.model_loader import load_model, resolve_device
from deepinfer_engine.model_runner import ModelRunner, StepResult
from deepinfer_engine.outputs import GenerationOutput, StreamDelta
from deepinfer_engine.request_state import FINISH_REASON_ERROR, RequestState
from deepinfer_engine.sampler import SamplingBatch
from deepinfer_engine.sampling_params import UINT64_MAX, SamplingParams
from deepinfer_engine.speculation import acceptance_by_position
from deepinfer_engine.stats import EngineStats
from deepinfer_engine.stop_strings import StopStringMatcher
from deepinfer_engine.verify_budget import VerifyBudgetPolicy
from deepinfer_sched import (
    FinishReason,
    RequestOutputPool,
    RequestParams,
    Scheduler,
    SchedulerConfig,
    StepKind,
)

logger = logging.getLogger("deepinfer")

# The ledger's finish codes (RequestOutputPool.gather's int8 column) as user-facing strings.
FINISH_REASONS = {int(r): (None if r == FinishReason.NONE else r.name.lower())
                  for r in FinishReason.__members__.values()}
# Finish reasons whose output carries no generated token.
NON_TOKEN_FINISHES = ("prompt_length_exceeded", "abort")


_FINISHED_PLACEHOLDER = RequestState(-1, SamplingParams(temperature=0), 0, GenerationOutput(-1, None, []))


def _as_int64_bits(seed: int) -> int:
    """uint64 seed -> the int64 with the same bits (what the sampling kernels take)."""
    return seed - (1 << 64) if seed >= (1 << 63) else seed


class LLMEngine:
    def __init__(self, config: EngineConfig):
        config.validate()
        self.config = config
        self.envs = Envs.from_environ()
        self.device = resolve_device(config.device)
        loaded = load_model(config.model, self.device, config.random_init_seed, config.dtype)
        self.model, self.tokenizer, self.model_source = loaded.model, loaded.tokenizer, loaded.source
        mcfg = self.model.config
        self.vocab_size = mcfg.vocab_size
        self.max_model_len = min(config.max_model_len or mcfg.max_position_embeddings, mcfg.max_position_embeddings)
        # YOCO: the last prefill chunk must hold the decoder bounded-replay tokens (docs/model.md).
        min_final_chunk = mcfg.sliding_window if mcfg.topology.yoco_enabled else 1
        if config.max_num_batched_tokens < min_final_chunk:
            raise ValueError(f"max_num_batched_tokens: must be >= {min_final_chunk} (the model's decoder "
                             f"bounded-replay length), got {config.max_num_batched_tokens}")
        requested = self.envs.use_nextn_decode if config.num_speculative_tokens is None else config.num_speculative_tokens
        self.nextn = min(requested, mcfg.nextn)  # a model without a draft head cannot speculate
        varlen = self.envs.enable_mtp_varlen if config.enable_mtp_varlen is None else config.enable_mtp_varlen
        self.budget = VerifyBudgetPolicy(self.nextn, varlen)
        blocks = num_kv_blocks(self.model, config, self.max_model_len)
        self.scheduler = Scheduler(SchedulerConfig(
            block_size=config.block_size, num_blocks=blocks, max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens, max_model_len=self.max_model_len,
            nextn=self.nextn, min_final_chunk_tokens=min_final_chunk,
            enable_prefix_caching=config.enable_prefix_caching, eos_token_ids=loaded.eos_token_ids))
        self.runner = ModelRunner(self.model, blocks, config.block_size, config.max_num_seqs, self.nextn)
        if config.cuda_graphs and self.device.type == "cuda":
            max_rows = min(config.max_num_batched_tokens, config.max_num_seqs * (self.nextn + 1))
            self.runner.enable_cuda_graphs(max_rows, self.max_model_len, self.envs.cudagraph_batch_size_interval)
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
                if not isinstance(t, (int, np.integer)) or not (0 <= int(t) < self.vocab_size):
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
        that fails to compile or times out finishes that request alone with finish_reason "error"."""
        params = params or SamplingParams()
        token_ids = self.validate_request(prompt, prompt_token_ids, params)
        request_id = self._next_request_id
        self._next_request_id += 1
        seed = params.seed if params.seed is not None else int(self._seed_rng.integers(0, UINT64_MAX, dtype=np.uint64))
        out = GenerationOutput(request_id=request_id, prompt=prompt, prompt_token_ids=token_ids)
        state = RequestState(request_id, params, seed, out)
        if self.tokenizer is not None:
            state.detokenizer = self._new_detokenizer()
            state.stops = StopStringMatcher(params.stop) if params.stop else None
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
    def _sampling_batch(self, request_ids: np.ndarray) -> SamplingBatch:
        # A request can finish (ledger stop under ZOS, text stop, grammar end) after it was scheduled
        # for this step: it still has rows, whose results the ledger discards (pushes 0). Greedy.
        states = [self._requests.get(int(r), _FINISHED_PLACEHOLDER) for r in request_ids]
        dev = self.device
        return SamplingBatch(
            temperature=torch.tensor([s.params.temperature for s in states], dtype=torch.float32, device=dev),
            top_k=torch.tensor([s.params.top_k for s in states], dtype=torch.int32, device=dev),
            top_p=torch.tensor([s.params.top_p for s in states], dtype=torch.float32, device=dev),
            seeds=torch.tensor([_as_int64_bits(s.seed) for s in states], dtype=torch.int64, device=dev),
            num_top_logprobs=[s.num_top_logprobs for s in states],
            all_greedy=all(s.params.is_greedy for s in states),
        )

    def step(self) -> list[GenerationOutput]:
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
                    out, self._sampling_batch(out.request_ids))
                finished += self._finish_step(out, res)
            return finished
        launched = None
        if self.scheduler.has_unfinished():
            out = self._schedule()
            prev_state = None if self._inflight is None or self._inflight[1] is None else self._inflight[1].state
            if self._needs_synchronous_step(out):
                # Grammar masks of this step need the matchers advanced by the in-flight step:
                # settle it first (the ledger already handles schedule(N+1) before process(N)).
                finished += self._finish_inflight()
            handle = None if out.step_kind == StepKind.IDLE else self.runner.launch(
                out, self._sampling_batch(out.request_ids), prev_state)
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

    def _needs_synchronous_step(self, out) -> bool:
        """A step with a structured-output request cannot run ahead of the previous step's ledger."""
        grammars = self._structured.grammars if self._structured is not None else ()
        return bool(grammars) and any(int(r) in grammars for r in out.request_ids)

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

    def _consume(self, request_ids: np.ndarray, res: StepResult, cols: dict[str, np.ndarray]) -> list[GenerationOutput]:
        """Pooled RequestOutputs -> per-request outputs. Token-level facts come from the ledger; the
        text level is decided here, per request, over the tokens the step emitted: the grammar
        advances (rolling back rejected drafts), the detokenizer and stop strings run token by
        token (a stop string cuts ids, logprobs and text at the token that completes it, even
        inside an accepted draft block), and a request finished on this side is aborted in the
        ledger (its "abort" echo next step is dropped)."""
        index_of = {int(r): i for i, r in enumerate(request_ids)}
        emitted: dict[int, int] = {}
        ledger_finish: dict[int, tuple[str | None, int]] = {}
        first_new: dict[int, int] = {}
        order: list[int] = []
        for j in range(len(cols["request_id"])):
            rid = int(cols["request_id"][j])
            state = self._requests.get(rid)
            if state is None:
                if rid in self._finished_here:  # the ledger's echo of a request finished on this side
                    self._finished_here.discard(rid)
                    continue
                raise KeyError(f"request {rid}: output for an unknown request")
            if rid not in first_new:
                first_new[rid] = len(state.output.token_ids)
                order.append(rid)
            reason = FINISH_REASONS[int(cols["finish_reason"][j])]
            if reason not in NON_TOKEN_FINISHES:
                k = emitted.get(rid, 0)
                emitted[rid] = k + 1
                top_rows = res.top_logprobs[index_of[rid]] if rid in index_of else None
                self.stats.num_generated_tokens += 1
                draft_tok = int(cols["draft_tok"][j])
                if draft_tok > 0:  # step statistics ride on the request's last output of a decode step
                    state.output.num_draft_tokens += draft_tok - 1
                    state.output.num_accepted_tokens += int(cols["accept_tok"][j]) - 1
                    self.stats.num_accepted_tokens += int(cols["accept_tok"][j]) - 1
                state.append(int(cols["token_id"][j]), float(cols["token_logprob"][j]),
                             top_rows[k] if top_rows and k < len(top_rows) else None)
            if bool(cols["finished"][j]):
                ledger_finish[rid] = (reason, int(cols["stop_token_id"][j]))
        finished: list[GenerationOutput] = []
        for rid in order:
            out = self._advance_output(self._requests[rid], first_new[rid], ledger_finish.get(rid))
            if out is not None:
                finished.append(out)
        return finished

    # ------------------------------------------------------------------ output path (issue 9)
    def _init_output_path(self) -> None:
        """State of the output path: grammar manager (created on the first grammar request), requests
        held while their grammar compiles, requests finished on the Python side, streaming deltas,
        and the batch-invariant forward (DEEPINFER_BATCH_INVARIANT=1)."""
        self._token_table = None
        self._structured = None
        self._held: dict[int, list[int]] = {}          # request id -> prompt ids, waiting for a grammar
        self._finished_here: set[int] = set()          # aborted in the ledger after a Python-side finish
        self._stream_deltas: list[StreamDelta] | None = None  # collected only while streaming
        self._stream_index: dict[int, int] = {}
        self.runner.mask_provider = None
        if self.envs.batch_invariant:
            from deepinfer_engine import batch_invariant
            batch_invariant.install(self.model)
            # The confidence-scheduled budget splits drafts across the batch, and a sampled request's
            # tokens depend on which drafts it verified (residual sampling): fixed draft counts.
            self.budget.varlen = False

    def _admit(self, request_id: int, token_ids: list[int]) -> None:
        params = self._requests[request_id].params
        self.scheduler.add_request(request_id, token_ids, RequestParams(
            max_tokens=params.max_tokens, min_tokens=params.min_tokens,
            stop_token_ids=tuple(params.stop_token_ids), ignore_eos=params.ignore_eos))

    def _new_detokenizer(self):
        from deepinfer_engine.detokenizer import TokenTable, make_detokenizer
        if self._token_table is None:
            self._token_table = TokenTable.from_tokenizer(self.tokenizer, self.vocab_size)
        return make_detokenizer(self.tokenizer, self._token_table)

    def _structured_output(self):
        if self._structured is None:
            from deepinfer_engine.detokenizer import TokenTable
            from deepinfer_engine.structured_output.manager import StructuredOutputManager
            if self._token_table is None:
                self._token_table = TokenTable.from_tokenizer(self.tokenizer, self.vocab_size)
            cfg = self.config
            self._structured = StructuredOutputManager(
                self._token_table.token_bytes, self.vocab_size, list(self.tokenizer.eos_token_ids), self.nextn,
                compile_timeout_s=cfg.structured_output_compile_timeout_s,
                cache_bytes=cfg.structured_output_cache_bytes, max_workers=cfg.structured_output_compile_threads)
            self.runner.mask_provider = self._structured.step_masks
        return self._structured

    def _admit_compiled(self) -> list[GenerationOutput]:
        """Requests whose grammar finished compiling enter the scheduler; failed ones finish with an
        error. When nothing else can run, waits briefly for a compilation instead of spinning."""
        if not self._held:
            return []
        idle = not self.scheduler.has_unfinished()
        ready, failed = self._structured.poll(wait_s=0.05 if idle else 0.0)
        for rid in ready:
            self._admit(rid, self._held.pop(rid))
        outs = []
        for rid, message in failed:
            self._held.pop(rid, None)
            state = self._requests.pop(rid)
            out = state.output
            out.finish_reason, out.error = FINISH_REASON_ERROR, f"structured_output: {message}"
            self._emit_delta(state, finished=True)
            outs.append(out)
        return outs

    def _advance_output(self, state: RequestState, first_new: int,
                        ledger_finish: tuple[str | None, int] | None) -> GenerationOutput | None:
        """Text-level processing of one request's new tokens; returns its output if it finished."""
        out, rid, params = state.output, state.request_id, state.params
        if params.prompt_logprobs is not None and out.prompt_logprobs is None:
            from deepinfer_engine.prompt_logprobs import compute_prompt_logprobs
            out.prompt_logprobs, out.prompt_top_logprobs = compute_prompt_logprobs(
                self.model, out.prompt_token_ids, params.prompt_logprobs)
        reason, stop_id = ledger_finish if ledger_finish is not None else (None, -1)
        error = None
        grammar = None
        if self._structured is not None and rid in self._structured.grammars:
            from deepinfer_engine.structured_output.matcher import GrammarStateError
            try:
                grammar = self._structured.commit(rid, out.token_ids[first_new:])
            except GrammarStateError as err:
                error = f"structured_output: {err}"
        keep = state.push_text(first_new)
        if keep is not None:  # a stop string: cut after the token that completed it
            self.stats.num_generated_tokens -= state.truncate(keep)
            reason, stop_id = "stop", -1
            out.stop_str = state.stop_match.stop
        elif error is not None:
            reason = FINISH_REASON_ERROR
        elif reason is None and grammar is not None and grammar.is_terminated:
            reason, stop_id = "stop", out.token_ids[-1]  # grammar complete and its stop token emitted
        if reason is None:
            self._emit_delta(state, finished=False)
            return None
        if ledger_finish is None:  # finished here, still live in the ledger: free it there now
            if self.scheduler.abort_request(rid):
                self._finished_here.add(rid)
        out.finish_reason = reason
        out.error = error
        out.stop_token_id = stop_id if stop_id is not None and stop_id >= 0 else None
        if state.detokenizer is not None:
            out.text = state.final_text()
        del self._requests[rid]
        self._prefill_started.discard(rid)
        if self._structured is not None:
            self._structured.drop(rid)
        self._emit_delta(state, finished=True)
        return out

    def _emit_delta(self, state: RequestState, finished: bool) -> None:
        if self._stream_deltas is None:
            return
        out = state.output
        text = (out.text or "") if finished else state.visible_text()
        new_text = text[state.text_sent:] if len(text) > state.text_sent else ""
        new_tokens = out.token_ids[state.tokens_sent:]
        state.text_sent = max(state.text_sent, len(text))
        state.tokens_sent = len(out.token_ids)
        if new_text or new_tokens or finished:
            self._stream_deltas.append(StreamDelta(self._stream_index.get(state.request_id, -1), state.request_id,
                                                   new_text, list(new_tokens), finished, out))

    def start_streaming(self, index_of: dict[int, int] | None = None) -> None:
        """Collect StreamDeltas from now on (`pop_stream_deltas` after each step)."""
        self._stream_deltas = []
        self._stream_index = dict(index_of or {})

    def pop_stream_deltas(self) -> list[StreamDelta]:
        deltas, self._stream_deltas = self._stream_deltas or [], []
        return deltas

    def stop_streaming(self) -> None:
        self._stream_deltas = None
        self._stream_index = {}
