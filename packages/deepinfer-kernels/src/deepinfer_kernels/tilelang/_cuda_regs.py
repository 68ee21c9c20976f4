"""CUDA device helpers of the register-operand sparse MLA decode kernel (``sparse_mla_regs.py``),
pulled in with ``T.import_source`` after ``_cuda.DEQUANT_SRC`` (whose ``di_e4m3x2_bits`` and
``di_bmul2`` they use) and ``_cuda_warp.WARP_SRC`` (``di_ldsm_x4_s``): the PV side's fills and
scale table (``REGS_SRC``) and the FP8 QK (``FP8_QK_SRC``)."""

# Register-operand sparse MLA decode (``sparse_mla_regs.py``), PV side: the consumer warpgroup builds
# the wgmma's register A operand straight from a stage of FP8 records (528 bytes each: 512 e4m3 + 16
# ue8m0 scales, one per 32 values), so no bf16 tile crosses shared memory. ``ldmatrix`` treats the
# FP8 bytes as 16-bit pairs; each 32-bit register it delivers holds 4 bytes, turned into two bf16x2
# by ``di_e4m3x2_bits`` (byte pair -> bf16 bits of e4m3 * 2^-120) and exact multiplies by the pair's
# scales (``di_pv_scale_table``: one multiply by 2^(s - 7) when the stage's scales allow, else 2^120
# then 2^(s - 127); s = 0 gives 0, as in ``di_dequant16``). QK needs no conversion (``FP8_QK_SRC``).
#
# PV (O^T = V^T P^T, latent dims on M): ``ldmatrix.x4.trans`` of 8-token x 16-byte tiles gives a
# lane the byte pairs (dims 2g, 2g+1) of tokens 2t and 2t+1; ``prmt`` makes (dim 2g: tokens 2t,
# 2t+1) and (dim 2g+1: ...). So logical row g of a warp's 16 rows is dim 2g and row g + 8 is dim
# 2g + 1 (``regs_pv_dim``), and the output is written back through that permutation. The scales
# (per token and 32 dims) come from a per-stage table a producer warp builds: for (group G, t) the
# 8 bf16x2 words of tokens 16kk + 2t (+8), kk = 0..3, and their successors.
REGS_SRC = r"""
#ifndef DI_REGS_SRC
#define DI_REGS_SRC
// ldmatrix.x4 (b16) from a generic pointer into shared memory (_cuda_warp's di_ldsm_x4_s)
__device__ __forceinline__ void di_ldsm_x4(const void* p, unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3) {
  di_ldsm_x4_s((unsigned)__cvta_generic_to_shared(p), r0, r1, r2, r3);
}
__device__ __forceinline__ void di_ldsm_x4_t(const void* p, unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3) {
  const unsigned a = (unsigned)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(a) : "memory");
}
// two e4m3 bytes of x (prmt selector sel: [b, sign(b), b', sign(b')]) times the bf16x2 scales f2
__device__ __forceinline__ unsigned di_cvt_pair(unsigned x, unsigned sel, unsigned f2) {
  return di_bmul2(di_bmul2(di_e4m3x2_bits(x, sel), 0x7B807B80u), f2);
}
// PV A fragment of dims [64mc, 64mc + 64) x the block's 64 tokens (4 k-steps): 16 registers.
// one_mul (the stage's table holds 2^(s - 7), see di_pv_scale_table): one exact multiply a pair
template <int REC>
__device__ __forceinline__ void di_fill_pv(void* frag, const void* stage, const void* scales, int tx, int mc,
                                           int one_mul = 0) {
  unsigned* a = reinterpret_cast<unsigned*>(frag);
  const unsigned char* st = reinterpret_cast<const unsigned char*>(stage);
  const int lane = tx & 31, w = (tx >> 5) & 3, t = lane & 3;
  const int col = 64 * mc + 16 * w;                            // the warp's 16 dims
  const uint4* sf = reinterpret_cast<const uint4*>(scales) + ((col >> 5) * 4 + t) * 2;
  const uint4 fa = sf[0], fb = sf[1];
  const unsigned f[8] = {fa.x, fa.y, fa.z, fa.w, fb.x, fb.y, fb.z, fb.w};
#pragma unroll
  for (int kp = 0; kp < 2; ++kp) {                             // tokens [32kp, 32kp + 32): k-steps 2kp, 2kp + 1
    unsigned r0, r1, r2, r3;
    di_ldsm_x4_t(st + (32 * kp + (lane >> 3) * 8 + (lane & 7)) * REC + col, r0, r1, r2, r3);
    const int k0 = 2 * kp, k1 = 2 * kp + 1;
    if (one_mul) {
      a[4 * k0 + 0] = di_bmul2(di_e4m3x2_bits(r0, 0xA280u), f[2 * k0]);
      a[4 * k0 + 1] = di_bmul2(di_e4m3x2_bits(r0, 0xB391u), f[2 * k0]);
      a[4 * k0 + 2] = di_bmul2(di_e4m3x2_bits(r1, 0xA280u), f[2 * k0 + 1]);
      a[4 * k0 + 3] = di_bmul2(di_e4m3x2_bits(r1, 0xB391u), f[2 * k0 + 1]);
      a[4 * k1 + 0] = di_bmul2(di_e4m3x2_bits(r2, 0xA280u), f[2 * k1]);
      a[4 * k1 + 1] = di_bmul2(di_e4m3x2_bits(r2, 0xB391u), f[2 * k1]);
      a[4 * k1 + 2] = di_bmul2(di_e4m3x2_bits(r3, 0xA280u), f[2 * k1 + 1]);
      a[4 * k1 + 3] = di_bmul2(di_e4m3x2_bits(r3, 0xB391u), f[2 * k1 + 1]);
      continue;
    }
    a[4 * k0 + 0] = di_cvt_pair(r0, 0xA280u, f[2 * k0]);
    a[4 * k0 + 1] = di_cvt_pair(r0, 0xB391u, f[2 * k0]);
    a[4 * k0 + 2] = di_cvt_pair(r1, 0xA280u, f[2 * k0 + 1]);
    a[4 * k0 + 3] = di_cvt_pair(r1, 0xB391u, f[2 * k0 + 1]);
    a[4 * k1 + 0] = di_cvt_pair(r2, 0xA280u, f[2 * k1]);
    a[4 * k1 + 1] = di_cvt_pair(r2, 0xB391u, f[2 * k1]);
    a[4 * k1 + 2] = di_cvt_pair(r3, 0xA280u, f[2 * k1 + 1]);
    a[4 * k1 + 3] = di_cvt_pair(r3, 0xB391u, f[2 * k1 + 1]);
  }
}
#endif
"""


