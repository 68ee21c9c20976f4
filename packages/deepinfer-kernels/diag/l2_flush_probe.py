#!/usr/bin/env python3
"""How the benchmarks' L2 flush charges the kernel timed after it (GPU).

``cuda_time_us`` flushes L2 before every timed call so that the call's data starts in HBM. The
flush used so far overwrites a 256 MB buffer: it leaves L2 full of *dirty* lines, and each miss
of the next kernel evicts one and writes it back, so a kernel reading up to L2's size (50 MB)
moves up to twice its bytes through HBM. A decode step's kernels follow kernels that mostly read
weights (clean lines). This tool times the same calls after a writing and after a reading flush
(``testing.l2_flusher``), in one process, in CUDA graphs as the benchmarks do:

    python packages/deepinfer-kernels/diag/l2_flush_probe.py [--reps 30] [--only read,copy,sparse_mla,moe]

Pure reads (``torch.sum``) and a copy give the baseline of the effect; then the sparse MLA decode
kernels (``bulk``, ``mma``) at issue 5's cases and the routed experts at `mini`'s shape. Prints
a table (us and % of 4.29 TB/s after each flush).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def _cases(only: set[str]):
    """(name, call, bytes) of every timed call."""
    import torch

    from deepinfer_kernels import testing as T

    out = []
    if "read" in only:
        for mb in (16, 48, 512):
            x = torch.randn(mb * 1024 * 1024 // 4, device="cuda")
            total = torch.zeros((), device="cuda")
            out.append((f"torch.sum, {mb} MB", (lambda x=x, t=total: torch.sum(x, dim=0, out=t)), x.numel() * 4))
    if "copy" in only:
        for mb in (32, 1024):
            src = torch.randn(mb * 1024 * 1024 // 4, device="cuda")
            dst = torch.empty_like(src)
            out.append((f"copy_, {mb} MB", (lambda s=src, d=dst: d.copy_(s)), 2 * src.numel() * 4))
    if "sparse_mla" in only:
        from deepinfer_kernels.tilelang.sparse_mla import sparse_mla_attention_tilelang

        slots = 132 * 8192 + 4096
        pool = T.make_pool(slots, 512, "cuda", seed=0)
        for width in (2048, 8192):
            c = T.make_sparse_mla_case(132, 16, 512, width, slots, "cuda", pool=pool, paged=128, seed=1)
            for variant in ("bulk", "mma"):
                out.append((f"sparse MLA {variant}, 132 x 16 heads, {width} keys (paged 128)",
                            (lambda c=c, v=variant: sparse_mla_attention_tilelang(c.q, c.pool, c.indices, c.sm_scale,
                                                                                 variant=v)),
                            c.unique_bytes()))
    if "moe" in only:
        from deepinfer_kernels.tilelang.moe import routed_experts_tilelang

        h, inter, e, k = 1024, 512, 64, 6
        for tokens in (8, 64, 256):
            x, w, ids, w13, w2 = T.make_moe_case(tokens, h, inter, e, k, "cuda", seed=tokens)
            nbytes = T.moe_active_weight_bytes(ids, w13, w2) + T.moe_activation_bytes(tokens, k, h, inter)
            out.append((f"routed experts (mini), {tokens} tokens",
                        (lambda a=(x, w, ids, w13, w2): routed_experts_tilelang(*a)), nbytes))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--only", default="read,copy,sparse_mla,moe")
    args = ap.parse_args()
    import torch

    from deepinfer_kernels import testing as T

    if not torch.cuda.is_available():
        print("needs CUDA", file=sys.stderr)
        return 2
    only = set(args.only.split(","))
    rows = []
    for name, call, nbytes in _cases(only):
        times = {"write": [], "read": []}
        for mode in ("write", "read", "write", "read"):   # alternated, two runs each
            times[mode].append(T.cuda_time_us(call, reps=args.reps, flush_l2=mode, graph=True)["median_us"])
        rows.append((name, nbytes, times["write"], times["read"]))
        print(f"{name}: write {times['write']} us, read {times['read']} us", flush=True)
    print("\n| call | MB | after write flush, us | after read flush, us | write / read | % of copy (write) | % of copy (read) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, nbytes, tw, tr in rows:
        w, r = min(tw), min(tr)       # the better of the two runs' medians
        pw, pr = (100 * nbytes / (t * 1e-6) / T.HBM_BYTES_PER_S for t in (w, r))
        both = lambda ts: " / ".join(f"{t:.1f}" for t in ts)   # noqa: E731
        print(f"| {name} | {nbytes / 1e6:.1f} | {both(tw)} | {both(tr)} | {w / r:.3f} | {pw:.1f}% | {pr:.1f}% |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
