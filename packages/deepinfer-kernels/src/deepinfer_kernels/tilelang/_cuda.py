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
