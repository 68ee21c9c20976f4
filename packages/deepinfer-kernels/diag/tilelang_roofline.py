#!/usr/bin/env python3
"""Turn the pytest-benchmark JSON of the TileLang benchmarks into a roofline report.

    python packages/deepinfer-kernels/diag/tilelang_roofline.py BENCH_JSON [--md out.md] [--precompile precompile.json]

Every benchmark records (in ``extra_info``) its CUDA-event median time with L2 flushed, the bytes
and FLOPs it must move / do, the ratios against the H200 roofline (4.29 TB/s copy bandwidth,
793 TFLOP/s bf16), the torch-reference time when measured, and compile times. This script only
formats them, with the targets of each kernel family next to the achieved ratio.
"""

import argparse
import json
import sys
from pathlib import Path


def _target(name: str, info: dict):
    if "sparse_mla" in name:
        return "%HBM", 80.0
    if "routed_experts" in name or "grouped_gemm" in name:
        if info.get("regime") == "prefill" or info.get("tokens", 0) > 256:
            return "%bf16", 60.0
        return "%HBM", 75.0
    return None, None


def _fmt(v, nd=1):
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{nd}f}"
    return str(v)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("bench_json")
    ap.add_argument("--md", default="")
    ap.add_argument("--precompile", default="")
    args = ap.parse_args()
    data = json.loads(Path(args.bench_json).read_text())
    rows = []
    for b in data.get("benchmarks", []):
        info = b.get("extra_info", {})
        if "median_us" not in info:
            continue
        name = b["name"].replace("test_bench_", "")
        metric, target = _target(name, info)
        achieved = info.get(metric) if metric else None
        if metric == "%HBM" and ("routed_experts" in name or "grouped_gemm" in name):
            wb = info.get("weight_bytes")
            if wb:
                achieved = 100.0 * wb / (info["median_us"] * 1e-6) / 4.29e12
        verdict = "-" if target is None else ("meets" if achieved is not None and achieved >= target else "below")
        rows.append({
            "name": name, "us": info["median_us"], "eager_us": info.get("eager_median_us"),
            "replay_us": info.get("replay_median_us"),
            "graphed": info.get("graphed", False), "TB/s": info.get("TB/s"), "%HBM": info.get("%HBM"),
            "TFLOP/s": info.get("TFLOP/s"), "%bf16": info.get("%bf16"), "gathered_TB/s": info.get("gathered_TB/s"),
            "ref_us": info.get("ref_median_us"), "speedup": info.get("speedup_vs_ref"),
            "first_call_s": info.get("first_call_s"), "compile": info.get("compile_s"),
            "target": f"{metric} >= {target:.0f}" if target else "-", "achieved": achieved, "verdict": verdict,
        })
    lines = ["# TileLang kernels vs the H200 roofline (4.29 TB/s, 793 TFLOP/s bf16)", "",
             "median us: device time inside a CUDA graph (8 calls per graph, L2 flushed before each,",
             "the flushes timed alone and subtracted: as a decode graph runs the call; * = not capturable,",
             "eager); replay us: one call per graph replay, the graph's launch latency included; eager us:",
             "the same call launched from Python, host costs included.", "",
             "| benchmark | median us | replay us | eager us | TB/s | %HBM | TFLOP/s | %bf16 | gathered TB/s | ref us | speedup | target | achieved | verdict |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | --- |"]
    for r in rows:
        us = _fmt(r["us"]) + ("" if r["graphed"] else "*")
        lines.append("| " + " | ".join([r["name"], us, _fmt(r["replay_us"]), _fmt(r["eager_us"]), _fmt(r["TB/s"], 2), _fmt(r["%HBM"]), _fmt(r["TFLOP/s"]),
                                         _fmt(r["%bf16"]), _fmt(r["gathered_TB/s"], 2), _fmt(r["ref_us"]),
                                         _fmt(r["speedup"]), r["target"], _fmt(r["achieved"]), r["verdict"]]) + " |")
    lines += ["", "First-call times (compile or disk-cache load) per benchmark:", ""]
    for r in rows:
        lines.append(f"- {r['name']}: {_fmt(r['first_call_s'], 2)} s {r['compile'] or ''}")
    if args.precompile and Path(args.precompile).exists():
        pre = json.loads(Path(args.precompile).read_text())
        tot = sum(p["seconds"] for p in pre)
        lines += ["", f"Precompile: {len(pre)} buckets, {sum(not p['ok'] for p in pre)} failed, "
                      f"{tot:.0f} s of compile time summed over workers", ""]
        for p in sorted(pre, key=lambda p: -p["seconds"]):
            lines.append(f"- {p['seconds']:.1f} s {'ok' if p['ok'] else 'FAIL'} {p['kernel']} {p.get('ptxas', '')}")
    text = "\n".join(lines) + "\n"
    if args.md:
        Path(args.md).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
