#!/usr/bin/env python3
"""Device time of each kernel inside one routed-experts call (permute, gate/up, down, combine).

Replays a CUDA graph of `routed_experts_tilelang` on the `mini` MoE (64 experts, top-6, hidden
1024, expert width 512) under the torch profiler, for the default tiles and the alternatives,
and prints each kernel's mean duration, the gaps between them and the call's span. This is how
the swapped GEMMs were found (H200, 2026-11-30) at 88% of copy bandwidth while the whole call was at
~76% (docs/benchmarks.md).

    python packages/deepinfer-kernels/diag/moe_kernel_profile.py [--tokens 8,64] [--reps 20]
"""

import argparse
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tools"))   # the engine profiler's kernel_events
from profile_ops import kernel_events  # noqa: E402

H, I, E, K = 1024, 512, 64, 6


def kernel_times(fn, reps: int) -> tuple[list[float], list[float], float]:
    """(mean us per kernel position, mean gap before it, mean span) of `fn` replayed from a graph."""
    from deepinfer_kernels.testing import capture_graph

    for _ in range(3):   # compiles and allocator warm-up outside the capture
        fn()
    torch.cuda.synchronize()
    g = capture_graph(fn)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            g.replay()
        torch.cuda.synchronize()
    ev = kernel_events(prof, torch)
    per = len(ev) // reps
    durs, gaps, span = [0.0] * per, [0.0] * per, 0.0
    for r in range(reps):
        chunk = ev[r * per:(r + 1) * per]
        span += (chunk[-1].time_range.end - chunk[0].time_range.start) / reps
        for i, e in enumerate(chunk):
            durs[i] += e.time_range.elapsed_us() / reps
            if i:
                gaps[i] += (e.time_range.start - chunk[i - 1].time_range.end) / reps
    return durs, gaps, span


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", default="8,64")
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    from deepinfer_kernels.tilelang import moe
    from deepinfer_kernels import testing as T

    variants = {"default": (None, None),
                "swapped, rows staged": (dict(moe.DECODE_SWAP, swap=moe.SWAP_STAGED),
                                         dict(moe.DECODE_SWAP_DOWN, swap=moe.SWAP_STAGED)),
                "64-row tiles": (moe.DECODE, moe.DECODE_DOWN)}
    for tokens in (int(t) for t in args.tokens.split(",")):
        case = T.make_moe_case(tokens, H, I, E, K, "cuda", seed=tokens)   # x, weights, ids, w13, w2
        for name, (gate_up, down) in variants.items():
            def call(gate_up=gate_up, down=down, case=case):
                return moe.routed_experts_tilelang(*case, gate_up_config=gate_up, down_config=down)
            durs, gaps, span = kernel_times(call, args.reps)
            print(f"tokens {tokens} {name}: {len(durs)} kernels, span {span:.1f} us; per kernel us "
                  + ", ".join(f"{d:.1f} (gap {g:.1f})" for d, g in zip(durs, gaps)))


if __name__ == "__main__":
    main()
