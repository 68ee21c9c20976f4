// Issue-pattern probe of the wgmmas the sparse MLA decode kernels issue (SM90; timing only, the
// operands are garbage): the register-operand PV of ``regs`` (m64n16k16 bf16, 8 fragments x 4
// k-steps) as dependent chains vs k-step-major; its FP8 QK (m64n32k32 e4m3, 16 scale groups) with a
// wait before each group's scaling, in rounds, or as one chain; ``bulk``'s shared-memory QK and PV.
// 132 CTAs x 1 or 2 warpgroups, 2,000 iterations; prints cycles per wgmma (median over warpgroups)
// and the SM clock (clock64 over %globaltimer).
//
//   nvcc -O3 -gencode arch=compute_90a,code=sm_90a -std=c++17 -o /tmp/wgmma_issue_probe tools/wgmma_issue_probe.cu
//   /tmp/wgmma_issue_probe
#include <cstdio>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>

__device__ __forceinline__ unsigned long long mkdesc(const void* p, int lbo, int sbo) {
  unsigned a = (unsigned)__cvta_generic_to_shared(p);
  return (unsigned long long)((a & 0x3FFFF) >> 4) | ((unsigned long long)((lbo >> 4) & 0x3FFF) << 16) |
         ((unsigned long long)((sbo >> 4) & 0x3FFF) << 32);
}
__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N> __device__ __forceinline__ void waitg() { asm volatile("wgmma.wait_group.sync.aligned %0;" :: "n"(N) : "memory"); }

// bf16 m64n16k16, A regs (4), B desc, d 8 f32
__device__ __forceinline__ void mma_bf16(float (&d)[8], const unsigned (&a)[4], unsigned long long b) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7}, {%8,%9,%10,%11}, %12, p, 1, 1, 0;\n}\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}
// e4m3 m64n32k32, A regs (4), B desc, d 16 f32, scale_d 0 (fresh) or 1
__device__ __forceinline__ void mma_e4m3(float (&d)[16], const unsigned (&a)[4], unsigned long long b, int sd) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, "
               "{%16,%17,%18,%19}, %20, p, 1, 1;\n}\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                 "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(sd));
}

__device__ __forceinline__ void mma_bf16_ss(float (&d)[8], unsigned long long a, unsigned long long b) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7}, %8, %9, p, 1, 1, 0, 0;\n}\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
               : "l"(a), "l"(b));
}
__device__ __forceinline__ unsigned long long gtime() {
  unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t;
}

constexpr int ITER = 2000;

