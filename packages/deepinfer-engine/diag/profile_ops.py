#!/usr/bin/env python3
"""Device time of each TileLang op, and of every other kernel by name, in eager decode steps.

TileLang kernels launch through the CUDA driver API: the torch profiler does not tie them to the
Python call that launched them (a `record_function` range around the call sees no kernel; in an
eager step it measures the host's gaps instead), and every one of them is named `main_kernel`.
This tool brackets each TileLang launcher call with two marker kernels (`torch.cuda._sleep(0)`,
a kernel with a name of its own) and reads the step's kernel sequence under the profiler: the
kernels between a call's two markers are that call's. A kernel's duration is the same when a
CUDA graph replays it (graphs change the gaps between kernels, not the kernels).

    python packages/deepinfer-engine/diag/profile_ops.py --model preset:mini --batch 1 [--nextn 0] [--steps 3] [--top 30]
    python packages/deepinfer-engine/diag/profile_ops.py --model preset:mini --phase prefill --batch 64 --prompt-len 512 [--syncs]

Prints per step: each TileLang op's calls, total and per-call device time; the other kernels
(cuBLAS GEMMs, torch element-wise ops) grouped by kernel name; the total; the timeline (host wall
time, kernel span, idle time between kernels and the largest gaps); with `--syncs`, where the step
synchronizes with the device (each sync lets the GPU run dry while the host catches up).
"""

from __future__ import annotations

import collections
import contextlib
import time
import traceback
import warnings
from dataclasses import dataclass, field

from _cli import model_run_parser


@dataclass
class Attribution:
    """Kernel time of one profiled window: by labelled call (TileLang op) and by kernel name."""

    by_label: dict[str, list] = field(default_factory=lambda: collections.defaultdict(lambda: [0, 0.0]))
    by_kernel: dict[str, list] = field(default_factory=lambda: collections.defaultdict(lambda: [0, 0.0]))

    @property
    def total_us(self) -> float:
        return sum(v[1] for v in self.by_label.values()) + sum(v[1] for v in self.by_kernel.values())


def attribute(kernels: list[tuple[str, float]], labels: list[str], marker: str) -> Attribution:
    """kernels: (name, us) in launch order; labels: the label of each bracketed call, in order;
    marker: the marker kernel's name. Kernels between a call's opening and closing marker count
    for its label (calls + 1 once per call), the others by their own name; markers count for
    nothing. Raises when the markers and the labels disagree (a lost or unmatched marker)."""
    out = Attribution()
    inside: str | None = None
    next_label = 0
    for name, us in kernels:
        if name == marker:
            if inside is None:
                if next_label >= len(labels):
                    raise ValueError(f"marker {next_label + 1} opens a call, but only {len(labels)} calls were labelled")
                inside = labels[next_label]
                next_label += 1
                out.by_label[inside][0] += 1
            else:
                inside = None
            continue
        if inside is not None:
            out.by_label[inside][1] += us
        else:
            entry = out.by_kernel[name[:110]]
            entry[0] += 1
            entry[1] += us
    if inside is not None or next_label != len(labels):
        raise ValueError(f"{next_label} calls bracketed by markers, {len(labels)} labelled")
    return out


def kernel_events(prof, torch) -> list:
    """The CUDA kernel events of a torch profile in launch order (copies and memsets left out)."""
    return sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
                   and not e.name.startswith("Memcpy") and not e.name.startswith("Memset")),
                  key=lambda e: e.time_range.start)


def _marker_name(torch) -> str:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        torch.cuda._sleep(0)
        torch.cuda.synchronize()
    names = {e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA}
    if len(names) != 1:
        raise RuntimeError(f"the marker launched {sorted(names)}, expected one kernel")
    return names.pop()


