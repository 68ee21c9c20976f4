"""CUDA device code of the warp-MMA sparse MLA decode kernel's per-stage tables (``di_mma_prep``: the
producer warps' work on each landed FP8 stage), pulled in with ``T.import_source`` before the
consumers (``_cuda_mma_steps.py``, ``_cuda_mma.py``, ``_cuda_mma_teams.py``), which read the tables.

Per 64-key stage: each key's factor 2^(s - C) for every scale group (s the group's ue8m0 byte, C the
row's running maximum of every scale byte; f16, both halves of a word, in the order a consumer lane
reads them), the -inf mask of invalid keys, and per 32-key half the accumulators' rescale and the
exponent C. The one-exponent design and its precision are in ``_cuda_mma.py``'s docstring.
"""

MMA_PREP_SRC = r"""
#ifndef DI_MMA_PREP_SRC
#define DI_MMA_PREP_SRC
// ---------------------------------------------------------------- per-stage tables (PW warps)
// One exponent for the whole row: C, the running maximum of every scale byte seen so far (after
// each 32-key half; never lower than before; every prep warp computes the same, so none waits for
// another). For the stage's 64 keys (two halves of 32; lane = key within the half) and prep warp
// pw's groups G in [16 pw / PW, 16 (pw + 1) / PW): the key factor kfac[G * 64 + 32 hb + 4 (k % 8) +
// k / 8] = f16 2^(s - C + SHIFT) in both halves of a word (0 for s = 0 or an invalid key; k the key
// in its half, stored in the order a consumer lane reads its four 8-key tiles), and per half
// (warp 0) the accumulators' rescale beta[hb] = 2^(C_before - C_after) and the exponent
// cabs[hb] = C_after (TEAMS: C runs over each half's keys apart, for the two-team consumer of
// _cuda_mma_teams.py). Warp 0 also writes vm (0 / -inf) and, with HW, zeroes invalid keys' bytes
// (never copied; the hardware conversion keeps NaN, and 0 x NaN is NaN). crun: the running C (TEAMS: two). TL:
// clock64() of warp 0 at the start and end into marks[9 * 256 + i], marks[10 * 256 + i] (the
// timeline tool; marks: the float buffer mark_buf from float mark_row on).
__device__ __forceinline__ float di_pow2f(int e) {       // 2^e, 0 below float's normal range
  return e >= -126 ? __uint_as_float((unsigned)(e + 127) << 23) : 0.f;
}
template <int REC, int D, bool HW, bool TL, int PW, bool TEAMS>
__device__ __forceinline__ void di_mma_prep(unsigned char* stage, const int* ix, float* vm, unsigned* kfac,
                                            float* beta, int* cabs, int* crun, int pw, int lane,
                                            void* mark_buf, int mark_row, int i) {
  constexpr int NG = D / 32, GW = NG / PW;               // groups of a prep warp
  static_assert(NG == 16, "16 scale bytes a record");
  long long* marks = reinterpret_cast<long long*>(reinterpret_cast<float*>(mark_buf) + mark_row);
  if (TL && pw == 0 && lane == 0) marks[9 * 256 + i] = clock64();
  constexpr int SHIFT = HW ? 0 : 8;                      // the integer conversion gives the value x 2^-8
  const int g0 = pw * GW;
  unsigned sw[2][GW / 4];                                // the warp's scale words of the lane's two keys
  int kmax[2];                                           // the largest scale byte of each key
#pragma unroll
  for (int hb = 0; hb < 2; ++hb) {
    const int key = 32 * hb + lane;
    const bool ok = ix[key] >= 0;
    uint4 s4 = make_uint4(0u, 0u, 0u, 0u);
    if (ok) s4 = *reinterpret_cast<const uint4*>(stage + key * REC + D);
    unsigned m4 = __vmaxu4(__vmaxu4(s4.x, s4.y), __vmaxu4(s4.z, s4.w));
    m4 = __vmaxu4(m4, m4 >> 16);
    kmax[hb] = (int)max(m4 & 0xffu, (m4 >> 8) & 0xffu);
#pragma unroll
    for (int q = 0; q < GW / 4; ++q) {                   // selected, not indexed (no local array)
      const int wi = g0 / 4 + q;
      sw[hb][q] = wi == 0 ? s4.x : wi == 1 ? s4.y : wi == 2 ? s4.z : s4.w;
    }
    if (pw == 0) {
      vm[key] = ok ? 0.f : __int_as_float(0xff800000);
      if (HW && !ok) {
        uint4* rec = reinterpret_cast<uint4*>(stage + key * REC);
#pragma unroll 4
        for (int c = 0; c < D / 16; ++c) rec[c] = make_uint4(0u, 0u, 0u, 0u);
      }
    }
  }
  // one running exponent over both halves, or (TEAMS: each half has its own consumer team) one per half
  const int m0 = (int)__reduce_max_sync(0xffffffffu, (unsigned)kmax[0]);
  const int m1 = (int)__reduce_max_sync(0xffffffffu, (unsigned)kmax[1]);
  const int before[2] = {crun[0], TEAMS ? crun[1] : max(crun[0], m0)};
  const int C[2] = {max(crun[0], m0), TEAMS ? max(crun[1], m1) : max(max(crun[0], m0), m1)};
  crun[0] = TEAMS ? C[0] : C[1];
  if (TEAMS) crun[1] = C[1];
  const int slot = 4 * (lane & 7) + (lane >> 3);         // the key's place among a consumer lane's four
#pragma unroll
  for (int G = 0; G < GW; ++G)
#pragma unroll
    for (int hb = 0; hb < 2; ++hb) {
      const unsigned b = (sw[hb][G / 4] >> (8 * (G % 4))) & 0xffu;
      unsigned short f;
      asm("cvt.rn.f16.f32 %0, %1;" : "=h"(f) : "f"(di_pow2f((int)b - C[hb] + SHIFT)));
      const unsigned fw = b ? (unsigned)f * 0x10001u : 0u;
      kfac[(g0 + G) * 64 + 32 * hb + slot] = fw;
    }
  if (pw == 0 && lane == 0) {
    beta[0] = di_pow2f(before[0] - C[0]);
    beta[1] = di_pow2f(before[1] - C[1]);
    cabs[0] = C[0];
    cabs[1] = C[1];
  }
  if (HW && pw == 0) asm volatile("fence.proxy.async.shared::cta;" ::: "memory");   // zeroes before later TMA writes
  if (TL && pw == 0 && lane == 0) marks[10 * 256 + i] = clock64();
}
#endif
"""
