"""Where the FP8 QK of the register-operand sparse MLA kernel (``sparse_mla_regs.py``) loses its time:
the kernel's per-phase timeline (``sparse_mla_decode_timeline.py regs``) beside two timing-only
probes whose QK skips the per-group scaling (their scores are wrong; never merged):

    probe 1: all 16 A fragments loaded first, one fence, 16 wgmmas into one accumulator, one wait
    probe 2: the same with a fence and a commit around each wgmma

H200, 2026-12-02: QK 3,040-3,151 cycles a block as is, 1,334-1,369 in both probes: the waits for
each group's result before scaling it serialize QK, not the register-operand fences.

    python tools/sparse_mla_regs_qk_probe.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import sparse_mla_decode_timeline as TL  # noqa: E402
from kernel_variants import ModuleEdit, compile_variant, load_variant  # noqa: E402

PROBE = r'''
template <int REC, int D, int SST, int NBUF, int FENCE_EACH>
__device__ __forceinline__ void di_qk_probe(const void* stage, const void* q8, const float* qsc, const float* vm,
                                            float* S_sm, int tx) {
  constexpr int NG = D / 32;
  const int lane = tx & 31, w = (tx >> 5) & 3;
  const unsigned row = di_qk_a_row<REC>(reinterpret_cast<const unsigned char*>(stage), w, lane);
  const unsigned long long desc0 = di_q8_desc(q8);
  unsigned a[NG][4];
#pragma unroll
  for (int G = 0; G < NG; ++G) di_ldsm_x4_s(row + 32 * G, a[G][0], a[G][1], a[G][2], a[G][3]);
  float d[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) d[i] = 0.f;
  if (!FENCE_EACH) di_wgmma_fence();
#pragma unroll
  for (int G = 0; G < NG; ++G) {
    if (FENCE_EACH) di_wgmma_fence();
    di_wgmma_e4m3_n32(a[G], desc0 + (unsigned long long)(64 * G), d, 1);
    if (FENCE_EACH) di_wgmma_commit();
  }
  if (!FENCE_EACH) di_wgmma_commit();
  di_wgmma_wait<0>();
  di_pin16(d);
  di_qk_store_scores<SST>(d, d + 8, qsc, vm, S_sm, w, lane);     // unscaled: hi = d[0..7], lo = d[8..15]
}
'''


def probe_edit(fence_each: int) -> ModuleEdit:
    """The timeline's marks plus the probe QK (``fence_each``: 0 = probe 1, 1 = probe 2)."""
    base = TL._regs_edit()
    subs = base.substitutions + (
        ("REGS_SRC + FP8_QK_SRC + ", f"REGS_SRC + FP8_QK_SRC + {PROBE!r} + "),
        ('QK_FP8 = f"di_qk_fp8<{REC}, {d}, {SST}, {qk_buffers}>"',
         f'QK_FP8 = f"di_qk_probe<{{REC}}, {{d}}, {{SST}}, {{qk_buffers}}, {fence_each}>"'),
    )
    return ModuleEdit(base.name, subs)


def probe_func(fence_each: int):
    """The instrumented probe kernel's prim_func (no split)."""
    return load_variant([TL._issuer_edit(), probe_edit(fence_each)], f"qk_probe{fence_each}")._build_regs(
        TL.HEADS, TL.D, False)


def main() -> None:
    for label, pf in (("kernel as is", TL.regs_prim_func()), ("probe1: one fence", probe_func(0)),
                      ("probe2: fence + commit per wgmma", probe_func(1))):
        print(f"== {label}", flush=True)
        TL._timeline(compile_variant(pf), TL.regs_phases, len(TL.REGS_EVENTS))


if __name__ == "__main__":
    main()