def main() -> None:
    ap = model_run_parser(__doc__)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--phase", choices=("decode", "prefill"), default="decode",
                    help="prefill: one step that prefills --batch prompts at once (after a warm-up prefill)")
    ap.add_argument("--steps", type=int, default=3, help="decode steps profiled (times are per step)")
    ap.add_argument("--top", type=int, default=30, help="kernel names listed outside the TileLang ops")
    ap.add_argument("--syncs", action="store_true",
                    help="also list where the profiled steps synchronize with the device (torch's sync debug mode)")
    args = ap.parse_args()

    import numpy as np
    import torch
    from torch.profiler import ProfilerActivity, profile

    if not torch.cuda.is_available():
        raise SystemExit("profile_ops: needs a CUDA device (it times kernels)")
    import deepinfer_kernels.tilelang as tl
    from deepinfer_engine import LLM, SamplingParams

    labels: list[str] = []
    recording = [False]
    get_launcher = tl.get_launcher

    def bracketed(op: str):
        fn = get_launcher(op)

        def call(*a, **k):
            if not recording[0]:
                return fn(*a, **k)
            labels.append(op)
            torch.cuda._sleep(0)
            try:
                return fn(*a, **k)
            finally:
                torch.cuda._sleep(0)
        return call
    tl.get_launcher = bracketed   # platform.tilelang_launcher imports it at every call

    marker = _marker_name(torch)
    prefill = args.phase == "prefill"
    prefill_rows = args.batch * args.prompt_len
    llm = LLM(None if args.model == "default" else args.model, device="cuda", block_size=128,
              max_num_seqs=max(args.batch, 8), max_model_len=args.prompt_len + 512,
              max_num_batched_tokens=max(8192, prefill_rows if prefill else 0),
              num_speculative_tokens=args.nextn, enable_mtp_varlen=False, cuda_graphs=False,
              zero_overhead_scheduling=False, compile_decode=False, enable_prefix_caching=False)
    engine = llm.engine
    rng = np.random.default_rng(0)
    params = SamplingParams(temperature=0, max_tokens=1 if prefill else 400, ignore_eos=True)

    def add_batch() -> None:
        for _ in range(args.batch):
            engine.add_request(prompt_token_ids=rng.integers(10, engine.vocab_size, size=args.prompt_len).tolist(),
                               params=params)

    add_batch()
    if prefill:   # a first prefill of the same shape compiles the kernels; the second is profiled
        while engine.has_unfinished():
            engine.step()
        add_batch()
        steps_done = engine.stats.num_prefill_steps
    else:
        while engine.stats.num_decode_steps < 8:   # past prefill and the kernels' first calls (compiles)
            engine.step()
    torch.cuda.synchronize()
    recording[0] = True
    syncs: collections.Counter = collections.Counter()
    with profile(activities=[ProfilerActivity.CUDA]) as prof, _sync_sites(torch, syncs, args.syncs):
        t0 = time.perf_counter()
        if prefill:
            while engine.stats.num_prefill_steps == steps_done:
                engine.step()
        else:
            for _ in range(args.steps):
                engine.step()
        torch.cuda.synchronize()
        wall_ms = (time.perf_counter() - t0) * 1e3
    recording[0] = False
    events = kernel_events(prof, torch)
    kernels = [(e.name, e.time_range.elapsed_us()) for e in events]
    result = attribute(kernels, labels, marker)
    n = 1 if prefill else args.steps
    print(f"== {args.model} {args.phase} batch {args.batch} nextn {args.nextn}: {result.total_us / n:.1f} us of kernels per "
          f"step (markers excluded)")
    print("-- TileLang ops: calls/step, us/step, us/call")
    for op, (calls, us) in sorted(result.by_label.items(), key=lambda kv: -kv[1][1]):
        print(f"{calls / n:7.1f} {us / n:9.1f} {us / max(calls, 1):8.2f}  {op}")
    print("-- other kernels: count/step, us/step, us each")
    for name, (count, us) in sorted(result.by_kernel.items(), key=lambda kv: -kv[1][1])[: args.top]:
        print(f"{count / n:7.1f} {us / n:9.1f} {us / max(count, 1):8.2f}  {name}")
    span_us = (events[-1].time_range.end - events[0].time_range.start) if events else 0.0
    gaps = [(b.time_range.start - a.time_range.end, a.name, b.name) for a, b in zip(events, events[1:])]
    print(f"-- timeline per step: host wall {wall_ms / n:.2f} ms, first kernel start -> last kernel end "
          f"{span_us / n / 1e3:.2f} ms, idle between kernels {sum(g[0] for g in gaps if g[0] > 0) / n / 1e3:.2f} ms "
          f"(eager, marker kernels included); largest gaps:")
    for us, before, after in sorted(gaps, reverse=True)[:8]:
        print(f"  {us:9.1f} us  after {before[:60]}  before {after[:60]}")
    if args.syncs:
        print(f"-- synchronizing calls ({sum(syncs.values())}), by call site:")
        for site, count in syncs.most_common(20):
            print(f"  {count:5d}  {site}")


@contextlib.contextmanager
def _sync_sites(torch, counter: collections.Counter, enabled: bool):
    """While enabled: count each synchronizing torch call by its innermost deepinfer call sites
    (torch's sync debug mode warns at each one; the warning's stack names the caller)."""
    if not enabled:
        yield
        return
    previous = warnings.showwarning

    def record(message, category, filename, lineno, file=None, line=None):
        if "synchronizing" not in str(message):
            return previous(message, category, filename, lineno, file, line)
        frames = [f for f in traceback.extract_stack()[:-1] if "deepinfer" in f.filename]
        counter[" <- ".join(f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno} {f.name}" for f in frames[::-1][:3])] += 1

    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings():   # restores the filters and showwarning on exit
            warnings.simplefilter("always")
            warnings.showwarning = record
            yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


if __name__ == "__main__":
    main()
