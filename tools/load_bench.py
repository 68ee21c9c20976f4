"""Open-loop load benchmark of `deepinfer serve` (and, with --compare-offline, of `LLM.generate` on
the same workload in the same run).

    python tools/load_bench.py --device cuda --rates 4,16,64,inf --num-requests 512 \\
        --compare-offline --json-out load.json --plot load.png

Workload (fixed by --seed): each request draws a prompt length from --prompt-lens and an output
length from --output-lens (token-id prompts cut from the Python standard library's source, greedy,
EOS ignored so every request emits exactly its output length); a --json-share of the requests
carry a JSON-schema response_format instead (they end when the JSON completes). Arrivals are
Poisson at each --rates value (requests/s; "inf" = all at once: saturation). Each request streams
(SSE, logprobs=0 so every chunk counts its tokens) and records TTFT (send -> first token) and
ITL (chunk gap / tokens in the chunk). The requests are sent and read by --client-processes
processes (one Python client parses at most ~10K streamed tokens/s), on one shared clock.

Reported per rate: request and output-token throughput, TTFT and ITL p50 / p99. With
--compare-offline the same requests run through `LLM.generate` in a fresh subprocess first (the
server is started afterwards, so both own the whole device in turn), and the saturation row
gives server / offline throughput. The server's per-token overhead against the engine step is
read from its /metrics: wall time per output token at saturation minus the engine's step time
per output token (deepinfer_engine_step_seconds / deepinfer_generation_tokens).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import math
import random
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 24},
                                           "size": {"type": "integer"}, "tags": {"type": "array", "items": {
                                               "type": "string", "maxLength": 12}, "maxItems": 4}},
          "required": ["name", "size"], "additionalProperties": False}


@dataclass
class Req:
    prompt: list[int]
    max_tokens: int
    json_schema: bool


@dataclass
class Result:
    ok: bool
    status: int = 200
    send: float = 0.0
    first: float | None = None
    end: float = 0.0
    tokens: int = 0
    itl: list[float] = field(default_factory=list)


def tokenizer_and_vocab(model: str | None):
    """(HF tokenizers.Tokenizer | None, vocab size) of a model, without loading its weights."""
    from tokenizers import Tokenizer

    from deepinfer_engine.model_loader import DEFAULT_MODEL_DIR, PRESET_PREFIX
    if model is not None and model.startswith(PRESET_PREFIX):
        from deepinfer_model import presets
        return None, presets.get_preset(model[len(PRESET_PREFIX):]).vocab_size
    d = Path(model) if model else DEFAULT_MODEL_DIR
    cfg = json.loads((d / "config.json").read_text())
    vocab = cfg.get("text_config", cfg).get("vocab_size", cfg.get("vocab_size"))
    tok = d / "tokenizer.json"
    return (Tokenizer.from_file(str(tok)) if tok.exists() else None), vocab


def workload(args) -> list[Req]:
    tokenizer, vocab_size = tokenizer_and_vocab(args.model)
    rng = random.Random(args.seed)
    corpus: list[int] = []
    if tokenizer is not None:
        import inspect
        import json as json_mod
        import os
        for mod in (os, json_mod, inspect, argparse, datetime):
            corpus += tokenizer.encode(inspect.getsource(mod), add_special_tokens=False).ids
    else:
        corpus = [rng.randrange(vocab_size) for _ in range(200_000)]
    plens = [int(x) for x in args.prompt_lens.split(",")]
    olens = [int(x) for x in args.output_lens.split(",")]
    reqs = []
    for _ in range(args.num_requests):
        p = rng.choice(plens)
        start = rng.randrange(0, len(corpus) - p)
        reqs.append(Req(corpus[start: start + p], rng.choice(olens),
                        tokenizer is not None and rng.random() < args.json_share))
    return reqs


def _body(args, r: Req, stream: bool) -> dict:
    body = {"model": args.served_model_name, "prompt": r.prompt, "max_tokens": r.max_tokens, "temperature": 0}
    if r.json_schema:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "rec", "schema": SCHEMA}}
    else:
        body["ignore_eos"] = True
    if stream:
        body.update(stream=True, logprobs=0)
    return body


async def _one(client, args, r: Req, delay: float, t0: float) -> Result:
    await asyncio.sleep(max(0.0, t0 + delay - time.perf_counter()))
    res = Result(ok=False, send=time.perf_counter())
    last = None
    async with client.stream("POST", "/v1/completions", json=_body(args, r, True)) as resp:
        res.status = resp.status_code
        if resp.status_code != 200:
            await resp.aread()
            res.end = time.perf_counter()
            return res
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            now = time.perf_counter()
            chunk = json.loads(line[6:])
            if "error" in chunk or not chunk.get("choices"):
                continue
            lp = chunk["choices"][0].get("logprobs")
            n = len(lp["tokens"]) if lp else 0
            if n == 0:
                continue
            if res.first is None:
                res.first = now
            elif last is not None:
                res.itl += [(now - last) / n] * n
            last = now
            res.tokens += n
    res.end = time.perf_counter()
    res.ok = True
    return res


def arrival_delays(args, n: int, rate: float) -> list[float]:
    """Poisson arrival offsets (s) of n requests at `rate` requests/s (all 0 at "inf")."""
    rng = random.Random(args.seed + 1)
    delays, t = [], 0.0
    for _ in range(n):
        delays.append(t)
        t += 0.0 if math.isinf(rate) else rng.expovariate(rate)
    return delays


async def _send_all(args, base_url: str, reqs: list[Req], delays: list[float], t0: float) -> list[Result]:
    import httpx
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=base_url, timeout=3600, limits=limits) as client:
        return await asyncio.gather(*(_one(client, args, r, d, t0) for r, d in zip(reqs, delays)))


def _client_process(args, base_url: str, reqs: list[Req], delays: list[float],
                    go_at: float) -> tuple[list[Result], float]:
    """One client process's share; `go_at` (time.time()) is the shared t0 of the arrivals.
    -> (results, time.time() at the end)."""
    t0 = time.perf_counter() + (go_at - time.time())
    results = asyncio.run(_send_all(args, base_url, reqs, delays, t0))
    return results, time.time()


def run_rate(args, base_url: str, reqs: list[Req], rate: float) -> tuple[list[Result], float]:
    """Every request at its arrival time, from --client-processes processes (request i from process
    i mod k): one Python process parses at most ~10K streamed tokens/s, below a GPU's output.
    -> (results in request order, seconds from t0 to the last response's end)."""
    delays = arrival_delays(args, len(reqs), rate)
    k = max(1, min(args.client_processes, len(reqs)))
    if k == 1:
        t0 = time.perf_counter()
        results = asyncio.run(_send_all(args, base_url, reqs, delays, t0))
        return results, time.perf_counter() - t0
    import concurrent.futures
    import multiprocessing
    with concurrent.futures.ProcessPoolExecutor(k, mp_context=multiprocessing.get_context("spawn")) as pool:
        list(pool.map(time.sleep, [0.0] * k))   # every process is up before t0
        go_at = time.time() + 0.2
        parts = pool.map(_client_process, [args] * k, [base_url] * k, [reqs[i::k] for i in range(k)],
                         [delays[i::k] for i in range(k)], [go_at] * k)
        results: list[Result | None] = [None] * len(reqs)
        ends = []
        for i, (part, end) in enumerate(parts):
            results[i::k] = part
            ends.append(end)
    return results, max(ends) - go_at


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def offline_worker(args) -> None:
    """In a fresh process: the same requests through LLM.generate; prints one JSON line."""
    from deepinfer_engine import LLM, SamplingParams
    from deepinfer_engine.structured_output.spec import StructuredOutput
    llm = LLM(args.model, **engine_kwargs(args))
    reqs = workload(args)
    params = [SamplingParams(temperature=0, max_tokens=r.max_tokens, ignore_eos=not r.json_schema,
                             structured_output=StructuredOutput.json_schema(SCHEMA) if r.json_schema else None)
              for r in reqs]
    warm = min(len(reqs), 16)
    llm.generate(prompt_token_ids=[r.prompt for r in reqs[:warm]], sampling_params=params[:warm], use_tqdm=False)
    t = time.perf_counter()
    outs = llm.generate(prompt_token_ids=[r.prompt for r in reqs], sampling_params=params, use_tqdm=False)
    wall = time.perf_counter() - t
    tokens = sum(len(o.token_ids) for o in outs)
    print(json.dumps({"wall_s": wall, "tokens": tokens, "requests": len(outs)}), flush=True)


def engine_kwargs(args) -> dict:
    kw = {"device": args.device, "max_num_seqs": args.max_num_seqs, "block_size": args.block_size}
    if args.max_model_len:
        kw["max_model_len"] = args.max_model_len
    if args.num_speculative_tokens is not None:
        kw["num_speculative_tokens"] = args.num_speculative_tokens
    return kw


def server_args(args) -> list[str]:
    a = ([args.model] if args.model else []) + ["--served-model-name", args.served_model_name,
                                                "--max-num-seqs", str(args.max_num_seqs), "--log-interval", "10",
                                                "--block-size", str(args.block_size)]
    if args.device:
        a += ["--device", args.device]
    if args.max_model_len:
        a += ["--max-model-len", str(args.max_model_len)]
    if args.num_speculative_tokens is not None:
        a += ["--num-speculative-tokens", str(args.num_speculative_tokens)]
    return a + shlex.split(args.server_args)


def plot(rows_by_rate, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rates = [r for r, _ in rows_by_rate]
    xs = [r if not math.isinf(r) else max([x for x in rates if not math.isinf(x)] + [1]) * 2 for r in rates]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, title in ((axes[0], "ttft", "TTFT"), (axes[1], "itl", "inter-token latency")):
        for q in ("p50", "p99"):
            ax.plot(xs, [s[f"{key}_{q}_ms"] for _, s in rows_by_rate], marker="o", label=q)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("request rate (req/s; rightmost = all at once)")
        ax.set_ylabel("ms")
        ax.set_title(title)
        ax.legend()
        ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--served-model-name", default="bench")
    ap.add_argument("--device", default=None)
    ap.add_argument("--url", default=None, help="an already running server (default: start one)")
    ap.add_argument("--server-args", default="", help="extra `deepinfer serve` arguments (the server only: "
                    "engine settings shared with the offline run have their own flags)")
    ap.add_argument("--rates", default="2,8,inf")
    ap.add_argument("--num-requests", type=int, default=64)
    ap.add_argument("--prompt-lens", default="32,128,512")
    ap.add_argument("--output-lens", default="16,64,128")
    ap.add_argument("--json-share", type=float, default=0.1)
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument("--max-model-len", type=int, default=None)
    ap.add_argument("--block-size", type=int, default=128)
    ap.add_argument("--num-speculative-tokens", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--client-processes", type=int, default=4,
                    help="processes that send the requests and read the streams (one tops out near 10K tokens/s)")
    ap.add_argument("--compare-offline", action="store_true")
    ap.add_argument("--json-out", type=Path, default=None)
    ap.add_argument("--plot", type=Path, default=None)
    ap.add_argument("--server-log", type=Path, default=Path(tempfile.gettempdir()) / "deepinfer_load_bench_server.log")
    ap.add_argument("--offline-worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.offline_worker:
        offline_worker(args)
        return 0
    command = "python tools/load_bench.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
    offline = None
    if args.compare_offline:
        worker = [sys.executable, __file__, "--offline-worker"] + [a for a in (argv or sys.argv[1:])
                                                                   if a != "--compare-offline"]
        out = subprocess.run(worker, check=True, capture_output=True, text=True).stdout.strip().splitlines()
        offline = json.loads(out[-1])
        print(f"offline LLM.generate: {offline['tokens'] / offline['wall_s']:.1f} tok/s "
              f"({offline['requests']} requests, {offline['wall_s']:.2f} s)", flush=True)
    from deepinfer_engine.serving.launch import ServerProcess, scrape
    server = None
    if args.url is None:
        server = ServerProcess(server_args(args), log_path=args.server_log).start()
    base_url = args.url or server.base_url
    try:
        reqs = workload(args)
        run_rate(args, base_url, reqs[: min(16, len(reqs))], math.inf)   # warm-up
        device = _device_name(args.device)
        rows, by_rate, sat = [], [], None
        for rate in [float(x) for x in args.rates.split(",")]:
            before = scrape(base_url)
            results, wall = run_rate(args, base_url, reqs, rate)
            after = scrape(base_url)
            ok = [r for r in results if r.ok]
            tokens = sum(r.tokens for r in ok)
            s = {"rate": rate, "wall_s": wall, "tok_s": tokens / wall, "req_s": len(ok) / wall,
                 "errors": len(results) - len(ok),
                 "ttft_p50_ms": 1e3 * pct([r.first - r.send for r in ok if r.first], 50),
                 "ttft_p99_ms": 1e3 * pct([r.first - r.send for r in ok if r.first], 99),
                 "itl_p50_ms": 1e3 * pct([x for r in ok for x in r.itl], 50),
                 "itl_p99_ms": 1e3 * pct([x for r in ok for x in r.itl], 99)}
            step_s = after["deepinfer_engine_step_seconds_sum"] - before["deepinfer_engine_step_seconds_sum"]
            gen = after["deepinfer_generation_tokens_total"] - before["deepinfer_generation_tokens_total"]
            s["engine_step_ms_per_token"] = 1e3 * step_s / gen if gen else float("nan")
            s["wall_ms_per_token"] = 1e3 * wall / tokens if tokens else float("nan")
            by_rate.append((rate, s))
            print(json.dumps(s), flush=True)
            name = "inf" if math.isinf(rate) else f"{rate:g}"
            for what, unit in (("tok_s", "tok/s"), ("req_s", "req/s"), ("ttft_p50_ms", "ms"), ("ttft_p99_ms", "ms"),
                               ("itl_p50_ms", "ms"), ("itl_p99_ms", "ms"), ("errors", "count")):
                rows.append(_row("load_bench", f"rate={name} {what}", s[what], unit, device, date, command))
            if math.isinf(rate):
                sat = s
        if sat is not None:
            overhead = sat["wall_ms_per_token"] - sat["engine_step_ms_per_token"]
            rows.append(_row("load_bench", "saturation server overhead per token", overhead, "ms", device, date,
                             command, "engine step per token", sat["engine_step_ms_per_token"]))
            if offline is not None:
                off = offline["tokens"] / offline["wall_s"]
                rows.append(_row("load_bench", "saturation throughput vs offline LLM.generate", sat["tok_s"],
                                 "tok/s", device, date, command, "offline LLM.generate", off))
                print(f"saturation: server {sat['tok_s']:.1f} tok/s = {100 * sat['tok_s'] / off:.1f}% of offline "
                      f"{off:.1f} tok/s", flush=True)
        if args.json_out:
            args.json_out.write_text(json.dumps(rows, indent=1))
        if args.plot:
            plot(by_rate, args.plot)
    finally:
        if server is not None:
            server.stop()
    return 0


def _row(group, what, value, unit, device, date, command, baseline=None, baseline_value=None) -> dict:
    ratio = value / baseline_value if baseline_value else None
    return {"group": group, "what": what, "value": value, "unit": unit, "baseline": baseline,
            "baseline_value": baseline_value, "ratio": ratio, "device": device, "date": date, "command": command}


def _device_name(device: str | None) -> str:
    import torch
    if (device or ("cuda" if torch.cuda.is_available() else "cpu")).startswith("cuda"):
        return torch.cuda.get_device_name(0)
    return "cpu"


if __name__ == "__main__":
    sys.exit(main())
