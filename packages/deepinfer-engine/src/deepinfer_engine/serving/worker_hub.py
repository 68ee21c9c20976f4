"""The engine process's end of the API worker links (protocol: serving.engine_link).

`WorkerHub` listens on a unix socket; each worker that connects gets a `WorkerLink`: a reader
thread that turns the worker's messages into AsyncLLM calls, and an outbox of deltas that the
engine loop sends as one message per loop iteration (AsyncLLM dispatch hook). The requests' own
streams are `ForwardedStream`s: AsyncLLM delivers to them as to any stream, and they queue.
"""

from __future__ import annotations

import logging
import os
import socket
import tempfile
import threading
from multiprocessing.connection import Client, Connection, Listener

from deepinfer_engine.errors import InvalidRequestError
from deepinfer_engine.serving import engine_link as link
from deepinfer_engine.serving.async_llm import AsyncLLM, RequestDelta, RequestStream

logger = logging.getLogger("deepinfer")


class ForwardedStream(RequestStream):
    """A request of one worker: its deltas go to the worker's outbox instead of a local consumer."""

    def __init__(self, owner: WorkerLink, local_id: int, token_ids: list[int], params, arrival: float):
        super().__init__(None, token_ids, params)
        self.link, self.local_id = owner, local_id
        self.arrival = arrival   # the worker's clock: CLOCK_MONOTONIC is one clock for every process

    def _put(self, delta: RequestDelta) -> None:
        self.link.queue(self.local_id, delta)


class WorkerLink:
    def __init__(self, conn: Connection, hub: WorkerHub):
        self.conn, self.hub = conn, hub
        self.streams: dict[int, ForwardedStream] = {}
        self._outbox: list[tuple] = []
        self._lock = threading.Lock()        # the outbox and the connection's send side
        self.closed = False
        self._thread = threading.Thread(target=self._read, name="deepinfer-worker-link", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout_s)

    # ------------------------------------------------------------------ engine -> worker
    def queue(self, local_id: int, delta: RequestDelta) -> None:
        with self._lock:
            self._outbox.append((local_id, link.pack(delta)))
        if delta.finished:
            self.streams.pop(local_id, None)

    def flush(self) -> None:
        """Send the queued deltas as one message (engine loop thread, after each iteration)."""
        if not self._outbox:
            return
        with self._lock:
            items, self._outbox = self._outbox, []
            self._send((link.DELTAS, items))

    def send(self, message: tuple) -> None:
        with self._lock:
            self._send(message)

    def _send(self, message: tuple) -> None:   # holds self._lock
        if self.closed:
            return
        try:
            self.conn.send(message)
        except (OSError, EOFError, ValueError):   # the worker went away: its reader aborts its requests
            self.closed = True

    # ------------------------------------------------------------------ worker -> engine
    def _read(self) -> None:
        llm = self.hub.llm
        try:
            while True:
                msg = self.conn.recv()
                kind = msg[0]
                if kind == link.ADD:
                    self._add(llm, *msg[1:])
                elif kind == link.ABORT:
                    stream = self.streams.get(msg[1])
                    if stream is not None:
                        stream.abort()
                elif kind == link.SCRAPE:
                    self.send((link.SCRAPED, msg[1], self.hub.metrics.render()))
                elif kind == link.HTTP_ERROR:
                    self.hub.metrics.count_http_error(msg[1])
                else:
                    raise ValueError(f"unknown message from an API worker: {kind!r}")
        except (EOFError, OSError):
            pass
        except Exception:  # noqa: BLE001 - one bad link must not take the engine down
            logger.exception("API worker link failed")
        finally:
            self.closed = True
            self.hub.drop(self)
            for stream in list(self.streams.values()):   # nobody reads them any more
                stream.abort()
            try:
                self.conn.close()
            except OSError:
                pass

    def _add(self, llm: AsyncLLM, local_id: int, token_ids: list[int], params, arrival: float) -> None:
        stream = ForwardedStream(self, local_id, token_ids, params, arrival)
        self.streams[local_id] = stream
        try:
            llm.submit(stream)
        except InvalidRequestError as err:
            self.queue(local_id, RequestDelta("", [], None, None, True, "error", str(err), len(token_ids)))
            self.flush()
        except RuntimeError as err:   # the loop is down
            self.queue(local_id, RequestDelta("", [], None, None, True, "error", f"engine error: {err}",
                                              len(token_ids)))
            self.flush()


