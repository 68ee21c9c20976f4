// Throughput probe of the warp-level instructions the warp-MMA sparse MLA decode kernel
// (``_cuda_mma.py``) leans on (SM90; timing only, operands are garbage): mma.sync m16n8k16 f16 ->
// f32, mma.sync m16n8k32 e4m3 -> f32, movmatrix (the PV transposes), and the kernel's 1 : 2 mix of
// mma and movmatrix. 132 CTAs x 4 / 8 / 16 warps, 2,000 iterations of 8 independent chains a warp;
// prints cycles per instruction per SM sub-partition (warps / 4 share one), median over warps.
//
//   nvcc -O3 -gencode arch=compute_90a,code=sm_90a -std=c++17 -o /tmp/mma_sync_pipe_probe packages/deepinfer-kernels/diag/mma_sync_pipe_probe.cu
//   /tmp/mma_sync_pipe_probe
//
// H200, 2026-12-02 (4 / 8 / 16 warps): f16 mma 6.2 / 6.0 / 6.0 cycles per
// sub-partition (~2,050 f16 FMA a cycle per SM, ~72% of the dense wgmma rate), e4m3 k32 mma 4.7 /
// 4.4 / 4.2 (twice the work), movmatrix 4.2 / 4.0 / 4.0, 1 mma + 2 movmatrix 3.5 / 3.2 / 3.3 an
// instruction (9.7 cycles a trio against 6 for the mma alone: a movmatrix beside mma costs ~1.9).
#include <cstdio>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>

constexpr int CHAINS = 8, ITERS = 2000;

#define MMA_F16(k) asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};" \
    : "+f"(c[k][0]), "+f"(c[k][1]), "+f"(c[k][2]), "+f"(c[k][3]) : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1))
#define MMA_E4M3(k) asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};" \
    : "+f"(c[k][0]), "+f"(c[k][1]), "+f"(c[k][2]), "+f"(c[k][3]) : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1))
#define MOVM(x) asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %0;" : "+r"(x))

// kind 0: f16 mma, 1: e4m3 mma, 2: movmatrix, 3: 8 f16 mma + 16 movmatrix an iteration
template <int KIND>
__global__ void probe(long long* cycles, unsigned seed) {
  unsigned a0 = (seed ^ threadIdx.x) & 0x3f3f3f3f, a1 = a0 * 3 & 0x3f3f3f3f, a2 = a0 * 5 & 0x3f3f3f3f,
           a3 = a0 * 7 & 0x3f3f3f3f, b0 = a0 * 11 & 0x3f3f3f3f, b1 = a0 * 13 & 0x3f3f3f3f;
  float c[CHAINS][4] = {};
  unsigned r[CHAINS];
  for (int k = 0; k < CHAINS; ++k) r[k] = seed * (k + 1) ^ threadIdx.x;
  __syncthreads();
  const long long t0 = clock64();
  for (int it = 0; it < ITERS; ++it) {
#pragma unroll
    for (int k = 0; k < CHAINS; ++k) {
      if (KIND == 0 || KIND == 3) MMA_F16(k);
      if (KIND == 1) MMA_E4M3(k);
      if (KIND == 2) MOVM(r[k]);
      if (KIND == 3) { MOVM(r[k]); MOVM(r[(k + 4) % CHAINS]); }
    }
  }
  const long long t1 = clock64();
  float s = 0.f;
  for (int k = 0; k < CHAINS; ++k) s += c[k][0] + c[k][1] + c[k][2] + c[k][3] + (float)r[k];
  if ((threadIdx.x & 31) == 0) cycles[blockIdx.x * 16 + threadIdx.x / 32] = s == 1234.5f ? 0 : t1 - t0;
}

template <int KIND>
static void run(const char* name, int per_iter) {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  long long* d;
  cudaMalloc(&d, sizeof(long long) * sms * 16);
  for (int warps : {4, 8, 16}) {
    for (int rep = 0; rep < 2; ++rep) probe<KIND><<<sms, 32 * warps>>>(d, 0x1234567u);
    std::vector<long long> h(sms * 16);
    cudaMemcpy(h.data(), d, sizeof(long long) * h.size(), cudaMemcpyDeviceToHost);
    std::vector<long long> v;
    for (int b = 0; b < sms; ++b) for (int w = 0; w < warps; ++w) v.push_back(h[b * 16 + w]);
    std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
    const double per_warp = (double)v[v.size() / 2] / ((double)ITERS * CHAINS * per_iter);
    printf("%-28s warps %2d: %6.2f cycles per instruction per sub-partition\n", name, warps, per_warp / (warps / 4));
  }
  cudaFree(d);
}

int main() {
  run<0>("mma m16n8k16 f16", 1);
  run<1>("mma m16n8k32 e4m3", 1);
  run<2>("movmatrix", 1);
  run<3>("1 mma + 2 movmatrix", 3);
  const cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess) { printf("CUDA error: %s\n", cudaGetErrorString(e)); return 1; }
  return 0;
}
