"""CUDA device code both warp-MMA decode consumers share (``_cuda_mma.py``'s one team,
``_cuda_mma_teams.py``'s two): the CTA's block count, Q's per-head power-of-two scale and its mma A
fragments, and the PV step (the accumulators' rescale, then P times the transposed registers).
Pulled in with ``T.import_source`` after ``_cuda_warp.WARP_SRC`` (the PTX wrappers) and before the
consumers.
"""

MMA_STEPS_SRC = r"""
#ifndef DI_MMA_STEPS_SRC
#define DI_MMA_STEPS_SRC
// The CTA's 64-key blocks: keys (W) and bps are kernel parameters, so ptxas reloads them where
// needed; a block count passed in stayed live from the kernel's start and was spilled (two-team consumer).
__device__ __forceinline__ int di_mma_block_count(int keys, int bps) {
  return max(0, min(bps, (keys + 63) / 64 - (int)blockIdx.y * bps));
}
// ---------------------------------------------------------------- Q (both consumers)
// Per-head power-of-two scale to f16 (max |q| in [2^14, 2^15)). qsm[h] = max |q_h| (256 threads, 16 a head)
template <int H, int D>
__device__ __forceinline__ void di_mma_q_maxima(const unsigned short* q, float* qsm, int tx) {
  static_assert(D == 512, "16 threads x 32 dims a head");
  const int hq = tx >> 4, part = tx & 15;
  float mx = 0.f;
  if (hq < H) {
    const uint4* qp = reinterpret_cast<const uint4*>(q + hq * D + 32 * part);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint4 v = qp[i];
      const unsigned u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int k = 0; k < 4; ++k)
        mx = fmaxf(mx, fmaxf(fabsf(__uint_as_float(u[k] << 16)), fabsf(__uint_as_float(u[k] & 0xffff0000u))));
    }
  }
#pragma unroll
  for (int o = 1; o < 16; o <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  if (part == 0) qsm[hq] = mx;
}
__device__ __forceinline__ int di_mma_q_exp(const float* qsm, int h) {   // a: max |q_h| 2^a in [2^14, 2^15)
  const float mx = qsm[h];
  int e = 0;
  frexpf(mx, &e);
  return mx > 0.f ? 15 - e : 0;
}
// The mma A fragments of NC 16-dim chunks from dim d0 (lane g, t: heads g, g + 8; dims 4t .. 4t + 3 of
// each chunk, the permuted k order), after di_mma_q_maxima's barrier.
template <int H, int D, int NC>
__device__ __forceinline__ void di_mma_q_fragments(const unsigned short* q, const float* qsm, int d0, int g, int t,
                                                   unsigned (&qa)[NC][4]) {
  const float up_g = ldexpf(1.f, di_mma_q_exp(qsm, g)), up_g8 = ldexpf(1.f, di_mma_q_exp(qsm, g + 8));
#pragma unroll
  for (int c = 0; c < NC; ++c) {
    const int dim = d0 + 16 * c + 4 * t;
    uint2 vg = make_uint2(0u, 0u), vg8 = make_uint2(0u, 0u);
    if (g < H) vg = *reinterpret_cast<const uint2*>(q + g * D + dim);
    if (g + 8 < H) vg8 = *reinterpret_cast<const uint2*>(q + (g + 8) * D + dim);
    auto lo = [](unsigned u) { return __uint_as_float(u << 16); };
    auto hi = [](unsigned u) { return __uint_as_float(u & 0xffff0000u); };
    qa[c][0] = di_f16x2(lo(vg.x) * up_g, hi(vg.x) * up_g);          // head g, dims 4t, 4t + 1
    qa[c][1] = di_f16x2(lo(vg8.x) * up_g8, hi(vg8.x) * up_g8);      // head g + 8
    qa[c][2] = di_f16x2(lo(vg.y) * up_g, hi(vg.y) * up_g);          // head g, dims 4t + 2, 4t + 3
    qa[c][3] = di_f16x2(lo(vg8.y) * up_g8, hi(vg8.y) * up_g8);
  }
}
// PV of a 32-key half (both consumers): the accumulators of NC 16-dim chunks rescaled by alpha[g] /
// alpha[g + 8] x bt when asked, then P (f16, ldmatrix from p_addr: two 16-key steps) times the
// transposed registers vt [8-key tile][chunk][lo / hi]
template <int NC>
__device__ __forceinline__ void di_mma_pv(float (&O)[NC][2][4], bool rescale, const float* alpha, float bt, int g,
                                          unsigned p_addr, const unsigned (&vt)[4][NC][2]) {
  if (rescale) {
    const float fg = alpha[g] * bt, fg8 = alpha[g + 8] * bt;
#pragma unroll
    for (int c = 0; c < NC; ++c)
#pragma unroll
      for (int x = 0; x < 2; ++x) {
        O[c][x][0] *= fg;
        O[c][x][1] *= fg;
        O[c][x][2] *= fg8;
        O[c][x][3] *= fg8;
      }
  }
#pragma unroll
  for (int kq = 0; kq < 2; ++kq) {
    unsigned pa[4];
    di_ldsm_x4_s(p_addr + 2 * 16 * kq, pa[0], pa[1], pa[2], pa[3]);
#pragma unroll
    for (int c = 0; c < NC; ++c)
#pragma unroll
      for (int x = 0; x < 2; ++x) di_mma16816(O[c][x], pa, vt[2 * kq][c][x], vt[2 * kq + 1][c][x]);
  }
}
#endif
"""
