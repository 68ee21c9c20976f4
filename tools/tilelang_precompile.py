#!/usr/bin/env python3
"""Compile every TileLang kernel bucket the GPU tests and benchmarks use, in parallel.

Needs TileLang and nvcc but no GPU: it is both the "does everything compile for sm_90a" check
and the warm-up that fills TileLang's disk cache, so the test and benchmark processes then load
each kernel in ~0.1 s instead of compiling it.

    python tools/tilelang_precompile.py [--jobs N] [--ptxas] [--json out.json] [--only sparse_mla,moe]

--ptxas also runs ptxas -v on every generated kernel and reports registers / spills; with --sass
it also counts, in the kernel's SASS, the instructions behind this project's code-generation faults
(TILELANG.md, pitfalls): CALL (an IEEE division or sqrt slow path per element), 1- and 2-byte
global loads and shared stores (a copy that lost its vectorization), LDL / STL (local memory).
Exit status 1 when any bucket fails to compile.
"""

import argparse
import importlib
import json
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "packages" / "deepinfer-kernels" / "src"))

MOD = "deepinfer_kernels.tilelang."


def _specs():
    import torch

    from deepinfer_kernels.tilelang import moe, sparse_mla

    bf16, f32, f16 = torch.bfloat16, torch.float32, torch.float16
    out = []   # (group, module, function, args)

    def add(group, module, specs):
        for fn, args in specs:
            out.append((group, module, fn, args))

    # ---- sparse MLA: (rows, heads, D, width, num_splits) of the tests and benchmarks, every variant
    calls = [(5, 16, 512, 256, None), (9, 16, 512, 200, None), (6, 8, 64, 130, None), (4, 24, 128, 96, None),
             (3, 64, 512, 128, None), (4, 16, 512, 300, None), (3, 16, 512, 64, None), (2, 16, 512, 1, None),
             (3, 16, 512, 2048, None), (3, 16, 512, 2048, 3), (3, 16, 512, 2048, 8),
             (24, 16, 512, 320, None), (200, 16, 512, 192, None), (4, 16, 512, 192, None), (5, 16, 512, 160, None),
             (132, 16, 512, 2048, None), (384, 16, 512, 2048, None), (16, 16, 512, 2048, None),
             (4096, 16, 512, 384, None)]
    for variant in ("ws", "bulk"):
        for rows, heads, d, width, ns in calls:
            add("sparse_mla", "sparse_mla", sparse_mla.precompile_specs(rows, heads, d, width, variant, ns))
    for rows, heads, width in ((301, 16, 384), (4096, 16, 384), (300, 4, 200), (263, 8, 1024)):   # shared keys
        add("sparse_mla", "sparse_mla", sparse_mla.precompile_specs(rows, heads, 512, width, "bulk", None,
                                                                    shared_keys=True, slots=1 << 20))
    for width in (128, 384, 1024):   # pairs at 16 heads too (DEEPINFER_SPARSE_MLA_GROUP_ROWS=2, the tests' pairs)
        add("sparse_mla", "sparse_mla", [("get_shared_keys_kernel", (width,)), ("get_groups_kernel", (16, 512))])
    add("sparse_mla", "sparse_mla", [("get_shared_keys_kernel", (128, 4))])   # quads of window-only rows
    # the warp-MMA decode kernel (variant="mma": up to 16 heads or a multiple, a CTA per 16)
    add("sparse_mla_mma", "sparse_mla", [("get_kernel", (h, 512, "mma", split)) for h in (8, 16, 32, 64)
                                         for split in (False, True)])

    # ---- KV store: (fmt, D, input dtype, slot dtype or None for quantize_*, identity)
    for d in (512, 64):
        for dt in (bf16, f32, f16):
            for it in (torch.int64, torch.int32):
                add("kv_store", "kv_store", [("_kernel", ("fp8", d, dt, it, False))])
            add("kv_store", "kv_store", [("_kernel", ("fp8", d, dt, None, True))])
    for it in (torch.int64, torch.int32):   # the decode latent store: 448 normed + 64 RoPE values
        for rope in (0, 64):                # (64: the RoPE rotated in the same launch)
            add("kv_store", "kv_store", [("_normed_kernel", (512, 448, bf16, f32, it, 1e-6, rope))])
    for d in (128, 64, 32):
        for dt in (bf16, f32):
            add("kv_store", "kv_store", [("_kernel", ("fp4", d, dt, torch.int64, False)),
                                         ("_kernel", ("fp4", d, dt, None, True))])

    # ---- one-row linear (`mini`'s batch-1 projections and the tests' shapes)
    for n, k in ((1024, 8192), (8192, 384), (5632, 1024), (2816, 1024), (1552, 1024), (1088, 1024), (1024, 2816),
                 (1024, 512), (904, 1024), (896, 1024), (648, 1024), (512, 1024), (384, 1024), (128, 1024),
                 (8, 1024), (1024, 384), (1024, 256), (1024, 3072)):
        for dt in (bf16, f16) if (n, k) != (1024, 3072) else (bf16,):
            add("matvec", "matvec", [("_kernel", (n, k, dt))])
    # flash's one-row shapes (the benchmark, the one-wave tile tests), on both tile rules
    for n, k in ((3072, 32768), (32768, 1024), (8192, 1024), (8064, 3072), (53760, 3072), (3072, 26880),
                 (129280, 3072), (24576, 2048), (32000, 1024)):
        add("matvec", "matvec", [("_kernel", (n, k, bf16, None, True)), ("_kernel", (n, k, bf16, None, False))])
    add("matvec", "matvec", [("_kernel", (5632, 1024, bf16, None, False))])
    # float32 outputs (the logits): the tests' shapes, plain and with the norm in the prologue
    for n, k in ((1552, 1024), (8192, 64), (8064, 3072), (129280, 3072)):
        add("matvec", "matvec", [("_kernel", (n, k, bf16, None, True, True)),
                                 ("_kernel", (n, k, bf16, ("float32", 1e-6, False, False), True, True))])
    # the layer input's norm in the prologue (`rms_norm_linear`): the tests' shapes, `mini`'s fused inputs
    for n, k in ((1088, 1024), (5632, 1024), (3072, 3072), (8192, 3072), (384, 2048), (1552, 1024), (904, 1024),
                 (896, 1024), (648, 1024)):
        for w_dt, add_res in (("float32", False), ("float32", True), ("bfloat16", False), ("bfloat16", True)):
            add("matvec", "matvec", [("_kernel", (n, k, bf16, (w_dt, 1e-6, add_res, add_res)))])

    # ---- SwiGLU activation (dense FFN 2816, shared expert 512, default model 48 / 192), a kernel per
    # row-stride pair: halves of the fused gate/up output (the model's), contiguous, the tests' slices
    for inter in (2816, 512, 48, 192):
        for stride in (2 * inter, inter, 64 + 2 * inter):
            add("activation", "activation", [("_kernel", (inter, bf16, True, stride, stride))])
    add("activation", "activation", [("_kernel", (512, bf16, False, 1024, 1024))])   # the MoE prefill's single rounding

    # ---- indexer
    for h, di in ((8, 128), (64, 128), (2, 32), (8, 64)):
        add("indexer", "indexer", [("_scores_kernel", (h, di, "scores", 1))])
    for h, di, bs in ((8, 128, 16), (64, 128, 64), (2, 32, 2), (4, 32, 4)):
        for vlen_dtype in ("int32", "int64"):   # the engine's valid counts are int64
            add("indexer", "indexer", [("_scores_kernel", (h, di, "blocks", bs, vlen_dtype))])
        add("indexer", "indexer", [("_scores_kernel", (h, di, "blocks", bs, "int64", "bfloat16"))])   # the engine's
    for bs in (1, 2, 3, 16, 64):
        add("indexer", "indexer", [("_block_max_kernel", (bs,))])
    for nb, k in ((1, 4), (7, 3), (64, 16), (1000, 16), (3000, 32), (125, 16), (24, 8), (45, 4), (3, 16),
                  (1024, 16), (256, 16), (128, 32)):
        add("indexer", "indexer", [("_topk_kernel", (nb, k))])

    # ---- MoE
    for rows, e, k, nout, cfg in ((211, 8, 1024, 512, None), (48, 64, 1024, 512, None), (4048, 8, 512, 1024, None),
                                  (586, 4, 512, 1024, moe.PREFILL)):
        for offn in ("int64", "int32"):
            add("moe", "moe", moe.precompile_specs("gemm", rows, e, k, nout, config=cfg, off_dtype=offn))
    for tokens in (8, 64, 256, 1024, 32, 128, 32768):
        add("moe", "moe", moe.precompile_specs("routed", tokens, 64, 1024, 512, 6))
    add("moe", "moe", moe.precompile_specs("routed", 1024, 64, 1024, 512, 6, config=moe.PREFILL_SWIGLU_PIPELINED))
    add("moe", "moe", moe.precompile_specs("routed", 5, 16, 256, 128, 4))
    for e, k, bm in ((64, 6, 16), (384, 6, 16), (64, 6, 8), (1500, 8, 16), (16, 6, 64)):   # the permute's tests
        add("moe", "moe", [("_permute_kernel", (e, k, bm))])
    add("moe", "moe", moe.precompile_specs("prefill", 32768, 64, 1024, 512, 6))
    for tokens in (8, 256, 32768):
        add("moe", "moe", moe.precompile_specs("gemm", tokens * 6, 64, 512, 1024))

    # ---- RMSNorm (bf16 / fp16 rows, float32 or same-dtype weight) and MoE routing, the model widths
    for d in (64, 192, 256, 384, 448, 1024, 3072):
        for xd, wd in ((bf16, f32), (f16, f32), (bf16, bf16)):
            add("norm", "norm", [("_kernel", (d, xd, wd, 1e-6))])
    add("norm", "norm", [("_kernel", (256, bf16, f32, 1e-5))])
    for d in (1024, 192, 3072):   # the residual add + norm of mini, the default model, flash
        add("norm", "norm", [("_kernel", (d, bf16, f32, 1e-6, True))])
    for e, k in ((8, 2), (64, 6), (384, 6), (256, 8), (16, 4)):
        for ld in (bf16, f32):
            for normalise in (True, False):
                add("moe_route", "moe_route", [("_kernel", (e, k, ld, f32, normalise, 2.5))])
    add("moe_route", "moe_route", [("_kernel", (64, 6, f32, f32, True, 1.0))])

    # ---- RoPE in place (heads, D, rotary width: the model's q / KV heads and the tests), the
    # attention index list and the block-table lookup (one kernel each, every shape dynamic)
    for h, d, r in ((16, 512, 64), (64, 512, 64), (4, 64, 16), (1, 512, 64), (1, 64, 16), (17, 512, 64),
                    (8, 128, 32)):
        for dt in (bf16, f16):
            add("rope", "rope", [("_kernel", (h, d, r, dt))])
    for d, r in ((512, 64), (64, 16)):   # compressed entries' float32 latents [E, 1, D]
        add("rope", "rope", [("_kernel", (1, d, r, f32))])
    add("attention_indices", "attention_indices", [("_kernel", ())])
    add("paged_slots", "paged_slots", [("_kernel", ())] + [("_runs_kernel", (r,)) for r in (0, 1, 2, 4)])
    for n_max, size, ids in ((3, 65536, "int32"), (3, 1000, "int32"), (4, 1_000_000, "int64"), (2, 7, "int32"),
                             (3, 100, "int32")):
        add("engram", "engram", [("_kernel", (n_max, size, -1, ids))])
    # ---- masked row writes: Engram ids (int32 rows of 1) and compressor token terms (fp32 rows of
    # D + Di + 1: 97 tiny / default, 641 mini / flash), slots int64 (the engine) or int32 (tests)
    for w, src_dt, dst_dt in ((1, torch.int32, torch.int32), (97, f32, f32), (641, f32, f32), (641, bf16, f32)):
        for idx_dt in (torch.int64, torch.int32):
            add("write_rows", "write_rows", [("_kernel", (w, src_dt, dst_dt, idx_dt))])

    uniq, seen = [], set()
    for item in out:
        key = (item[1], item[2], repr(item[3]))
        if key not in seen:
            seen.add(key)
            uniq.append(item)
    return uniq


