"""CUDA device helpers pulled into TileLang kernels with ``T.import_source`` + ``T.call_extern``.

They do the bit-level format conversions TileLang has no vector primitive for. Each helper is
exact with respect to the torch references in ``deepinfer_kernels.ops``.
"""

# FP8 KV record -> bf16.
# prmt with a sign-replicating selector puts byte b of a word into a 16-bit lane as
# (b | (sign(b) ? 0xFF00 : 0)); shifting left by 4 and masking with 0x87F0 leaves the sign at bit 15
# and the 7 magnitude bits (4 exponent, 3 mantissa) at bits 4..10: the bf16 whose value is
# e4m3(b) * 2^-120 exactly (zero and e4m3 subnormals included, since bf16 keeps subnormals).
# Two exact bf16 multiplies then apply 2^120 and the ue8m0 scale 2^(s-127) (s = 0, i.e. an all-zero
# group, gives 0). Cost per pair of values: prmt, shift, lop3, 2 x mul.bf16x2.
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
  const unsigned fs = ((unsigned)sbyte) << 7;
  const unsigned f2 = fs | (fs << 16);
  const unsigned c2 = 0x7B807B80u;  // bf16x2 (2^120, 2^120)
  const unsigned w[4] = {q.x, q.y, q.z, q.w};
  unsigned o[8];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    o[2 * i] = di_bmul2(di_bmul2(di_e4m3x2_bits(w[i], 0x9180u), c2), f2);
    o[2 * i + 1] = di_bmul2(di_bmul2(di_e4m3x2_bits(w[i], 0xB3A2u), c2), f2);
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
