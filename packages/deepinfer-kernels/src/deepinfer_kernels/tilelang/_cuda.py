"""CUDA device helpers pulled into TileLang kernels with ``T.import_source`` + ``T.call_extern``.

They do the bit-level format conversions TileLang has no vector primitive for. Each helper is
exact with respect to the torch references in ``deepinfer_kernels.ops``.
"""

# FP8 KV record -> bf16.
# prmt with a sign-replicating selector puts byte b of a word into a 16-bit lane as
# (b | (sign(b) ? 0xFF00 : 0)); shifting left by 4 and masking with 0x87F0 leaves the sign at bit 15
# and the 7 magnitude bits (4 exponent, 3 mantissa) at bits 4..10: the bf16 whose value is
# e4m3(b) * 2^-120 exactly (zero and e4m3 subnormals included, since bf16 keeps subnormals).
# One bf16 multiply by 2^120 * 2^(s-127) = 2^(s-7) then applies the ue8m0 scale: that factor is a
# normal bf16 for s <= 134, and the product is the same single rounding of e4m3(b) * 2^(s-127) as
# two multiplies would give (larger scales take the two-multiply path; s = 0, an all-zero group,
# gives 0). Cost per pair of values: prmt, shift, lop3, mul.bf16x2.
DEQUANT_SRC = r"""
#ifndef DI_DEQUANT_SRC
#define DI_DEQUANT_SRC
__device__ __forceinline__ unsigned di_e4m3x2_bits(unsigned x, unsigned sel) {
  unsigned v;
  asm("prmt.b32 %0, %1, 0, %2;" : "=r"(v) : "r"(x), "r"(sel));
  return (v << 4) & 0x87F087F0u;
}
__device__ __forceinline__ unsigned di_bmul2(unsigned a, unsigned b) {
  unsigned d;
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
// 16 e4m3 bytes at src (16-byte aligned) times 2^(sbyte-127) -> 16 bf16 at dst (16-byte aligned).
__device__ __forceinline__ void di_dequant16(const void* src, void* dst, unsigned char sbyte) {
  const uint4 q = *reinterpret_cast<const uint4*>(src);
  const unsigned s = sbyte;
  const unsigned w[4] = {q.x, q.y, q.z, q.w};
  unsigned o[8];
  if (s <= 134u) {
    const unsigned f = s == 0u ? 0u : (s + 120u) << 7;    // bf16 2^(s-7), or 0
    const unsigned f2 = f | (f << 16);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      o[2 * i] = di_bmul2(di_e4m3x2_bits(w[i], 0x9180u), f2);
      o[2 * i + 1] = di_bmul2(di_e4m3x2_bits(w[i], 0xB3A2u), f2);
    }
  } else {
    const unsigned fs = s << 7;
    const unsigned f2 = fs | (fs << 16);
    const unsigned c2 = 0x7B807B80u;  // bf16x2 (2^120, 2^120)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      o[2 * i] = di_bmul2(di_bmul2(di_e4m3x2_bits(w[i], 0x9180u), c2), f2);
      o[2 * i + 1] = di_bmul2(di_bmul2(di_e4m3x2_bits(w[i], 0xB3A2u), c2), f2);
    }
  }
  uint4* d = reinterpret_cast<uint4*>(dst);
  d[0] = make_uint4(o[0], o[1], o[2], o[3]);
  d[1] = make_uint4(o[4], o[5], o[6], o[7]);
}
#endif
"""

# FP4 (e2m1, two codes per byte, element 2i in the low nibble) -> bf16.
# For one byte b holding codes (lo, hi): one multiply by 0x40040 moves the magnitude bits of lo
# to bits 6..8 and those of hi to bits 22..24 (the junk cross terms are masked off), a second one
# moves the sign bits to 15 and 31. A code c = (e1 e0 m) placed at bf16 bits 6..8 is the bf16
# e2m1(c) * 2^-126 exactly (c = 1, the e2m1 subnormal 0.5, lands on the bf16 subnormal 2^-127);
# two exact bf16 multiplies apply 2^126 and the ue8m0 scale 2^(s-127).
FP4_DEQUANT_SRC = r"""
#ifndef DI_FP4_DEQUANT_SRC
#define DI_FP4_DEQUANT_SRC
__device__ __forceinline__ unsigned di_bmul2_fp4(unsigned a, unsigned b) {
  unsigned d;
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
// 4 bytes (8 e2m1 codes) at src -> 8 bf16 at dst (16-byte aligned), times 2^(sbyte-127).
__device__ __forceinline__ void di_dequant_fp4x8(const void* src, void* dst, unsigned char sbyte) {
  const unsigned char* s = reinterpret_cast<const unsigned char*>(src);
  const unsigned fs = ((unsigned)sbyte) << 7;
  const unsigned f2 = fs | (fs << 16);
  const unsigned c2 = 0x7E807E80u;  // bf16x2 (2^126, 2^126)
  unsigned o[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const unsigned b = s[i];
    const unsigned mag = ((b & 0x77u) * 0x40040u) & 0x01C001C0u;
    const unsigned sgn = ((b & 0x88u) * 0x1001000u) & 0x80008000u;
    o[i] = di_bmul2_fp4(di_bmul2_fp4(mag | sgn, c2), f2);
  }
  *reinterpret_cast<uint4*>(dst) = make_uint4(o[0], o[1], o[2], o[3]);
}
#endif
"""