# SASS opcodes that flag a fault when a kernel has many of them (``--sass``)
SASS_FLAGS = ("CALL.REL", "LDG.E.U16", "LDG.E.U8", "STS.U16", "STS.U8", "LDL", "STL", "MUFU.RCP")


def _cuobjdump() -> str | None:
    """cuobjdump from the CUDA toolkit, else the copy triton ships (the device machine has no toolkit)."""
    import shutil

    found = shutil.which("cuobjdump")
    if found:
        return found
    try:
        import triton
    except ImportError:
        return None
    bundled = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    return str(bundled) if bundled.exists() else None


def sass_counts(sass: str) -> dict[str, int]:
    """How many instructions of ``sass`` (cuobjdump -sass text) start with each of SASS_FLAGS."""
    counts = dict.fromkeys(SASS_FLAGS, 0)
    for line in sass.splitlines():
        parts = line.split("*/", 1)
        if len(parts) < 2 or "/*" not in parts[0]:
            continue
        words = parts[1].split()
        op = words[1] if words and words[0].startswith("@") and len(words) > 1 else (words[0] if words else "")
        for flag in SASS_FLAGS:
            if op == flag or op.startswith(flag + "."):
                counts[flag] += 1
    return counts


def _ptxas(src: str, sass: bool = False) -> str:
    import tilelang

    tl = Path(tilelang.__file__).parent
    with tempfile.TemporaryDirectory() as td:
        cu = Path(td) / "k.cu"
        cubin = Path(td) / "k.cubin"
        cu.write_text(src)
        cmd = ["nvcc", "--cubin", "-O3", "-arch=sm_90a", "-std=c++20", f"-I{tl / 'src'}",
               f"-I{tl / '3rdparty' / 'cutlass' / 'include'}", "-Xptxas", "-v", "-o", str(cubin), str(cu)]
        res = subprocess.run(cmd, capture_output=True, text=True)
        lines = [ln.strip() for ln in (res.stdout + res.stderr).splitlines() if "registers" in ln or "spill" in ln]
        tool = _cuobjdump() if sass and cubin.exists() else None
        if tool:
            dump = subprocess.run([tool, "-sass", str(cubin)], capture_output=True, text=True).stdout
            flagged = {k: v for k, v in sass_counts(dump).items() if v}
            lines.append("sass " + (" ".join(f"{k}={v}" for k, v in flagged.items()) or "clean"))
        elif sass:
            lines.append("sass: no cuobjdump")
    return " | ".join(lines)


