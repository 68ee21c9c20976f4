"""TileLang builder of the register-operand sparse MLA decode kernel ("regs"; **experimental, not
dispatched**).

Why: the ``bulk`` kernel dequantizes each 64-key block into a bf16 tile in shared memory that
both wgmmas then read (QK, and PV transposed): ~300 KB of shared-memory traffic per block for
34 KB of HBM reads, about what the SM's shared memory moves in the time HBM delivers the block at
80% of copy bandwidth. Here no bf16 tile exists; the only tile traffic is the TMA's write, one
``ldmatrix`` read of the FP8 bytes for each wgmma and Q / P (~135 KB per block):

* QK by FP8 wgmmas (``_cuda_regs.FP8_QK_SRC``): a 32-value scale group is one ``m64n32k32`` e4m3
  k-step, so the stage's raw bytes are the A operand and each group's ue8m0 scale multiplies its
  fp32 result in registers; Q is two e4m3 rows a head (hi, and lo of the residual; power-of-two
  scales), which hold its bf16 values exactly but for elements far below the head's largest. The
  tensor cores' FP8 accumulator keeps fewer bits than float32: lse within ~5e-5 of the reference
  on unit-scale data (``bulk``: ~1e-6), so this kernel is checked at the reference's tolerance.
* PV with its register A operand converted from the FP8 stage (``_cuda_regs.REGS_SRC``: ``ldmatrix``
  on byte pairs, exact bf16 conversion, the latent rows permuted: ``regs_pv_dim``, the output
  written back through it), scaled by a per-stage table one producer warp builds.

CTA (one query row x 16 heads; 384 threads, ``setmaxnreg``: consumers 232 registers, producers 40):

    producer warp 0:      issue block i + NST -> K8[s]  (after empty[s]; TMA bulk copies, bytes on full[s])
    producer warp 1:      after full[s]: the PV scale table and the -inf mask -> ready[s]
    consumer w (0, 1):    blocks i = 2j + w: QK (16 FP8 wgmmas, ``qk_buffers`` in flight), online
                          softmax, PV (8 fragments of 64 dims) -> empty[s]

The two consumers keep their own online softmax (so one's softmax overlaps the other's wgmmas)
and merge through shared memory at the end; the CTA then writes the row (or its split partial).
Invalid slots' records are never copied: QK selects their scores to -inf and the table's zero
scales turn their PV values into zeros (the bit conversion never yields Inf / NaN).

Measured (H200, 2026-12-02, 132 rows x 16 heads, CUDA-graph replays, L2 flushed): correct (GPU
tests ``-k regs``), faster than its first version (bf16 QK from converted registers, 2026-12-01)
but still slower than ``bulk`` where the keys come in runs: 113 vs 75 us over KV blocks of 128
(first version 121), 119 vs 124 us over random slots (133), 32 vs 20 us on the engine's packed
indices (52). Its timeline (``tools/sparse_mla_decode_timeline.py regs``): per block and consumer
~3,000 cycles of QK, ~1,250 of softmax and ~5,500 of PV; deeper QK pipelining (2 to 6 wgmmas in
flight) and overlapping PV's fills with its wgmmas changed nothing measurable. A timing-only probe
(16 wgmmas, one wait, scores unscaled) ran QK in ~1,350 cycles: the per-group waits before each
scaling serialize it, not the register-operand fences. PV's conversions (3 integer operations a
value pair) are the larger half. Kept as the base of that design, not dispatched.
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations at
# decoration time against the builder locals.

from deepinfer_kernels.tilelang._common import PDL, pdl_sync
from deepinfer_kernels.tilelang._cuda import BULK_COPY_SRC, DEQUANT_SRC
from deepinfer_kernels.tilelang._cuda_regs import FP8_QK_SRC, REGS_SRC, regs_pv_dim
from deepinfer_kernels.tilelang._cuda_warp import WARP_SRC
from deepinfer_kernels.tilelang.sparse_mla_builders import (
    BLOCK_TOKENS,
    LOG2E,
    NEG_INIT,
    PAIR_BARRIERS,
    Q_LOAD_BARRIER,
    _consumer_sync,
    _record_bytes,
    _softmax_macros,
)
from deepinfer_kernels.tilelang.sparse_mla_bulk import _bulk_macros, _issue_stream_macro

REGS_STAGES = 4          # FP8 stages: two being consumed, two loading
QK_BUFFERS = 4           # QK wgmmas in flight (FP8_QK_SRC's NBUF)
CONSUMER_REGS = 232      # setmaxnreg: 2 x 128 consumers x 232 + 128 producers x 40 <= 64K registers
PRODUCER_REGS = 40
PV_OVERLAP = True        # fill PV fragment i + 1 while fragment i's wgmma runs
PV_DIMS = 64             # latent dims of one PV fragment (16 registers a thread)
MERGE_BARRIER = 4        # both consumers: the second's partial result is in shared memory
SINGLE_FILL_PATH = True   # PV fills always multiply twice: 5-10% faster with the other branch out of the code
CONSUMERS = 2             # consumer warpgroups taking alternate blocks (1: one code copy, for the timeline)


def _build_regs(heads: int, d: int, split: bool, qk_buffers: int = QK_BUFFERS, pv_overlap: bool = PV_OVERLAP,
                single_fill_path: bool = SINGLE_FILL_PATH, consumers: int = CONSUMERS):
    """Register-operand decode kernel; same signature and dynamic shapes as ``_build_bulk`` (one
    query row x ``heads`` <= 16 heads per CTA; ``bps`` blocks per split). ``qk_buffers``: QK
    accumulators (wgmmas in flight, ``di_qk_fp8``); ``pv_overlap``: each PV fragment's fill overlaps
    the previous fragment's wgmma (two A fragments). ``single_fill_path`` (default): the scale table
    never folds the conversion's 2^120, so the fills' one-multiply branch is not in the code (one
    more exact multiply a value pair, 126 -> 107 KB of code). Nsight Compute put instruction fetch
    first among this kernel's stalls; without the branch it ran 5-10% faster (H200, 2026-12-02, two
    runs: 106.4 vs 112.2-114.3 us over KV blocks, 108.0-108.5 vs 116.4-117.4 over random slots,
    28.7-29.2 vs 31.7-32.1 on the engine's packed indices). ``consumers``: 2 (default) warpgroups
    taking alternate blocks and merging at the end, or 1 (one copy of the consumer code in the
    kernel: the measure of one consumer's own pace, without the other's instruction footprint)."""
    import tilelang.language as T

    BI = BLOCK_TOKENS
    REC = _record_bytes(d)
    H = heads
    HB = 16
    NST = REGS_STAGES
    TPC = 128 // HB                  # softmax threads per head column
    NG = d // 32                     # scale groups of a record
    NPV = d // PV_DIMS               # PV fragments
    SFW = NG * 4 * 8                 # PV scale words per stage
    PREP = 32                        # producer threads of the prep (warp 1)
    SST = HB + 1                     # row stride of the score tile S_sm
    NC = consumers
    CT = 128 * NC                    # consumer threads
    assert H <= HB and d == 512 and REC % 16 == 0 and NPV == 8, "regs: 16 heads, D 512"
    assert NC in (1, 2), f"consumers={NC}: 1 or 2"
    issue_stream = _issue_stream_macro(T, *_bulk_macros(T, d, 1)[:2], NST)
    softmax = [_softmax_macros(T, HB, d, H, split, explicit_sync=True, barrier=PAIR_BARRIERS[w])[0] for w in (0, 1)]
    QK_FP8 = f"di_qk_fp8<{REC}, {d}, {SST}, {qk_buffers}>"
    Q8_PREP = f"di_q8_prep<{d}>"
    PV_TABLE = f"di_pv_scale_table<{REC}, {d}, {'false' if single_fill_path else 'true'}>"
    FILL_PV = f"di_fill_pv<{REC}>"

    R = T.dynamic("R")
    W = T.dynamic("W")
    S = T.dynamic("S")
    NS = T.dynamic("NS")
    RP = T.dynamic("RP")

    def pv_dim(mc, m):
        # latent dim of row m of PV fragment mc
        return mc * PV_DIMS + regs_pv_dim(m)

    @T.macro
    def consume(w, tw, nblk, K8, vm, sft, one_mul, Q8_s, qsc_s, S_sm, P_s, alpha_s, ready, empty, accs, a_pv, st,
                scale):
        # consumer w's blocks 2j + w: QK, online softmax, PV; stage handed back after PV. S_sm, P_s,
        # alpha_s: consumer w's own. pv_overlap: two alternating A fragments, fragment mc's wgmma
        # waited for after fragment mc + 1's fill (within the runs' spread of the one-fragment loop
        # on the H200, 2026-12-02)
        for j in T.serial((nblk - w + NC - 1) // NC):
            i = NC * j + w
            s = i % NST
            T.barrier_wait(ready[s], (i // NST) & 1)
            T.call_extern("handle", QK_FP8, T.access_ptr(K8[s, 0, 0], "r"), T.access_ptr(Q8_s[0], "r"),
                          T.access_ptr(qsc_s[0], "r"), T.access_ptr(vm[s, 0], "r"), T.access_ptr(S_sm[0, 0], "w"), tw)
            _consumer_sync(T, PAIR_BARRIERS[w])      # S_sm complete; the last block's readers are past the sync below
            softmax[w](tw, S_sm, vm, s, P_s, alpha_s, st, scale)
            T.fence_proxy_async()                    # P_s (generic writes) before the wgmma reads it
            _consumer_sync(T, PAIR_BARRIERS[w])      # P_s and alpha_s complete
            for mc, acc_c in enumerate(accs):
                for m, h in T.Parallel(PV_DIMS, HB):
                    acc_c[m, h] *= alpha_s[h]
                a_mc = a_pv[mc % 2] if pv_overlap else a_pv[0]
                T.call_extern("handle", FILL_PV, a_mc.data, T.access_ptr(K8[s, 0, 0], "r"),
                              T.access_ptr(sft[s, 0], "r"), tw, mc, 0 if single_fill_path else one_mul[s])
                if pv_overlap:     # fragment mc - 1's wgmma done: its A registers are refilled next
                    T.wgmma_gemm(a_mc, P_s, acc_c)
                    T.wait_wgmma(1)
                else:
                    T.gemm(a_mc, P_s, acc_c)
            if pv_overlap:
                T.wait_wgmma(0)
            T.barrier_arrive(empty[s])

    @T.macro
    def consumer_role(w, tw, r, sp, nblk, Q, K8, vm, sft, one_mul, Q8_s, qsc_s, S_sm, P_s, alpha_s, Ob, ml_s, fac_s,
                      ready, empty, Out, Lse, Opart, Lpart, scale):
        # consumer warpgroup w (thread tw of it): its own fragments and online softmax over blocks 2j + w;
        # then consumer 1 hands its result over in shared memory and consumer 0 merges and writes
        accs = tuple(T.alloc_fragment((PV_DIMS, HB), T.float32) for _ in range(NPV))
        a_pv = tuple(T.alloc_fragment((PV_DIMS, BI), T.bfloat16) for _ in range(2 if pv_overlap else 1))
        st = T.alloc_local((4,), T.float32)
        if w == 0:
            T.call_extern("handle", Q8_PREP, T.access_ptr(Q[r, 0, 0], "r"), H, T.access_ptr(Q8_s[0], "w"),
                          T.access_ptr(qsc_s[0], "w"), tw)
            T.fence_proxy_async()
        for acc_c in accs:
            T.clear(acc_c)
        st[0] = NEG_INIT
        st[1] = 0.0
        T.sync_threads(Q_LOAD_BARRIER, CT)          # Q8_s, qsc_s complete before either consumer's first QK
        consume(w, tw, nblk, K8, vm, sft, one_mul, Q8_s, qsc_s, S_sm, P_s, alpha_s, ready, empty, accs, a_pv, st,
                scale)
        if w == 1:
            for mc, acc_c in enumerate(accs):
                for m, h in T.Parallel(PV_DIMS, HB):
                    Ob[mc, m, h] = acc_c[m, h]
            if tw % TPC == 0:
                ml_s[0, tw // TPC] = st[0]
                ml_s[1, tw // TPC] = st[1]
        if NC == 2:
            T.sync_threads(MERGE_BARRIER, CT)
        if w == 0:
            c = tw // TPC
            if tw % TPC == 0:
                if NC == 2:
                    mx = T.max(st[0], ml_s[0, c])
                    a0 = T.exp2((st[0] - mx) * scale)
                    a1 = T.exp2((ml_s[0, c] - mx) * scale)
                    tot = st[1] * a0 + ml_s[1, c] * a1
                else:
                    mx = st[0]
                    a0 = 1.0
                    a1 = 0.0
                    tot = st[1]
                inv = T.if_then_else(tot > 0, 1.0 / tot, 0.0)
                fac_s[0, c] = a0 * inv
                fac_s[1, c] = a1 * inv
                if c < H:
                    if split:
                        Lpart[sp, r, c] = T.if_then_else(tot > 0, T.log2(tot) + mx * scale, -T.infinity(T.float32))
                    else:
                        Lse[r, c] = T.if_then_else(tot > 0, (T.log2(tot) + mx * scale) / LOG2E, -T.infinity(T.float32))
            _consumer_sync(T, PAIR_BARRIERS[0])      # fac_s complete
            for mc, acc_c in enumerate(accs):
                for m, h in T.Parallel(PV_DIMS, HB):
                    if h < H:
                        if NC == 2:
                            o = acc_c[m, h] * fac_s[0, h] + Ob[mc, m, h] * fac_s[1, h]
                        else:
                            o = acc_c[m, h] * fac_s[0, h]
                        if split:
                            Opart[sp, r, h, pv_dim(mc, m)] = o
                        else:
                            Out[r, h, pv_dim(mc, m)] = T.cast(o, T.bfloat16)

    @T.prim_func
    def main(
        Q: T.Tensor((R, H, d), T.bfloat16),
        Pool: T.Tensor((S, REC), T.uint8),
        Idx: T.Tensor((R, W), T.int32),
        Out: T.Tensor((R, H, d), T.bfloat16),
        Lse: T.Tensor((R, H), T.float32),
        Opart: T.Tensor((NS, RP, H, d), T.float32),
        Lpart: T.Tensor((NS, RP, H), T.float32),
        scale: T.float32,          # sm_scale * log2(e)
        bps: T.int32,              # blocks per split
    ):
        with T.Kernel(R, NS, threads=CT + 128) as (r, sp):
            if PDL:   # wait for the previous kernel before touching memory (_common.PDL)
                T.evaluate(pdl_sync())
            T.import_source(DEQUANT_SRC + BULK_COPY_SRC + WARP_SRC + REGS_SRC + FP8_QK_SRC)
            K8 = T.alloc_shared((NST, BI, REC), T.uint8)
            ix_s = T.alloc_shared((NST, BI), T.int32)
            vm = T.alloc_shared((NST, BI), T.float32)
            sft = T.alloc_shared((NST, SFW), T.uint32)
            one_mul = T.alloc_shared((NST,), T.int32)           # the stage's table holds 2^(s - 7)
            Q8_s = T.alloc_shared((2 * HB * d,), T.uint8)           # Q's hi / lo e4m3 rows (FP8_QK_SRC layout)
            qsc_s = T.alloc_shared((2 * HB,), T.float32)            # their per-head scales
            S_sm0 = T.alloc_shared((BI, SST), T.float32)            # per consumer: scores, P, rescale
            S_sm1 = T.alloc_shared((BI, SST), T.float32)
            P_s0 = T.alloc_shared((BI, HB), T.bfloat16)
            P_s1 = T.alloc_shared((BI, HB), T.bfloat16)
            alpha_s0 = T.alloc_shared((HB,), T.float32)
            alpha_s1 = T.alloc_shared((HB,), T.float32)
            Ob = T.alloc_shared((NPV, PV_DIMS, HB) if NC == 2 else (1,), T.float32)   # consumer 1's result, for the merge
            ml_s = T.alloc_shared((2, HB), T.float32)               # consumer 1's (max, sum) per head
            fac_s = T.alloc_shared((2, HB), T.float32)              # merge weights per head
            full = T.alloc_barrier(arrive_count=[1] * NST)
            ready = T.alloc_barrier(arrive_count=[PREP] * NST)
            empty = T.alloc_barrier(arrive_count=[128] * NST)
            tx = T.get_thread_binding()
            b0 = sp * bps
            nblk = T.alloc_var(T.int32)
            nblk = T.max(0, T.min(bps, T.ceildiv(W, BI) - b0))
            if tx < 128:
                T.set_max_nreg(CONSUMER_REGS, 1)
                consumer_role(0, tx, r, sp, nblk, Q, K8, vm, sft, one_mul, Q8_s, qsc_s, S_sm0, P_s0, alpha_s0, Ob, ml_s,
                              fac_s, ready, empty, Out, Lse, Opart, Lpart, scale)
            elif NC == 2 and tx < 256:
                T.set_max_nreg(CONSUMER_REGS, 1)
                consumer_role(1, tx - 128, r, sp, nblk, Q, K8, vm, sft, one_mul, Q8_s, qsc_s, S_sm1, P_s1, alpha_s1, Ob,
                              ml_s, fac_s, ready, empty, Out, Lse, Opart, Lpart, scale)
            else:
                T.set_max_nreg(PRODUCER_REGS, 0)
                # ------------------------------------------------------------ producers
                tp = tx - CT
                if tp < 32:
                    issue_stream(Idx, Pool, K8, ix_s, full, empty, r, W, b0, nblk, tp)
                elif tp < 64:
                    lane = tp - 32
                    for i in T.serial(nblk):
                        s = i % NST
                        T.barrier_wait(full[s], (i // NST) & 1)
                        T.call_extern("handle", PV_TABLE, T.access_ptr(K8[s, 0, 0], "r"), T.access_ptr(ix_s[s, 0], "r"),
                                      T.access_ptr(sft[s, 0], "w"), T.access_ptr(vm[s, 0], "w"),
                                      T.access_ptr(one_mul[s], "w"), lane)
                        T.barrier_arrive(ready[s])

    return main
