"""Where the warp-MMA sparse MLA decode kernel's time goes (SM90, ``mma``, the two-team consumer, 16
heads, D 512): variants of ``_cuda_mma_teams.py`` / ``_cuda_mma_steps.py`` with one part of the
consumer's work compiled out (text substitutions, never merged, ``kernel_variants.py``), timed in
one process (CUDA graphs, L2 flushed) over KV blocks of 128. Prints, per width and variant, the
median us, us per 64-key block, the share of the device's copy bandwidth (``timing.HBM_BYTES_PER_S``,
as the kernel benchmarks count it), and the largest difference from the first variant's output
(garbage for the variants that skip work).

    python packages/deepinfer-kernels/diag/sparse_mla_mma_diag.py                                # every variant, 8,192 keys
    python packages/deepinfer-kernels/diag/sparse_mla_mma_diag.py base,no_movm,no_cvt+no_kfac --widths 2048,8192

A name joins variants with ``+`` (their substitutions together). Issue 5 asks for 80% of copy, and
the steady state is the consumer's pace (docs/benchmarks.md, 2026-12-02 and 2026-12-03): a part whose removal
buys little is off the critical path, whatever its instruction count.
"""

from __future__ import annotations

import argparse
import functools
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from kernel_variants import ModuleEdit, compile_in_workers, compile_variant, load_variant  # noqa: E402
from sparse_mla_decode_case import HEADS, D, make_decode_case  # noqa: E402
from sparse_mla_mma_ab import _runner  # noqa: E402

SLOTS = 1_200_000
TEAMS, STEPS = "_cuda_mma_teams", "_cuda_mma_steps"
MOVT = "vt[j][c][{x}] = di_movt(kv[j][c][{x}]);"
KFAC = "kv[j][4 * cc + m][{x}] = di_hmul2({half}, fac);"
QK_MMA = ("if (c == 0) di_mma16816_z(acc[j], qa[c], kv[j][c][0], kv[j][c][1]);\n"
          "      else di_mma16816(acc[j], qa[c], kv[j][c][0], kv[j][c][1]);")
PV_MMA = "for (int x = 0; x < 2; ++x) di_mma16816(O[c][x], pa, vt[2 * kq][c][x], vt[2 * kq + 1][c][x]);"
REDUX = re.compile(r"int mo = \(int\)0x80000000;.*?\n  \}\n", re.S)
LOOP_TOP = '    asm volatile("" : "+r"(s));\n'

# name -> substitutions: (module, old, new)
VARIANTS: dict[str, list[tuple[str, str | re.Pattern[str], str]]] = {
    "base": [],
    # the 64 transposes a half: PV takes the untransposed registers
    "no_movm": [(TEAMS, MOVT.format(x=x), f"vt[j][c][{x}] = kv[j][c][{x}];") for x in (0, 1)],
    # the 64 e4m3 -> f16 conversions a half: the raw bytes stand in for the f16 pairs
    "no_cvt": [(TEAMS, "di_e4m3x4_f16<HW>(r[m], lo, hi);", "lo = r[m]; hi = lo >> 1;")],
    # the 64 multiplies by the key's group factor, and the factor loads
    "no_kfac": [(TEAMS, KFAC.format(x=x, half=half), f"kv[j][4 * cc + m][{x}] = {half};") for x, half in ((0, "lo"), (1, "hi"))],
    # QK's 32 mma (the scores are 0)
    "no_qk_mma": [(TEAMS, QK_MMA, "if (c == 0) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;")],
    # PV's 32 mma: one xor a replaced mma keeps the transposed registers and P live
    "no_pv_mma": [(STEPS, PV_MMA, "for (int x = 0; x < 2; ++x) O[c][x][kq] = __uint_as_float(__float_as_uint(O[c][x][kq])"
                                  " ^ vt[2 * kq][c][x] ^ vt[2 * kq + 1][c][x] ^ pa[x]);")],
    # the softmax's four redux.sync a half (each lane keeps its own maximum)
    "no_redux": [(TEAMS, REDUX, "int mo = o;\n")],
    # the team's two named barriers a half (the scores and P then race: timing only)
    "no_team_bars": [(TEAMS, "di_named_sync(team_bar, 128);                          // the team's partials complete",
                      ""),
                     (TEAMS, "const bool any_grew = di_named_sync_or(team_bar, 128, grew);", "const bool any_grew = grew;")],
    # the consumers only wait for each stage and release it: the producers' and the memory's pace
    "idle_consumer": [(TEAMS, LOOP_TOP, LOOP_TOP + "    if (true) {\n      __syncwarp();\n"
                       "      if (lane == 0) di_mbar_arrive_s(a_emp + 8 * s);\n"
                       "      if (i + 1 < nblk) di_mbar_wait_s(a_rdy + 8 * ((i + 1) % NST), ((i + 1) / NST) & 1);\n"
                       "      continue;\n    }\n")],
}


