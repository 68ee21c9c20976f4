"""CUDA device code of the warp-MMA sparse MLA decode kernel (``sparse_mla_mma.py``), pulled in with
``T.import_source`` after ``_cuda.BULK_COPY_SRC`` and ``_cuda_warp.WARP_SRC`` (its PTX wrappers and
conversions): the consumer (``di_mma_consumer``: Q set-up, the block loop, the epilogue) and the
per-stage scale tables (``di_mma_prep``).

Eight consumer warps share one query row's 16 heads; warp w owns the latent dims [64w, 64w + 64)
(scale groups 2w and 2w + 1). Per 32-key half of a 64-key stage, every warp:

1. loads its 64 dims of the 32 records with ``ldmatrix`` (one 32-bit register: 4 e4m3 bytes of one
   key), converts them to f16 pairs once (``di_e4m3x4_f16``: the hardware ``cvt``, exact, or three
   integer operations giving the value times 2^-8) and multiplies each pair by its key's factor
   2^(s - C) for their group (``kfac``; s the group's ue8m0 byte, C the row's running maximum of
   every scale byte so far), so one register set carries the dequantized values in units of
   2^(C - 127) for QK and PV alike;
2. QK, ``mma.m16n8k16`` (16 heads = M): its partial of the score, in those units;
3. writes the partial to shared memory (two buffers, alternating halves); warp r sums the eight
   partials of heads 2r, 2r + 1 (complete since the last half's barrier), scales them by
   2^(C - 127), runs their online softmax (LAZY: the reference maximum moves only by more than
   2^8, so alpha is mostly 1 and the rescale is skipped) and writes P (f16) and the rescale alpha
   (two buffers too); one barrier a half, whose OR reduction (``bar.red.or``) tells every warp
   whether any head's maximum moved: if none did, PV starts without reading alpha (1.05x at
   8,192 keys, H200 session 31);
4. PV, ``mma.m16n8k16`` again: A = P, B = the same registers transposed in registers
   (``movmatrix``). The accumulators hold O in units of 2^(C - 127); a half where C grows rescales
   them by alpha x 2^(C_old - C_new).

One exponent for the row, not one per scale group (session 30's tables: the QK partial per group
times its scale in fp32, P times a per-group ratio), takes 32 multiplies and 16 table loads off a
warp's half and the QK accumulators from 32 registers to 16: 1.08x at 8,192 keys (H200, session
31). Its cost: a value whose group scale sits more than 2^15 below the row's largest so far is an
f16 subnormal (fewer bits) and, past 2^24 below (its f16 factor 0), zero -- an absolute error under
2^-25 of the largest value that scale expresses (448 x 2^(C - 127)); RMS-normalized latents keep
their group scales within a few powers of two.

No tile ever crosses shared memory; each FP8 byte is read from it once (the TMA's copy and one
``ldmatrix``). The k index of QK is permuted (a register's 4 bytes are dims 4t..4t+3: logical
k 2t, 2t + 1 are dims 4t, 4t + 1 and k 2t + 8, 2t + 9 are 4t + 2, 4t + 3), identically in Q's
fragment, so the contraction is unchanged; PV's output columns come out as 4 consecutive dims a lane.
"""

