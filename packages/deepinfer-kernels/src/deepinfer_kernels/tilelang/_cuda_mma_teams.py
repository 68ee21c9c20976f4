"""CUDA device code of the warp-MMA sparse MLA decode kernel's two-team consumer
(``_build_mma(..., teams=True)``), pulled in after ``_cuda_mma_prep.MMA_PREP_SRC`` (whose tables,
with one running scale exponent per half, it reads) and ``_cuda_mma_steps.MMA_STEPS_SRC``.

Why: in the one-team consumer (``di_mma_consumer``) all eight warps meet at a barrier every 32 keys,
so the two warps of each SM sub-partition run the same phase at the same time (the conversions, then
the mma, then the softmax) and leave the other pipes idle; and every score sums eight partials
through shared memory. Here the eight warps form two teams of four, one warp of each per
sub-partition: team T takes half T (keys 32T .. 32T + 31) of every 64-key stage, its warp u the
latent dims [128u, 128u + 128) (scale groups 4u .. 4u + 3), with its own online softmax, running
scale exponent, accumulators and barriers (128 threads). The teams drift apart, so one team's
conversions or softmax run beside the other's mma, and a score sums four partials. Per half a warp:

1. QK (after ready[s]): ``ldmatrix`` of its 128 dims of the half's 32 keys, conversion to f16 times
   the key's factor for its group (``kfac``, as in ``di_mma_consumer``), 32 ``mma.m16n8k16``; the
   partials to shared memory; team barrier;
2. the softmax of heads 4u .. 4u + 3 (8 lanes a head, 4 keys a lane; LAZY as in ``di_mma_consumer``),
   P (f16) and alpha to shared memory; the registers transposed for PV (``movmatrix``); the stage
   released (empty[s]); team barrier (``bar.red.or``: did any head's maximum move);
3. PV: rescale (skipped when no maximum moved and the exponent did not grow), 32 mma.

The epilogue merges the teams' softmax states (maximum, sum, exponent) per head, as a split-KV
combine does: each team scales its accumulators, hands the other team's half of the dims over in
shared memory and writes its own half.
"""

