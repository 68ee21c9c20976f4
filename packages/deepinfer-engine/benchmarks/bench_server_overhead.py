"""The server's own cost per streamed token, without a model: `deepinfer serve`'s app (the AsyncLLM
loop thread, FastAPI + uvicorn, SSE, the metrics) over a paced engine, against the same engine
stepped alone in the same run.

The paced engine gives every live request `tokens_per_step` tokens per step after `step_ms` of
"device time" (a sleep: the GIL is free, as while the engine thread waits for a CUDA step). So
the engine alone runs at exactly batch x tokens_per_step / step_ms tokens/s and everything the
server adds shows as the ratio server / alone: the Python work that does not hide under the step
(the loop thread's hand-over, the event loop's SSE, the GIL between them). The client (httpx, in
this process) reads every chunk of every stream, as tools/load_bench.py does.

    pytest packages/deepinfer-engine/benchmarks/bench_server_overhead.py --benchmark-only -q -s
    python packages/deepinfer-engine/benchmarks/bench_server_overhead.py --step-ms 2 --tokens-per-step 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass

import pytest

from deepinfer_engine.outputs import GenerationOutput, StreamDelta
from deepinfer_engine.request_validation import CheckedPrompt, validate_request
from deepinfer_engine.sampling_params import SamplingParams
from deepinfer_engine.stats import EngineGauges, EngineStats

VOCAB = 32000


class PacedEngine:
    """The engine interface AsyncLLM and the server use. Each step: admit up to `max_num_seqs`
    requests, sleep `step_ms`, give each running request `tokens_per_step` tokens (logprob -1)."""

    def __init__(self, step_ms: float, tokens_per_step: int = 1, max_num_seqs: int = 64):
        self.step_s, self.k, self.max_num_seqs = step_ms / 1e3, tokens_per_step, max_num_seqs
        self.tokenizer, self.vocab_size, self.max_model_len = None, VOCAB, 1 << 16
        self.stats = EngineStats()
        self._next_id = 0
        self._waiting: list[tuple[GenerationOutput, int]] = []
        self._running: dict[int, tuple[GenerationOutput, int]] = {}
        self._deltas: list[StreamDelta] | None = None
        self._finished_aborts: list[GenerationOutput] = []

    def validate_request(self, prompt, prompt_token_ids, params: SamplingParams) -> CheckedPrompt:
        return validate_request(prompt, prompt_token_ids, params, tokenizer=None, vocab_size=VOCAB)

    def add_request(self, prompt, prompt_token_ids, params: SamplingParams) -> int:
        rid, self._next_id = self._next_id, self._next_id + 1
        ids = self.validate_request(prompt, prompt_token_ids, params).token_ids
        self._waiting.append((GenerationOutput(rid, prompt, ids, token_logprobs=[]), params.max_tokens))
        return rid

    def abort_request(self, request_id: int) -> bool:
        entry = self._running.pop(request_id, None)
        if entry is None:
            hit = [w for w in self._waiting if w[0].request_id == request_id]
            if not hit:
                return False
            self._waiting.remove(hit[0])
            entry = hit[0]
        entry[0].finish_reason = "abort"
        self._finished_aborts.append(entry[0])
        return True

    def has_unfinished(self) -> bool:
        return bool(self._waiting or self._running or self._finished_aborts)

    def step(self) -> list[GenerationOutput]:
        while self._waiting and len(self._running) < self.max_num_seqs:
            out, limit = self._waiting.pop(0)
            self._running[out.request_id] = (out, limit)
        finished, self._finished_aborts = self._finished_aborts, []
        for out in finished:
            self._emit(out, [])
        time.sleep(self.step_s)
        self.stats.num_steps += 1
        for rid, (out, limit) in list(self._running.items()):
            new = [7] * min(self.k, limit - len(out.token_ids))
            out.token_ids += new
            out.token_logprobs += [-1.0] * len(new)
            self.stats.num_generated_tokens += len(new)
            if len(out.token_ids) >= limit:
                out.finish_reason = "length"
                del self._running[rid]
                finished.append(out)
            self._emit(out, new)
        return finished

    def _emit(self, out: GenerationOutput, new: list[int]) -> None:
        if self._deltas is not None:
            self._deltas.append(StreamDelta(-1, out.request_id, "", new, out.finish_reason is not None, out))

    def start_streaming(self, index_of=None) -> None:
        self._deltas = []

    def stop_streaming(self) -> None:
        self._deltas = None

    def pop_stream_deltas(self) -> list[StreamDelta]:
        deltas, self._deltas = self._deltas or [], [] if self._deltas is not None else None
        return deltas

    def gauges(self) -> EngineGauges:
        n = len(self._running)
        return EngineGauges(n, len(self._waiting), 0, 1024, 1024 - n, 0, self.stats, [])


@dataclass(frozen=True)
class Workload:
    step_ms: float = 2.0
    tokens_per_step: int = 1
    batch: int = 64                  # requests the engine runs at once
    num_requests: int = 256
    max_tokens: int = 64

    def engine(self) -> PacedEngine:
        return PacedEngine(self.step_ms, self.tokens_per_step, self.batch)


def engine_alone(w: Workload) -> float:
    """Tokens/s of the paced engine stepped in a loop (streaming on, as under the server)."""
    eng = w.engine()
    eng.start_streaming()
    params = SamplingParams(max_tokens=w.max_tokens)
    for _ in range(w.num_requests):
        eng.add_request(None, [1, 2, 3], params)
    t, tokens = time.perf_counter(), 0
    while eng.has_unfinished():
        eng.step()
        tokens += sum(len(d.token_ids) for d in eng.pop_stream_deltas())
    return tokens / (time.perf_counter() - t)


def serve(w: Workload, port: int, switch_interval_s: float | None, api_workers: int = 1) -> None:
    """The server process: the real app over a PacedEngine (in this process, or in `api_workers`
    HTTP worker processes linked to it, as `deepinfer serve --api-workers`)."""
    import uvicorn

    from deepinfer_engine.serving.app import build_app, make_state
    from deepinfer_engine.serving.async_llm import AsyncLLM
    from deepinfer_engine.serving.metrics import ServingMetrics
    if switch_interval_s is not None:
        sys.setswitchinterval(switch_interval_s)
    metrics = ServingMetrics(log_interval_s=0)
    llm = AsyncLLM(w.engine(), observer=metrics)
    if api_workers == 1:
        app = build_app(make_state(llm, "paced", "", metrics))
        uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)
        return
    from deepinfer_engine.serving.engine_link import ServerInfo
    from deepinfer_engine.serving.worker_hub import serve_api_workers
    serve_api_workers(llm, metrics, ServerInfo("paced", "", None, VOCAB, 1 << 16, 256), api_workers,
                      host="127.0.0.1", port=port, log_level="warning", access_log=False)


async def _stream_one(client, w: Workload) -> int:
    body = {"model": "paced", "prompt": [1, 2, 3], "max_tokens": w.max_tokens, "stream": True, "logprobs": 0}
    tokens = 0
    async with client.stream("POST", "/v1/completions", json=body) as resp:
        assert resp.status_code == 200, resp.status_code
        async for line in resp.aiter_lines():
            if line.startswith("data: {"):
                lp = json.loads(line[6:])["choices"][0].get("logprobs")
                tokens += len(lp["tokens"]) if lp else 0
    return tokens


async def _streams(base_url: str, w: Workload, n: int) -> tuple[int, float, float]:
    """n streams at once -> (tokens read, start, end) on the wall clock."""
    import httpx
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=base_url, timeout=600, limits=limits) as client:
        start = time.time()
        counts = await asyncio.gather(*(_stream_one(client, w) for _ in range(n)))
        end = time.time()
    assert counts == [w.max_tokens] * n   # every token of every stream arrived
    return sum(counts), start, end


def _client_process(base_url: str, w: Workload, n: int, go_at: float) -> tuple[int, float, float]:
    time.sleep(max(0.0, go_at - time.time()))
    return asyncio.run(_streams(base_url, w, n))


def _saturate(base_url: str, w: Workload, clients: int, server_pid: int) -> tuple[float, float]:
    """All requests at once from `clients` processes (one Python client reads at most ~10K tokens/s
    on this machine's cores) -> (tokens/s, server CPU seconds per token)."""
    import concurrent.futures
    import multiprocessing
    asyncio.run(_streams(base_url, w, 8))   # warm-up
    share = [w.num_requests // clients + (i < w.num_requests % clients) for i in range(clients)]
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(clients, mp_context=ctx) as pool:
        list(pool.map(time.sleep, [0.0] * clients))   # the workers are up before the clock starts
        go_at = time.time() + 0.5
        runs = pool.map(_client_process, [base_url] * clients, [w] * clients, share, [go_at] * clients)
        time.sleep(max(0.0, go_at - time.time()))
        from deepinfer_engine.serving.launch import process_tree
        pids = process_tree(server_pid)   # the engine process first, then its API workers
        cpu0 = [_cpu_s(p) for p in pids]
        parts = list(runs)
        cpu = [_cpu_s(p) - c for p, c in zip(pids, cpu0)]
    tokens = sum(p[0] for p in parts)
    if len(pids) > 1:
        print(f"  server CPU per token: engine process {1e6 * cpu[0] / tokens:.1f} us, API workers "
              f"{1e6 * sum(cpu[1:]) / tokens:.1f} us", flush=True)
    return tokens / (max(p[2] for p in parts) - min(p[1] for p in parts)), sum(cpu) / tokens


def _cpu_s(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")   # utime + stime


def _wait_healthy(base_url: str, proc: subprocess.Popen, timeout_s: float) -> None:
    import urllib.request
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"server exited with {proc.returncode}"
        try:
            with urllib.request.urlopen(base_url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"server not healthy after {timeout_s:g} s")


def through_server(w: Workload, clients: int = 2, switch_interval_s: float | None = None, api_workers: int = 1) -> float:
    """Tokens/s the clients read from a server process over the paced engine, all requests at once."""
    from deepinfer_engine.serving.launch import free_port
    port = free_port()
    cmd = [sys.executable, __file__, "--serve", str(port), "--step-ms", str(w.step_ms),
           "--tokens-per-step", str(w.tokens_per_step), "--batch", str(w.batch), "--api-workers", str(api_workers)]
    if switch_interval_s is not None:
        cmd += ["--switch-interval", str(switch_interval_s)]
    proc = subprocess.Popen(cmd)
    try:
        base = f"http://127.0.0.1:{port}"
        _wait_healthy(base, proc, timeout_s=120)
        tok_s, cpu_per_token = _saturate(base, w, clients, proc.pid)
        print(f"  server CPU {1e6 * cpu_per_token:.1f} us per token ({clients} client processes, "
              f"{api_workers} API process{'es' if api_workers > 1 else ''})", flush=True)
        return tok_s
    finally:
        proc.terminate()
        proc.wait(timeout=30)


CASES = [Workload(step_ms=2.0, tokens_per_step=1, num_requests=192), Workload(step_ms=2.0, tokens_per_step=3, num_requests=192),
         Workload(step_ms=8.0, tokens_per_step=3, num_requests=192)]


@pytest.mark.parametrize("w", CASES, ids=lambda w: f"{w.step_ms:g}ms-x{w.tokens_per_step}-b{w.batch}")
def test_server_vs_engine_alone(benchmark, w):
    pytest.importorskip("fastapi")
    alone = engine_alone(w)
    served = benchmark.pedantic(lambda: through_server(w, clients=3), rounds=1, iterations=1)
    benchmark.extra_info.update(engine_alone_tok_s=alone, server_tok_s=served, ratio=served / alone)
    print(f"\n{w}: server {served:.0f} tok/s vs engine alone {alone:.0f} tok/s = {served / alone:.3f}")
    assert served > 0


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--step-ms", type=float, default=2.0)
    ap.add_argument("--tokens-per-step", type=int, default=1)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--num-requests", type=int, default=256)
    ap.add_argument("--clients", type=int, default=2, help="client processes")
    ap.add_argument("--switch-interval", type=float, default=None, help="sys.setswitchinterval in the server (s)")
    ap.add_argument("--api-workers", type=int, default=1, help="HTTP worker processes (deepinfer serve --api-workers)")
    ap.add_argument("--serve", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    w = Workload(args.step_ms, args.tokens_per_step, args.batch, args.num_requests)
    if args.serve is not None:
        serve(w, args.serve, args.switch_interval, args.api_workers)
        return
    alone = engine_alone(w)
    served = through_server(w, args.clients, args.switch_interval, args.api_workers)
    print(f"{w}: server {served:.0f} tok/s vs engine alone {alone:.0f} tok/s = {served / alone:.3f}")


if __name__ == "__main__":
    main()
