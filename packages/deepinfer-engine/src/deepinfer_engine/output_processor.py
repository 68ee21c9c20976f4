"""The output half of the engine: the ledger's pooled RequestOutputs -> per-request outputs.

Token-level facts (tokens, logprobs, EOS / max_tokens / stop ids) come from the C++ ledger; the
text level is decided here: the incremental detokenizer, stop strings, structured-output
matchers (advance, roll back rejected drafts, admit requests once their grammar compiled) and
streaming deltas. The engine holds one `OutputProcessor`:

    add_request(state, token_ids)    a request's bookkeeping; it enters the scheduler now, or once
                                     its grammar compiled (`admit_compiled`, each step)
    consume(request_ids, res, cols)  one step's pooled outputs -> the requests that finished in it
                                     (+ stream deltas while streaming: `pop_stream_deltas`)

It talks to the scheduler only to admit requests and to abort those it finishes itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from deepinfer_engine import request_failure
from deepinfer_engine.outputs import GenerationOutput, StreamDelta
from deepinfer_engine.request_state import FINISH_REASON_ERROR, RequestState
from deepinfer_engine.runner_step import StepResult
from deepinfer_sched import FinishReason, RequestParams, Scheduler

if TYPE_CHECKING:
    from deepinfer_engine.detokenizer import TokenTable
    from deepinfer_engine.request_validation import CheckedPrompt
    from deepinfer_engine.structured_output.manager import StructuredOutputManager

# The ledger's finish codes (RequestOutputPool.gather's int8 column) as user-facing strings.
FINISH_REASONS = {int(r): (None if r == FinishReason.NONE else r.name.lower())
                  for r in FinishReason.__members__.values()}
# Finish reasons whose output carries no generated token.
NON_TOKEN_FINISHES = ("prompt_length_exceeded", "abort")


class OutputProcessor:
    def __init__(self, scheduler: Scheduler, tokenizer, model, vocab_size: int, stats):
        self.scheduler = scheduler
        self.tokenizer = tokenizer          # None: a model without one (token ids only, no text)
        self.model = model                  # prompt logprobs run a forward of their own
        self.vocab_size = vocab_size
        self.stats = stats                  # EngineStats: generated / accepted token counters
        self.requests: dict[int, RequestState] = {}    # live requests by id (finished ones leave)
        self.structured: StructuredOutputManager | None = None   # set on the first grammar request
        self._token_table: TokenTable | None = None
        self._held: dict[int, CheckedPrompt] = {}      # request id -> prompt, waiting for a grammar
        self._aborted_held: list[int] = []             # aborted while held: finish ("abort") next step
        self.penalties = None                          # PenaltyTable, made on the first request with penalties
        self._finished_here: set[int] = set()          # aborted in the ledger after a Python-side finish
        self._stream_deltas: list[StreamDelta] | None = None  # collected only while streaming
        self.stream_index: dict[int, int] = {}         # request id -> StreamDelta.index (input position)

    # ------------------------------------------------------------------ requests
    def token_table(self) -> TokenTable:
        """The tokenizer's byte table (built once, on first use)."""
        if self._token_table is None:
            from deepinfer_engine.detokenizer import TokenTable
            self._token_table = TokenTable.from_tokenizer(self.tokenizer, self.vocab_size)
        return self._token_table

    def new_detokenizer(self):
        from deepinfer_engine.detokenizer import make_detokenizer
        return make_detokenizer(self.tokenizer, self.token_table())

    def add_request(self, state: RequestState, prompt: CheckedPrompt) -> None:
        """Track `state`; a request with structured output waits (held) until its grammar compiles,
        any other enters the scheduler now. `self.structured` is set before a grammar request comes."""
        rid = state.request_id
        self.requests[rid] = state
        if state.params.structured_output is not None:
            self.structured.submit(rid, state.params.structured_output)
            self._held[rid] = prompt
        else:
            self._admit(rid, prompt)

    def _admit(self, request_id: int, prompt: CheckedPrompt) -> None:
        params = self.requests[request_id].params
        if params.has_penalties:   # device rows of token counts (penalties.py), made on first use
            if self.penalties is None:
                from deepinfer_engine.penalties import PenaltyTable
                self.penalties = PenaltyTable(self.vocab_size, self.model.device)
            self.penalties.assign(request_id, prompt.token_ids)
        self.scheduler.add_request(request_id, prompt.token_array, RequestParams(
            max_tokens=params.max_tokens, min_tokens=params.min_tokens,
            stop_token_ids=tuple(params.stop_token_ids), ignore_eos=params.ignore_eos))

    @property
    def has_held(self) -> bool:
        """Some request waits for its grammar to compile (not in the scheduler yet), or was aborted
        while it waited and has not been reported yet."""
        return bool(self._held) or bool(self._aborted_held)

    @property
    def num_held(self) -> int:
        """Requests waiting for their grammar to compile."""
        return len(self._held)

    def is_held(self, request_id: int) -> bool:
        """The request waits for its grammar to compile."""
        return request_id in self._held

    def abort_held(self, request_id: int) -> bool:
        """Abort a request still waiting for its grammar: it never enters the scheduler and finishes
        with "abort" in the next step (`finish_aborted_held`). False if it is not held."""
        if request_id not in self._held:
            return False
        del self._held[request_id]
        self.structured.drop(request_id)
        self._aborted_held.append(request_id)
        return True

    def finish_aborted_held(self) -> list[GenerationOutput]:
        """Requests aborted while their grammar compiled: finished here, never scheduled."""
        outs = []
        for rid in self._aborted_held:
            state = self.requests.pop(rid)
            state.output.finish_reason = "abort"
            self._emit_delta(state, finished=True)
            outs.append(state.output)
        self._aborted_held = []
        return outs

    def admit_compiled(self) -> list[GenerationOutput]:
        """Requests whose grammar finished compiling enter the scheduler; failed ones finish with an
        error. When nothing else can run, waits briefly for a compilation instead of spinning."""
        if not self._held:
            return []
        idle = not self.scheduler.has_unfinished()
        ready, failed = self.structured.poll(wait_s=0.05 if idle else 0.0)
        for rid in ready:
            self._admit(rid, self._held.pop(rid))
        outs = []
        for rid, message in failed:
            self._held.pop(rid, None)
            state = self.requests.pop(rid)
            out = state.output
            out.finish_reason, out.error = FINISH_REASON_ERROR, f"structured_output: {message}"
            self._emit_delta(state, finished=True)
            outs.append(out)
        return outs

    def has_grammar(self, request_ids: np.ndarray) -> bool:
        """Some request of the step is grammar-constrained (structured output)."""
        grammars = self.structured.grammars if self.structured is not None else ()
        return bool(grammars) and any(int(r) in grammars for r in request_ids)

    # ------------------------------------------------------------------ failures (request_failure.py)
    def discard_request(self, request_id: int) -> None:
        """Remove every piece of state a request has, wherever it got to. Idempotent."""
        self.requests.pop(request_id, None)
        self._held.pop(request_id, None)
        if self.penalties is not None:
            self.penalties.release(request_id)
        if self.structured is not None:
            self.structured.drop(request_id)
        try:
            if self.scheduler.abort_request(request_id):
                self._finished_here.add(request_id)   # its "abort" echo next step is dropped
        except Exception:  # noqa: BLE001 - never admitted: nothing to abort
            pass

    def fail_request(self, request_id: int, message: str) -> GenerationOutput:
        """Finish one live request with `finish_reason == "error"` (error "request: <message>") and
        remove its state."""
        message = f"request: {message}"
        state = self.requests.get(request_id)
        self.discard_request(request_id)
        if state is None:
            return GenerationOutput(request_id, None, [], finish_reason=FINISH_REASON_ERROR, error=message)
        out = state.output
        out.finish_reason, out.error = FINISH_REASON_ERROR, message
        if state.detokenizer is not None:
            try:
                out.text = state.final_text()
            except Exception:  # noqa: BLE001 - the text is a courtesy; the error is the output
                out.text = None
        self._emit_delta(state, finished=True)
        return out

    # ------------------------------------------------------------------ one step's outputs
    def consume(self, request_ids: np.ndarray, res: StepResult, cols: dict[str, np.ndarray]) -> list[GenerationOutput]:
        """Pooled RequestOutputs -> per-request outputs. Token-level facts come from the ledger; the
        text level is decided here, per request, over the tokens the step emitted: the grammar
        advances (rolling back rejected drafts), the detokenizer and stop strings run token by
        token (a stop string cuts ids, logprobs and text at the token that completes it, even
        inside an accepted draft block), and a request finished on this side is aborted in the
        ledger (its "abort" echo next step is dropped). request_ids [req_cnt]: the step's, in the
        order of `res`; cols: `RequestOutputPool.gather`'s columns."""
        index_of = {int(r): i for i, r in enumerate(request_ids)}
        emitted: dict[int, int] = {}
        ledger_finish: dict[int, tuple[str | None, int]] = {}
        first_new: dict[int, int] = {}
        order: list[int] = []
        # plain Python lists: one conversion per column instead of a numpy scalar per element
        request_col, reason_col, finished_col = (cols["request_id"].tolist(), cols["finish_reason"].tolist(),
                                                 cols["finished"].tolist())
        token_col, logprob_col = cols["token_id"].tolist(), cols["token_logprob"].tolist()
        draft_col, accept_col, stop_col = (cols["draft_tok"].tolist(), cols["accept_tok"].tolist(),
                                           cols["stop_token_id"].tolist())
        generated = accepted = 0
        for j, rid in enumerate(request_col):
            state = self.requests.get(rid)
            if state is None:
                if rid in self._finished_here:  # the ledger's echo of a request finished on this side
                    self._finished_here.discard(rid)
                    continue
                raise KeyError(f"request {rid}: output for an unknown request")
            if rid not in first_new:
                first_new[rid] = len(state.output.token_ids)
                order.append(rid)
            reason = FINISH_REASONS[reason_col[j]]
            if reason not in NON_TOKEN_FINISHES:
                k = emitted.get(rid, 0)
                emitted[rid] = k + 1
                top_rows = res.top_logprobs[index_of[rid]] if rid in index_of else None
                generated += 1
                if draft_col[j] > 0:  # step statistics ride on the request's last output of a decode step
                    state.output.num_draft_tokens += draft_col[j] - 1
                    state.output.num_accepted_tokens += accept_col[j] - 1
                    accepted += accept_col[j] - 1
                state.append(token_col[j], logprob_col[j], top_rows[k] if top_rows and k < len(top_rows) else None)
            if finished_col[j]:
                ledger_finish[rid] = (reason, stop_col[j])
        self.stats.num_generated_tokens += generated
        self.stats.num_accepted_tokens += accepted
        finished: list[GenerationOutput] = []
        for rid in order:
            try:
                out = self._advance_output(self.requests[rid], first_new[rid], ledger_finish.get(rid))
            except Exception as err:  # noqa: BLE001 - one request's failure is its own output
                out = self.fail_request(rid, f"output processing failed: {request_failure.describe(err)}")
            if out is not None:
                finished.append(out)
        return finished

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
        if self.structured is not None and rid in self.structured.grammars:
            from deepinfer_engine.structured_output.matcher import GrammarStateError
            try:
                grammar = self.structured.commit(rid, out.token_ids[first_new:])
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
        del self.requests[rid]
        if self.penalties is not None:
            self.penalties.release(rid)
        if self.structured is not None:
            self.structured.drop(rid)
        self._emit_delta(state, finished=True)
        return out

    # ------------------------------------------------------------------ streaming
    def _emit_delta(self, state: RequestState, finished: bool) -> None:
        if self._stream_deltas is None:
            return
        out = state.output
        if finished:
            text = out.text or ""
            new_text, shown = (text[state.text_sent:] if len(text) > state.text_sent else ""), len(text)
        else:
            new_text, shown = state.visible_text_since(state.text_sent)
        new_tokens = out.token_ids[state.tokens_sent:]
        state.text_sent = max(state.text_sent, shown)
        state.tokens_sent = len(out.token_ids)
        if new_text or new_tokens or finished:
            self._stream_deltas.append(StreamDelta(self.stream_index.get(state.request_id, -1), state.request_id,
                                                   new_text, list(new_tokens), finished, out))

    def start_streaming(self, index_of: dict[int, int] | None = None) -> None:
        self._stream_deltas = []
        self.stream_index = dict(index_of or {})

    def pop_stream_deltas(self) -> list[StreamDelta]:
        deltas, self._stream_deltas = self._stream_deltas or [], []
        return deltas

    def stop_streaming(self) -> None:
        self._stream_deltas = None
        self.stream_index = {}
