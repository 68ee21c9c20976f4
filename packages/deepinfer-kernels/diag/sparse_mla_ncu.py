"""Hardware counters of the sparse MLA decode kernels (Nsight Compute, SM90): per 64-key block of
one CTA, the shared-memory wavefronts the kernel issued and the ideal count (no bank conflicts),
how busy the LSU data pipe, the tensor pipe and the issue slots were, the instruction-cache
pressure and the largest warp stalls; beside them the cycles a block may take at issue 5's 80% of
copy bandwidth. The ideal wavefront count is the kernel's floor: the L1 data pipe moves one
128-byte wavefront a cycle, so a design whose ideal count per block is near that budget cannot
reach the target however well it overlaps.

    python packages/deepinfer-kernels/diag/sparse_mla_ncu.py                              # profile bulk and mma; print the table
    python packages/deepinfer-kernels/diag/sparse_mla_ncu.py --variants bulk --width 8192
    python packages/deepinfer-kernels/diag/sparse_mla_ncu.py --report saved.csv --width 2048   # the table from `ncu --page raw --csv`

Needs `ncu` (CUDA toolkit; /usr/local/cuda/bin on the H200) and access to the GPU's performance
counters. Nsight Compute locks the SM clock to its base (1.35 GHz on the H200), so the cycle counts
are what matter; the budget line uses the unlocked clock (``--clock-ghz``, 1.98 GHz measured with
nvidia-smi while the kernels ran, 2026-12-02) and the copy bandwidth (``--copy-tbs``).
"""

from __future__ import annotations

import argparse
import csv
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sparse_mla_decode_case import LAYOUTS, RECORD_BYTES, ROWS, VARIANTS, D, attention_call, make_decode_case  # noqa: E402

BLOCK = 64
# each variant's attention kernel (CTA size); "bulk_c2" (two consumer warpgroups) and "regs" (register
# operands) are removed kernels, kept to read the saved H200 profile of 2026-12-02
KERNEL_THREADS = {"bulk": 384, "mma": 384, "bulk_c2": 512, "regs": 384}
STALL_PREFIX = "smsp__average_warps_issue_stalled_"
STALL_SUFFIX = "_per_issue_active.ratio"


@dataclass(frozen=True)
class KernelCounters:
    """One profiled kernel, per 64-key block of one CTA where it says so."""

    label: str
    duration_us: float
    sm_ghz: float                  # the clock Nsight Compute ran it at
    cycles_per_block: float
    wavefronts_per_block: float    # shared-memory wavefronts through the L1 data pipe (as issued)
    ideal_wavefronts_per_block: float
    lsu_pipe_pct: float
    tensor_pipe_pct: float
    issue_active_pct: float
    icache_pct: float              # GPC cache instruction requests, % of peak
    stalls: tuple[tuple[str, float], ...]   # (reason, cycles per issued instruction), largest first


