"""Per-phase timeline of the decode sparse MLA kernel (SM90, ``bulk``, 16 heads, D 512): the
kernel instrumented with ``clock64()`` marks (text substitutions of the builders' source,
``kernel_variants.py``, never merged), run on issue 5's decode cases. One thread of each role
records, for every 64-key block, when it passed each step:

    consumer warpgroup:    stage ready -> QK done -> softmax done -> PV done, stage handed back
    producer warpgroups:   FP8 stage ready -> bf16 stage free -> dequantized, handed over
    issuing lane:          FP8 stage free again -> next block's copies issued

Prints, per case, the mean cycles of each step over the steady-state blocks (the first 4 and the
last one left out), the median over CTAs, beside the block period: which role the pipeline
waits for, and what that role spends its time on. ``sparse_mla_decode_diag.py`` times variants
with parts compiled out; this one sees the unchanged kernel (apart from the marks).

    python packages/deepinfer-kernels/diag/sparse_mla_decode_timeline.py                  # the kernel as it is
    python packages/deepinfer-kernels/diag/sparse_mla_decode_timeline.py idle_producers   # with a diag variant's parts compiled out
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from kernel_variants import ModuleEdit, compile_variant, load_variant, median_us  # noqa: E402

HEADS, D, ROWS, SLOTS = 16, 512, 132, 400_000
MAX_BLOCKS = 256          # block slots per event in a CTA's record
# clock64() into the int64 view of the (otherwise unused, not split) Opart row of the CTA's row
MARK_SRC = r'''
#ifndef DI_MARK_SRC
#define DI_MARK_SRC
__device__ __forceinline__ void di_mark(void* base, int slot) {
  reinterpret_cast<long long*>(base)[slot] = clock64();
}
#endif
'''
EVENTS = ("c_ready", "c_qk", "c_softmax", "c_pv",          # consumer, thread 0
          "p0_fp8", "p0_kb", "p0_done", "p1_fp8", "p1_kb", "p1_done",   # producer warpgroups 0 / 1
          "i_free", "i_issued")                             # issuing lane (slot: the block whose stage it reissues)
EV = {name: i for i, name in enumerate(EVENTS)}


def _mark(ev: str | int, blk: str, cond: str, indent: str) -> str:
    slot = f"({ev}) * {MAX_BLOCKS} + {blk}"
    return (f"{indent}if {cond}:\n{indent}    T.call_extern(\"handle\", \"di_mark\", "
            f"T.access_ptr(Opart[0, r, 0, 0], \"w\"), {slot})\n")


def _consumer_edit() -> ModuleEdit:
    i8 = " " * 8
    return ModuleEdit("sparse_mla.common", (
        ("bar_full, bar_empty, scale):\n        T.barrier_wait(bar_full[s], phase)\n",
         "bar_full, bar_empty, scale, Opart, r, blk):\n        T.barrier_wait(bar_full[s], phase)\n"
         + _mark(EV["c_ready"], "blk", "tx == 0", i8)),
        ("        T.gemm(Kb[s, :, :], Q_s, acc_s, transpose_B=True)\n",
         "        T.gemm(Kb[s, :, :], Q_s, acc_s, transpose_B=True)\n" + _mark(EV["c_qk"], "blk", "tx == 0", i8)),
        ("            _consumer_sync(T, barrier)  # P_s and alpha_s complete before the rescale and PV\n",
         "            _consumer_sync(T, barrier)  # P_s and alpha_s complete before the rescale and PV\n"
         + _mark(EV["c_softmax"], "blk", "tx == 0", i8)),
        ("        T.barrier_arrive(bar_empty[s])\n\n    return consume_block",
         "        T.barrier_arrive(bar_empty[s])\n" + _mark(EV["c_pv"], "blk", "tx == 0", i8)
         + "\n    return consume_block"),
        ("st, bar_full, bar_empty,\n                              scale)",
         "st, bar_full, bar_empty,\n                              scale, Opart, r, 2 * j + s)"),
    ))


def _producer_edit() -> ModuleEdit:
    i24, i28 = " " * 24, " " * 28
    wg = "(tp % 128 == 0)"
    base = "3 * (tp // 128)"
    return ModuleEdit("sparse_mla.bulk", (
        ("\ndef _build_bulk(", f"\nMARK_SRC = {MARK_SRC!r}\n\n\ndef _build_bulk("),
        ("T.import_source(DEQUANT_SRC + BULK_COPY_SRC)     # one import per kernel",
         "T.import_source(DEQUANT_SRC + BULK_COPY_SRC + MARK_SRC)"),
        ("                        T.barrier_wait(fp8_full[s], j & 1)\n",
         "                        T.barrier_wait(fp8_full[s], j & 1)\n" + _mark(f"{EV['p0_fp8']} + {base}", "2 * j + s", wg, i24)),
        ("                        T.barrier_wait(kb_empty[s], (j & 1) ^ 1)\n",
         "                        T.barrier_wait(kb_empty[s], (j & 1) ^ 1)\n" + _mark(f"{EV['p0_kb']} + {base}", "2 * j + s", wg, i24)),
        ("                        T.barrier_arrive(fp8_empty[s])\n",
         "                        T.barrier_arrive(fp8_empty[s])\n" + _mark(f"{EV['p0_done']} + {base}", "2 * j + s", wg, i24)),
        ("                            T.barrier_wait(fp8_empty[s], j & 1)\n"
         "                            issue_block(Pool, K8, ix_s, fp8_full, s, tp, ib, s * (RPL + 1))\n",
         "                            T.barrier_wait(fp8_empty[s], j & 1)\n"
         + _mark(EV["i_free"], "2 * j + s", "tp == 0", i28)
         + "                            issue_block(Pool, K8, ix_s, fp8_full, s, tp, ib, s * (RPL + 1))\n"
         + _mark(EV["i_issued"], "2 * j + s", "tp == 0", i28)),
    ))


def prim_func(variant: str = "base"):
    """The instrumented decode kernel's prim_func (no GPU needed): the launcher's decode kernel
    (two dequantizing warpgroups, no split, no trim) with the marks, and with the substitutions of
    ``sparse_mla_decode_diag.py``'s ``variant`` after them."""
    from sparse_mla_decode_diag import VARIANTS

    consumer, producer, kwargs = VARIANTS[variant]
    c, p = _consumer_edit(), _producer_edit()
    edits = [ModuleEdit(c.name, c.substitutions + tuple(consumer)), ModuleEdit(p.name, p.substitutions + tuple(producer))]
    module = load_variant(edits, f"timeline_{variant}")
    return module._build_bulk(HEADS, D, HEADS, False, **{"producers": 2, "trim": False, **kwargs})


