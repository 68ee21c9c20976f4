"""The DP front end: spawns one process per rank, spreads requests over them by load, gathers outputs.

    LLM(data_parallel_size=2, expert_parallel=True) -> DataParallelEngine
        add_request -> a rank by load (load_balance.py) -> buffered
        step        -> broadcast the buffered adds (every rank gets every command: group_vote.py)
                    -> wait for finished outputs from the ranks (worker.py)

It offers the LLMEngine methods `LLM.generate`, `LLM.generate_stream` and the server's AsyncLLM
use (validate_request, add_request, abort_request, step, has_unfinished, the streaming calls,
gauges, tokenizer), so `LLM` and `deepinfer serve` only choose it. While streaming, every rank
sends each step's StreamDeltas and its gauges; the front end sums the gauges over ranks. A rank
that reports an error or dies ends the engine with `RankFailedError` naming the rank (and its
traceback), never a hang.
"""

from __future__ import annotations

import atexit
import os
import pickle
import queue
import socket
import time
from typing import Any

import torch
import torch.multiprocessing as mp

from deepinfer_engine.outputs import GenerationOutput, StreamDelta
from deepinfer_engine.parallel.load_balance import pick_rank
from deepinfer_engine.parallel.worker import COLLECTIVE_TIMEOUT_ENV, RankLoad, RankSpec, rank_main
from deepinfer_engine.request_validation import CheckedPrompt, validate_request
from deepinfer_engine.sampling_params import SamplingParams
from deepinfer_engine.stats import EngineGauges, EngineStats

START_TIMEOUT_S = 600.0
POLL_S = 0.2
STEP_WAIT_S = 0.05


