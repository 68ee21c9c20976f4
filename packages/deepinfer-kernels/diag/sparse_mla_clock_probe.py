"""The SM clock while the sparse MLA decode kernels run: CUDA-graph replays (50 calls a graph) back
to back for a few seconds per variant while nvidia-smi samples the SM / memory clocks, the power
and the clock event reasons every 100 ms. Kernel cycle counts (timelines, Nsight Compute, whose
profiles run at a locked base clock) turn into time at this clock.

    python packages/deepinfer-kernels/diag/sparse_mla_clock_probe.py                    # bulk, then mma; 132 rows x 2,048 keys
    python packages/deepinfer-kernels/diag/sparse_mla_clock_probe.py --variants bulk --seconds 8

H200, 2026-12-02, bulk and the since-removed regs kernel: 1,980 MHz throughout for both, no event reasons.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sparse_mla_decode_case import VARIANTS, D, attention_call, make_decode_case  # noqa: E402

QUERY = "clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variants", type=lambda s: s.split(","), default=["bulk", "mma"])
    p.add_argument("--seconds", type=float, default=4.0, help="replay time per variant")
    args = p.parse_args(argv)
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown:
        p.error(f"--variants: unknown {unknown}; expected some of {sorted(VARIANTS)}")

    import torch

    from deepinfer_kernels import testing as T

    slots = 400_000
    case = make_decode_case(2048, "paged128", slots, T.make_pool(slots, D, "cuda", seed=0))
    for variant in args.variants:
        fn = attention_call(case, variant)
        fn()
        torch.cuda.synchronize()
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):            # warm up on a side stream before capture
            for _ in range(3):
                fn()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(50):
                fn()
        graph.replay()
        torch.cuda.synchronize()
        smi = subprocess.Popen(["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader", "-lms", "100"],
                               stdout=subprocess.PIPE, text=True)
        time.sleep(0.3)
        start, replays = time.time(), 0
        ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        ev0.record()
        while time.time() - start < args.seconds:
            graph.replay()
            replays += 1
            if replays % 20 == 0:
                torch.cuda.synchronize()
        ev1.record()
        torch.cuda.synchronize()
        smi.terminate()
        samples = smi.communicate()[0].strip().splitlines()
        per_call = ev0.elapsed_time(ev1) * 1e3 / (replays * 50)
        print(f"{variant}: {replays * 50} calls, {per_call:.1f} us a call (L2 warm), {len(samples)} samples of {QUERY}:")
        for line in samples[3:-2]:               # the samples while replays ran
            print("   ", line)


if __name__ == "__main__":
    main()