// MODE 0: PV fragment-major: 8 fragments x 4 dependent k-steps, commit per fragment, wait<1> (regs today)
// MODE 1: PV k-step-major: 4 k-steps x 8 independent fragments, commit per k-step, wait<1>
// MODE 2: PV k-step-major, one commit and wait<0> per block
// MODE 3: QK 16 independent e4m3 wgmmas (scale_d 0) into 4 rotating accumulators, wait<3> after each (regs today, 4 in flight)
// MODE 4: QK 16 e4m3 wgmmas in rounds of 4 into 4 accumulators, one wait<0> per round
// MODE 5: QK 16 e4m3 wgmmas in one dependent chain (scale_d 1), one wait (the timing-only probe)
// MODE 6: bulk's QK: 32 shared-memory (SS) bf16 k-steps into one accumulator, one wait
// MODE 7: bulk's PV: 8 SS fragments x 4 k-steps, fragment-major, one wait
// MODE 8: bulk's PV k-step-major, one wait
template <int MODE>
__global__ void __launch_bounds__(256, 1) probe(float* sink, unsigned long long* cyc, unsigned long long* ns) {
  __shared__ __align__(1024) unsigned char sb[16384];
  for (int i = threadIdx.x; i < 16384 / 4; i += blockDim.x) reinterpret_cast<unsigned*>(sb)[i] = 0x3c003c00u ^ (i * 2654435761u & 0x00ff00ffu);
  __syncthreads();
  const int wg = threadIdx.x / 128;
  unsigned a[4][4];
#pragma unroll
  for (int k = 0; k < 4; ++k)
#pragma unroll
    for (int i = 0; i < 4; ++i) a[k][i] = 0x3c003c00u + threadIdx.x * 7 + k * 3 + i;
  const unsigned long long bd = mkdesc(sb + wg * 4096, 128, 256);
  const unsigned long long ad = mkdesc(sb + 8192, 128, 256);
  float acc[8][8];
  float q[4][16];
#pragma unroll
  for (int m = 0; m < 8; ++m)
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[m][i] = 0.f;
#pragma unroll
  for (int m = 0; m < 4; ++m)
#pragma unroll
    for (int i = 0; i < 16; ++i) q[m][i] = 0.f;
  float sum = 0.f;
  unsigned long long c0 = 0, t0 = 0;
  for (int it = -50; it < ITER; ++it) {
    if (it == 0) { __syncwarp(); c0 = clock64(); t0 = gtime(); }
    if (MODE == 0) {
#pragma unroll
      for (int m = 0; m < 8; ++m) {
        fence();
#pragma unroll
        for (int k = 0; k < 4; ++k) mma_bf16(acc[m], a[k], bd + k * 16);
        commit();
        waitg<1>();
      }
      waitg<0>();
    } else if (MODE == 1) {
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        fence();
#pragma unroll
        for (int m = 0; m < 8; ++m) mma_bf16(acc[m], a[k], bd + k * 16);
        commit();
        waitg<1>();
      }
      waitg<0>();
    } else if (MODE == 2) {
      fence();
#pragma unroll
      for (int k = 0; k < 4; ++k)
#pragma unroll
        for (int m = 0; m < 8; ++m) mma_bf16(acc[m], a[k], bd + k * 16);
      commit();
      waitg<0>();
    } else if (MODE == 3) {
#pragma unroll
      for (int G = 0; G < 16 + 3; ++G) {
        if (G < 16) {
          fence();
          mma_e4m3(q[G % 4], a[G % 4], bd + G * 32, 0);
          commit();
        }
        const int P = G - 3;
        if (P >= 0) {
          const int n = (G < 16 ? G : 15) - P;
          if (n == 3) waitg<3>(); else if (n == 2) waitg<2>(); else if (n == 1) waitg<1>(); else waitg<0>();
#pragma unroll
          for (int i = 0; i < 16; ++i) asm volatile("" : "+f"(q[P % 4][i]) :: "memory");
#pragma unroll
          for (int i = 0; i < 16; ++i) sum += q[P % 4][i];
        }
      }
    } else if (MODE == 4) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        fence();
#pragma unroll
        for (int g = 0; g < 4; ++g) mma_e4m3(q[g], a[g], bd + (4 * r + g) * 32, 0);
        commit();
        waitg<0>();
#pragma unroll
        for (int g = 0; g < 4; ++g)
#pragma unroll
          for (int i = 0; i < 16; ++i) sum += q[g][i];
      }
    } else if (MODE == 6) {      // bulk's QK: 32 SS k-steps into one accumulator
      fence();
#pragma unroll
      for (int k = 0; k < 32; ++k) mma_bf16_ss(acc[0], ad + (k % 4) * 128, bd + (k % 8) * 32);
      commit();
      waitg<0>();
    } else if (MODE == 7) {      // bulk's PV: 8 M-tiles x 4 SS k-steps, fragment-major, one wait
      fence();
#pragma unroll
      for (int m = 0; m < 8; ++m)
#pragma unroll
        for (int k = 0; k < 4; ++k) mma_bf16_ss(acc[m], ad + (m * 4 + k) % 4 * 128, bd + k * 32);
      commit();
      waitg<0>();
    } else if (MODE == 8) {      // bulk's PV k-major
      fence();
#pragma unroll
      for (int k = 0; k < 4; ++k)
#pragma unroll
        for (int m = 0; m < 8; ++m) mma_bf16_ss(acc[m], ad + (m * 4 + k) % 4 * 128, bd + k * 32);
      commit();
      waitg<0>();
    } else if (MODE == 5) {
      fence();
#pragma unroll
      for (int g = 0; g < 16; ++g) mma_e4m3(q[0], a[g % 4], bd + g * 32, g > 0);
      commit();
      waitg<0>();
#pragma unroll
      for (int i = 0; i < 16; ++i) sum += q[0][i];
    }
  }
  __syncwarp();
  const unsigned long long c1 = clock64(), t1 = gtime();
