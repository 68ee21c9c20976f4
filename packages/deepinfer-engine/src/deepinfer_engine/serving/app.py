"""The OpenAI-compatible HTTP app (FastAPI): /v1/completions, /v1/chat/completions, /v1/models,
/health, /metrics.

A request's path:

    body -> json -> pydantic (strict) -> prompt ids (chat template / plain encoding) -> limits
    -> one AsyncLLM stream per choice (n) -> wait for each choice's first delta
    -> an error there (invalid grammar, ...) is still a 4xx; otherwise 200 (JSON, or SSE chunks)

The first delta is awaited before any byte is sent, so a request that fails at its start (a
schema xgrammar cannot compile) gets a 4xx envelope, not a broken stream. A client that goes
away (stream closed, connection dropped) aborts its requests in the engine.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Protocol

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from deepinfer_engine.errors import InvalidRequestError
from deepinfer_engine.sampling_params import UINT64_MAX, SamplingParams
from deepinfer_engine.serving import openai_format as fmt
from deepinfer_engine.serving.async_llm import AsyncLLM, RequestStream
from deepinfer_engine.serving.chat_template import ChatRenderer, ChatTemplateError, PlainEncoder
from deepinfer_engine.serving.errors import APIError, from_invalid_request, from_validation_error
from deepinfer_engine.serving.metrics import ServingMetrics
from deepinfer_engine.serving.protocol import ChatCompletionRequest, CompletionRequest, SamplingFields
from deepinfer_engine.structured_output.spec import StructuredOutput

MAX_BODY_BYTES = 8 << 20
DISCONNECT_POLL_S = 0.25


class EngineHandle(Protocol):
    """What the app asks of the engine: AsyncLLM in-process, serving.api_worker.EngineClient in an
    API worker process."""

    def add_request(self, prompt: str | None, prompt_token_ids: list[int] | None,
                    params: SamplingParams) -> RequestStream: ...
    def is_healthy(self) -> tuple[bool, str]: ...


class MetricsEndpoint(Protocol):
    """ServingMetrics in-process; the engine process's metrics through the link in a worker."""

    async def scrape(self) -> bytes: ...
    def count_http_error(self, status: int) -> None: ...


@dataclass
class ServerState:
    llm: EngineHandle
    model_name: str
    encoder: PlainEncoder | None       # None: the model has no tokenizer (token-id prompts only)
    renderer: ChatRenderer | None
    tokens: fmt.TokenStrings
    metrics: MetricsEndpoint
    max_model_len: int
    vocab_size: int
    default_max_tokens: int = 256


def build_app(state: ServerState) -> FastAPI:
    app = FastAPI(title="DeepInfer", docs_url=None, redoc_url=None)

    @app.exception_handler(APIError)
    async def _api_error(_: Request, err: APIError):
        state.metrics.count_http_error(err.status)
        return JSONResponse(err.body(), status_code=err.status)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, err: StarletteHTTPException):
        state.metrics.count_http_error(err.status_code)
        kind = "not_found_error" if err.status_code == 404 else "invalid_request_error"
        return JSONResponse(APIError(str(err.detail), None, err.status_code, kind).body(), status_code=err.status_code)

    @app.get("/health")
    async def health():
        ok, why = state.llm.is_healthy()
        if ok:
            return {"status": "ok"}
        return JSONResponse({"status": "unhealthy", "reason": why}, status_code=503)

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(await state.metrics.scrape(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": state.model_name, "object": "model", "created": 0,
                                            "owned_by": "deepinfer", "max_model_len": state.max_model_len}]}

    @app.post("/v1/completions")
    async def completions(request: Request):
        req = _parse(CompletionRequest, await _body(request), state)
        prompts = [_encode_prompt(state, p) for p in req.prompts()]
        return await _serve(request, state, req, prompts, req.max_tokens, req.logprobs, chat=False)

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        req = _parse(ChatCompletionRequest, await _body(request), state)
        if state.renderer is None:
            raise APIError("messages: this model has no tokenizer; use /v1/completions with token ids", "messages")
        try:
            ids = state.renderer.render_ids([(m.role, m.text) for m in req.messages], req.add_generation_prompt)
        except ChatTemplateError as err:
            raise APIError(f"messages: {err}", "messages") from None
        top = (req.top_logprobs or 0) if req.logprobs else None
        return await _serve(request, state, req, [ids], req.output_limit, top, chat=True)

    return app


# ---------------------------------------------------------------------- parsing
async def _body(request: Request) -> bytes:
    body = await request.body()
    if len(body) > MAX_BODY_BYTES:
        raise APIError(f"request body: {len(body)} bytes exceeds the limit of {MAX_BODY_BYTES}", None, 413)
    return body


def _parse(model, body: bytes, state: ServerState):
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise APIError(f"body: invalid JSON ({err})", "body") from None
    if not isinstance(data, dict):
        raise APIError(f"body: expected a JSON object, got {type(data).__name__}", "body")
    try:
        req = model.model_validate(data)
    except ValidationError as err:
        raise from_validation_error(err) from None
    if req.model != state.model_name:
        raise APIError(f"model: the model {req.model!r} does not exist; this server serves {state.model_name!r}",
                       "model", 404, "not_found_error", "model_not_found")
    return req


