"""Soak test of `deepinfer serve`: many mixed requests (completions, chat, streaming, JSON schema,
client aborts, bad requests) at a fixed concurrency; checks zero 5xx, zero leaked KV blocks or
request slots at the end (/metrics), and the server's RSS growth after warm-up.

    python tools/soak.py --device cuda --num-requests 10000 --concurrency 64 --json-out soak.json
    python tools/soak.py --device cpu --num-requests 10000 --duration-s 540     # as many as fit

Exit status 0 when every check passes. RSS is sampled once the first --warmup-share of the
requests is done (allocator pools, grammar cache and prefix cache warm) and again at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

MODEL = "soak"
SCHEMA = {"type": "object", "properties": {"id": {"type": "integer"}, "tag": {"type": "string", "maxLength": 8}},
          "required": ["id"], "additionalProperties": False}
PROMPTS = ["def add(a, b):", "class Stack:", "import os\n", "def parse(line):", "for i in range(",
           "with open(path) as f:", "try:\n    ", "def __repr__(self):"]
BAD = [b'{"model": "soak", "prompt": ', {"model": "soak", "prompt": "x", "temperature": "hot"},
       {"model": "nope", "prompt": "x"}, {"model": "soak", "prompt": "x", "max_tokens": 0},
       {"model": "soak", "prompt": "x", "top_p": 2}, {"model": "soak", "messages": []},
       {"model": "soak", "prompt": "x", "response_format": {"type": "regex", "regex": "(unclosed"}},
       {"model": "soak", "prompt": list(range(5000))}, {"model": "soak", "prompt": "x", "n": 99}]


def pick(rng: random.Random, max_tokens: int) -> tuple[str, str, object]:
    """(kind, path, body) of one request."""
    u = rng.random()
    n = rng.randint(1, max_tokens)
    base = {"model": MODEL, "max_tokens": n, "temperature": rng.choice([0, 0.7]), "seed": rng.randrange(1 << 32)}
    if u < 0.15:
        return "bad", "/v1/chat/completions" if rng.random() < 0.2 else "/v1/completions", rng.choice(BAD)
    if u < 0.30:
        return "abort", "/v1/completions", {**base, "prompt": rng.choice(PROMPTS), "max_tokens": 64,
                                            "ignore_eos": True, "stream": True}
    if u < 0.40:
        return "json", "/v1/chat/completions", {**base, "max_tokens": 24, "messages": [
            {"role": "user", "content": rng.choice(PROMPTS)}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": SCHEMA}}}
    if u < 0.55:
        return "chat", "/v1/chat/completions", {**base, "messages": [{"role": "user", "content": rng.choice(PROMPTS)}],
                                                "stream": rng.random() < 0.5}
    return "completion", "/v1/completions", {**base, "prompt": rng.choice(PROMPTS), "stream": rng.random() < 0.5,
                                             "n": rng.choice([1, 1, 2])}


async def one(client, kind: str, path: str, body) -> int:
    kw = {"content": body, "headers": {"content-type": "application/json"}} if isinstance(body, bytes) else {"json": body}
    if isinstance(body, dict) and body.get("stream"):
        async with client.stream("POST", path, **kw) as r:
            if kind == "abort" and r.status_code == 200:
                async for _ in r.aiter_lines():
                    break   # the first event, then close the connection mid-stream
                return r.status_code
            await r.aread()
            return r.status_code
    r = await client.post(path, **kw)
    return r.status_code


async def drive(args, base_url: str, server) -> dict:
    import httpx
    rng = random.Random(args.seed)
    statuses: Counter = Counter()
    kinds: Counter = Counter()
    done = 0
    rss_warm = None
    deadline = time.monotonic() + args.duration_s
    queue: asyncio.Queue = asyncio.Queue()
    for _ in range(args.num_requests):
        queue.put_nowait(pick(rng, args.max_tokens))

    async def worker(client):
        nonlocal done, rss_warm
        while not queue.empty() and time.monotonic() < deadline:
            kind, path, body = queue.get_nowait()
            try:
                status = await one(client, kind, path, body)
            except httpx.HTTPError as err:
                status = f"transport:{type(err).__name__}"
            statuses[status] += 1
            kinds[kind] += 1
            done += 1
            if rss_warm is None and done >= args.warmup_share * args.num_requests and server is not None:
                rss_warm = server.rss_bytes()

    async with httpx.AsyncClient(base_url=base_url, timeout=600,
                                 limits=httpx.Limits(max_connections=args.concurrency * 2)) as client:
        t = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(args.concurrency)))
        wall = time.perf_counter() - t
    return {"done": done, "wall_s": wall, "statuses": {str(k): v for k, v in statuses.items()}, "kinds": dict(kinds),
            "rss_warm": rss_warm}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--device", default=None)
    ap.add_argument("--url", default=None, help="an already running server named 'soak' (default: start one)")
    ap.add_argument("--num-requests", type=int, default=10000)
    ap.add_argument("--duration-s", type=float, default=float("inf"), help="stop sending after this long")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--warmup-share", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--server-args", default="--block-size 16 --max-model-len 512")
    ap.add_argument("--json-out", type=Path, default=None)
    ap.add_argument("--server-log", type=Path, default=Path(tempfile.gettempdir()) / "deepinfer_soak_server.log")
    args = ap.parse_args(argv)
    import shlex

    from deepinfer_engine.serving.launch import ServerProcess, scrape
    server = None
    if args.url is None:
        extra = ([args.model] if args.model else []) + (["--device", args.device] if args.device else [])
        server = ServerProcess(extra + ["--served-model-name", MODEL, "--max-num-seqs", str(args.concurrency * 2),
                                        "--log-interval", "30", *shlex.split(args.server_args)],
                               log_path=args.server_log).start()
    base_url = args.url or server.base_url
    try:
        res = asyncio.run(drive(args, base_url, server))
        deadline = time.monotonic() + 120
        while True:   # the last aborts and finishes settle
            m = scrape(base_url)
            idle = m["deepinfer_kv_blocks_used"] == 0 and m["deepinfer_request_slots_used"] == 0 \
                and m["deepinfer_num_requests_live"] == 0
            if idle or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        rss_end = server.rss_bytes() if server is not None else None
        healthy = __import__("urllib.request").request.urlopen(base_url + "/health").status == 200
    finally:
        if server is not None:
            server.stop()
    num_5xx = sum(v for k, v in res["statuses"].items() if k.startswith("5") or k.startswith("transport"))
    growth = (rss_end / res["rss_warm"] - 1) if rss_end and res["rss_warm"] else None
    summary = {**res, "rss_end": rss_end, "rss_growth": growth, "num_5xx_or_transport": num_5xx,
               "kv_blocks_used_end": m["deepinfer_kv_blocks_used"], "slots_used_end": m["deepinfer_request_slots_used"],
               "aborts": m.get("deepinfer_aborts_total"), "healthy_end": healthy,
               "requests_per_s": res["done"] / res["wall_s"],
               "requests_live_end": m["deepinfer_num_requests_live"]}
    ok = num_5xx == 0 and idle and healthy and (growth is None or growth < 0.05)
    summary["pass"] = ok
    print(json.dumps(summary, indent=1))
    if args.json_out:
        args.json_out.write_text(json.dumps(summary, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