#pragma unroll
  for (int m = 0; m < 8; ++m)
#pragma unroll
    for (int i = 0; i < 8; ++i) sum += acc[m][i];
#pragma unroll
  for (int m = 0; m < 4; ++m)
#pragma unroll
    for (int i = 0; i < 16; ++i) sum += q[m][i];
  sink[blockIdx.x * blockDim.x + threadIdx.x] = sum;
  if (threadIdx.x % 128 == 0) {
    cyc[blockIdx.x * 2 + wg] = c1 - c0;
    ns[blockIdx.x * 2 + wg] = t1 - t0;
  }
}

template <int MODE>
void run(const char* name, int wgs, int wgmmas_per_iter) {
  float* sink; unsigned long long *cyc, *ns;
  cudaMalloc(&sink, 132 * 256 * 4); cudaMalloc(&cyc, 132 * 2 * 8); cudaMalloc(&ns, 132 * 2 * 8);
  cudaMemset(cyc, 0, 132 * 16); cudaMemset(ns, 0, 132 * 16);
  probe<MODE><<<132, 128 * wgs>>>(sink, cyc, ns);
  probe<MODE><<<132, 128 * wgs>>>(sink, cyc, ns);
  cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess) { printf("%s: %s\n", name, cudaGetErrorString(e)); return; }
  std::vector<unsigned long long> c(132 * 2), t(132 * 2);
  cudaMemcpy(c.data(), cyc, 132 * 16, cudaMemcpyDeviceToHost);
  cudaMemcpy(t.data(), ns, 132 * 16, cudaMemcpyDeviceToHost);
  std::vector<double> per, mhz;
  for (int i = 0; i < 132 * 2; ++i)
    if (c[i]) { per.push_back((double)c[i] / ITER); mhz.push_back((double)c[i] / t[i] * 1e3); }
  std::sort(per.begin(), per.end()); std::sort(mhz.begin(), mhz.end());
  printf("%-58s wgs %d: %8.1f cycles/iter (%6.1f per wgmma), SM clock %5.0f MHz\n", name, wgs,
         per[per.size() / 2], per[per.size() / 2] / wgmmas_per_iter, mhz[mhz.size() / 2]);
  cudaFree(sink); cudaFree(cyc); cudaFree(ns);
}

int main() {
  for (int wgs = 1; wgs <= 2; ++wgs) {
    run<0>("PV bf16 m64n16k16: 8 chains of 4, wait<1> per fragment", wgs, 32);
    run<1>("PV bf16 m64n16k16: k-major, 8 independent, wait<1> per k", wgs, 32);
    run<2>("PV bf16 m64n16k16: k-major, one wait per block", wgs, 32);
    run<3>("QK e4m3 m64n32k32: 16 independent, 4 in flight, wait<3>", wgs, 16);
    run<4>("QK e4m3 m64n32k32: rounds of 4, wait<0> per round", wgs, 16);
    run<5>("QK e4m3 m64n32k32: one chain of 16, one wait", wgs, 16);
    run<6>("bulk QK bf16 SS m64n16k16: chain of 32, one wait", wgs, 32);
    run<7>("bulk PV bf16 SS m64n16k16: 8 chains of 4, one wait", wgs, 32);
    run<8>("bulk PV bf16 SS m64n16k16: k-major, one wait", wgs, 32);
  }
  return 0;
}