def _encode_prompt(state: ServerState, prompt: str | list[int]) -> list[int]:
    if isinstance(prompt, str):
        if state.encoder is None:
            raise APIError("prompt: this model has no tokenizer; pass token ids", "prompt")
        ids = state.encoder.encode_plain(prompt)
        if not ids:
            raise APIError("prompt: must encode to at least 1 token", "prompt")
        return ids
    vocab = state.vocab_size
    for i, t in enumerate(prompt):
        if not 0 <= t < vocab:
            raise APIError(f"prompt: token id {t} at index {i} is outside the vocabulary [0, {vocab})", "prompt")
    if not prompt:
        raise APIError("prompt: must contain at least 1 token", "prompt")
    return list(prompt)


def _structured(req: SamplingFields) -> StructuredOutput | None:
    rf = req.response_format
    if rf is None or rf.type == "text":
        return None
    try:
        if rf.type == "json_object":
            return StructuredOutput.json_object()
        if rf.type == "regex":
            return StructuredOutput.regex(rf.regex)
        return StructuredOutput.json_schema(rf.json_schema.schema_)
    except InvalidRequestError as err:
        raise APIError(f"response_format: {str(err).split(': ', 1)[-1]}", "response_format") from None


def _params(req: SamplingFields, max_tokens: int, logprobs: int | None, choice: int) -> SamplingParams:
    seed = None if req.seed is None else (req.seed + choice) % (UINT64_MAX + 1)
    try:
        return SamplingParams(
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p, top_k=-1 if req.top_k is None else req.top_k,
            max_tokens=max_tokens, min_tokens=min(req.min_tokens, max_tokens), seed=seed, stop=req.stop_list,
            ignore_eos=req.ignore_eos, logprobs=logprobs, structured_output=_structured(req),
            presence_penalty=req.presence_penalty, frequency_penalty=req.frequency_penalty,
            repetition_penalty=req.repetition_penalty)
    except InvalidRequestError as err:
        raise from_invalid_request(err) from None


def _limit(state: ServerState, prompt_len: int, requested: int | None, chat: bool) -> int:
    room = state.max_model_len - prompt_len
    field = "messages" if chat else "prompt"
    if room <= 0:
        raise APIError(f"{field}: the prompt has {prompt_len} tokens; max_model_len is {state.max_model_len} "
                       "(prompt plus at least 1 output token)", field)
    if requested is None:
        return min(state.default_max_tokens, room)
    if requested > room:
        name = "max_completion_tokens" if chat else "max_tokens"
        raise APIError(f"{name}: {requested} output tokens plus the prompt's {prompt_len} exceed max_model_len "
                       f"{state.max_model_len} (at most {room})", name)
    return requested


# ---------------------------------------------------------------------- serving
async def _serve(request: Request, state: ServerState, req: SamplingFields, prompts: list[list[int]],
                 requested: int | None, logprobs: int | None, chat: bool):
    plan = []   # (prompt index, choice index, params)
    for p, ids in enumerate(prompts):
        limit = _limit(state, len(ids), requested, chat)
        for k in range(req.n):
            plan.append((p, p * req.n + k, ids, _params(req, limit, logprobs, k)))
    streams: list[RequestStream] = []
    try:
        for _, _, ids, params in plan:
            streams.append(state.llm.add_request(None, ids, params))
    except InvalidRequestError as err:
        _abort_all(streams)
        raise from_invalid_request(err) from None
    except RuntimeError as err:
        _abort_all(streams)
        raise APIError(f"engine unavailable: {err}", None, 503, "server_error") from None
    choices = [fmt.Choice(index=i, prompt_index=p) for p, i, _, _ in plan]
    try:
        firsts = await _watch(request, asyncio.gather(*(s.__anext__() for s in streams)), streams)
    except BaseException:
        _abort_all(streams)
        raise
    for delta in firsts:
        if delta.finished and delta.finish_reason == "error":
            _abort_all(streams)
            raise _error_of(delta.error)
    prompt_lens = [len(ids) for ids in prompts]
    rid = fmt.new_id("chatcmpl" if chat else "cmpl")
    if req.stream:
        gen = _sse(state, req, streams, choices, firsts, prompt_lens, rid, logprobs is not None, chat)
        return StreamingResponse(gen, media_type="text/event-stream")
    try:
        for choice, first in zip(choices, firsts):
            choice.add(first)
        await _watch(request, asyncio.gather(*(_collect(s, c) for s, c in zip(streams, choices))), streams)
    except BaseException:
        _abort_all(streams)
        raise
    for c in choices:
        if c.finish_reason == "error":
            raise _error_of(c.error)
    build = fmt.chat_response if chat else fmt.completion_response
    return build(rid, state.model_name, choices, prompt_lens, state.tokens, logprobs is not None)