MMA_SRC = r"""
#ifndef DI_MMA_SRC
#define DI_MMA_SRC
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
// ---------------------------------------------------------------- the consumer (256 threads)
// Shared buffers: K8 [NST][64][REC], vm [NST][64], kfac [NST][16][64], beta / cabs [NST][2],
// S_red [2][8][16][40] (the warps' partial scores), P_sm [2][16][40] (f16), alpha_sm [2][16] (each
// alternating between halves), qsm [16], fin_sm [16]; ready / empty: NST mbarriers each. out_row:
// the row's [H][D] (bf16, or f32 split partials), lse_row its [H] (ln-sum-exp, or split:
// log2-sum-exp). scale: sm_scale log2(e).
// TL: thread 0 writes clock64() per block i to marks[e * 256 + i]: e = 0 the block's first half
// starts, then per half hb at 1 + 4 hb + (0: the half starts, 1: softmax with the next half's QK
// and this half's transposes done, 2: past the barrier, 3: PV done); marks: the float buffer
// mark_buf from row mark_row of [H][D] floats on.
template <int REC, int D, int NST, int H, int SST, bool SPLIT, bool HW, bool TL, bool LAZY>
__device__ __forceinline__ void di_mma_consumer(const unsigned char* K8, const float* vm, const unsigned* kfac,
                                                const float* beta, const int* cabs,
                                                float* S_red, unsigned short* P_sm, float* alpha_sm, float* qsm,
                                                float* fin_sm, void* ready, void* empty, const void* q_row,
                                                void* out_row, float* lse_row, float scale, int tx,
                                                void* mark_buf, int mark_row, int keys, int bps) {
  const int nblk = di_mma_block_count(keys, bps);
  long long* marks = reinterpret_cast<long long*>(reinterpret_cast<float*>(mark_buf) + (size_t)mark_row * H * D);
  static_assert(D == 512 && H <= 16, "mma: D 512, up to 16 heads");
  const float NEG_INF = __int_as_float(0xff800000);
  constexpr float LAZY_TAU = 8.f;                          // log2 units: P <= 2^8 between rescales
  const int w = tx >> 5, lane = tx & 31, g = lane >> 2, t = lane & 3;
  const unsigned short* q = reinterpret_cast<const unsigned short*>(q_row);   // bf16 bits
  di_mma_q_maxima<H, D>(q, qsm, tx);
  di_named_sync(3, 256);
  unsigned qa[4][4];                                       // [chunk c][A register]
  di_mma_q_fragments<H, D, 4>(q, qsm, 64 * w, g, t, qa);
  const int hr = 2 * w + (lane >> 4), kk = 2 * (lane & 15);     // this lane's softmax head and key pair
  const float qinv = ldexpf(1.f, -di_mma_q_exp(qsm, hr)) * scale;
  float m_run = NEG_INF;
  float O[4][2][4];                                        // [chunk c][dims 4t + {0,1} / + {2,3}][C register]
#pragma unroll
  for (int c = 0; c < 4; ++c)
#pragma unroll
    for (int x = 0; x < 2; ++x)
#pragma unroll
      for (int e = 0; e < 4; ++e) O[c][x][e] = 0.f;
  const unsigned k8_base = (unsigned)__cvta_generic_to_shared(K8) + (lane & 7) * REC + 64 * w + 16 * (lane >> 3);
  const unsigned p_base = (unsigned)__cvta_generic_to_shared(P_sm)
                          + 2 * (((lane & 7) + 8 * ((lane >> 3) & 1)) * SST + 8 * (lane >> 4));
  unsigned long long* rdy = reinterpret_cast<unsigned long long*>(ready);
  unsigned long long* emp = reinterpret_cast<unsigned long long*>(empty);
  // One 32-key half at a time. Before the half's barrier a warp issues the next half's QK (loads,
  // conversions, mma) first, then this half's reduction and softmax while those are in flight, then
  // the next half's partial scores (to the other S_red buffer) and the transposes of this half's
  // registers for PV; after the barrier only P's load and the PV mma remain. The last half's "next"
  // QK re-reads its own stage (ignored).
  // QK of a half: the lane's converted bytes (key 8j + g of the half, dims 4t.. of each 16-dim chunk)
  // times the key's factor for their group (kfac: a word of two equal f16), then 16 mma into one
  // accumulator per 8-key tile: the warp's partial score in units of 2^(C - 127).
  auto qk_mma = [&](int s, int hb, unsigned (&kv)[4][4][2], float (&acc)[4][4]) {
    const unsigned* kf = kfac + (s * 16 + 2 * w) * 64 + 32 * hb + 4 * g;
    const uint4 f0 = *reinterpret_cast<const uint4*>(kf), f1 = *reinterpret_cast<const uint4*>(kf + 64);
    const unsigned fac[2][4] = {{f0.x, f0.y, f0.z, f0.w}, {f1.x, f1.y, f1.z, f1.w}};   // [group][tile j]
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      unsigned r[4];
      di_ldsm_x4_s(k8_base + (s * 64 + 32 * hb + 8 * j) * REC, r[0], r[1], r[2], r[3]);
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        unsigned lo, hi;
        di_e4m3x4_f16<HW>(r[c], lo, hi);
        kv[j][c][0] = di_hmul2(lo, fac[c >> 1][j]);
        kv[j][c][1] = di_hmul2(hi, fac[c >> 1][j]);
      }
    }
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        if (c == 0) di_mma16816_z(acc[j], qa[c], kv[j][c][0], kv[j][c][1]);
        else di_mma16816(acc[j], qa[c], kv[j][c][0], kv[j][c][1]);
      }
  };
  auto qk_store = [&](const float (&acc)[4][4], float* red) {   // the partials -> red
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      *reinterpret_cast<float2*>(red + (w * 16 + g) * SST + 8 * j + 2 * t) = make_float2(acc[j][0], acc[j][1]);
      *reinterpret_cast<float2*>(red + (w * 16 + g + 8) * SST + 8 * j + 2 * t) = make_float2(acc[j][2], acc[j][3]);
    }
  };
  constexpr int RED = 8 * 16 * SST;                        // floats of one S_red buffer
  float l_lane = 0.f;                                      // this lane's share of its head's softmax sum
  unsigned kv0[4][4][2], kv1[4][4][2];                     // converted bytes of a block's halves: [8-key tile j][chunk c][lo / hi]
  if (nblk > 0) {
    di_mbar_wait(rdy, 0);
    float acc[4][4];
    qk_mma(0, 0, kv0, acc);
    qk_store(acc, S_red);
  }
  di_named_sync(1, 256);                                   // the first half's partials complete
  // Half hb of block i (hb a constant: the loop body is the block's two halves, so the S_red / P /
  // alpha buffer of a half is its hb and the converted registers alternate between kv0 and kv1
  // without copies).
  auto half = [&](int i, const int hb, unsigned (&kv)[4][4][2], unsigned (&kv_next)[4][4][2]) {
    const int s = i % NST;
    auto mark = [&](int e) { if (TL && tx == 0) marks[e * 256 + i] = clock64(); };
    const bool next_block = hb == 1 && i + 1 < nblk;
    const int s_next = hb == 0 ? s : (next_block ? (i + 1) % NST : s), hb_next = hb == 0 ? 1 : (next_block ? 0 : 1);
    if (next_block) di_mbar_wait(rdy + s_next, ((i + 1) / NST) & 1);
    if (hb == 0) mark(0);
    // No barrier here: this half's partials were complete at the last half's barrier (or the one
    // above), and P / alpha alternate between two buffers, so the last half's PV may still read
    // the other one.
    mark(1 + 4 * hb);
    float acc[4][4];
    qk_mma(s_next, hb_next, kv_next, acc);
    const float bt = beta[s * 2 + hb];                     // this half's tables (ready since its stage was)
    const float qs = qinv * __uint_as_float((unsigned)cabs[s * 2 + hb] << 23);   // x 2^(C - 127): score units
    // ---- warp w: the scores of heads 2w, 2w + 1 (16 lanes each, two keys a lane), online softmax
    bool grew;                                             // this lane's head moved its reference maximum
    {
      const float* red = S_red + hb * RED;
      float2 sum = make_float2(0.f, 0.f);
#pragma unroll
      for (int w2 = 0; w2 < 8; ++w2) {
        const float2 v = *reinterpret_cast<const float2*>(red + (w2 * 16 + hr) * SST + kk);
        sum.x += v.x;
        sum.y += v.y;
      }
      const float2 mask = *reinterpret_cast<const float2*>(vm + s * 64 + 32 * hb + kk);
      const float x0 = mask.x == 0.f ? sum.x * qs : NEG_INF;
      const float x1 = mask.y == 0.f ? sum.y * qs : NEG_INF;
      // The half's maximum of each of the warp's two heads (lanes 0-15 / 16-31): two redux.sync
      // over order-preserving integers, no dependent shuffles (1.04x over four shfl.bfly rounds,
      // H200 session 30; a vote that skips them while no score passes the lazy threshold: 0.99x)
      const int o = di_f2ord(fmaxf(x0, x1));
      const int m_lo = __reduce_max_sync(0xffffffffu, lane < 16 ? o : (int)0x80000000);
      const int m_hi = __reduce_max_sync(0xffffffffu, lane < 16 ? (int)0x80000000 : o);
      const float mb = di_ord2f(lane < 16 ? m_lo : m_hi);
      // LAZY: the reference maximum moves only when the half's maximum passes it by more than
      // LAZY_TAU (so P <= 2^LAZY_TAU, exact in f16 and l in fp32); alpha is then 1 exactly and PV
      // skips the rescale.
      const bool grow = LAZY ? mb > m_run + LAZY_TAU : mb > m_run;
      const float m_new = grow ? mb : m_run;
      const float ms = m_new == NEG_INF ? 0.f : m_new;
      const float alpha = grow ? exp2f(m_run - ms) : 1.f;
      const float p0 = exp2f(x0 - ms), p1 = exp2f(x1 - ms);
      l_lane = l_lane * alpha + (p0 + p1);
      m_run = m_new;
      grew = grow;
      *reinterpret_cast<unsigned*>(P_sm + hb * 16 * SST + hr * SST + kk) = di_f16x2(p0, p1);
      if ((lane & 15) == 0) alpha_sm[hb * 16 + hr] = alpha;
    }
    // ---- before the barrier: this half's registers transposed for PV, then the next half's partials
    // stored (after them, so ptxas interleaves the transposes with the next half's mma instead of
    // leaving them between the stores and the barrier)
    unsigned vt[4][4][2];                                  // [8-key tile j][chunk c][lo / hi], transposed
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        vt[j][c][0] = di_movt(kv[j][c][0]);
        vt[j][c][1] = di_movt(kv[j][c][1]);
      }
    // ptxas places an instruction by its distance to the end of its basic block; the transposes (used
    // only past the rescale branch below) sank past the barrier, onto PV's critical path. A branch
    // never taken (beta is a power of two) ends their block here: 1.02x (H200, session 31).
    if (bt < 0.f) __trap();
    qk_store(acc, S_red + (1 - hb) * RED);
    mark(2 + 4 * hb);
    const bool any_grew = di_named_sync_or(2, 256, grew);  // P and alpha complete; did any head's maximum move
    mark(3 + 4 * hb);
    // ---- PV: rescale (skipped, alpha unread, when no head's maximum moved and C did not grow), then
    // P times the transposed registers (already scaled per key and group)
    di_mma_pv<4>(O, any_grew || bt != 1.f, alpha_sm + hb * 16, bt, g, p_base + 2 * hb * 16 * SST, vt);
    if (TL) asm volatile("" :: "f"(O[0][0][0]), "f"(O[3][1][3]));   // the mark after the PV results
    mark(4 + 4 * hb);
    if (hb == 1) {                                         // the stage's bytes and tables are no longer read
      __syncwarp();
      if (lane == 0) di_mbar_arrive(emp + s);
    }
  };
  for (int i = 0; i < nblk; ++i) {
    half(i, 0, kv0, kv1);
    half(i, 1, kv1, kv0);
  }
  float l_run = l_lane;
#pragma unroll
  for (int o = 1; o < 16; o <<= 1) l_run += __shfl_xor_sync(0xffffffffu, l_run, o);
  // ---- epilogue: 1 / l per head, the unit 2^(C - 127), the row's output
  if ((lane & 15) == 0) {
    fin_sm[hr] = l_run > 0.f ? 1.f / l_run : 0.f;
    if (hr < H) {
      const float l2 = l_run > 0.f ? log2f(l_run) + m_run : NEG_INF;
      lse_row[hr] = SPLIT ? l2 : l2 * 0.6931471805599453f;
    }
  }
  di_named_sync(1, 256);
  const int last = nblk > 0 ? ((nblk - 1) % NST) * 2 + 1 : -1;
  const float u = last < 0 ? 0.f : __uint_as_float((unsigned)cabs[last] << 23);
  const float f_g = fin_sm[g], f_g8 = fin_sm[g + 8];
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    const int dim = 64 * w + 16 * c + 4 * t;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int h = g + 8 * half;
      if (h >= H) continue;
      const float f = (half ? f_g8 : f_g) * u;
      const float v0 = O[c][0][2 * half] * f, v1 = O[c][0][2 * half + 1] * f;
      const float v2 = O[c][1][2 * half] * f, v3 = O[c][1][2 * half + 1] * f;
      if (SPLIT) {
        *reinterpret_cast<float4*>(reinterpret_cast<float*>(out_row) + h * D + dim) = make_float4(v0, v1, v2, v3);
      } else {
        unsigned b01, b23;
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(b01) : "f"(v1), "f"(v0));
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(b23) : "f"(v3), "f"(v2));
        *reinterpret_cast<uint2*>(reinterpret_cast<unsigned short*>(out_row) + h * D + dim) = make_uint2(b01, b23);
      }
    }
  }
}
#endif
"""
