"""Multi-turn chat replay: prefix-cache hit rate and warm / cold TTFT, measured in one run.

Workload (deterministic in --seed): `--conversations` chats share a system prompt of
`--system-tokens` ids; turn t of chat c sends the whole history (system + earlier user turns and
the model's replies) plus a new user message of `--user-tokens` ids, and the model answers with
`--max-tokens` greedy tokens (EOS ignored, so every reply has the same length). All chats of one
turn are submitted together; turn t + 1 starts when every reply of turn t is complete.

The replay runs twice in this process on two engines over the same weights: "cold" with prefix
caching off, "warm" with it on; each engine first replays a 2-turn chat of other tokens (warm-up:
kernels and graphs for whole prompts and for cached prefixes), then runs the system prompt once
(the warm engine starts with it cached, as a server whose system prompt is hot). Reported:
- the warm run's input-token hit rate = prompt tokens served from the prefix cache / prompt tokens
  (`EngineStats.num_prefix_cached_tokens`), every turn counted;
- TTFT = time from a turn's submission to each request's first streamed token, averaged over
  turns 2.. and chats, warm / cold (turn 1 only warms the system prompt);
- whether warm and cold produced the same tokens (greedy; equal under batch invariance).

    python tools/chat_replay.py --json-out chat_replay.jsonl                      # the H200 run
    python tools/chat_replay.py --conversations 4 --turns 3 --system-tokens 256 \\
        --user-tokens 16 --max-tokens 8 --block-size 32                            # CPU smoke test
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import sys
import time
from dataclasses import dataclass, field

import numpy as np


@dataclass
class ReplayResult:
    prompt_tokens: int = 0
    cached_tokens: int = 0
    ttft_s: list[list[float]] = field(default_factory=list)   # [turn][chat] seconds
    replies: list[list[list[int]]] = field(default_factory=list)   # [turn][chat] output ids

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def mean_ttft_s(self, first_turn: int = 1) -> float:
        return float(np.mean([t for turn in self.ttft_s[first_turn:] for t in turn]))


def make_conversations(args, vocab_size: int) -> tuple[list[int], list[list[list[int]]]]:
    """-> (system prompt ids, user messages [chat][turn] ids), ids in [16, vocab) (no special ids)."""
    rng = np.random.default_rng(args.seed)
    system = rng.integers(16, vocab_size, args.system_tokens).tolist()
    users = [[rng.integers(16, vocab_size, args.user_tokens).tolist() for _ in range(args.turns)]
             for _ in range(args.conversations)]
    return system, users


def trace_steps(engine) -> list[float]:
    """Wrap `engine.step` to record each step's wall milliseconds (appended to the returned list)."""
    times: list[float] = []
    step = engine.step

    def timed_step():
        t = time.perf_counter()
        out = step()
        times.append(1e3 * (time.perf_counter() - t))
        return out

    engine.step = timed_step
    return times


def replay(llm, system: list[int], users: list[list[list[int]]], max_tokens: int,
           step_ms: list[float] | None = None) -> ReplayResult:
    """`step_ms`: the list `trace_steps` fills; then each turn prints the steps up to its last first token."""
    from deepinfer_engine import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    history = [list(system) for _ in users]
    res = ReplayResult()
    stats = llm.engine.stats
    for t in range(len(users[0])):
        prompts = [h + u[t] for h, u in zip(history, users, strict=True)]
        cached_before = stats.num_prefix_cached_tokens
        first: dict[int, float] = {}
        replies: list[list[int]] = [[] for _ in prompts]
        start = time.perf_counter()
        steps_before = len(step_ms) if step_ms is not None else 0
        for d in llm.generate_stream(prompt_token_ids=prompts, sampling_params=params):
            if d.token_ids and d.index not in first:
                first[d.index] = time.perf_counter() - start
                if step_ms is not None and len(first) == len(prompts):
                    steps = step_ms[steps_before:]
                    print(f"  turn {t}: last first token after {1e3 * first[d.index]:.1f} ms, "
                          f"{len(steps)} steps (ms: {', '.join(f'{x:.1f}' for x in steps)})", flush=True)
            replies[d.index] += d.token_ids
        res.prompt_tokens += sum(len(p) for p in prompts)
        res.cached_tokens += stats.num_prefix_cached_tokens - cached_before
        res.ttft_s.append([first[i] for i in range(len(prompts))])
        res.replies.append(replies)
        history = [p + r for p, r in zip(prompts, replies, strict=True)]
    return res