async def _collect(stream: RequestStream, choice: fmt.Choice) -> None:
    if choice.finish_reason is not None:
        return
    async for delta in stream:
        choice.add(delta)


async def _watch(request: Request, work, streams: list[RequestStream]):
    """Await `work`; abort the streams if the client disconnects first."""
    task = asyncio.ensure_future(work)
    while True:
        done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
        if done:
            return task.result()
        if await request.is_disconnected():
            _abort_all(streams)
            task.cancel()
            raise APIError("client disconnected", None, 499)


def _abort_all(streams: list[RequestStream]) -> None:
    for s in streams:
        if not s.finished:
            s.abort()


def _error_of(message: str | None) -> APIError:
    message = message or "request failed"
    field = message.split(":", 1)[0] if ":" in message else None
    if field == "structured_output":
        return APIError("response_format: " + message.split(":", 1)[1].strip(), "response_format")
    if field == "engine error":
        return APIError(message, None, 503, "server_error")
    return APIError(message, field)


def _sse_line(body: dict) -> bytes:
    return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"


async def _sse(state: ServerState, req: SamplingFields, streams, choices, firsts, prompt_lens, rid: str,
               want_logprobs: bool, chat: bool):
    """SSE chunks of all choices (merged as they come), the usage chunk, [DONE]. Closing the
    connection cancels this generator: its `finally` aborts the unfinished requests."""
    include_usage = req.stream_options is not None and req.stream_options.include_usage
    model, tok = state.model_name, state.tokens
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, stream: RequestStream):
        async for delta in stream:
            await queue.put((i, delta))
        await queue.put((i, None))

    for i, d in enumerate(firsts):
        queue.put_nowait((i, d))
    pumps = [asyncio.ensure_future(pump(i, s)) if not firsts[i].finished else None for i, s in enumerate(streams)]
    open_choices = sum(p is not None for p in pumps)
    offsets = [0] * len(choices)
    try:
        if chat:
            for c in choices:
                yield _sse_line(fmt.chat_chunk(rid, model, c.index, {"role": "assistant", "content": ""}, None,
                                               None, include_usage))
        pending_finals = len(choices)
        while pending_finals or open_choices:
            i, delta = await queue.get()
            if delta is None:
                open_choices -= 1
                continue
            c = choices[i]
            c.add(delta)
            if delta.finished:
                pending_finals -= 1
            if delta.finished and delta.finish_reason == "error":
                err = _error_of(delta.error)
                yield _sse_line(err.body())
                continue
            if not delta.text and not delta.token_ids and not delta.finished:
                continue
            if chat:
                lp = fmt.chat_logprobs(tok, delta.token_ids, delta.logprobs or [], delta.top_logprobs) \
                    if want_logprobs else None
                body = {"content": delta.text} if (delta.text or delta.token_ids) else {}
                yield _sse_line(fmt.chat_chunk(rid, model, c.index, body, delta.finish_reason if delta.finished
                                               else None, lp, include_usage))
            else:
                yield _sse_line(fmt.completion_chunk(rid, model, c.index, delta, tok, want_logprobs, offsets[i],
                                                     include_usage))
            offsets[i] += len(delta.text)
        if include_usage:
            obj = "chat.completion.chunk" if chat else "text_completion"
            yield _sse_line(fmt.usage_chunk(rid, model, obj, choices, prompt_lens))
        yield b"data: [DONE]\n\n"
    finally:
        _abort_all(streams)
        for p in pumps:
            if p is not None:
                p.cancel()


def make_state(llm: AsyncLLM, model_name: str, template: str, metrics: ServingMetrics,
               default_max_tokens: int = 256) -> ServerState:
    """The in-process server's state (the app over this process's AsyncLLM)."""
    engine = llm.engine
    return state_for(llm, metrics, model_name, template, engine.tokenizer, engine.vocab_size, engine.max_model_len,
                     default_max_tokens)


def state_for(llm: EngineHandle, metrics: MetricsEndpoint, model_name: str, template: str, tokenizer,
              vocab_size: int, max_model_len: int, default_max_tokens: int = 256) -> ServerState:
    """The server's state; a model without a tokenizer (random-weight presets) serves token-id
    prompts only (chat and text prompts get a 400 naming the field)."""
    from deepinfer_engine.detokenizer import TokenTable
    if tokenizer is None:
        return ServerState(llm, model_name, None, None, fmt.TokenStrings([]), metrics, max_model_len, vocab_size,
                           default_max_tokens)
    encoder = PlainEncoder(tokenizer)
    backend = tokenizer.backend
    bos = backend.id_to_token(tokenizer.bos_token_id) if tokenizer.bos_token_id is not None else ""
    eos = backend.id_to_token(tokenizer.eos_token_ids[0]) if tokenizer.eos_token_ids else ""
    table = TokenTable.from_tokenizer(tokenizer, vocab_size)
    return ServerState(llm, model_name, encoder, ChatRenderer(template, encoder, bos or "", eos or ""),
                       fmt.TokenStrings(table.token_bytes), metrics, max_model_len, vocab_size, default_max_tokens)