MMA_TEAMS_SRC = r"""
#ifndef DI_MMA_TEAMS_SRC
#define DI_MMA_TEAMS_SRC
// ---------------------------------------------------------------- one team's steps
// A team warp's registers of a 32-key half: the ldmatrix of its 128 dims (k8: the lane's shared
// address in the stage), each byte quad to f16 pairs times the key's factor for its group (kf: the
// lane's first factor in the stage's table) -> kv [8-key tile j][chunk c][lo / hi]
template <int REC, bool HW>
__device__ __forceinline__ void di_mma_team_convert(unsigned k8, const unsigned* kf, unsigned (&kv)[4][8][2]) {
  uint4 f4[4];                                           // [group]: the factors of the lane's four keys
#pragma unroll
  for (int G = 0; G < 4; ++G) f4[G] = *reinterpret_cast<const uint4*>(kf + 64 * G);
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int cc = 0; cc < 2; ++cc) {
      unsigned r[4];
      di_ldsm_x4_s(k8 + 8 * j * REC + 64 * cc, r[0], r[1], r[2], r[3]);
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        const uint4 fg = f4[2 * cc + (m >> 1)];
        const unsigned fac = j == 0 ? fg.x : j == 1 ? fg.y : j == 2 ? fg.z : fg.w;
        unsigned lo, hi;
        di_e4m3x4_f16<HW>(r[m], lo, hi);
        kv[j][4 * cc + m][0] = di_hmul2(lo, fac);
        kv[j][4 * cc + m][1] = di_hmul2(hi, fac);
      }
    }
}
// The warp's partial scores of the half: 8 mma per 8-key tile (acc [tile j][C register]), then into
// red [4 warps][16 heads][SST] at warp u. (Two chains of four mma a tile instead of one of eight were
// slower: H200, 2026-12-03, 179.3 vs 178.0 us at 8,192 keys.)
__device__ __forceinline__ void di_mma_team_qk(const unsigned (&qa)[8][4], const unsigned (&kv)[4][8][2],
                                               float (&acc)[4][4]) {
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int c = 0; c < 8; ++c) {
      if (c == 0) di_mma16816_z(acc[j], qa[c], kv[j][c][0], kv[j][c][1]);
      else di_mma16816(acc[j], qa[c], kv[j][c][0], kv[j][c][1]);
    }
}
// (red_lane: the lane's first slot, red + (16u + g) x SST + 2t)
template <int SST>
__device__ __forceinline__ void di_mma_team_store_scores(const float (&acc)[4][4], float* red_lane) {
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    *reinterpret_cast<float2*>(red_lane + 8 * j) = make_float2(acc[j][0], acc[j][1]);
    *reinterpret_cast<float2*>(red_lane + 8 * SST + 8 * j) = make_float2(acc[j][2], acc[j][3]);
  }
}
// The scores of head hl over keys kq4 .. kq4 + 3 of the half (8 lanes a head): the four warps'
// partials (red_lane: red + hl x SST + kq4) summed, scaled (qs) and masked (vm_lane: the half's
// 0 / -inf from key kq4, added: an invalid key's factors are 0 and its bytes finite (zeroed for the
// hardware conversion), so its sum is 0 and its score -inf).
template <int SST>
__device__ __forceinline__ float4 di_mma_team_head_scores(const float* red_lane, const float* vm_lane, float qs) {
  float4 sum = *reinterpret_cast<const float4*>(red_lane);
#pragma unroll
  for (int u2 = 1; u2 < 4; ++u2) {
    const float4 v = *reinterpret_cast<const float4*>(red_lane + u2 * 16 * SST);
    sum.x += v.x;
    sum.y += v.y;
    sum.z += v.z;
    sum.w += v.w;
  }
  const float4 mask = *reinterpret_cast<const float4*>(vm_lane);
  return make_float4(fmaf(sum.x, qs, mask.x), fmaf(sum.y, qs, mask.y), fmaf(sum.z, qs, mask.z), fmaf(sum.w, qs, mask.w));
}
// 2^x: exp2f, or (FAST) the bare ex2.approx.ftz: exp2f is the same instruction plus a rescale around
// it for results below 2^-126, which here flush to 0 (P is f16, whose smallest subnormal is 2^-24;
// an alpha that small zeroes the accumulators either way). H200, 2026-12-03: 175.6 vs 178.0 us at
// 8,192 keys, 16.9 vs 17.2 on the engine's packed layout, same errors.
template <bool FAST>
__device__ __forceinline__ float di_exp2(float x) {
  if (!FAST) return exp2f(x);
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
// The online softmax step of head hl over those four scores x: P (f16) to P_lane (P_team + hl x SST
// + kq4) and alpha to alpha_lane (alpha_team + hl). Returns whether the head's reference maximum moved
// (LAZY: by more than 8).
template <bool LAZY, bool FAST_EXP>
__device__ __forceinline__ bool di_mma_team_softmax(float4 x, int lane, float& m_run, float& l_lane,
                                                    unsigned short* P_lane, float* alpha_lane) {
  const float NEG_INF = __int_as_float(0xff800000);
  constexpr float LAZY_TAU = 8.f;
  const int o = di_f2ord(fmaxf(fmaxf(x.x, x.y), fmaxf(x.z, x.w)));
  int mo = (int)0x80000000;                              // the head's maximum: one redux.sync per 8-lane group
#pragma unroll
  for (int hq = 0; hq < 4; ++hq) {
    const int m_q = __reduce_max_sync(0xffffffffu, (lane >> 3) == hq ? o : (int)0x80000000);
    mo = (lane >> 3) == hq ? m_q : mo;
  }
  const float mb = di_ord2f(mo);
  const bool grow = LAZY ? mb > m_run + LAZY_TAU : mb > m_run;
  const float m_new = grow ? mb : m_run;
  const float ms = m_new == NEG_INF ? 0.f : m_new;
  const float alpha = grow ? di_exp2<FAST_EXP>(m_run - ms) : 1.f;
  const float p0 = di_exp2<FAST_EXP>(x.x - ms), p1 = di_exp2<FAST_EXP>(x.y - ms);
  const float p2 = di_exp2<FAST_EXP>(x.z - ms), p3 = di_exp2<FAST_EXP>(x.w - ms);
  l_lane = l_lane * alpha + ((p0 + p1) + (p2 + p3));
  m_run = m_new;
  *reinterpret_cast<uint2*>(P_lane) = make_uint2(di_f16x2(p0, p1), di_f16x2(p2, p3));
  if ((lane & 7) == 0) *alpha_lane = alpha;
  return grow;
}
// The epilogue: the teams' softmax states merged per head (as a split-KV combine), then each team
// hands the other its half of the dims (scaled) over the stages' bytes and writes its own half: team
// 0 chunks 0-3, team 1 4-7. unit: 2^(C_T - 127) of the team's last half (0 when it had none).
template <int REC, int D, int NST, int H, bool SPLIT>
__device__ __forceinline__ void di_mma_teams_epilogue(float (&O)[8][2][4], float m_run, float l_lane, float unit,
                                                      const unsigned char* K8, float* fin_sm, void* out_row,
                                                      float* lse_row, int T, int u, int g, int t, int hl, int lane) {
  const float NEG_INF = __int_as_float(0xff800000);
  float l_run = l_lane;
#pragma unroll
  for (int o = 1; o < 8; o <<= 1) l_run += __shfl_xor_sync(0xffffffffu, l_run, o);
  if ((lane & 7) == 0) {
    fin_sm[T * 16 + hl] = m_run;
    fin_sm[32 + T * 16 + hl] = l_run;
  }
  di_named_sync(1, 256);                                   // both teams are past their last half
  auto merged = [&](int h, float& m, float& l) {           // head h: the merged maximum and sum; this team's weight
    const float m0 = fin_sm[h], m1 = fin_sm[16 + h], l0 = fin_sm[32 + h], l1 = fin_sm[48 + h];
    m = fmaxf(m0, m1);
    const float w0 = m0 == NEG_INF ? 0.f : exp2f(m0 - m), w1 = m1 == NEG_INF ? 0.f : exp2f(m1 - m);
    l = l0 * w0 + l1 * w1;
    return T == 0 ? w0 : w1;
  };
  auto factor = [&](int h) {                               // head h: this team's accumulators' factor
    float m, l;
    const float own = merged(h, m, l);
    return l > 0.f ? own / l * unit : 0.f;
  };
  const float f_g = factor(g), f_g8 = factor(g + 8);
  if (T == 0 && (lane & 7) == 0 && hl < H) {               // the row's log-sum-exp (log2 units when split)
    float m, l;
    merged(hl, m, l);
    const float lse2 = l > 0.f ? log2f(l) + m : NEG_INF;
    lse_row[hl] = SPLIT ? lse2 : lse2 * 0.6931471805599453f;
  }
  constexpr int XST = D + 16;                              // row stride (floats) of the hand-over
  // [16 heads][XST] (33 KB) over the stages' bytes: every copy has landed (each half waited for its
  // stage) and no warp reads them any more
  static_assert(NST * 64 * REC >= 16 * XST * 4, "the hand-over fits in the stages' bytes");
  float* xch = reinterpret_cast<float*>(const_cast<unsigned char*>(K8));
#pragma unroll
  for (int c = 0; c < 8; ++c) {
    if ((c >> 2) == T) continue;                           // the other team's chunks
    const int dim = 128 * u + 16 * c + 4 * t;
    *reinterpret_cast<float4*>(xch + g * XST + dim) =
        make_float4(O[c][0][0] * f_g, O[c][0][1] * f_g, O[c][1][0] * f_g, O[c][1][1] * f_g);
    *reinterpret_cast<float4*>(xch + (g + 8) * XST + dim) =
        make_float4(O[c][0][2] * f_g8, O[c][0][3] * f_g8, O[c][1][2] * f_g8, O[c][1][3] * f_g8);
  }
  di_named_sync(1, 256);
#pragma unroll
  for (int c = 0; c < 8; ++c) {
    if ((c >> 2) != T) continue;                           // this team's chunks
    const int dim = 128 * u + 16 * c + 4 * t;
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int h = g + 8 * hh;
      if (h >= H) continue;
      const float f = hh ? f_g8 : f_g;
      const float4 o2 = *reinterpret_cast<const float4*>(xch + h * XST + dim);
      const float v0 = O[c][0][2 * hh] * f + o2.x, v1 = O[c][0][2 * hh + 1] * f + o2.y;
      const float v2 = O[c][1][2 * hh] * f + o2.z, v3 = O[c][1][2 * hh + 1] * f + o2.w;
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
// ---------------------------------------------------------------- the two-team consumer
// Shared buffers as di_mma_consumer's but S_red [2][4][16][SST] (team T: S_red[T], P_sm[T], alpha_sm[T];
// beta / cabs[s][T] its half's rescale and exponent), and fin_sm [64]: the teams' maxima and sums per
// head. The same arguments as di_mma_consumer's (no timeline marks). FAST_EXP: di_exp2's.
template <int REC, int D, int NST, int H, int SST, bool SPLIT, bool HW, bool LAZY, bool FAST_EXP>
__device__ __forceinline__ void di_mma_teams_consumer(const unsigned char* K8, const float* vm, const unsigned* kfac,
                                                      const float* beta, const int* cabs,
                                                      float* S_red, unsigned short* P_sm, float* alpha_sm, float* qsm,
                                                      float* fin_sm, void* ready, void* empty,
                                                      const void* q_row, void* out_row, float* lse_row, float scale,
                                                      int tx, void* /*mark_buf*/, int /*mark_row*/, int keys, int bps) {
  static_assert(D == 512 && H <= 16, "mma: D 512, up to 16 heads");
  const float NEG_INF = __int_as_float(0xff800000);
  const int w = tx >> 5, lane = tx & 31, g = lane >> 2, t = lane & 3;
  const int nblk = di_mma_block_count(keys, bps);
  const int T = w >> 2, u = w & 3;                         // team (its half of every stage), warp in team (its dims)
  const int team_bar = 4 + T;                              // the team's named barrier (128 threads)
  const unsigned short* q = reinterpret_cast<const unsigned short*>(q_row);
  di_mma_q_maxima<H, D>(q, qsm, tx);
  di_named_sync(3, 256);
  unsigned qa[8][4];                                       // [chunk c][A register]: dims 128u + 16c + 4t ..
  di_mma_q_fragments<H, D, 8>(q, qsm, 128 * u, g, t, qa);
  const int hl = 4 * u + (lane >> 3), kq4 = 4 * (lane & 7);   // this lane's softmax head and four keys
  const float qinv = ldexpf(1.f, -di_mma_q_exp(qsm, hl)) * scale;
  float m_run = NEG_INF, l_lane = 0.f;
  float O[8][2][4];                                        // [chunk c][dims 4t + {0,1} / + {2,3}][C register]
#pragma unroll
  for (int c = 0; c < 8; ++c)
#pragma unroll
    for (int x = 0; x < 2; ++x)
#pragma unroll
      for (int e = 0; e < 4; ++e) O[c][x][e] = 0.f;
  // The loop's lane addresses as 32-bit shared addresses, pinned in registers by an empty asm: ptxas
  // recomputed most of them from the thread index every half (H200, 2026-12-03, 8,192 keys, each step
  // A/B'd in one process: six of them 514 -> 492 instructions a half, 174.0 -> 172.1 us; the other
  // four 492 -> 468, 172.9 -> 170.1 us); pointers again through __cvta_shared_to_generic, which
  // ptxas still turns into shared loads and stores
  const float* red = S_red + T * 4 * 16 * SST;             // the team's partial scores [4 warps][16 heads][SST]
  float* alpha_team = alpha_sm + T * 16;
  unsigned a_k8 = (unsigned)__cvta_generic_to_shared(K8) + (32 * T + (lane & 7)) * REC + 128 * u + 16 * (lane >> 3);
  unsigned a_p = (unsigned)__cvta_generic_to_shared(P_sm)   // PV's ldmatrix of P
                 + 2 * (T * 16 * SST + ((lane & 7) + 8 * ((lane >> 3) & 1)) * SST + 8 * (lane >> 4));
  unsigned a_rdy = (unsigned)__cvta_generic_to_shared(ready), a_emp = (unsigned)__cvta_generic_to_shared(empty);
  unsigned a_red_st = (unsigned)__cvta_generic_to_shared(red + (u * 16 + g) * SST + 2 * t);
  unsigned a_red_ld = (unsigned)__cvta_generic_to_shared(red + hl * SST + kq4);
  unsigned a_P_st = (unsigned)__cvta_generic_to_shared(P_sm + T * 16 * SST + hl * SST + kq4);
  unsigned a_alpha = (unsigned)__cvta_generic_to_shared(alpha_team + hl);
  unsigned a_kf = (unsigned)__cvta_generic_to_shared(kfac + 4 * u * 64 + 32 * T + 4 * g);
  unsigned a_vm = (unsigned)__cvta_generic_to_shared(vm + 32 * T + kq4);
  asm volatile("" : "+r"(a_k8), "+r"(a_p), "+r"(a_rdy), "+r"(a_emp), "+r"(a_red_st), "+r"(a_red_ld), "+r"(a_P_st),
               "+r"(a_alpha), "+r"(a_kf), "+r"(a_vm));
  auto generic = [](unsigned a) { return __cvta_shared_to_generic(a); };
  float* red_st = reinterpret_cast<float*>(generic(a_red_st));
  const float* red_ld = reinterpret_cast<const float*>(generic(a_red_ld));
  unsigned short* P_st = reinterpret_cast<unsigned short*>(generic(a_P_st));
  float* alpha_st = reinterpret_cast<float*>(generic(a_alpha));
  const unsigned* kf_l = reinterpret_cast<const unsigned*>(generic(a_kf));
  const float* vm_l = reinterpret_cast<const float*>(generic(a_vm));
  if (nblk > 0) di_mbar_wait_s(a_rdy, 0);
  for (int i = 0; i < nblk; ++i) {
    int s = i % NST;
    // the stage index made opaque: ptxas folds i % NST into each table's offset as (i x C) & M otherwise,
    // three instructions a table instead of one (H200, 2026-12-03: 462 instructions a half, 168.1 /
    // 168.2 vs 169.9 / 169.7 us at 8,192 keys)
    asm volatile("" : "+r"(s));
    // ---- QK: the lane's bytes (key 8j + g of the half, dims 4t.. of each 16-dim chunk) to f16 times the
    // key's factor for their group, then 8 mma per 8-key tile: the warp's partial score
    unsigned kv[4][8][2];                                  // [8-key tile j][chunk c][lo / hi]
    di_mma_team_convert<REC, HW>(a_k8 + s * 64 * REC, kf_l + s * 16 * 64, kv);
    {
      float acc[4][4];
      di_mma_team_qk(qa, kv, acc);
      di_mma_team_store_scores<SST>(acc, red_st);
    }
    const float bt = beta[s * 2 + T];
    const float qs = qinv * __uint_as_float((unsigned)cabs[s * 2 + T] << 23);   // x 2^(C_T - 127): score units
    di_named_sync(team_bar, 128);                          // the team's partials complete
    // ---- softmax of head hl over keys kq4 .. kq4 + 3 (8 lanes a head)
    const bool grew = di_mma_team_softmax<LAZY, FAST_EXP>(di_mma_team_head_scores<SST>(red_ld, vm_l + s * 64, qs), lane,
                                                          m_run, l_lane, P_st, alpha_st);
    unsigned vt[4][8][2];                                  // the registers transposed for PV
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        vt[j][c][0] = di_movt(kv[j][c][0]);
        vt[j][c][1] = di_movt(kv[j][c][1]);
      }
    // ptxas places an instruction by its distance to the end of its basic block and moves movmatrix
    // across barriers: all 64 sank past the next barrier, onto PV's path. A branch never taken (beta is
    // a power of two) ends their block here (8,192 keys, H200, 2026-12-03: 184.8-186.1 us without it in
    // one run, 179.8-181.8 with it in the next; not one process). Before the team barrier instead, beside
    // QK's mma, they were slower (2026-12-03: 182.4 vs 178.0 us).
    if (bt < 0.f) __trap();
    __syncwarp();                                          // the stage's bytes and tables are no longer read
    if (lane == 0) di_mbar_arrive_s(a_emp + 8 * s);
    const bool any_grew = di_named_sync_or(team_bar, 128, grew);   // P and alpha complete
    if (i + 1 < nblk) di_mbar_wait_s(a_rdy + 8 * ((i + 1) % NST), ((i + 1) / NST) & 1);
    // ---- PV: rescale (skipped when no head's maximum moved and C_T did not grow), then P times the
    // transposed registers
    di_mma_pv<8>(O, any_grew || bt != 1.f, alpha_team, bt, g, a_p, vt);
  }
  const int last = nblk > 0 ? ((nblk - 1) % NST) * 2 + T : -1;
  const float unit = last < 0 ? 0.f : __uint_as_float((unsigned)cabs[last] << 23);   // 2^(C_T - 127)
  di_mma_teams_epilogue<REC, D, NST, H, SPLIT>(O, m_run, l_lane, unit, K8, fin_sm, out_row, lse_row, T, u, g, t, hl,
                                               lane);
}
#endif
"""