def device_name(llm) -> str:
    import torch

    dev = llm.engine.model.device if hasattr(llm.engine, "model") else torch.device("cpu")
    if getattr(dev, "type", "cpu") == "cuda":
        return torch.cuda.get_device_name(dev)
    return "cpu"


def rows(cold: ReplayResult, warm: ReplayResult, device: str, command: str) -> list[dict]:
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")

    def row(what, value, unit, baseline, baseline_value):
        ratio = value / baseline_value if baseline_value else None
        return {"group": "chat_replay", "what": what, "value": value, "unit": unit, "baseline": baseline,
                "baseline_value": baseline_value, "ratio": ratio, "device": device, "date": date, "command": command}

    same = float(cold.replies == warm.replies)
    return [
        row("input_token_hit_rate", warm.hit_rate, "fraction", "acceptance target", 0.9),
        row("ttft_warm_ms", warm.mean_ttft_s() * 1e3, "ms", "ttft_cold_ms", cold.mean_ttft_s() * 1e3),
        row("ttft_cold_ms", cold.mean_ttft_s() * 1e3, "ms", "ttft_cold_ms", cold.mean_ttft_s() * 1e3),
        row("warm_outputs_equal_cold", same, "bool", "cold outputs", 1.0),
    ]


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="HF-layout checkpoint dir (default: the embedded default model)")
    ap.add_argument("--conversations", type=int, default=32)
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--system-tokens", type=int, default=2048)
    ap.add_argument("--user-tokens", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--block-size", type=int, default=128)
    ap.add_argument("--window-kv", choices=("ring", "paged"), default=None,
                    help="the window KV layout (EngineConfig.window_kv; default: the device's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json-out", default=None, help="append the result rows (JSON lines) here")
    ap.add_argument("--trace-steps", action="store_true",
                    help="print, per turn, the engine steps up to the turn's last first token and their wall ms")
    args = ap.parse_args(argv)

    from deepinfer_engine import LLM, SamplingParams

    need = args.system_tokens + args.turns * (args.user_tokens + args.max_tokens) + 64
    engine_args = dict(model=args.model, block_size=args.block_size, max_model_len=need,
                       max_num_seqs=max(args.conversations, 1), window_kv=args.window_kv)
    results = {}
    for mode in ("cold", "warm"):
        llm = LLM(**engine_args, enable_prefix_caching=mode == "warm")
        vocab = llm.engine.model.config.vocab_size
        system, users = make_conversations(args, vocab)
        # warm-up (kernels, graphs): a 2-turn chat of other tokens takes the shapes of both paths (a
        # whole prompt, a cached prefix and its tail) through the device once; then the system
        # prompt, so the warm engine starts with it cached, as a server whose system prompt is hot
        # (the cold one computes it again every turn)
        other = argparse.Namespace(**{**vars(args), "seed": args.seed + 1, "conversations": 1, "turns": 2})
        replay(llm, *make_conversations(other, vocab), args.max_tokens)
        llm.generate(prompt_token_ids=[system], sampling_params=SamplingParams(max_tokens=1), use_tqdm=False)
        step_ms = trace_steps(llm.engine) if args.trace_steps else None
        if step_ms is not None:
            print(f"{mode}:", flush=True)
        results[mode] = replay(llm, system, users, args.max_tokens, step_ms)
        device = device_name(llm)
        del llm
    command = "python " + " ".join(shlex.quote(a) for a in [sys.argv[0]] + (argv if argv is not None else sys.argv[1:]))
    out = rows(results["cold"], results["warm"], device, command)
    for r in out:
        ratio = "" if r["ratio"] is None else f"  ratio {r['ratio']:.3f}"
        print(f"{r['what']:26s} {r['value']:12.4f} {r['unit']:9s} vs {r['baseline']} {r['baseline_value']:.4f}{ratio}")
    if args.json_out:
        with open(args.json_out, "a") as f:
            for r in out:
                f.write(json.dumps(r) + "\n")
    return out


if __name__ == "__main__":
    main()
