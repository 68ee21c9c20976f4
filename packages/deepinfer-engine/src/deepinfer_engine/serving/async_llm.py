"""AsyncLLM: one background thread owns an LLMEngine and steps it while any request is live.

    llm = AsyncLLM.from_config(EngineConfig(device="cpu"))
    stream = llm.add_request(prompt_token_ids=ids, params=SamplingParams(max_tokens=32))
    async for delta in stream:        # RequestDelta: new text / tokens / logprobs, then finished
        ...
    stream.abort()                    # from any thread or coroutine

The loop (thread "deepinfer-engine-loop")::

    wait on a condition while nothing is live and no command is queued (no spin when idle)
    take the queued commands: add -> engine.add_request, abort -> engine.abort_request
    engine.step() if anything is live
    engine.pop_stream_deltas() -> snapshot per request -> RequestStream (thread-safe hand-over)

Only the loop thread touches the engine's mutable state. `add_request` validates in the caller's
thread (engine.validate_request reads only the tokenizer, the vocabulary and the params), so a bad
request fails there with InvalidRequestError and never reaches the loop. An abort is applied
before the next step: the engine frees the request's KV blocks and slot at once, in every phase
(waiting for its grammar, prefilling, decoding, a ZOS step in flight); its final delta
(finish_reason "abort") follows within a step or two.

`is_healthy`: the thread is alive, no step raised, and the loop made progress (a step or an idle
wake-up) within `stuck_after_s`.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Protocol

from deepinfer_engine.outputs import StreamDelta
from deepinfer_engine.sampling_params import SamplingParams

logger = logging.getLogger("deepinfer")

IDLE_WAKE_S = 1.0   # the idle loop wakes this often (heartbeat for /health, the periodic log)


@dataclass(frozen=True)
class RequestDelta:
    """What one request gained in one engine step, copied out of the engine's objects (the loop
    thread keeps mutating those). Deltas concatenate to the final output exactly."""

    text: str
    token_ids: list[int]
    logprobs: list[float] | None            # per new token (when params.logprobs is not None)
    top_logprobs: list[dict[int, float]] | None  # per new token (when params.logprobs > 0)
    finished: bool
    finish_reason: str | None = None        # stop | length | abort | error (set when finished)
    error: str | None = None                # finish_reason "error": why (names the field)
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0              # prompt tokens served from the prefix cache
    num_output_tokens: int = 0              # cumulative


class RequestStream:
    """The async iterator of one request's deltas. Producer: the loop thread (`_put`); consumer:
    one coroutine on any event loop. Ends after the finished delta."""

    def __init__(self, prompt: str | None, token_ids: list[int] | None, params: SamplingParams):
        self.prompt = prompt
        self.prompt_token_ids = token_ids
        self.params = params
        self.checked_prompt = None               # validate_request's result (submit): ids checked once
        self.request_id: int | None = None       # the engine's id, once the loop added it
        self.arrival = time.monotonic()
        self.first_token_at: float | None = None
        self.last_token_at: float | None = None
        self.num_tokens_sent = 0                 # loop-side cursor into the output's logprobs
        self.finished = False                    # the loop delivered the final delta
        self._owner: AsyncLLM | None = None
        self._items: collections.deque[RequestDelta] = collections.deque()
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiter: asyncio.Future | None = None
        self._consumed_final = False
        self.abort_requested = False

    # ------------------------------------------------------------------ producer (loop thread)
    def _put(self, delta: RequestDelta) -> None:
        with self._lock:
            self._items.append(delta)
            loop, waiter, self._waiter = self._loop, self._waiter, None
        if waiter is not None and loop is not None:
            try:
                loop.call_soon_threadsafe(_wake, waiter)
            except RuntimeError:   # the consumer's event loop is closed: nobody listens any more
                pass

    def _put_in_loop(self, delta: RequestDelta) -> None:
        """`_put` from a callback on the consumer's own event loop (no thread hand-off)."""
        with self._lock:
            self._items.append(delta)
            waiter, self._waiter = self._waiter, None
        if waiter is not None:
            _wake(waiter)

    # ------------------------------------------------------------------ consumer
    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> RequestDelta:
        while True:
            with self._lock:
                if self._items:
                    delta = self._items.popleft()
                    self._consumed_final = delta.finished
                    return delta
                if self._consumed_final:
                    raise StopAsyncIteration
                self._loop = asyncio.get_running_loop()
                waiter = self._waiter = self._loop.create_future()
            await waiter

    def drain(self) -> list[RequestDelta]:
        """Deltas already delivered and not yet read (no waiting): lets a consumer coalesce."""
        with self._lock:
            items = list(self._items)
            self._items.clear()
            if items:
                self._consumed_final = items[-1].finished
        return items

    def abort(self) -> None:
        """Ask the loop to abort this request (idempotent, any thread)."""
        if self._owner is not None and not self.abort_requested:
            self.abort_requested = True
            self._owner._submit(("abort", self))


