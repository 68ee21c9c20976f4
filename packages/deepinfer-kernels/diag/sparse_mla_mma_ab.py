"""Builds of the warp-MMA sparse MLA decode kernel side by side with ``bulk``, in one process: each
checked against ``sparse_mla_attention_ref`` (max errors printed), then timed in CUDA graphs with the
L2 flushed. 132 rows x 16 heads x D 512 over KV blocks of 128 at each width, random slots at 2,048
keys and the engine's packed decode layout (docs/benchmarks.md, 2026-12-02).

    python packages/deepinfer-kernels/diag/sparse_mla_mma_ab.py --widths 2048,8192 --builds "bulk,mma,mma:lazy_rescale=0"
    python packages/deepinfer-kernels/diag/sparse_mla_mma_ab.py --widths 8192 --builds "mma@d93b62c,mma,mma@d93b62c,mma"

A build is ``bulk`` / ``mma`` (the launcher's kernels), ``mma:k=v;k=v`` (``_build_mma`` options,
integer values) or ``mma@REV[:k=v;...]``: the kernel as a git revision had it (its
``sparse_mla_mma.py``, ``_cuda_mma.py``, ``_cuda_warp.py`` and, where it has them, ``_cuda_mma_teams.py``,
``_cuda_mma_prep.py`` and ``_cuda_mma_steps.py``;
the rest of the package is the working tree's), to time a change against what it replaced in one
process.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

COPY_TBS = 4.29
ROWS, HEADS, D = 132, 16, 512


# what "mma@REV" takes from the revision (those it has: the two-team consumer, the prep tables' and the
# shared steps' own files came later)
REV_FILES = ("sparse_mla_mma", "_cuda_mma", "_cuda_warp", "_cuda_mma_teams", "_cuda_mma_prep", "_cuda_mma_steps")
LATER_FILES = ("_cuda_mma_teams", "_cuda_mma_prep", "_cuda_mma_steps")
KERNEL_DIR = "packages/deepinfer-kernels/src/deepinfer_kernels/tilelang"
# the builder's file in the sparse_mla/ package; revisions before it: tilelang/sparse_mla_mma.py, whose
# imports of the shared builders are pointed at their modules in the package
PACKAGE_PATHS = {"sparse_mla_mma": "sparse_mla/mma"}
OLD_IMPORTS = (("deepinfer_kernels.tilelang.sparse_mla_builders import", "deepinfer_kernels.tilelang.sparse_mla.common import"),
               ("deepinfer_kernels.tilelang.sparse_mla_bulk import", "deepinfer_kernels.tilelang.sparse_mla.producer import"))


def parse_build(spec: str) -> tuple[str, dict[str, int], str | None]:
    """``"mma:lazy_rescale=0;hw_cvt=1"`` -> ("mma", {"lazy_rescale": 0, "hw_cvt": 1}, None); ``"bulk"`` ->
    ("bulk", {}, None); ``"mma@abc123:hw_cvt=0"`` -> ("mma", {"hw_cvt": 0}, "abc123")."""
    name, _, opts = spec.partition(":")
    name, _, rev = name.partition("@")
    if name not in ("bulk", "mma") or ((opts or rev) and name != "mma") or (rev and not re.fullmatch(r"[\w./~^-]+", rev)):
        raise ValueError(f"build {spec!r}: expected bulk, mma, mma:k=v;k=v or mma@REV[:k=v;k=v]")
    kw = {}
    for item in filter(None, opts.split(";")):
        key, eq, value = item.partition("=")
        if not eq or not value.lstrip("-").isdigit():
            raise ValueError(f"build {spec!r}: option {item!r} is not k=<int>")
        kw[key] = int(value)
    return name, kw, rev or None


@functools.cache
def load_revision_builder(rev: str, root: Path | None = None):
    """``_build_mma`` as revision ``rev`` had it: its three kernel files read with ``git show``, their
    imports of each other pointed at the copies, imported from a temporary directory (once a
    revision)."""
    root = root or Path(__file__).resolve().parent.parent
    tag = re.sub(r"\W", "_", rev)
    out = Path(tempfile.mkdtemp(prefix=f"mma_{tag}_"))
    for stem in REV_FILES:
        for path in (PACKAGE_PATHS.get(stem, stem), stem):
            shown = subprocess.run(["git", "-C", str(root), "show", f"{rev}:{KERNEL_DIR}/{path}.py"],
                                   capture_output=True, text=True)
            if shown.returncode == 0:
                break
        if shown.returncode != 0 and stem in LATER_FILES:
            continue
        shown.check_returncode()
        src = shown.stdout
        for old, new in OLD_IMPORTS:
            src = src.replace(old, new)
        for other in REV_FILES:
            src = src.replace(f"deepinfer_kernels.tilelang.{other} import", f"{other}_{tag} import")
        (out / f"{stem}_{tag}.py").write_text(src)
    sys.path.insert(0, str(out))
    return importlib.import_module(f"sparse_mla_mma_{tag}")._build_mma


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--widths", default="2048", help="keys per row over KV blocks, comma-separated")
    p.add_argument("--builds", default="bulk,mma", help="comma-separated builds (see the module docstring)")
    args = p.parse_args(argv)
    builds = [(spec, *parse_build(spec)) for spec in args.builds.split(",")]

    import torch
    from kernel_variants import compile_variant

    from deepinfer_kernels.ops.sparse_mla import sparse_mla_attention_ref
    from deepinfer_kernels import testing as T
    from deepinfer_kernels.tilelang.sparse_mla import sparse_mla_attention_tilelang
    from deepinfer_kernels.tilelang.sparse_mla.common import LOG2E
    from deepinfer_kernels.tilelang.sparse_mla.mma import _build_mma

    widths = [int(w) for w in args.widths.split(",")]
    slots = max(400_000, ROWS * max(widths) + 4096)
    pool = T.make_pool(slots, D, "cuda", seed=0)
    cases = {f"paged128_w{w}": T.make_sparse_mla_case(ROWS, HEADS, D, w, slots, "cuda", pool=pool, paged=128, seed=1)
             for w in widths}
    cases["random_w2048"] = T.make_sparse_mla_case(ROWS, HEADS, D, 2048, slots, "cuda", pool=pool, distinct=True, seed=1)
    cases["engine_packed"] = T.make_engine_decode_case(ROWS, HEADS, D, 128, 16, 16, 4, slots, "cuda", pool=pool, seed=5,
                                                       packed=True)
    kernels = {}
    for spec, _, kw, rev in builds:            # a spec listed twice (interleaved timing) compiles once
        if (kw or rev) and spec not in kernels:
            kernels[spec] = compile_variant((load_revision_builder(rev) if rev else _build_mma)(HEADS, D, False, **kw))
    for case_name, c in cases.items():
        ref_out, ref_lse = sparse_mla_attention_ref(c.q, c.pool, c.indices, c.sm_scale)
        finite = torch.isfinite(ref_lse)
        for spec, name, _, _ in builds:
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