def phases(marks, nblk: int) -> dict[str, float]:
    """Steady-state mean cycles of each step, median over CTAs. ``marks``: int64 (ctas, events,
    MAX_BLOCKS) of clock64 values."""
    import torch

    m = marks[:, :, :nblk].to(torch.float64)
    b = slice(4, nblk - 1)
    prev = slice(3, nblk - 2)
    two_before = slice(2, nblk - 3)
    e = {name: m[:, i] for name, i in EV.items()}
    out = {
        "period (consumer, block to block)": e["c_pv"][:, b] - e["c_pv"][:, prev],
        "consumer waits for its stage": e["c_ready"][:, b] - e["c_pv"][:, prev],
        "consumer QK": e["c_qk"][:, b] - e["c_ready"][:, b],
        "consumer softmax": e["c_softmax"][:, b] - e["c_qk"][:, b],
        "consumer rescale + PV + hand-back": e["c_pv"][:, b] - e["c_softmax"][:, b],
    }
    for w in (0, 1):
        out[f"producer {w} waits for FP8 stage"] = e[f"p{w}_fp8"][:, b] - e[f"p{w}_done"][:, prev]
        out[f"producer {w} waits for bf16 stage"] = e[f"p{w}_kb"][:, b] - e[f"p{w}_fp8"][:, b]
        out[f"producer {w} dequantizes"] = e[f"p{w}_done"][:, b] - e[f"p{w}_kb"][:, b]
    reissued = slice(4, nblk - 2)         # the last two blocks' stages are not reissued
    out["issuer waits for both producers"] = e["i_free"][:, reissued] - e["p0_done"][:, reissued]
    out["issuing the copies"] = e["i_issued"][:, reissued] - e["i_free"][:, reissued]
    out["copy: issued -> producer 0 sees the stage"] = e["p0_fp8"][:, b] - e["i_issued"][:, two_before]
    return {k: v.mean(dim=1).median().item() for k, v in out.items()}


# ---------------------------------------------------------------------------- the "mma" kernel
# its marks are built in (``_build_mma(..., timeline=True)``, ``_cuda_mma.MMA_SRC``)
MMA_EVENTS = ("block", "start0", "softmax_qk0", "bar2_0", "pv0", "start1", "softmax_qk1", "bar2_1", "pv1",
              "prep_start", "prep_end")
