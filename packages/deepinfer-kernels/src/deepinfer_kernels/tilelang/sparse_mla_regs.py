"""TileLang builder of the register-operand sparse MLA decode kernel ("regs"; **experimental, not
dispatched**).

Why: the ``bulk`` kernel dequantizes each 64-key block into a bf16 tile in shared memory that
both wgmmas then read (QK, and PV transposed): ~290 KB of shared-memory traffic per block for
34 KB of HBM reads. The per-phase timeline (``tools/sparse_mla_decode_timeline.py``, H200
2026-12-01) put its consumer at ~3,700 cycles per block (QK 1,040, softmax 1,610, PV 920) with
the dequantizing warpgroups busy 2,300-2,400 cycles of it, and each role alone still took 2,800
to 5,200 cycles: shared memory is the shared bottleneck (46% of copy bandwidth at best).

Here the consumers build the wgmma's *register* A operand straight from the FP8 stage
(``_cuda.REGS_SRC``: ``ldmatrix`` on byte pairs, exact bf16 conversion and scaling in registers),
so the only tile traffic is the TMA's write and two ``ldmatrix`` reads of the FP8 bytes (~130 KB
per block). The reduction columns of QK and the latent rows of PV are permuted to fit the
fragment layout (``regs_qk_column``: Q is stored permuted; ``regs_pv_dim``: the output is written
back through it).

CTA (one query row x 16 heads; 384 threads):

    producer warp 0:      issue block i + NST -> K8[s]  (after empty[s]; TMA bulk copies, bytes on full[s])
    producer warps 1-3:   after full[s]: zero the stage's invalid records, the -inf mask, the PV scale
                          table -> ready[s]
    consumer w (0, 1):    blocks i = 2j + w: QK (4 fragments of 128 columns), online softmax, PV
                          (8 fragments of 64 dims) -> empty[s]

The two consumers keep their own online softmax (so one's softmax overlaps the other's wgmmas)
and merge through shared memory at the end; the CTA then writes the row (or its split partial).

Measured (H200, 2026-12-01): correct (GPU tests ``-k regs``), but slower than ``bulk``: 120.6 vs
75.0 us over KV blocks, 51.5 vs 20.0 us on the engine's packed indices. Its timeline: each consumer
spends ~2,800 cycles on QK and ~3,150 on PV per block (the conversion: 5 operations per value pair,
twice per block), and the prep ~4,500 cycles a block. Kept as the base of that design (its
``clock64`` timeline: ``tools/sparse_mla_decode_timeline.py regs``), not dispatched.
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations at
# decoration time against the builder locals.

from deepinfer_kernels.tilelang._common import PDL, pdl_sync
from deepinfer_kernels.tilelang._cuda import BULK_COPY_SRC, DEQUANT_SRC, REGS_SRC, regs_pv_dim, regs_qk_column
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
from deepinfer_kernels.tilelang.sparse_mla_bulk import _bulk_macros

REGS_STAGES = 4          # FP8 stages: two being consumed, two loading
QK_COLUMNS = 128         # columns of one QK fragment (32 registers a thread)
PV_DIMS = 64             # latent dims of one PV fragment (16 registers a thread)
MERGE_BARRIER = 4        # both consumers: the second's partial result is in shared memory


def _build_regs(heads: int, d: int, split: bool):
    """Register-operand decode kernel; same signature and dynamic shapes as ``_build_bulk`` (one
    query row x ``heads`` <= 16 heads per CTA; ``bps`` blocks per split)."""
    import tilelang.language as T

    BI = BLOCK_TOKENS
    REC = _record_bytes(d)
    H = heads
    HB = 16
    NST = REGS_STAGES
    TPC = 128 // HB                  # softmax threads per head column
    NG = d // 32                     # scale groups of a record
    NQ = d // QK_COLUMNS             # QK fragments
    NPV = d // PV_DIMS               # PV fragments
    SFW = NG * 4 * 8                 # PV scale words per stage
    PREP = 96                        # producer threads of the prep (warps 1-3)
    RPL = BI // 32
    assert H <= HB and d == 512 and REC % 16 == 0 and NPV == 8, "regs: 16 heads, D 512"
    load_indices, issue_block, _ = _bulk_macros(T, d, 1)
    softmax = [_softmax_macros(T, HB, d, H, split, explicit_sync=True, barrier=PAIR_BARRIERS[w])[0] for w in (0, 1)]
    FILL_QK = f"di_fill_qk<{REC}, {d}, {QK_COLUMNS // 32}>"
    FILL_PV = f"di_fill_pv<{REC}>"

    R = T.dynamic("R")
    W = T.dynamic("W")
    S = T.dynamic("S")
    NS = T.dynamic("NS")
    RP = T.dynamic("RP")

    def qk_column(k):
        # physical column of logical column k (the permutation within each 16-column half)
        return (k // 16) * 16 + regs_qk_column(k % 16)

    def pv_dim(mc, m):
        # latent dim of row m of PV fragment mc
        return mc * PV_DIMS + regs_pv_dim(m)

    @T.macro
    def consume(w, tw, nblk, K8, vm, sft, Q_s, S_sm, P_s, alpha_s, ready, empty, accs, acc_s, a_qk, a_pv, st, scale):
        # consumer w's blocks 2j + w: QK, online softmax, PV; stage handed back after PV. S_sm, P_s,
        # alpha_s: consumer w's own. Each fragment's wgmmas are waited for before the next fill: two
        # alternating fragments with the wait one wgmma later measured slower (154 vs 120 us over
        # 132 rows x 32 KV blocks, H200 2026-12-01)
        for j in T.serial((nblk - w + 1) // 2):
            i = 2 * j + w
            s = i % NST
            T.barrier_wait(ready[s], (i // NST) & 1)
            T.clear(acc_s)
            for c in T.serial(NQ):
                T.call_extern("handle", FILL_QK, a_qk.data, T.access_ptr(K8[s, 0, 0], "r"), tw, c)
                T.gemm(a_qk, Q_s[:, c * QK_COLUMNS:(c + 1) * QK_COLUMNS], acc_s, transpose_B=True)
            T.copy(acc_s, S_sm[:, 0:HB])
            _consumer_sync(T, PAIR_BARRIERS[w])      # S_sm complete; the last block's readers are past the sync below
            softmax[w](tw, S_sm, vm, s, P_s, alpha_s, st, scale)
            T.fence_proxy_async()                    # P_s (generic writes) before the wgmma reads it
            _consumer_sync(T, PAIR_BARRIERS[w])      # P_s and alpha_s complete
            for mc, acc_c in enumerate(accs):
                for m, h in T.Parallel(PV_DIMS, HB):
                    acc_c[m, h] *= alpha_s[h]
                T.call_extern("handle", FILL_PV, a_pv.data, T.access_ptr(K8[s, 0, 0], "r"),
                              T.access_ptr(sft[s, 0], "r"), tw, mc)
                T.gemm(a_pv, P_s, acc_c)
            T.barrier_arrive(empty[s])

    @T.macro
    def consumer_role(w, tw, r, sp, nblk, Q, K8, vm, sft, Q_s, S_sm, P_s, alpha_s, Ob, ml_s, fac_s, ready, empty,
                      Out, Lse, Opart, Lpart, scale):
        # consumer warpgroup w (thread tw of it): its own fragments and online softmax over blocks 2j + w;
        # then consumer 1 hands its result over in shared memory and consumer 0 merges and writes
        accs = tuple(T.alloc_fragment((PV_DIMS, HB), T.float32) for _ in range(NPV))
        acc_s = T.alloc_fragment((BI, HB), T.float32)
        a_qk = T.alloc_fragment((BI, QK_COLUMNS), T.bfloat16)
        a_pv = T.alloc_fragment((PV_DIMS, BI), T.bfloat16)
        st = T.alloc_local((4,), T.float32)
        if w == 0:
            for h, k in T.Parallel(HB, d):
                Q_s[h, k] = T.if_then_else(h < H, Q[r, T.min(h, H - 1), qk_column(k)], T.bfloat16(0))
            T.fence_proxy_async()
        for acc_c in accs:
            T.clear(acc_c)
        st[0] = NEG_INIT
        st[1] = 0.0
        T.sync_threads(Q_LOAD_BARRIER, 256)         # Q_s complete before either consumer's first QK
        consume(w, tw, nblk, K8, vm, sft, Q_s, S_sm, P_s, alpha_s, ready, empty, accs, acc_s, a_qk, a_pv, st, scale)
        if w == 1:
            for mc, acc_c in enumerate(accs):
                for m, h in T.Parallel(PV_DIMS, HB):
                    Ob[mc, m, h] = acc_c[m, h]
            if tw % TPC == 0:
                ml_s[0, tw // TPC] = st[0]
                ml_s[1, tw // TPC] = st[1]
        T.sync_threads(MERGE_BARRIER, 256)
        if w == 0:
            c = tw // TPC
            if tw % TPC == 0:
                mx = T.max(st[0], ml_s[0, c])
                a0 = T.exp2((st[0] - mx) * scale)
                a1 = T.exp2((ml_s[0, c] - mx) * scale)
                tot = st[1] * a0 + ml_s[1, c] * a1
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
                        if split:
                            Opart[sp, r, h, pv_dim(mc, m)] = acc_c[m, h] * fac_s[0, h] + Ob[mc, m, h] * fac_s[1, h]
                        else:
                            Out[r, h, pv_dim(mc, m)] = T.cast(acc_c[m, h] * fac_s[0, h] + Ob[mc, m, h] * fac_s[1, h],
                                                              T.bfloat16)

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
        with T.Kernel(R, NS, threads=384) as (r, sp):
            if PDL:   # wait for the previous kernel before touching memory (_common.PDL)
                T.evaluate(pdl_sync())
            T.import_source(DEQUANT_SRC + BULK_COPY_SRC + REGS_SRC)
            K8 = T.alloc_shared((NST, BI, REC), T.uint8)
            ix_s = T.alloc_shared((NST, BI), T.int32)
            vm = T.alloc_shared((NST, BI), T.float32)
            sft = T.alloc_shared((NST, SFW), T.uint32)
            Q_s = T.alloc_shared((HB, d), T.bfloat16)
            S_sm0 = T.alloc_shared((BI, HB + 1), T.float32)       # per consumer: scores, P, rescale
            S_sm1 = T.alloc_shared((BI, HB + 1), T.float32)
            P_s0 = T.alloc_shared((BI, HB), T.bfloat16)
            P_s1 = T.alloc_shared((BI, HB), T.bfloat16)
            alpha_s0 = T.alloc_shared((HB,), T.float32)
            alpha_s1 = T.alloc_shared((HB,), T.float32)
            Ob = T.alloc_shared((NPV, PV_DIMS, HB), T.float32)      # consumer 1's result, for the merge
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
                consumer_role(0, tx, r, sp, nblk, Q, K8, vm, sft, Q_s, S_sm0, P_s0, alpha_s0, Ob, ml_s, fac_s, ready,
                              empty, Out, Lse, Opart, Lpart, scale)
            elif tx < 256:
                consumer_role(1, tx - 128, r, sp, nblk, Q, K8, vm, sft, Q_s, S_sm1, P_s1, alpha_s1, Ob, ml_s, fac_s,
                              ready, empty, Out, Lse, Opart, Lpart, scale)
            else:
                # ------------------------------------------------------------ producers
                tp = tx - 256
                if tp < 32:
                    ib = T.alloc_local((NST * (RPL + 1),), T.int32)
                    for s in T.unroll(NST):                      # blocks 0 .. NST - 1: every index load first
                        load_indices(Idx, r, W, b0 + s, s < nblk, tp, ib, s * (RPL + 1))
                    for s in T.unroll(NST):
                        issue_block(Pool, K8, ix_s, full, s, tp, ib, s * (RPL + 1))
                    for u in T.unroll(2):
                        load_indices(Idx, r, W, b0 + NST + u, NST + u < nblk, tp, ib, u * (RPL + 1))
                    for i2 in T.serial(T.ceildiv(T.max(nblk - NST, 0), 2)):
                        for u in T.unroll(2):                    # block i + NST into block i's stage
                            i = 2 * i2 + u
                            if i + NST < nblk:
                                T.barrier_wait(empty[i % NST], (i // NST) & 1)
                                issue_block(Pool, K8, ix_s, full, i % NST, tp, ib, u * (RPL + 1))
                                load_indices(Idx, r, W, b0 + i + NST + 2, i + NST + 2 < nblk, tp, ib, u * (RPL + 1))
                else:
                    pt = tp - 32
                    pw = pt // 32
                    lane = pt % 32
                    for i in T.serial(nblk):
                        s = i % NST
                        T.barrier_wait(full[s], (i // NST) & 1)
                        # records not copied hold another block's bytes or garbage: zero them
                        for q in T.serial(-(-BI // 3)):
                            rec = q * 3 + pw
                            if rec < BI:
                                if ix_s[s, rec] < 0:
                                    for v in T.vectorized(16):
                                        K8[s, rec, lane * 16 + v] = T.uint8(0)
                                    if lane < (REC - d) // 16:
                                        for v in T.vectorized(16):
                                            K8[s, rec, d + lane * 16 + v] = T.uint8(0)
                        if pt < BI:
                            vm[s, pt] = T.if_then_else(ix_s[s, pt] >= 0, 0.0, -T.infinity(T.float32))
                        for q in T.unroll(-(-SFW // PREP)):
                            wi = q * PREP + pt
                            if wi < SFW:
                                g = wi // 32
                                tok = 16 * ((wi % 8) // 2) + 2 * ((wi // 8) % 4) + 8 * (wi % 2)
                                s0 = T.if_then_else(ix_s[s, tok] >= 0, T.cast(K8[s, tok, d + g], T.uint32), T.uint32(0))
                                s1 = T.if_then_else(ix_s[s, tok + 1] >= 0, T.cast(K8[s, tok + 1, d + g], T.uint32),
                                                    T.uint32(0))
                                sft[s, wi] = (s0 << T.uint32(7)) | (s1 << T.uint32(23))
                        T.fence_proxy_async()                    # the zeroed bytes before later bulk copies
                        T.barrier_arrive(ready[s])

    return main
