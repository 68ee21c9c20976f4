"""Builds of the warp-MMA sparse MLA decode kernel side by side with ``bulk``, in one process: each
checked against ``sparse_mla_attention_ref`` (max errors printed), then timed in CUDA graphs with the
L2 flushed. 132 rows x 16 heads x D 512 over KV blocks of 128 at each width, random slots at 2,048
keys and the engine's packed decode layout (docs/benchmarks.md, thirtieth session).

    python tools/sparse_mla_mma_ab.py --widths 2048,8192 --builds "bulk,mma,mma:lazy_rescale=0"

A build is ``bulk`` / ``mma`` (the launcher's kernels) or ``mma:k=v;k=v`` (``_build_mma`` options,
integer values).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

COPY_TBS = 4.29
ROWS, HEADS, D = 132, 16, 512


def parse_build(spec: str) -> tuple[str, dict[str, int]]:
    """``"mma:lazy_rescale=0;hw_cvt=1"`` -> ("mma", {"lazy_rescale": 0, "hw_cvt": 1}); ``"bulk"`` -> ("bulk", {})."""
    name, _, opts = spec.partition(":")
    if name not in ("bulk", "mma") or (opts and name != "mma"):
        raise ValueError(f"build {spec!r}: expected bulk, mma or mma:k=v;k=v")
    kw = {}
    for item in filter(None, opts.split(";")):
        key, eq, value = item.partition("=")
        if not eq or not value.lstrip("-").isdigit():
            raise ValueError(f"build {spec!r}: option {item!r} is not k=<int>")
        kw[key] = int(value)
    return name, kw


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--widths", default="2048", help="keys per row over KV blocks, comma-separated")
    p.add_argument("--builds", default="bulk,mma", help="comma-separated builds (see the module docstring)")
    args = p.parse_args(argv)
    builds = [(spec, *parse_build(spec)) for spec in args.builds.split(",")]

    import torch
    from kernel_variants import compile_variant

    from deepinfer_kernels.ops.sparse_mla import sparse_mla_attention_ref
    from deepinfer_kernels.tilelang import testing as T
    from deepinfer_kernels.tilelang.sparse_mla import sparse_mla_attention_tilelang
    from deepinfer_kernels.tilelang.sparse_mla_builders import LOG2E
    from deepinfer_kernels.tilelang.sparse_mla_mma import _build_mma

    widths = [int(w) for w in args.widths.split(",")]
    slots = max(400_000, ROWS * max(widths) + 4096)
    pool = T.make_pool(slots, D, "cuda", seed=0)
    cases = {f"paged128_w{w}": T.make_sparse_mla_case(ROWS, HEADS, D, w, slots, "cuda", pool=pool, paged=128, seed=1)
             for w in widths}
    cases["random_w2048"] = T.make_sparse_mla_case(ROWS, HEADS, D, 2048, slots, "cuda", pool=pool, distinct=True, seed=1)
    cases["engine_packed"] = T.make_engine_decode_case(ROWS, HEADS, D, 128, 16, 16, 4, slots, "cuda", pool=pool, seed=5,
                                                       packed=True)
    kernels = {spec: compile_variant(_build_mma(HEADS, D, False, **kw)) for spec, name, kw in builds if kw}
    for case_name, c in cases.items():
        ref_out, ref_lse = sparse_mla_attention_ref(c.q, c.pool, c.indices, c.sm_scale)
        finite = torch.isfinite(ref_lse)
        for spec, name, _ in builds:
            run = _runner(c, name, kernels.get(spec), LOG2E, sparse_mla_attention_tilelang)
            out, lse = run()
            torch.cuda.synchronize()
            out_err = (out.float() - ref_out.float()).abs().max().item()
            lse_err = (lse[finite] - ref_lse[finite]).abs().max().item()
            us = T.cuda_time_us(run, graph=True)["median_us"]
            print(f"{case_name:16s} {spec:24s} {us:8.1f} us  {c.unique_bytes() / (us * 1e-6) / (COPY_TBS * 1e12) * 100:5.1f}%"
                  f" of copy  out err {out_err:.3g}  lse err {lse_err:.3g}", flush=True)


def _runner(case, name: str, kernel, log2e: float, launcher):
    """A no-argument call of one build on ``case``: a compiled ``_build_mma`` kernel (whole rows, its
    launch arguments as the launcher passes them) or the launcher's ``name`` variant."""
    import torch

    if kernel is None:
        return lambda: launcher(case.q, case.pool, case.indices, case.sm_scale, variant=name)
    rows, width = case.indices.shape
    idx = case.indices.to(torch.int32).contiguous()
    unused_o = torch.empty(1, 1, HEADS, D, dtype=torch.float32, device="cuda")
    unused_l = torch.empty(1, 1, HEADS, dtype=torch.float32, device="cuda")

    def run():
        out = torch.empty(rows, HEADS, D, dtype=torch.bfloat16, device="cuda")
        lse = torch.empty(rows, HEADS, dtype=torch.float32, device="cuda")
        kernel(case.q, case.pool, idx, out, lse, unused_o, unused_l, float(case.sm_scale) * log2e, -(-width // 64))
        return out, lse

    return run


if __name__ == "__main__":
    main()