def _wake(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)


class LoopObserver(Protocol):
    """What the loop reports (serving.metrics.ServingMetrics implements it)."""

    def on_delta(self, stream: RequestStream, delta: RequestDelta, now: float) -> None: ...
    def on_step(self, llm: AsyncLLM, step_s: float) -> None: ...
    def on_idle(self, llm: AsyncLLM) -> None: ...


@dataclass
class LoopState:
    """Counters of the loop itself (metrics and tests read them)."""

    num_steps: int = 0               # engine.step() calls
    num_aborts: int = 0              # aborts applied
    last_abort_step: int = -1        # num_steps when the last abort was applied
    num_live: int = 0                # requests added and not finished
    step_s_total: float = 0.0        # wall time inside engine.step()
    num_idle_wakeups: int = 0        # idle waits that timed out or were notified (no spin: ~1 per IDLE_WAKE_S)
    pending: list = field(default_factory=list)


class AsyncLLM:
    def __init__(self, engine, *, stuck_after_s: float = 120.0, observer: LoopObserver | None = None):
        self.engine = engine
        self.stuck_after_s = stuck_after_s
        self.observer = observer
        self.state = LoopState()
        self.heartbeat = time.monotonic()
        self.step_started: float | None = None
        self.error: BaseException | None = None
        self._streams: dict[int, RequestStream] = {}
        self._cond = threading.Condition()
        self._closed = False
        self._dispatch_hooks: list = []
        engine.start_streaming()
        self._thread = threading.Thread(target=self._run, name="deepinfer-engine-loop", daemon=True)
        self._thread.start()

    @classmethod
    def from_config(cls, config, **kwargs) -> AsyncLLM:
        from deepinfer_engine.llm_engine import LLMEngine
        return cls(LLMEngine(config), **kwargs)

    # ------------------------------------------------------------------ public API (any thread)
    def add_request(self, prompt: str | None = None, prompt_token_ids: list[int] | None = None,
                    params: SamplingParams | None = None) -> RequestStream:
        """Validate (raises InvalidRequestError naming the field) and queue a request; returns its
        stream. Raises RuntimeError when the loop is down."""
        params = params or SamplingParams()
        return self.submit(RequestStream(prompt, prompt_token_ids, params))

    def submit(self, stream: RequestStream) -> RequestStream:
        """`add_request` for a stream made by the caller (a subclass that forwards its deltas
        elsewhere: serving.worker_hub). Validates stream.prompt / prompt_token_ids / params."""
        if self.error is not None or self._closed:
            raise RuntimeError(f"engine loop is not running: {self.error!r}")
        stream.checked_prompt = self.engine.validate_request(stream.prompt, stream.prompt_token_ids, stream.params)
        stream.prompt_token_ids = stream.checked_prompt.token_ids
        stream._owner = self
        self._submit(("add", stream))
        return stream

    def add_dispatch_hook(self, hook) -> None:
        """Call `hook()` on the loop thread after every loop iteration that handed out deltas (a
        forwarding stream's owner sends what the iteration queued as one message)."""
        self._dispatch_hooks.append(hook)

    async def generate(self, prompt: str | None = None, prompt_token_ids: list[int] | None = None,
                       params: SamplingParams | None = None) -> list[RequestDelta]:
        """All deltas of one request (aborts it if the caller is cancelled)."""
        stream = self.add_request(prompt, prompt_token_ids, params)
        try:
            return [d async for d in stream]
        finally:
            if not stream.finished:
                stream.abort()

    def is_healthy(self) -> tuple[bool, str]:
        if self.error is not None:
            return False, f"engine loop failed: {self.error!r}"
        if not self._thread.is_alive():
            return False, "engine loop thread is not running"
        started = self.step_started
        if started is not None and time.monotonic() - started > self.stuck_after_s:
            return False, f"engine step running for {time.monotonic() - started:.1f} s > {self.stuck_after_s:g} s"
        if time.monotonic() - self.heartbeat > self.stuck_after_s + IDLE_WAKE_S:
            return False, f"engine loop made no progress for {time.monotonic() - self.heartbeat:.1f} s"
        return True, "ok"

    @property
    def num_queued(self) -> int:
        """Commands handed to the loop and not yet applied."""
        return len(self.state.pending)

    def shutdown(self, timeout_s: float = 5.0) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout_s)

    # ------------------------------------------------------------------ the loop
    def _submit(self, command: tuple) -> None:
        with self._cond:
            self.state.pending.append(command)
            self._cond.notify()

    def _run(self) -> None:
        engine, st = self.engine, self.state
        while True:
            with self._cond:
                while not st.pending and not engine.has_unfinished() and not self._closed:
                    self.heartbeat = time.monotonic()
                    if self.observer is not None:
                        self.observer.on_idle(self)
                    self._cond.wait(IDLE_WAKE_S)
                    st.num_idle_wakeups += 1
                if self._closed:
                    return
                commands, st.pending = st.pending, []
            try:
                for command in commands:
                    self._apply(command)
                if commands and self.observer is not None:   # an abort's freed blocks show before the step
                    self.observer.on_idle(self)
                if engine.has_unfinished():
                    self.step_started = t0 = time.monotonic()
                    engine.step()
                    step_s = time.monotonic() - t0
                    self.step_started = None
                    st.num_steps += 1
                    st.step_s_total += step_s
                    self._dispatch(engine.pop_stream_deltas())
                    if self.observer is not None:
                        self.observer.on_step(self, step_s)
                else:
                    self._dispatch(engine.pop_stream_deltas())
                for hook in self._dispatch_hooks:
                    hook()
                self.heartbeat = time.monotonic()
            except BaseException as err:  # noqa: BLE001 - the loop must report, not vanish
                logger.exception("engine loop failed")
                self.error = err
                self._fail_all(f"engine error: {err!r}")
                for hook in self._dispatch_hooks:   # forwarded streams get their final deltas too
                    hook()
                return

    def _apply(self, command: tuple) -> None:
        kind, stream = command
        st = self.state
        if kind == "add":
            if stream.abort_requested:   # aborted before the loop saw it
                self._deliver_final(stream, "abort", None)
                return
            from deepinfer_engine.errors import InvalidRequestError
            try:
                rid = self.engine.add_request(stream.prompt, stream.checked_prompt, stream.params)
            except InvalidRequestError as err:
                self._deliver_final(stream, "error", str(err))
                return
            stream.request_id = rid
            self._streams[rid] = stream
            st.num_live += 1
        elif kind == "abort":
            if stream.request_id is not None and stream.request_id in self._streams:
                if self.engine.abort_request(stream.request_id):
                    st.num_aborts += 1
                    st.last_abort_step = st.num_steps

    def _dispatch(self, deltas: list[StreamDelta]) -> None:
        now = time.monotonic()
        for d in deltas:
            stream = self._streams.get(d.request_id)
            if stream is None:
                continue
            out = d.output
            lo, hi = stream.num_tokens_sent, stream.num_tokens_sent + len(d.token_ids)
            stream.num_tokens_sent = hi
            delta = RequestDelta(
                text=d.text, token_ids=list(d.token_ids),
                logprobs=list(out.token_logprobs[lo:hi]) if out.token_logprobs is not None else None,
                top_logprobs=[dict(t) for t in out.top_logprobs[lo:hi]] if out.top_logprobs is not None else None,
                finished=d.finished, finish_reason=out.finish_reason if d.finished else None,
                error=out.error if d.finished else None, num_prompt_tokens=len(out.prompt_token_ids),
                num_cached_tokens=out.num_cached_tokens, num_output_tokens=hi)
            if d.token_ids:
                stream.first_token_at = stream.first_token_at or now
            if self.observer is not None:
                self.observer.on_delta(stream, delta, now)
            if d.token_ids:
                stream.last_token_at = now
            if d.finished:
                del self._streams[d.request_id]
                self.state.num_live -= 1
                stream.finished = True
            stream._put(delta)

    def _deliver_final(self, stream: RequestStream, reason: str, error: str | None) -> None:
        stream.finished = True
        stream._put(RequestDelta("", [], None, None, True, reason, error, len(stream.prompt_token_ids)))

    def _fail_all(self, message: str) -> None:
        for stream in list(self._streams.values()):
            self._deliver_final(stream, "error", message)
        self._streams.clear()
        for kind, stream in self.state.pending:
            if kind == "add":
                self._deliver_final(stream, "error", message)
        self.state.pending = []