# QK by FP8 wgmma for the register-operand kernel (``sparse_mla_regs.py``). The scores need no
# dequantization: a 32-value scale group is exactly one ``m64n32k32`` e4m3 k-step, so the stage's raw
# record bytes are the A operand and each group's ue8m0 scale multiplies that k-step's fp32 result.
#
# A: ``ldmatrix.x4`` (b16, not transposed) of a warp's 16 tokens x the group's 32 bytes gives lane
# (g = lane / 4, t = lane % 4) bytes 4t..4t+3 of tokens g and g + 8 in each 16-byte half: exactly the
# e4m3 A fragment (rows g, g + 8; k 4t..4t+3 and 16 + 4t..16 + 4t + 3), so nothing is permuted.
# B: Q as two e4m3 rows a head, hi = e4m3(q 2^a) and lo = e4m3((q - hi 2^-a) 2^b) with power-of-two
# a, b per head (``di_q8_prep``), 32 rows (hi heads 0..15, lo heads 16..31) in the no-swizzle K-major
# layout: byte (n, k) at (k / 16) 512 + 16 n + k % 16 (core matrices 8 rows x 16 bytes; 512 bytes
# between the two 16-byte halves of a k-step, 128 between 8-row groups). hi + lo holds every bf16
# element exactly unless it sits more than ~13 binades below its head's largest (lo then subnormal).
# Records of invalid slots are not copied (garbage, maybe e4m3 NaN): their rows are selected to -inf.
# Imported after ``_cuda_warp.WARP_SRC`` (its ``di_ldsm_x4_s``).
FP8_QK_SRC = r"""
#ifndef DI_FP8_QK_SRC
#define DI_FP8_QK_SRC
__device__ __forceinline__ void di_wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void di_wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void di_wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;" :: "n"(N) : "memory"); }
__device__ __forceinline__ void di_pin16(float (&d)[16]) {
#pragma unroll
  for (int i = 0; i < 16; ++i) asm volatile("" : "+f"(d[i]) :: "memory");
}
// d = A B (scale_d 0) or d += A B (1); A: 4 registers of e4m3 (64 x 32), B: descriptor (32 x 32, K-major)
__device__ __forceinline__ void di_wgmma_e4m3_n32(const unsigned (&a)[4], unsigned long long desc, float (&d)[16],
                                                  int scale_d = 0) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
      "{%16, %17, %18, %19}, %20, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(scale_d));
}
__device__ __forceinline__ float di_ue8m0(unsigned w, int byte) {      // 2^(s - 127); s = 0 gives 0
  return __uint_as_float(((w >> (8 * byte)) & 0xffu) << 23);
}
// Q row (H <= 16 heads x D) -> q8 (32 x D e4m3, the layout above) and qsc[0..15] = 2^-a, qsc[16..31] =
// 2^-b per head; 128 threads, thread t: head t / 8, values [D/8 (t % 8), D/8 (t % 8 + 1)).
template <int D>
__device__ __forceinline__ void di_q8_prep(const void* q_row, int H, void* q8, float* qsc, int t) {
  constexpr int PER = D / 8;
  const int h = t >> 3, part = t & 7;
  const unsigned short* q = reinterpret_cast<const unsigned short*>(q_row) + (size_t)h * D + part * PER;  // bf16 bits
  float v[PER];
#pragma unroll
  for (int i = 0; i < PER; ++i) v[i] = h < H ? __uint_as_float((unsigned)q[i] << 16) : 0.f;
  unsigned char* dst = reinterpret_cast<unsigned char*>(q8);
#pragma unroll
  for (int half = 0; half < 2; ++half) {          // hi, then lo of the residual
    float amax = 0.f;
#pragma unroll
    for (int i = 0; i < PER; ++i) amax = fmaxf(amax, fabsf(v[i]));
#pragma unroll
    for (int o = 1; o < 8; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    int e = 0;
    frexpf(amax, &e);                                // amax < 2^e
    const int a = amax > 0.f ? min(8 - e, 127) : 0;  // amax 2^a < 256 <= 448
    const float up = ldexpf(1.f, a), down = ldexpf(1.f, -a);
    unsigned words[PER / 4];
#pragma unroll
    for (int i = 0; i < PER; i += 2) {
      unsigned short p2;
      asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(p2) : "f"(v[i + 1] * up), "f"(v[i] * up));
      unsigned h2;
      float b0, b1;
      asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(p2));
      asm("{\n.reg .b16 lo, hi;\nmov.b32 {lo, hi}, %2;\ncvt.f32.f16 %0, lo;\ncvt.f32.f16 %1, hi;\n}\n"
          : "=f"(b0), "=f"(b1) : "r"(h2));
      v[i] -= b0 * down;                             // exact: the residual of a bf16 value
      v[i + 1] -= b1 * down;
      if (i % 4 == 0) words[i / 4] = p2; else words[i / 4] |= (unsigned)p2 << 16;
    }
#pragma unroll
    for (int c = 0; c < PER / 16; ++c) {
      const int kc = part * (PER / 16) + c;          // 16-byte k-chunk
      *reinterpret_cast<uint4*>(dst + kc * 512 + (16 * half + h) * 16) =
          make_uint4(words[4 * c], words[4 * c + 1], words[4 * c + 2], words[4 * c + 3]);
    }
    if (part == 0) qsc[16 * half + h] = h < H ? down : 0.f;
  }
}
__device__ __forceinline__ void di_wgmma_wait_n(int n) {   // n folds to a constant once unrolled
  switch (n) {
    case 0: di_wgmma_wait<0>(); break;
    case 1: di_wgmma_wait<1>(); break;
    case 2: di_wgmma_wait<2>(); break;
    case 3: di_wgmma_wait<3>(); break;
    case 4: di_wgmma_wait<4>(); break;
    case 5: di_wgmma_wait<5>(); break;
    case 6: di_wgmma_wait<6>(); break;
    default: di_wgmma_wait<7>(); break;
  }
}
// The QK's A operand and B descriptor, shared with tools/sparse_mla_regs_qk_probe.py: the shared
// address lane (of warp w) hands ldmatrix.x4 for scale group 0 (group G: + 32 G), and Q8's
// descriptor for k-step 0 (k-step G: + 64 G).
template <int REC>
__device__ __forceinline__ unsigned di_qk_a_row(const unsigned char* st, int w, int lane) {
  return (unsigned)__cvta_generic_to_shared(st + (16 * w + ((lane >> 3) & 1) * 8 + (lane & 7)) * REC + (lane >> 4) * 16);
}
__device__ __forceinline__ unsigned long long di_q8_desc(const void* q8) {
  return (unsigned long long)((__cvta_generic_to_shared(q8) >> 4) & 0x3fff)
         | (32ull << 16) | (8ull << 32);   // LBO 512 B, SBO 128 B, no swizzle
}
// The lane's 8 scores (hi[i] qsc[h] + lo[i] qsc[16 + h]: Q's hi and lo rows) to S_sm[tok * SST + h],
// -inf for invalid tokens (vm[tok] != 0).
template <int SST>
__device__ __forceinline__ void di_qk_store_scores(const float* hi, const float* lo, const float* qsc, const float* vm,
                                                   float* S_sm, int w, int lane) {
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int tok = 16 * w + g + 8 * ((i >> 1) & 1), h = 8 * (i >> 2) + 2 * t + (i & 1);
    const float s = fmaf(hi[i], qsc[h], lo[i] * qsc[16 + h]);
    S_sm[tok * SST + h] = vm[tok] == 0.f ? s : __int_as_float(0xff800000);
  }
}
// S_sm[tok * SST + h] for the stage's 64 tokens x 16 heads (raw scores, -inf for invalid tokens:
// vm[tok] != 0); 128 consumer threads (tx). NBUF accumulators: up to NBUF wgmmas in flight, group
// g scaled in once group g + NBUF - 1 is issued.
template <int REC, int D, int SST, int NBUF>
__device__ __forceinline__ void di_qk_fp8(const void* stage, const void* q8, const float* qsc, const float* vm,
                                          float* S_sm, int tx) {
  constexpr int NG = D / 32;
  const int lane = tx & 31, w = (tx >> 5) & 3, g = lane >> 2;
  const unsigned char* st = reinterpret_cast<const unsigned char*>(stage);
  const unsigned row = di_qk_a_row<REC>(st, w, lane);
  const uint4 sc0 = *reinterpret_cast<const uint4*>(st + (16 * w + g) * REC + D);       // token g's scales
  const uint4 sc8 = *reinterpret_cast<const uint4*>(st + (16 * w + g + 8) * REC + D);   // token g + 8's
  const unsigned s0w[4] = {sc0.x, sc0.y, sc0.z, sc0.w}, s8w[4] = {sc8.x, sc8.y, sc8.z, sc8.w};
  const unsigned long long desc0 = di_q8_desc(q8);
  unsigned a[NBUF][4];
  float acc[NBUF][16];
  float thi[8], tlo[8];
#pragma unroll
  for (int b = 0; b < NBUF; ++b)
#pragma unroll
    for (int i = 0; i < 16; ++i) acc[b][i] = 0.f;
#pragma unroll
  for (int i = 0; i < 8; ++i) { thi[i] = 0.f; tlo[i] = 0.f; }
#pragma unroll
  for (int G = 0; G < NG + NBUF - 1; ++G) {
    if (G < NG) {
      di_ldsm_x4_s(row + 32 * G, a[G % NBUF][0], a[G % NBUF][1], a[G % NBUF][2], a[G % NBUF][3]);
      di_wgmma_fence();
      di_wgmma_e4m3_n32(a[G % NBUF], desc0 + (unsigned long long)(64 * G), acc[G % NBUF]);
      di_wgmma_commit();
    }
    const int P = G - (NBUF - 1);                    // the group scaled in now
    if (P >= 0) {
      di_wgmma_wait_n((G < NG ? G : NG - 1) - P);    // groups issued after P may stay in flight
      const int b = P % NBUF;
      di_pin16(acc[b]);
      const float f0 = di_ue8m0(s0w[P / 4], P % 4), f8 = di_ue8m0(s8w[P / 4], P % 4);
#pragma unroll
      for (int j = 0; j < 2; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          thi[4 * j + e] = fmaf(acc[b][4 * j + e], f0, thi[4 * j + e]);
          thi[4 * j + 2 + e] = fmaf(acc[b][4 * j + 2 + e], f8, thi[4 * j + 2 + e]);
          tlo[4 * j + e] = fmaf(acc[b][8 + 4 * j + e], f0, tlo[4 * j + e]);
          tlo[4 * j + 2 + e] = fmaf(acc[b][8 + 4 * j + 2 + e], f8, tlo[4 * j + 2 + e]);
        }
      }
    }
  }
  di_qk_store_scores<SST>(thi, tlo, qsc, vm, S_sm, w, lane);
}
// One warp: the PV scale table of a stage (``REGS_SRC``'s layout: word G * 32 + i holds the bf16x2
// scales of group G for tokens tok(i) = 16 ((i % 8) / 2) + 2 (i / 8) + 8 (i % 2) and tok(i) + 1, 0 for
// invalid tokens) and the -inf mask vm of its 64 tokens. When every valid scale byte is <= 134 the
// words are 2^(s - 7) (bits (s + 120) << 7; s = 0 gives 0): the fill's e4m3 bits (the value times
// 2^-120) then need one multiply, and *one_mul = 1; otherwise 2^(s - 127) (bits s << 7) and 0.
// FOLD = false: always the latter (a kernel whose fills take the two-multiply path only).
template <int REC, int D, bool FOLD = true>
__device__ __forceinline__ void di_pv_scale_table(const void* stage, const int* ix, unsigned* sft, float* vm,
                                                  int* one_mul, int lane) {
  const unsigned char* st = reinterpret_cast<const unsigned char*>(stage);
  const int tok = 16 * ((lane & 7) >> 1) + 2 * (lane >> 3) + 8 * (lane & 1);
  const bool ok0 = ix[tok] >= 0, ok1 = ix[tok + 1] >= 0;
  const uint4 z = make_uint4(0u, 0u, 0u, 0u);
  const uint4 v0 = ok0 ? *reinterpret_cast<const uint4*>(st + tok * REC + D) : z;
  const uint4 v1 = ok1 ? *reinterpret_cast<const uint4*>(st + (tok + 1) * REC + D) : z;
  vm[tok] = ok0 ? 0.f : __int_as_float(0xff800000);
  vm[tok + 1] = ok1 ? 0.f : __int_as_float(0xff800000);
  const unsigned w0[4] = {v0.x, v0.y, v0.z, v0.w}, w1[4] = {v1.x, v1.y, v1.z, v1.w};
  bool big = false;                                  // a byte over 134 (2^(s - 7) past bf16's range)
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    big |= __vcmpgtu4(w0[k], 0x86868686u) != 0u || __vcmpgtu4(w1[k], 0x86868686u) != 0u;
  }
  const bool fold = FOLD && !__any_sync(0xffffffffu, big);
#pragma unroll
  for (int G = 0; G < D / 32; ++G) {
    unsigned b0 = (w0[G / 4] >> (8 * (G % 4))) & 0xffu, b1 = (w1[G / 4] >> (8 * (G % 4))) & 0xffu;
    if (fold) {
      b0 = b0 ? b0 + 120u : 0u;
      b1 = b1 ? b1 + 120u : 0u;
    }
    sft[G * 32 + lane] = (b0 << 7) | (b1 << 23);
  }
  if (lane == 0) *one_mul = fold ? 1 : 0;
}
#endif
"""


def regs_pv_dim(row):
    """Latent dim (within a 64-dim chunk) of the PV fragment's logical row ``row`` (``REGS_SRC``;
    an int or a TileLang expression)."""
    return (row // 16) * 16 + 2 * (row % 8) + (row % 16) // 8
