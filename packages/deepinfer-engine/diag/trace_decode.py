"""Where the time of graph-replayed decode steps goes: a torch-profiler trace of the engine's real
loop (graphs + ZOS, `LLM.generate`), summarized per CUDA graph replay.

    python packages/deepinfer-engine/diag/trace_decode.py --model preset:mini --batch 1 [--tokens 64] [--save trace.json.gz]

Prints: the replays' kernel span (first kernel start to last kernel end), the start-to-start
interval of consecutive replays, the gap between one replay's end and the next one's start, and
the device work issued outside the graphs between two replays (eager kernels and copies: host-paced
work that makes a batch-1 step host-bound).

The profiler's own cost lands on the host (CUPTI makes `cudaGraphLaunch` take ~1 ms of host time
per replay of a ~600-node graph), so the intervals and gaps of a trace are an upper bound: read
the step time and idle fraction from tools/benchmark.py, and this trace for what runs and where.
"""

from __future__ import annotations

import collections
import gzip
import json
import statistics
import tempfile
from pathlib import Path

from _cli import model_run_parser

DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")


def slim_events(trace_events: list[dict]) -> list[dict]:
    """Chrome-trace events -> the device work and CUDA runtime calls: category, name, start,
    duration (us), stream, the correlation id tying a kernel to the runtime call that issued it, and
    a kernel's grid and block (TileLang kernels are all named `main_kernel`: their launch shapes tell
    them apart)."""
    keep = [e for e in trace_events if e.get("ph") == "X" and e.get("cat") in DEVICE_CATEGORIES + ("cuda_runtime",)]
    return [dict(c=e["cat"], n=e["name"][:90], ts=e["ts"], d=e.get("dur", 0), s=e.get("args", {}).get("stream", -1),
                 k=e.get("args", {}).get("correlation", -1), g=e.get("args", {}).get("grid"),
                 b=e.get("args", {}).get("block")) for e in keep]


def summarize(events: list[dict], skip: int = 5) -> dict:
    """Per-replay statistics (medians over the replays, `skip` dropped at each end)."""
    device = [e for e in events if e["c"] in DEVICE_CATEGORIES]
    launches = sorted((e for e in events if e["c"] == "cuda_runtime" and "GraphLaunch" in e["n"]),
                      key=lambda e: e["ts"])
    graph_ids = {e["k"] for e in launches}
    first: dict[int, float] = {}
    last: dict[int, float] = {}
    for e in device:
        if e["k"] in graph_ids:
            first[e["k"]] = min(first.get(e["k"], float("inf")), e["ts"])
            last[e["k"]] = max(last.get(e["k"], 0.0), e["ts"] + e["d"])
    replays = sorted(first, key=first.get)
    if len(replays) > 2 * skip + 2:
        replays = replays[skip:-skip]
    if len(replays) < 2:
        raise ValueError(f"need at least 2 graph replays in the trace, found {len(replays)}")
    spans = [last[c] - first[c] for c in replays]
    intervals = [first[b] - first[a] for a, b in zip(replays, replays[1:])]
    gaps = [first[b] - last[a] for a, b in zip(replays, replays[1:])]
    mid = len(replays) // 2
    t0, t1 = first[replays[mid - 1]], first[replays[mid]]
    outside = [e for e in device if e["k"] not in graph_ids and t0 <= e["ts"] < t1]
    by_shape: dict[tuple, list] = collections.defaultdict(lambda: [0, 0.0])
    for e in device:
        if e["k"] == replays[mid]:
            group = by_shape[(e["n"][:40], str(e.get("g")), str(e.get("b")))]
            group[0] += 1
            group[1] += e["d"]
    return {
        "replays": len(replays),
        "kernels": sum(n for n, _ in by_shape.values()),
        "kernel_us": sum(us for _, us in by_shape.values()),
        "by_shape": sorted(((k, n, us) for k, (n, us) in by_shape.items()), key=lambda r: -r[2]),
        "span_us": statistics.median(spans),
        "interval_us": statistics.median(intervals),
        "gap_us": statistics.median(gaps),
        "graph_launch_host_us": statistics.median(e["d"] for e in launches),
        "outside_graph_ops": len(outside),
        "outside_graph_top": collections.Counter(e["n"][:48] for e in outside).most_common(8),
    }


def main() -> None:
    import numpy as np
    import torch
    from torch.profiler import ProfilerActivity, profile

    from deepinfer_engine import LLM, SamplingParams

    ap = model_run_parser(__doc__)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--tokens", type=int, default=64, help="decode steps traced (after one untraced round)")
    ap.add_argument("--save", type=Path, help="write the slimmed events here (.json.gz)")
    ap.add_argument("--top", type=int, default=25, help="kernel groups listed (by name, grid and block)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("trace_decode.py needs a CUDA device (it traces CUDA graph replays)")

    llm = LLM(None if args.model == "default" else args.model, device="cuda", block_size=128,
              max_num_seqs=args.batch, max_model_len=args.prompt_len + args.tokens + 256,
              num_speculative_tokens=args.nextn, enable_prefix_caching=False)
    prompts = np.random.default_rng(0).integers(10, llm.engine.vocab_size, size=(args.batch, args.prompt_len)).tolist()
    params = SamplingParams(max_tokens=args.tokens, temperature=0.0, ignore_eos=True)
    llm.generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False)   # warm-up round
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        llm.generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        events = slim_events(json.loads(path.read_text())["traceEvents"])
    if args.save:
        with gzip.open(args.save, "wt") as f:
            json.dump(events, f)
    s = summarize(events)
    print(f"{args.model} batch {args.batch} nextn {args.nextn}: {s['replays']} graph replays (medians)")
    print(f"  kernel span {s['span_us']:.1f} us, start to start {s['interval_us']:.1f} us, "
          f"end to next start {s['gap_us']:.1f} us; cudaGraphLaunch host time {s['graph_launch_host_us']:.1f} us")
    print(f"  one replay: {s['kernels']} kernels, {s['kernel_us']:.1f} us of kernel time; by (name, grid, block):")
    for (name, grid, block), n, us in s["by_shape"][:args.top]:
        print(f"    {n:4d} {us:8.1f} us {us / n:6.2f} each  {name}  grid {grid} block {block}")
    print(f"  device ops outside the graphs between two replays: {s['outside_graph_ops']}")
    for name, n in s["outside_graph_top"]:
        print(f"    {n:4d}  {name}")


if __name__ == "__main__":
    main()