# Global -> shared copies by the TMA unit without a tensor map (cp.async.bulk): sizes are
# multiples of 16 bytes, both addresses 16-byte aligned, and the bytes are counted off the
# mbarrier's expected transaction count. A CTA's own shared address is a valid shared::cluster one.
#
# di_issue_record_runs: one warp stages a block of 64 records. Lane l holds the pool slots of
# records l and l + 32 (-1 = none). Each run of consecutive slots becomes one copy, because the
# TMA unit takes ~40 ns per request whatever its size: 64 separate 528-byte records cap one SM at
# ~12 GB/s, while a KV block of 128 tokens is 128 consecutive slots. Lane 0 arrives on the barrier
# expecting rec bytes per valid record before any copy is issued; returns the valid count.
BULK_COPY_SRC = r"""
#ifndef DI_BULK_COPY_SRC
#define DI_BULK_COPY_SRC
__device__ __forceinline__ void di_bulk_g2s(void* dst, const void* src, unsigned bytes, void* bar) {
  const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
  const unsigned b = (unsigned)__cvta_generic_to_shared(bar);
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               :: "r"(d), "l"(src), "r"(bytes), "r"(b) : "memory");
}
__device__ __forceinline__ int di_issue_record_runs(int s0, int s1, const void* pool, unsigned rec,
                                                    void* dst, void* bar, int lane) {
  const unsigned full = 0xffffffffu;
  const unsigned long long valid =
      ((unsigned long long)__ballot_sync(full, s1 >= 0) << 32) | __ballot_sync(full, s0 >= 0);
  const int up0 = __shfl_up_sync(full, s0, 1);
  const int up1 = __shfl_up_sync(full, s1, 1);
  const int last0 = __shfl_sync(full, s0, 31);
  const int prev1 = lane == 0 ? last0 : up1;
  // record r continues the run of record r - 1 (both valid, consecutive slots)
  const bool c0 = lane > 0 && s0 >= 0 && up0 >= 0 && s0 == up0 + 1;
  const bool c1 = s1 >= 0 && prev1 >= 0 && s1 == prev1 + 1;
  const unsigned long long cont =
      ((unsigned long long)__ballot_sync(full, c1) << 32) | __ballot_sync(full, c0);
  const int count = __popcll(valid);
  if (lane == 0) {
    const unsigned b = (unsigned)__cvta_generic_to_shared(bar);
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                 :: "r"(b), "r"((unsigned)count * rec) : "memory");
  }
  __syncwarp();
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const int r = k * 32 + lane;
    const int s = k == 0 ? s0 : s1;
    if (s >= 0 && !((cont >> r) & 1ull)) {           // r starts a run: it ends where cont breaks
      const unsigned long long after = r == 63 ? 0ull : (~cont) & (~0ull << (r + 1));
      const int end = after ? __ffsll((long long)after) - 1 : 64;
      di_bulk_g2s((unsigned char*)dst + (size_t)r * rec, (const unsigned char*)pool + (size_t)s * rec,
                  (unsigned)(end - r) * rec, bar);
    }
  }
  return count;
}
#endif
"""