def free_port() -> int:
    """A free local TCP port for the process group's rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RankFailedError(RuntimeError):
    """A data-parallel rank failed or died; the engine is shut down."""

    def __init__(self, rank: int, detail: str):
        super().__init__(f"data-parallel rank {rank} failed: {detail}")
        self.rank = rank


class DataParallelEngine:
    def __init__(self, data_parallel_size: int, expert_parallel: bool = False, timeout_s: float | None = None,
                 **engine_args: Any):
        if data_parallel_size < 2:
            raise ValueError(f"data_parallel_size: must be >= 2 for the DP front end, got {data_parallel_size}")
        self.world = data_parallel_size
        if timeout_s is None:
            timeout_s = float(os.environ.get(COLLECTIVE_TIMEOUT_ENV, "300"))
        cuda = torch.cuda.is_available() and engine_args.get("device") in (None, "cuda")
        if cuda and torch.cuda.device_count() < data_parallel_size:
            raise ValueError(f"data_parallel_size={data_parallel_size}: only {torch.cuda.device_count()} GPUs")
        if not cuda:
            engine_args["device"] = "cpu"
        backend = "nccl" if cuda else "gloo"
        ctx = mp.get_context("spawn")
        init = f"tcp://127.0.0.1:{free_port()}"
        self.inboxes = [ctx.Queue() for _ in range(self.world)]
        self.outbox = ctx.Queue()
        self.procs = []
        for r in range(self.world):
            spec = RankSpec(r, self.world, init, engine_args, expert_parallel, backend, timeout_s)
            p = ctx.Process(target=rank_main, args=(spec, self.inboxes[r], self.outbox), daemon=True)
            p.start()
            self.procs.append(p)
        self.loads = [RankLoad(r, 0, 0.0) for r in range(self.world)]
        self._outstanding = [0] * self.world          # requests sent to each rank, not finished
        self.num_assigned = [0] * self.world          # requests ever sent to each rank
        self._rank_of: dict[int, int] = {}
        self._pending: dict[int, list] = {}           # rank -> adds not yet broadcast
        self._next_id = 0
        self._closed = False
        self._deltas: list[StreamDelta] | None = None   # collected only while streaming
        self._stream_index: dict[int, int] = {}         # request id -> StreamDelta.index
        self._gauges: dict[int, EngineGauges] = {}      # rank -> its latest (while streaming)
        self._compiles: list[tuple[float, bool]] = []   # grammar compiles reported, not yet read
        self._finished: list[GenerationOutput] = []     # received, not yet returned by step()
        info = {}
        deadline = time.monotonic() + START_TIMEOUT_S
        while len(info) < self.world:
            msg = self._get(deadline)
            if msg[0] == "ready":
                info[msg[1]] = msg[2]
        self.vocab_size = info[0]["vocab_size"]
        self.model_source = f"{info[0]['model_source']} x {self.world} ranks"
        self.tokenizer = info[0]["tokenizer"]   # rank 0's (text prompts are encoded at the ranks)
        self.max_model_len = info[0]["max_model_len"]
        atexit.register(self.shutdown)

    # ------------------------------------------------------------------ requests
    def validate_request(self, prompt: str | None, prompt_token_ids: list[int] | CheckedPrompt | None,
                         params: SamplingParams) -> CheckedPrompt:
        """The prompt of a valid request (the ranks' own check, done here first)."""
        return validate_request(prompt, prompt_token_ids, params, tokenizer=self.tokenizer, vocab_size=self.vocab_size)

    def add_request(self, prompt: str | None = None, prompt_token_ids: list[int] | CheckedPrompt | None = None,
                    params: SamplingParams | None = None) -> int:
        if isinstance(prompt_token_ids, CheckedPrompt):   # the ranks take plain ids (and check them again)
            prompt_token_ids = prompt_token_ids.token_ids
        gid = self._next_id
        self._next_id += 1
        r = pick_rank(self.loads, self._outstanding)
        self._outstanding[r] += 1
        self.num_assigned[r] += 1
        self._rank_of[gid] = r
        self._pending.setdefault(r, []).append((gid, prompt, prompt_token_ids, params or SamplingParams()))
        return gid

    def abort_request(self, request_id: int) -> bool:
        """Abort a request: one not yet sent to its rank finishes "abort" here, in the next step."""
        rank = self._rank_of.get(request_id)
        if rank is None:
            return False
        queued = self._pending.get(rank, [])
        for i, (gid, prompt, ids, _params) in enumerate(queued):
            if gid == request_id:
                del queued[i]
                del self._rank_of[request_id]
                self._outstanding[rank] -= 1
                out = GenerationOutput(request_id, prompt, list(ids or []), finish_reason="abort")
                self._finished.append(out)
                if self._deltas is not None:
                    self._deltas.append(StreamDelta(self._stream_index.get(request_id, -1), request_id, "", [],
                                                    True, out))
                return True
        self._broadcast(("abort", [request_id]))
        return True

    def has_unfinished(self) -> bool:
        return bool(self._rank_of) or bool(self._finished)

    def discard_request(self, request_id: int) -> None:
        """Forget a request (LLM.generate cleaning up after an interruption); ranks still running
        abort it. Idempotent."""
        rank = self._rank_of.pop(request_id, None)
        if rank is None:
            return
        self._outstanding[rank] -= 1
        for queued in self._pending.values():
            queued[:] = [item for item in queued if item[0] != request_id]
        if not self._closed:
            self._broadcast(("abort", [request_id]))

    def fail_request(self, request_id: int, message: str) -> GenerationOutput:
        """Finish a request with `finish_reason == "error"` (error "request: <message>")."""
        self.discard_request(request_id)
        return GenerationOutput(request_id, None, [], finish_reason="error", error=f"request: {message}")

    def step(self) -> list[GenerationOutput]:
        """Send the queued requests, then return the outputs that finished since: waits for a rank's
        message up to STEP_WAIT_S, so new requests and aborts reach the ranks while one request is
        still held (a grammar compiling) or prefilling."""
        self._pending = {r: q for r, q in self._pending.items() if q}
        if self._pending:
            self._broadcast(("add", self._pending))
            self._pending = {}
        if self._rank_of and not self._finished:
            msg = self._get(None, patience_s=STEP_WAIT_S)
            if msg is not None:
                self._handle(msg)
        self._handle_queued()
        finished, self._finished = self._finished, []
        return finished

    def _handle_queued(self) -> None:
        while True:
            try:
                msg = self.outbox.get_nowait()
            except queue.Empty:
                return
            self._handle(self._check(msg))

    def _handle(self, msg) -> None:
        if msg[0] != "outputs":
            return
        _, rank, outs, load, deltas = msg
        if load is not None:
            self.loads[rank] = load
            if load.gauges is not None:
                self._gauges[rank] = load.gauges
                self._compiles += load.gauges.grammar_compiles
        for out in outs:
            if self._rank_of.pop(out.request_id, None) is not None:
                self._outstanding[rank] -= 1
        self._finished += outs
        if deltas is not None and self._deltas is not None:
            for d in pickle.loads(deltas):
                d.output.request_id = d.request_id
                d.index = self._stream_index.get(d.request_id, -1)
                self._deltas.append(d)

    # ------------------------------------------------------------------ streaming
    def start_streaming(self, index_of: dict[int, int] | None = None) -> None:
        """Every rank sends each step's StreamDeltas from now on (`pop_stream_deltas` after a step)."""
        self._deltas, self._stream_index = [], dict(index_of or {})
        self._broadcast(("stream", True))

    def set_stream_indices(self, index_of: dict[int, int]) -> None:
        self._stream_index = dict(index_of)

    def pop_stream_deltas(self) -> list[StreamDelta]:
        deltas, self._deltas = self._deltas or [], [] if self._deltas is not None else None
        return deltas

    def stop_streaming(self) -> None:
        self._deltas, self._stream_index = None, {}
        if not self._closed:
            self._broadcast(("stream", False))

    def gauges(self) -> EngineGauges:
        """The ranks' latest gauges summed (zeros before any rank reported while streaming)."""
        self._handle_queued()
        parts = list(self._gauges.values()) or [EngineGauges(0, 0, 0, 0, 0, 0, EngineStats(), [])]
        total = EngineGauges.total(parts)
        total.grammar_compiles, self._compiles = self._compiles, []
        return total

    @property
    def moe_lb(self) -> float | None:
        """EPLB's max / mean tokens per rank (the latest figure any rank reported)."""
        figures = [x.moe_lb for x in self.loads if x.moe_lb is not None]
        return max(figures) if figures else None

    # ------------------------------------------------------------------ processes
    def _broadcast(self, cmd) -> None:
        for box in self.inboxes:
            box.put(cmd)

    def _get(self, deadline: float | None, patience_s: float | None = None):
        """The next message (None after `patience_s` without one); a rank error or a dead rank raises
        RankFailedError naming the rank."""
        wait = POLL_S if patience_s is None else min(POLL_S, patience_s)
        waited = 0.0
        while True:
            try:
                msg = self.outbox.get(timeout=wait)
            except queue.Empty:
                self._check_alive()
                waited += wait
                if patience_s is not None and waited >= patience_s:
                    return None
                if deadline is not None and time.monotonic() > deadline:
                    self._fail(0, "ranks did not start in time")
                continue
            return self._check(msg)

    def _check_alive(self) -> None:
        dead = [r for r, p in enumerate(self.procs) if p.exitcode is not None]
        if dead:
            self._fail(dead[0], f"process exited with code {self.procs[dead[0]].exitcode}")

    def _check(self, msg):
        """`msg`, unless it reports a rank's error: then RankFailedError naming the rank."""
        if msg[0] == "error":
            # a rank that died takes its peers' collectives down with it: name the one that died
            time.sleep(POLL_S)
            dead = [r for r, p in enumerate(self.procs) if p.exitcode not in (None, 1)]
            if dead:
                self._fail(dead[0], f"process exited with code {self.procs[dead[0]].exitcode} "
                                    f"(rank {msg[1]} then failed: {msg[2].splitlines()[0]})")
            self._fail(msg[1], msg[2])
        return msg

    def _fail(self, rank: int, detail: str) -> None:
        self.shutdown(force=True)
        raise RankFailedError(rank, detail)

    def shutdown(self, force: bool = False) -> None:
        if self._closed:
            return
        self._closed = True
        if not force:
            self._broadcast(("stop", None))
            for p in self.procs:
                p.join(timeout=30)
        for p in self.procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=5)

