"""CUDA device code of the warp-MMA sparse MLA decode kernel's one-team consumer (``di_mma_consumer``:
Q set-up, the block loop, the epilogue; ``_build_mma(..., teams=False)``), pulled in with
``T.import_source`` after ``_cuda.BULK_COPY_SRC``, ``_cuda_warp.WARP_SRC`` (its PTX wrappers and
conversions), ``_cuda_mma_prep.MMA_PREP_SRC`` (the per-stage scale tables it reads) and
``_cuda_mma_steps.MMA_STEPS_SRC`` (the Q set-up and PV step both consumers share). The design below
is both consumers'; ``_cuda_mma_teams.py`` splits the eight warps into two teams.

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
   8,192 keys, H200, 2026-12-02);
4. PV, ``mma.m16n8k16`` again: A = P, B = the same registers transposed in registers
   (``movmatrix``). The accumulators hold O in units of 2^(C - 127); a half where C grows rescales
   them by alpha x 2^(C_old - C_new).

One exponent for the row, not one per scale group (the 2026-12-02 kernel's tables: the QK partial per group
times its scale in fp32, P times a per-group ratio), takes 32 multiplies and 16 table loads off a
warp's half and the QK accumulators from 32 registers to 16: 1.08x at 8,192 keys (H200,
2026-12-02). Its cost: a value whose group scale sits more than 2^15 below the row's largest so far is an
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
      // H200, 2026-12-02; a vote that skips them while no score passes the lazy threshold: 0.99x)
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
    // never taken (beta is a power of two) ends their block here: 1.02x (H200, 2026-12-02).
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