# Register-operand sparse MLA decode (``sparse_mla_regs.py``): the consumer warpgroup builds the
# wgmma's register A operand straight from a stage of FP8 records (528 bytes each: 512 e4m3 + 16
# ue8m0 scales, one per 32 values), so no bf16 tile crosses shared memory. ``ldmatrix`` treats the
# FP8 bytes as 16-bit pairs; each 32-bit register it delivers holds 4 bytes, turned into two bf16x2
# by ``di_e4m3x2_bits`` (byte pair -> bf16 bits of e4m3 * 2^-120) and two exact multiplies
# (2^120, then the pair's scales 2^(s - 127) as bf16 bits s << 7; s = 0 gives 0, as in
# ``di_dequant16``).
#
# QK (S^T = K Q^T, 64 tokens on M): ``ldmatrix.x4`` of a warp's 16 tokens x 32 bytes gives lane
# (g = lane / 4, t = lane % 4) bytes 4t..4t+3 of tokens g and g + 8 in each 16-byte half. The
# fragment wants columns 2t, 2t+1 and 2t+8, 2t+9 of a 16-column k-step, so the kernel permutes the
# reduction dimension: logical column l of a 16-column half is physical byte
# ``regs_qk_column(l)``, and Q is stored in shared memory in that order.
#
# PV (O^T = V^T P^T, latent dims on M): ``ldmatrix.x4.trans`` of 8-token x 16-byte tiles gives a
# lane the byte pairs (dims 2g, 2g+1) of tokens 2t and 2t+1; ``prmt`` makes (dim 2g: tokens 2t,
# 2t+1) and (dim 2g+1: ...). So logical row g of a warp's 16 rows is dim 2g and row g + 8 is dim
# 2g + 1 (``regs_pv_dim``), and the output is written back through that permutation. The scales
# (per token and 32 dims) come from a per-stage table the producers build: for (group G, t) the
# 8 bf16x2 words (s_tok << 7 | s_tok+1 << 23) of tokens 16kk + 2t (+8), kk = 0..3.
REGS_SRC = r"""
#ifndef DI_REGS_SRC
#define DI_REGS_SRC
__device__ __forceinline__ void di_ldsm_x4(const void* p, unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3) {
  const unsigned a = (unsigned)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(a) : "memory");
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
// QK A fragment, k columns [32 NGRP c, 32 NGRP (c + 1)) (NGRP scale groups, 2 NGRP k-steps): 8 NGRP registers
template <int REC, int D, int NGRP>
__device__ __forceinline__ void di_fill_qk(void* frag, const void* stage, int tx, int c) {
  unsigned* a = reinterpret_cast<unsigned*>(frag);
  const unsigned char* st = reinterpret_cast<const unsigned char*>(stage);
  const int lane = tx & 31, w = (tx >> 5) & 3, g = lane >> 2;
  const unsigned char* row = st + (16 * w + ((lane >> 3) & 1) * 8 + (lane & 7)) * REC + (lane >> 4) * 16;
  const unsigned char* sg = st + (16 * w + g) * REC + D;      // scales of tokens g and g + 8
#pragma unroll
  for (int q = 0; q < NGRP; ++q) {
    const int G = NGRP * c + q;
    unsigned r0, r1, r2, r3;
    di_ldsm_x4(row + 32 * G, r0, r1, r2, r3);
    const unsigned f = (unsigned)sg[G] << 7, f8 = (unsigned)sg[8 * REC + G] << 7;
    const unsigned f2 = f | (f << 16), f82 = f8 | (f8 << 16);
    a[8 * q + 0] = di_cvt_pair(r0, 0x9180u, f2);
    a[8 * q + 1] = di_cvt_pair(r1, 0x9180u, f82);
    a[8 * q + 2] = di_cvt_pair(r0, 0xB3A2u, f2);
    a[8 * q + 3] = di_cvt_pair(r1, 0xB3A2u, f82);
    a[8 * q + 4] = di_cvt_pair(r2, 0x9180u, f2);
    a[8 * q + 5] = di_cvt_pair(r3, 0x9180u, f82);
    a[8 * q + 6] = di_cvt_pair(r2, 0xB3A2u, f2);
    a[8 * q + 7] = di_cvt_pair(r3, 0xB3A2u, f82);
  }
}
// PV A fragment of dims [64mc, 64mc + 64) x the block's 64 tokens (4 k-steps): 16 registers
template <int REC>
__device__ __forceinline__ void di_fill_pv(void* frag, const void* stage, const void* scales, int tx, int mc) {
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


def regs_qk_column(l):
    """Physical byte (within a 16-column half of a 32-value scale group) of the QK fragment's
    logical column ``l`` (``REGS_SRC``): columns 2t, 2t+1 -> bytes 4t, 4t+1; 2t+8, 2t+9 -> 4t+2,
    4t+3. Plain arithmetic, so the kernel builder calls it on TileLang expressions too."""
    return 4 * ((l % 8) // 2) + 2 * (l // 8) + l % 2


def regs_pv_dim(row):
    """Latent dim (within a 64-dim chunk) of the PV fragment's logical row ``row`` (``REGS_SRC``;
    an int or a TileLang expression)."""
    return (row // 16) * 16 + 2 * (row % 8) + (row % 16) // 8