def substitutions(name: str) -> list[tuple[str, str | re.Pattern[str], str]]:
    """``name``'s substitutions; ``a+b``: a's and b's."""
    parts = name.split("+")
    unknown = [p for p in parts if p not in VARIANTS]
    if unknown:
        raise ValueError(f"unknown variants {unknown}; choose from {', '.join(VARIANTS)}")
    return [sub for p in parts for sub in VARIANTS[p]]


def edits(name: str) -> list[ModuleEdit]:
    """The edited modules in import order: the consumer's sources, then the builder that imports them."""
    subs = substitutions(name)
    return [ModuleEdit(module, tuple((old, new) for m, old, new in subs if m == module)) for module in (STEPS, TEAMS)] + [
        ModuleEdit("sparse_mla.mma", ())]


def variant_prim_func(name: str):
    """The variant's TileLang prim_func (no GPU needed): 16 heads, whole rows, two teams."""
    return load_variant(edits(name), re.sub(r"\W", "_", name))._build_mma(HEADS, D, False, teams=True)


@functools.cache        # each variant is timed at every width: compile once
def build(name: str):
    return compile_variant(variant_prim_func(name))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("variants", nargs="?", default=",".join(VARIANTS), help="comma-separated, of: " + ", ".join(VARIANTS))
    ap.add_argument("--widths", default="8192", help="keys per row over KV blocks of 128, comma-separated")
    args = ap.parse_args()
    names = args.variants.split(",")
    for name in names:
        try:
            substitutions(name)
        except ValueError as e:
            ap.error(str(e))
    compile_in_workers(build, list(dict.fromkeys(names)))   # a name listed twice (interleaved timing) compiles once

    import torch

    from deepinfer_kernels import testing
    from deepinfer_kernels.tilelang.sparse_mla.common import LOG2E
    from deepinfer_kernels.tilelang.timing import HBM_BYTES_PER_S

    pool = testing.make_pool(SLOTS, D, "cuda", seed=0)
    for width in (int(w) for w in args.widths.split(",")):
        c = make_decode_case(width, "paged128", SLOTS, pool)
        blocks = -(-width // 64)
        reference = None
        for name in names:
            run = _runner(c, name, build(name), LOG2E, None)    # the A/B tool's whole-row launch of a build
            out, _ = run()
            torch.cuda.synchronize()
            if reference is None:
                reference = out.clone()
            diff = (out.float() - reference.float()).abs().max().item()
            us = testing.cuda_time_us(run, graph=True)["median_us"]
            share = c.unique_bytes() / (us * 1e-6) / HBM_BYTES_PER_S
            print(f"w{width} {name:28s} {us:7.1f} us  {us / blocks:.3f} us/block  {share:6.1%} of copy  "
                  f"max|diff| vs {names[0]} {diff:.3g}", flush=True)


if __name__ == "__main__":
    main()
