"""Warp-level PTX wrappers shared by the register-operand sparse MLA decode kernels
(``_cuda_mma.py``): ``ldmatrix``, ``movmatrix``, ``mma.sync`` m16n8k16 (f16 in,
f32 accumulators), f16 pair arithmetic and conversion (from fp32 and from e4m3), the float <->
ordered-int map behind ``redux.sync`` maxima, mbarrier waits / arrivals and named barriers from
CUDA code. Pulled in with ``T.import_source`` before the kernels' own sources."""

WARP_SRC = r"""
#ifndef DI_WARP_SRC
#define DI_WARP_SRC
// mbarrier wait / arrival at a 32-bit shared address (b), and at a generic pointer
__device__ __forceinline__ void di_mbar_wait_s(unsigned b, unsigned parity) {
  unsigned ok = 0;
  while (!ok) {
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(ok) : "r"(b), "r"(parity) : "memory");
  }
}
__device__ __forceinline__ void di_mbar_arrive_s(unsigned b) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(b) : "memory");
}
__device__ __forceinline__ void di_mbar_wait(const void* bar, unsigned parity) {
  di_mbar_wait_s((unsigned)__cvta_generic_to_shared(bar), parity);
}
__device__ __forceinline__ void di_mbar_arrive(void* bar) { di_mbar_arrive_s((unsigned)__cvta_generic_to_shared(bar)); }
__device__ __forceinline__ void di_named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" :: "r"(id), "r"(threads) : "memory");
}
// the same barrier, also returning whether any of its threads passed p true (bar.red.or)
__device__ __forceinline__ bool di_named_sync_or(int id, int threads, bool p) {
  unsigned r;
  asm volatile("{\n.reg .pred pi, po;\nsetp.ne.u32 pi, %1, 0;\nbarrier.red.or.pred po, %2, %3, pi;\nselp.u32 %0, 1, 0, po;\n}"
               : "=r"(r) : "r"((unsigned)p), "r"(id), "r"(threads) : "memory");
  return r != 0;
}
// ldmatrix.x4 (b16) at shared address a
__device__ __forceinline__ void di_ldsm_x4_s(unsigned a, unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(a) : "memory");
}
__device__ __forceinline__ unsigned di_movt(unsigned x) {        // 8x8 b16 tile transposed across the warp
  unsigned y;
  asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(y) : "r"(x));
  return y;
}
__device__ __forceinline__ unsigned di_hmul2(unsigned a, unsigned b) {
  unsigned d;
  asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
__device__ __forceinline__ unsigned di_f16x2(float lo, float hi) {
  unsigned d;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
}
// c += a b: m16n8k16, f16 inputs, f32 accumulators
__device__ __forceinline__ void di_mma16816(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// the same with C = 0 (ptxas reads the zero register instead of zeroing four)
__device__ __forceinline__ void di_mma16816_z(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%10, %10, %10, %10};"
      : "=f"(c[0]), "=f"(c[1]), "=f"(c[2]), "=f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(0.f));
}
// 4 e4m3 bytes -> two f16 pairs (bytes 0, 1 -> lo; 2, 3 -> hi). HW: the exact hardware conversion;
// otherwise the bits of value x 2^-8 (e4m3's exponent field one bit up: every e4m3, subnormals
// included, is an f16 normal or subnormal, and e4m3 NaN bytes give finite values).
template <bool HW>
__device__ __forceinline__ void di_e4m3x4_f16(unsigned x, unsigned& lo, unsigned& hi) {
  if (HW) {
    asm("{\n.reg .b16 l, h;\nmov.b32 {l, h}, %2;\ncvt.rn.f16x2.e4m3x2 %0, l;\ncvt.rn.f16x2.e4m3x2 %1, h;\n}\n"
        : "=r"(lo), "=r"(hi) : "r"(x));
  } else {
    unsigned a, b;
    asm("prmt.b32 %0, %1, 0, 0x9180;" : "=r"(a) : "r"(x));     // [b0, sign(b0), b1, sign(b1)]
    asm("prmt.b32 %0, %1, 0, 0xB3A2;" : "=r"(b) : "r"(x));
    lo = (a << 7) & 0xBF80BF80u;
    hi = (b << 7) & 0xBF80BF80u;
  }
}
// float <-> int with the same order (signed compare), for redux.sync.max
__device__ __forceinline__ int di_f2ord(float f) {
  const int i = __float_as_int(f);
  return i ^ ((i >> 31) & 0x7fffffff);
}
__device__ __forceinline__ float di_ord2f(int i) { return __int_as_float(i ^ ((i >> 31) & 0x7fffffff)); }
#endif
"""