def _work(job):
    group, module, fn, args, want_ptxas, want_sass = job
    t0 = time.perf_counter()
    try:
        mod = importlib.import_module(MOD + module)
        kernel = getattr(mod, fn)(*args)
        res = {"ok": True, "seconds": round(time.perf_counter() - t0, 2)}
        if want_ptxas:
            res["ptxas"] = _ptxas(kernel.get_kernel_source(), want_sass)
    except Exception as exc:  # report and keep going
        res = {"ok": False, "seconds": round(time.perf_counter() - t0, 2), "error": f"{type(exc).__name__}: {exc}"[-2000:]}
    res.update({"group": group, "kernel": f"{module}.{fn}{args!r}"})
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=min(16, os.cpu_count() or 1))
    ap.add_argument("--ptxas", action="store_true")
    ap.add_argument("--sass", action="store_true", help="with --ptxas: count flagged SASS instructions")
    ap.add_argument("--json", type=str, default="")
    ap.add_argument("--only", type=str, default="")
    args = ap.parse_args()
    specs = _specs()
    if args.only:
        groups = set(args.only.split(","))
        specs = [s for s in specs if s[0] in groups]
    jobs = [(*s, args.ptxas or args.sass, args.sass) for s in specs]
    print(f"compiling {len(jobs)} kernel buckets with {args.jobs} processes", flush=True)
    t0 = time.perf_counter()
    ctx = mp.get_context("spawn")
    results = []
    with ctx.Pool(args.jobs) as pool:
        for res in pool.imap_unordered(_work, jobs):
            results.append(res)
            status = "ok  " if res["ok"] else "FAIL"
            extra = res.get("ptxas", "") if res["ok"] else res["error"]
            print(f"{status} {res['seconds']:7.2f}s {res['kernel']} {extra}", flush=True)
    bad = [r for r in results if not r["ok"]]
    print(f"done in {time.perf_counter() - t0:.1f}s: {len(results) - len(bad)} ok, {len(bad)} failed", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