class WorkerHub:
    """Accepts API worker connections for one AsyncLLM (`env()`: what a worker needs to connect)."""

    def __init__(self, llm: AsyncLLM, metrics, info: link.ServerInfo):
        self.llm, self.metrics, self.info = llm, metrics, info
        self._dir = tempfile.mkdtemp(prefix="deepinfer-link-")
        self.address = os.path.join(self._dir, "engine.sock")
        self.authkey = os.urandom(32)
        self._listener = Listener(self.address, family="AF_UNIX", authkey=self.authkey)
        self.links: list[WorkerLink] = []
        self._links_lock = threading.Lock()
        self._closed = threading.Event()
        llm.add_dispatch_hook(self._flush)
        self._threads = [threading.Thread(target=self._accept, name="deepinfer-worker-hub", daemon=True),
                         threading.Thread(target=self._heartbeat, name="deepinfer-worker-heartbeat", daemon=True)]
        for t in self._threads:
            t.start()

    def env(self) -> dict[str, str]:
        return {link.ADDRESS_ENV: self.address, link.AUTHKEY_ENV: self.authkey.hex()}

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn = self._listener.accept()
            except OSError:
                if self._closed.is_set():
                    return
                logger.warning("an API worker failed to connect", exc_info=True)
                continue
            if self._closed.is_set():   # close()'s wake-up connection
                conn.close()
                return
            try:   # the handshake goes first: the heartbeat reaches a link only once it is listed
                conn.send(self.info)
            except OSError:
                conn.close()
                continue
            worker = WorkerLink(conn, self)
            with self._links_lock:
                self.links.append(worker)
                self.metrics.api_workers.set(len(self.links))
            worker.start()

    def drop(self, worker: WorkerLink) -> None:
        with self._links_lock:
            if worker in self.links:
                self.links.remove(worker)
            self.metrics.api_workers.set(len(self.links))

    def _flush(self) -> None:
        for worker in tuple(self.links):
            worker.flush()

    def _heartbeat(self) -> None:
        while not self._closed.wait(link.HEARTBEAT_S):
            ok, why = self.llm.is_healthy()
            for worker in list(self.links):
                worker.send((link.HEALTH, ok, why))

    def close(self) -> None:
        """Stop accepting and heartbeats (the workers have exited: their links end by themselves)."""
        self._closed.set()
        try:   # accept() does not return when its socket closes: connect once to wake it
            Client(self.address, family="AF_UNIX", authkey=self.authkey).close()
        except OSError:
            pass
        for t in self._threads:
            t.join(5)
        try:
            self._listener.close()
        except OSError:
            pass
        for worker in list(self.links):   # workers still linked: end their readers (shutdown wakes recv)
            worker.closed = True
            try:
                socket.fromfd(worker.conn.fileno(), socket.AF_UNIX, socket.SOCK_STREAM).shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            worker.join(5)
        try:
            os.unlink(self.address)
            os.rmdir(self._dir)
        except OSError:
            pass


def serve_api_workers(llm: AsyncLLM, metrics, info: link.ServerInfo, workers: int, **uvicorn_args) -> None:
    """Serve over `workers` uvicorn worker processes on one socket, each linked to `llm`, until
    uvicorn returns (SIGINT / SIGTERM); `uvicorn_args`: host, port, log_level, ..."""
    import uvicorn
    hub = WorkerHub(llm, metrics, info)
    os.environ.update(hub.env())   # the workers (spawned) read where to connect from here
    try:
        uvicorn.run("deepinfer_engine.serving.api_worker:create_app", factory=True, workers=workers, **uvicorn_args)
    finally:
        hub.close()
