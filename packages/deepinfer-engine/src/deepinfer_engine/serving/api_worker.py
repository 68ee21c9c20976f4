"""An API worker process of `deepinfer serve --api-workers N`: the HTTP app over a link to the
engine process (protocol: serving.engine_link).

uvicorn starts N of these (`create_app` is the factory), all accepting on the server's one
listening socket, so the JSON, SSE and socket work of many streams spreads over N processes while
one engine process steps the model. `EngineClient` gives the app AsyncLLM's interface: the same
RequestStream per request, fed by a reader thread that hands each link message (every delta of
one engine loop iteration) to the event loop in one call.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Client

from deepinfer_engine.sampling_params import SamplingParams
from deepinfer_engine.serving import engine_link as link
from deepinfer_engine.serving.async_llm import RequestDelta, RequestStream


class EngineClient:
    """AsyncLLM's interface (add_request, is_healthy) and the metrics endpoint, over the link."""

    def __init__(self, address: str, authkey: bytes, stale_after_s: float = link.HEARTBEAT_STALE_S,
                 on_link_lost: Callable[[], None] | None = None):
        self._conn = Client(address, family="AF_UNIX", authkey=authkey)
        self.info: link.ServerInfo = self._conn.recv()
        self.stale_after_s = stale_after_s
        self._ids = itertools.count()
        self._streams: dict[int, RequestStream] = {}
        self._scrapes: dict[int, asyncio.Future] = {}
        self._send_lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._health: tuple[bool, str] = (True, "ok")
        self._health_at = time.monotonic()
        self.link_error: str | None = None
        self.on_link_lost = on_link_lost   # called on the reader thread once the link is gone
        self._thread = threading.Thread(target=self._read, name="deepinfer-engine-link", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ EngineHandle
    def add_request(self, prompt: str | None = None, prompt_token_ids: list[int] | None = None,
                    params: SamplingParams | None = None) -> RequestStream:
        """Queue a request in the engine process (on the app's event loop). Validation happens
        there: an invalid request's first delta is its error (the app answers it with a 4xx).
        Raises RuntimeError when the link is down."""
        if prompt is not None or prompt_token_ids is None:
            raise ValueError("EngineClient.add_request: pass prompt_token_ids (the app encodes prompts)")
        if self.link_error is not None:
            raise RuntimeError(self.link_error)
        self._loop = asyncio.get_running_loop()
        params = params or SamplingParams()
        stream = RequestStream(None, list(prompt_token_ids), params)
        stream._owner = self
        stream.request_id = lid = next(self._ids)
        self._streams[lid] = stream
        self._send((link.ADD, lid, stream.prompt_token_ids, params, stream.arrival))
        return stream

    def _submit(self, command: tuple) -> None:   # RequestStream.abort
        kind, stream = command
        if kind == "abort" and stream.request_id in self._streams:
            try:
                self._send((link.ABORT, stream.request_id))
            except RuntimeError:   # the link is down: the engine process aborts this worker's requests itself
                pass

    def is_healthy(self) -> tuple[bool, str]:
        if self.link_error is not None:
            return False, self.link_error
        age = time.monotonic() - self._health_at
        if age > self.stale_after_s:
            return False, f"no heartbeat from the engine process for {age:.1f} s"
        return self._health

    # ------------------------------------------------------------------ MetricsEndpoint
    async def scrape(self) -> bytes:
        """The engine process's /metrics (one registry for the whole server)."""
        self._loop = asyncio.get_running_loop()
        call = next(self._ids)
        fut = self._scrapes[call] = self._loop.create_future()
        self._send((link.SCRAPE, call))
        try:
            return await asyncio.wait_for(fut, self.stale_after_s)
        finally:
            self._scrapes.pop(call, None)

    def count_http_error(self, status: int) -> None:
        try:
            self._send((link.HTTP_ERROR, status))
        except RuntimeError:
            pass

    def close(self) -> None:
        """Drop the link (the engine process aborts this worker's requests)."""
        try:   # shutdown wakes the reader's recv with EOF; then the handle can go
            socket.fromfd(self._conn.fileno(), socket.AF_UNIX, socket.SOCK_STREAM).shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._thread.join(5)
        self._conn.close()

    # ------------------------------------------------------------------ the link
    def _send(self, message: tuple) -> None:
        with self._send_lock:
            try:
                self._conn.send(message)
            except (OSError, EOFError, ValueError) as err:
                self.link_error = self.link_error or f"engine error: the link to the engine process failed: {err!r}"
                raise RuntimeError(self.link_error) from None

    def _read(self) -> None:
        try:
            while True:
                msg = self._conn.recv()
                kind = msg[0]
                if kind == link.DELTAS:
                    self._call_in_loop(self._deliver, msg[1])
                elif kind == link.HEALTH:
                    self._health, self._health_at = (msg[1], msg[2]), time.monotonic()
                elif kind == link.SCRAPED:
                    self._call_in_loop(self._scraped, msg[1], msg[2])
        except (EOFError, OSError) as err:
            self.link_error = f"engine error: the engine process closed the link ({type(err).__name__})"
        finally:
            self._call_in_loop(self._fail_all)
            if self.on_link_lost is not None:
                self.on_link_lost()

    def _call_in_loop(self, fn, *args) -> None:
        if self._loop is not None:
            try:
                self._loop.call_soon_threadsafe(fn, *args)
            except RuntimeError:   # the event loop is closed (shutdown)
                pass

    def _deliver(self, items: list[tuple]) -> None:   # on the event loop
        for lid, packed in items:
            stream = self._streams.get(lid)
            if stream is None:
                continue
            delta = link.unpack(packed)
            if delta.finished:
                del self._streams[lid]
                stream.finished = True
            stream._put_in_loop(delta)

    def _scraped(self, call: int, text: bytes) -> None:
        fut = self._scrapes.get(call)
        if fut is not None and not fut.done():
            fut.set_result(text)

    def _fail_all(self) -> None:
        message = self.link_error or "engine error: the link to the engine process closed"
        for stream in list(self._streams.values()):
            stream.finished = True
            stream._put_in_loop(RequestDelta("", [], None, None, True, "error", message,
                                             len(stream.prompt_token_ids or [])))
        self._streams.clear()
        for fut in self._scrapes.values():
            if not fut.done():
                fut.set_exception(RuntimeError(message))


def exit_when_orphaned(parent_pid: int, reparent_wait_s: float = 5.0, force_after_s: float = 10.0) -> None:
    """The link is gone: if the engine process (this worker's parent, also uvicorn's supervisor)
    died, nothing will ever stop this worker, so stop it here: SIGTERM for uvicorn's graceful
    shutdown (the streams already ended with an error delta), and a hard exit if that stalls. While
    the parent lives (its hub failed, or it is shutting down) the worker stays: /health says why."""
    deadline = time.monotonic() + reparent_wait_s   # the kernel closes the socket just before it re-parents us
    while os.getppid() == parent_pid:
        if time.monotonic() > deadline:
            return
        time.sleep(0.05)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(force_after_s)
    os._exit(1)


def create_app():
    """uvicorn's app factory in each worker: connect to the engine process named in the environment."""
    from deepinfer_engine.serving.app import build_app, state_for
    parent_pid = os.getppid()
    client = EngineClient(os.environ[link.ADDRESS_ENV], bytes.fromhex(os.environ[link.AUTHKEY_ENV]),
                          on_link_lost=lambda: exit_when_orphaned(parent_pid))
    info = client.info
    state = state_for(client, client, info.model_name, info.chat_template, info.tokenizer, info.vocab_size,
                      info.max_model_len, info.default_max_tokens)
    return build_app(state)