MMA_EV = {name: i for i, name in enumerate(MMA_EVENTS)}


def mma_phases(marks, nblk: int) -> dict[str, float]:
    """Steady-state mean cycles of each step of the "mma" kernel (blocks 4 .. nblk - 2), median over
    CTAs: consumer warp 0's steps in each 32-key half (the softmax shares its step with the next
    half's QK), the prep warp's tables per block."""
    import torch

    m = marks[:, :, :nblk].to(torch.float64)
    e = {name: m[:, i] for name, i in MMA_EV.items()}
    b = torch.arange(4, nblk - 1)
    out = {"period (block to block)": e["block"][:, b + 1] - e["block"][:, b],
           "half 1 starts: next block's stage waited for": e["start1"][:, b] - e["pv0"][:, b]}
    for hb in (0, 1):
        out[f"half {hb}: reduce + softmax + next half's QK"] = e[f"softmax_qk{hb}"][:, b] - e[f"start{hb}"][:, b]
        out[f"half {hb}: barrier (P complete)"] = e[f"bar2_{hb}"][:, b] - e[f"softmax_qk{hb}"][:, b]
        out[f"half {hb}: PV (rescale, 16 mma)"] = e[f"pv{hb}"][:, b] - e[f"bar2_{hb}"][:, b]
    out["prep warp: tables of a block"] = e["prep_end"][:, b] - e["prep_start"][:, b]
    out["prep ends -> its block starts"] = e["block"][:, b] - e["prep_end"][:, b]
    return {k: v.mean(dim=1).median().item() for k, v in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("variants", nargs="?", default="base", help="comma-separated variants of sparse_mla_decode_diag.py")
    for variant in ap.parse_args().variants.split(","):
        print(f"== {variant}", flush=True)
        timeline(variant)


def timeline(variant: str) -> None:
    """``variant``: one of the decode diag's or "mma" (the warp-MMA kernel)."""
    if variant == "mma":
        from deepinfer_kernels.tilelang.sparse_mla.mma import _build_mma

        return _timeline(compile_variant(_build_mma(HEADS, D, False, timeline=True)), mma_phases, len(MMA_EVENTS))
    return _timeline(compile_variant(prim_func(variant)), phases, len(EVENTS))


def _timeline(kernel, phase_fn, n_events: int) -> None:
    import torch

    from deepinfer_kernels import testing
    from deepinfer_kernels.tilelang.sparse_mla import plan
    from deepinfer_kernels.tilelang.sparse_mla.common import LOG2E

    pool = testing.make_pool(SLOTS, D, "cuda", seed=0)
    cases = (
        ("kv_blocks_w2048", testing.make_sparse_mla_case(ROWS, HEADS, D, 2048, SLOTS, "cuda", pool=pool, paged=128, seed=1)),
        ("random_w2048", testing.make_sparse_mla_case(ROWS, HEADS, D, 2048, SLOTS, "cuda", pool=pool, distinct=True, seed=1)),
    )
    for case_name, c in cases:
        rows, width = c.indices.shape
        bps = plan(rows, HEADS, D, width, 132, 1, "bulk")["bps"]
        assert bps <= MAX_BLOCKS
        idx = c.indices.to(torch.int32).contiguous()
        out = torch.empty(rows, HEADS, D, dtype=torch.bfloat16, device="cuda")
        lse = torch.empty(rows, HEADS, dtype=torch.float32, device="cuda")
        opart = torch.zeros(1, rows, HEADS, D, dtype=torch.float32, device="cuda")
        lpart = torch.empty(1, rows, HEADS, dtype=torch.float32, device="cuda")
        scale = float(c.sm_scale) * LOG2E
        us = median_us(functools.partial(kernel, c.q, pool, idx, out, lse, opart, lpart, scale, bps))
        torch.cuda.synchronize()
        marks = opart.view(torch.int64).view(rows, -1)[:, : n_events * MAX_BLOCKS].view(rows, n_events, MAX_BLOCKS)
        result = phase_fn(marks.cpu(), bps)
        period = next(iter(result.values()))
        print(f"{case_name}: {us:.1f} us, {us / bps:.2f} us per block = {period:.0f} cycles "
              f"({period / (us / bps) / 1e3:.2f} GHz)", flush=True)
        for name, cycles in result.items():
            print(f"  {name:45s} {cycles:8.0f} cycles  {cycles / period:6.1%}", flush=True)


if __name__ == "__main__":
    main()
