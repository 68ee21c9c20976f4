#!/usr/bin/env python3
"""Sweep decode tile shapes of the TileLang routed-experts MoE (gate/up x down) on the GPU.

Every (gate/up, down) pair of CONFIGS runs `routed_experts_tilelang` at decode token counts; each
result is checked against `routed_experts_ref`, then timed as a CUDA-graph replay with L2 flushed
(device time, as the decode graphs run it). Kernels compile in parallel worker processes first
(TileLang's disk cache), so the sweep itself only loads them.

    python packages/deepinfer-kernels/diag/moe_tile_sweep.py [--tokens 8,64,256] [--json sweep.json]

Prints, per token count, the default pair (what `moe.pick_config` picks there) and the fastest pairs,
with the share of copy bandwidth spent on the active experts' weights.
"""

import argparse
import itertools
import json
import multiprocessing as mp
import time

import torch

H, I, E, K = 1024, 512, 64, 6   # the `mini` MoE: hidden, expert width, experts, top-k
COPY_BW = 4.29e12
CONFIGS = {   # "sBM..." / "pBM...": operand-swapped (weights on the wgmma's M side, BM token rows on N),
              # the rows staged whole-K first (s) or pipelined beside the weights (p)
    "64x64x64s4": dict(bm=64, bn=64, bk=64, stages=4, threads=128),
    "64x128x64s3": dict(bm=64, bn=128, bk=64, stages=3, threads=128),
    "s16x64x64s4": dict(bm=16, bn=64, bk=64, stages=4, threads=128, swap=1),
    "s16x128x64s4": dict(bm=16, bn=128, bk=64, stages=4, threads=128, swap=1),
    "s8x64x64s4": dict(bm=8, bn=64, bk=64, stages=4, threads=128, swap=1),
    "p16x64x64s4": dict(bm=16, bn=64, bk=64, stages=4, threads=128, swap=2),
    "p16x64x64s6": dict(bm=16, bn=64, bk=64, stages=6, threads=128, swap=2),
    "p16x128x64s4": dict(bm=16, bn=128, bk=64, stages=4, threads=128, swap=2),
    "p8x64x64s4": dict(bm=8, bn=64, bk=64, stages=4, threads=128, swap=2),
}


def _compile(job: tuple[str, str]) -> tuple[str, str, bool, float, str]:
    from deepinfer_kernels.tilelang import moe

    kind, name = job
    cfg, start = CONFIGS[name], time.time()
    try:
        if kind == "gate_up":
            moe._grouped_kernel(E, H, I, cfg, True, True, torch.bfloat16)
            moe._permute_kernel(E, K, cfg["bm"])
        else:
            moe._grouped_kernel(E, I, H, cfg, False, False, torch.bfloat16)
        return kind, name, True, time.time() - start, ""
    except Exception as err:  # noqa: BLE001 (a shape TileLang cannot build is a result, not a crash)
        return kind, name, False, time.time() - start, repr(err)[:300]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", default="8,64,256")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    from deepinfer_kernels.ops.moe import routed_experts_ref
    from deepinfer_kernels.tilelang import moe
    from deepinfer_kernels import testing as T

    jobs = [(kind, name) for name in CONFIGS for kind in ("gate_up", "down")]
    with mp.get_context("spawn").Pool(min(len(jobs), mp.cpu_count())) as pool:
        built = pool.map(_compile, jobs)
    ok = {(kind, name) for kind, name, good, _, _ in built if good}
    for kind, name, good, seconds, err in built:
        print(f"compile {kind:7s} {name:12s} {'ok' if good else 'FAILED'} {seconds:5.1f} s {err}")
    rows = []
    for tokens in (int(t) for t in args.tokens.split(",")):
        default = {"gate_up": moe.pick_config(tokens * K, E, True, k=H, nout=I),
                   "down": moe.pick_config(tokens * K, E, False, k=I, nout=H)}
        x, w, ids, w13, w2 = T.make_moe_case(tokens, H, I, E, K, "cuda", seed=tokens)
        weight_bytes = T.moe_active_weight_bytes(ids, w13, w2)
        want = routed_experts_ref(x, w, ids, w13, w2).float()
        for g, d in itertools.product(CONFIGS, CONFIGS):
            if ("gate_up", g) not in ok or ("down", d) not in ok:
                continue
            def call(g=g, d=d, case=(x, w, ids, w13, w2)):
                return moe.routed_experts_tilelang(*case, gate_up_config=CONFIGS[g], down_config=CONFIGS[d])
            torch.testing.assert_close(call().float(), want, atol=3e-2, rtol=3e-2)
            us = T.cuda_time_us(call, reps=40, graph=True)["median_us"]
            rows.append(dict(tokens=tokens, gate_up=g, down=d, us=us,
                             weight_bw_pct=100 * weight_bytes / (us * 1e-6) / COPY_BW,
                             default=CONFIGS[g] == default["gate_up"] and CONFIGS[d] == default["down"]))
        mine = sorted((r for r in rows if r["tokens"] == tokens), key=lambda r: r["us"])
        print(f"tokens {tokens}: default {[r for r in mine if r['default']]}")
        for r in mine[:5]:
            print(f"  {r['us']:7.1f} us  {r['weight_bw_pct']:5.1f}%  gate/up {r['gate_up']:12s} down {r['down']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