def read_raw_csv(path: str | Path) -> list[dict[str, str]]:
    """``ncu --page raw --csv``: a header row, a units row, then one row per kernel."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    if len(rows) < 3:
        raise ValueError(f"{path}: no kernel rows (is it `ncu --page raw --csv` output?)")
    header = rows[0]
    return [dict(zip(header, r)) for r in rows[2:]]


def _num(row: dict[str, str], metric: str) -> float:
    if metric not in row:
        raise KeyError(f"metric {metric!r} missing from the Nsight Compute CSV (profile with --set full)")
    return float(row[metric].replace(",", ""))


def label_kernels(rows: list[dict[str, str]], variants: list[str]) -> list[str]:
    """Launch order -> labels: each variant's attention kernel has its thread count; any other
    kernel (a split-KV combine) is labelled after the variant it follows."""
    labels, i = [], 0
    current = None
    for row in rows:
        threads = int(_num(row, "launch__block_size"))
        if i < len(variants) and threads == KERNEL_THREADS[variants[i]]:
            current = variants[i]
            labels.append(current)
            i += 1
        else:
            labels.append(f"{current} (other kernel)")
    if i != len(variants):
        raise ValueError(f"found {i} of the {len(variants)} attention kernels {variants} in the CSV")
    return labels


def summarize(row: dict[str, str], label: str, blocks_per_cta: int) -> KernelCounters:
    ctas = _num(row, "launch__grid_size")
    per_block = ctas * blocks_per_cta
    stalls = sorted(((k[len(STALL_PREFIX):-len(STALL_SUFFIX)], _num(row, k)) for k in row
                     if k.startswith(STALL_PREFIX) and k.endswith(STALL_SUFFIX) and "not_selected" not in k
                     and "selected" != k[len(STALL_PREFIX):-len(STALL_SUFFIX)]),
                    key=lambda kv: -kv[1])
    return KernelCounters(
        label=label,
        duration_us=_num(row, "gpu__time_duration.sum"),
        sm_ghz=_num(row, "sm__cycles_elapsed.avg.per_second"),
        cycles_per_block=_num(row, "gpc__cycles_elapsed.max") / blocks_per_cta,
        wavefronts_per_block=_num(row, "memory_l1_wavefronts_shared") / per_block,
        ideal_wavefronts_per_block=_num(row, "memory_l1_wavefronts_shared_ideal") / per_block,
        lsu_pipe_pct=_num(row, "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum.pct_of_peak_sustained_elapsed"),
        tensor_pipe_pct=_num(row, "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed"),
        issue_active_pct=_num(row, "smsp__issue_active.avg.pct_of_peak_sustained_active"),
        icache_pct=_num(row, "gcc__cache_requests_type_instruction.sum.pct_of_peak_sustained_elapsed"),
        stalls=tuple(stalls[:4]),
    )


def budget_cycles_per_block(copy_tbs: float, clock_ghz: float, fraction: float = 0.8, sms: int = ROWS) -> float:
    """SM cycles one CTA may spend on a 64-key block when every SM streams its share of
    ``fraction`` x the copy bandwidth (one CTA a SM)."""
    bytes_per_ns = fraction * copy_tbs * 1e3 / sms
    return BLOCK * RECORD_BYTES / bytes_per_ns * clock_ghz


def format_table(counters: list[KernelCounters], budget: float) -> str:
    lines = [
        "| kernel | us (at the profiler's clock) | cycles a block | shared wavefronts a block (ideal) | ideal / 80% budget "
        "| LSU pipe | tensor pipe | issue active | instruction requests | largest stalls (cycles per issue) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for k in counters:
        stalls = ", ".join(f"{name} {v:.2f}" for name, v in k.stalls)
        lines.append(f"| {k.label} | {k.duration_us:.1f} ({k.sm_ghz:.2f} GHz) | {k.cycles_per_block:,.0f} "
                     f"| {k.wavefronts_per_block:,.0f} ({k.ideal_wavefronts_per_block:,.0f}) "
                     f"| {k.ideal_wavefronts_per_block / budget:.2f} | {k.lsu_pipe_pct:.1f}% | {k.tensor_pipe_pct:.1f}% "
                     f"| {k.issue_active_pct:.1f}% | {k.icache_pct:.1f}% | {stalls} |")
    lines.append(f"\n80% of copy leaves {budget:,.0f} SM cycles a 64-key block (one CTA a SM, unlocked clock).")
    return "\n".join(lines)


def report(csv_path: str | Path, variants: list[str], width: int, copy_tbs: float, clock_ghz: float) -> str:
    rows = read_raw_csv(csv_path)
    labels = label_kernels(rows, variants)
    blocks = -(-width // BLOCK)
    counters = [summarize(r, lab, blocks) for r, lab in zip(rows, labels) if "other kernel" not in lab]
    return format_table(counters, budget_cycles_per_block(copy_tbs, clock_ghz))


def launch(variants: list[str], width: int, layout: str) -> None:
    """The profiled process: every variant compiled and run twice outside the profiler's range,
    then one launch each inside it (cudaProfilerStart / Stop)."""
    import torch

    from deepinfer_kernels import testing as T

    slots = max(400_000, ROWS * width + 4096)
    case = make_decode_case(width, layout, slots, T.make_pool(slots, D, "cuda", seed=0))
    calls = [attention_call(case, v) for v in variants]
    for fn in calls:
        fn()
        fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for fn in calls:
        fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


def profile(args) -> str:
    ncu = shutil.which("ncu") or next((str(p) for p in sorted(Path("/usr/local").glob("cuda*/bin/ncu"))), None)
    if ncu is None:
        raise SystemExit("ncu not found (CUDA toolkit's Nsight Compute)")
    out = Path(args.out or tempfile.mkdtemp(prefix="sparse_mla_ncu_"))
    out.mkdir(parents=True, exist_ok=True)
    rep = out / "sparse_mla_decode"
    target = [sys.executable, __file__, "--launch", "--variants", ",".join(args.variants), "--width", str(args.width),
              "--layout", args.layout]
    subprocess.run([ncu, "--profile-from-start", "off", "--set", "full", "--import-source", "no", "-f", "-o", str(rep),
                    *target], check=True)
    csv_path = out / "sparse_mla_decode.csv"
    with open(csv_path, "w") as f:
        subprocess.run([ncu, "--import", f"{rep}.ncu-rep", "--page", "raw", "--csv"], stdout=f, check=True)
    return report(csv_path, args.variants, args.width, args.copy_tbs, args.clock_ghz)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variants", type=lambda s: s.split(","), default=["bulk", "mma"],
                   help=f"comma-separated, launch order; of {sorted(VARIANTS)}")
    p.add_argument("--width", type=int, default=2048, help="keys per row")
    p.add_argument("--layout", choices=LAYOUTS, default="paged128", help="sparse_mla_decode_case.LAYOUTS")
    p.add_argument("--copy-tbs", type=float, default=4.29, help="device copy bandwidth, TB/s")
    p.add_argument("--clock-ghz", type=float, default=1.98, help="SM clock outside the profiler")
    p.add_argument("--out", help="directory for the .ncu-rep and the CSV (default: a temp dir)")
    p.add_argument("--report", help="print the table from this saved `ncu --page raw --csv` file")
    p.add_argument("--launch", action="store_true", help=argparse.SUPPRESS)   # the profiled process
    args = p.parse_args(argv)
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown:
        p.error(f"--variants: unknown {unknown}; expected some of {sorted(VARIANTS)}")
    if args.launch:
        launch(args.variants, args.width, args.layout)
    elif args.report:
        print(report(args.report, args.variants, args.width, args.copy_tbs, args.clock_ghz))
    else:
        print(profile(args))


if __name__ == "__main__":
    main()
