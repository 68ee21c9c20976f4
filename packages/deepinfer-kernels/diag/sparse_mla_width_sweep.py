"""Sparse MLA decode (132 rows x 16 heads, D 512) by keys per row: every variant checked against the
reference and timed in CUDA graphs with the L2 flushed (``testing.cuda_time_us``), then a straight
line fitted through each variant's times. The slope is the steady state (a 64-key block after the
pipeline is full, as a share of copy bandwidth); the intercept is what a call costs whatever its
width (launch, the first loads, the last block and the output). Issue 5's decode target is a
share of copy bandwidth: the fit says how much of the gap is the kernel's steady state.

    python packages/deepinfer-kernels/diag/sparse_mla_width_sweep.py                                   # 2,048 .. 16,384 keys
    python packages/deepinfer-kernels/diag/sparse_mla_width_sweep.py --widths 2048,8192 --layouts paged128 --variants bulk
    python packages/deepinfer-kernels/diag/sparse_mla_width_sweep.py --variants mma --layouts paged128 --rows 1,66,132 --no-split

``--rows``: the sweep at each row count (one CTA a row; ``--no-split`` keeps split-KV off at few
rows): a steady state that does not change with the row count is the SM's own pace, one that
falls as rows (SMs) are added is the memory system's.

Layouts: ``sparse_mla_decode_case.LAYOUTS`` (``random`` up to 8,192 keys).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sparse_mla_decode_case import LAYOUTS, RECORD_BYTES, ROWS, VARIANTS, D, attention_call, make_decode_case  # noqa: E402

RANDOM_MAX_WIDTH = 8192


def fit_line(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares (slope, intercept) of (x, y) points; at least two distinct x."""
    n = len(points)
    if n < 2 or len({x for x, _ in points}) < 2:
        raise ValueError(f"need two distinct widths to fit, got {points}")
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx
    return slope, my - slope * mx


def steady_state(points_us: list[tuple[int, float]], copy_tbs: float, rows: int = ROWS) -> tuple[float, float]:
    """(steady-state share of copy bandwidth, fixed us per call) from (width, us) points: the slope
    is us per key of every row, i.e. ``rows`` records."""
    slope, fixed = fit_line([(float(w), us) for w, us in points_us])
    if slope <= 0:
        raise ValueError(f"time does not grow with width: {points_us}")
    return rows * RECORD_BYTES / (slope * 1e-6) / (copy_tbs * 1e12), fixed


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--widths", type=lambda s: [int(w) for w in s.split(",")], default=[2048, 4096, 8192, 16384])
    p.add_argument("--layouts", type=lambda s: s.split(","), default=list(LAYOUTS))
    p.add_argument("--variants", type=lambda s: s.split(","), default=list(VARIANTS))
    p.add_argument("--copy-tbs", type=float, default=4.29, help="device copy bandwidth, TB/s")
    p.add_argument("--rows", type=lambda s: [int(r) for r in s.split(",")], default=[ROWS])
    p.add_argument("--no-split", action="store_true", help="one CTA a row at every row count (num_splits=1)")
    args = p.parse_args(argv)
    bad = [v for v in args.variants if v not in VARIANTS] + [lay for lay in args.layouts if lay not in LAYOUTS]
    if bad:
        p.error(f"unknown {bad}: variants {sorted(VARIANTS)}, layouts {LAYOUTS}")

    import torch

    from deepinfer_kernels.ops.sparse_mla import sparse_mla_attention_ref
    from deepinfer_kernels import testing as T

    slots = max(args.rows) * max(args.widths) + 4096
    pool = T.make_pool(slots, D, "cuda", seed=0)
    times: dict[tuple[str, str, int], list[tuple[int, float]]] = {}
    for rows in args.rows:
        for layout in args.layouts:
            for width in args.widths:
                if layout == "random" and width > RANDOM_MAX_WIDTH:
                    continue
                c = make_decode_case(width, layout, slots, pool, rows)
                ref_out, ref_lse = sparse_mla_attention_ref(c.q, c.pool, c.indices, c.sm_scale)
                finite = torch.isfinite(ref_lse)
                for name in args.variants:
                    fn = attention_call(c, name, num_splits=1 if args.no_split else None)
                    out, lse = fn()
                    out_err = (out.float() - ref_out.float()).abs().max().item()
                    lse_err = (lse[finite] - ref_lse[finite]).abs().max().item()
                    us = T.cuda_time_us(fn, graph=True)["median_us"]
                    times.setdefault((layout, name, rows), []).append((width, us))
                    share = c.unique_bytes() / (us * 1e-6) / (args.copy_tbs * 1e12)
                    print(f"{rows:4d} rows {layout:9s} w{width:<6d} {name:8s} {us:8.1f} us  {share:6.1%} of copy"
                          f"  out err {out_err:.3g}  lse err {lse_err:.3g}", flush=True)
                del ref_out, ref_lse
                torch.cuda.empty_cache()
    for (layout, name, rows), pts in times.items():
        if len(pts) >= 2:
            share, fixed = steady_state(pts, args.copy_tbs, rows)
            print(f"{rows:4d} rows {layout:9s} {name:8s} steady state {share:6.1%} of copy "
                  f"({rows * RECORD_BYTES * 64 / (share * args.copy_tbs * 1e12) * 1e6:.3f} us a 64-key block), "
                  f"fixed {fixed:5.1f} us a call (widths {pts[0][0]}..{pts[-1][0]})", flush=True)


if __name__ == "__main__":
    main()
