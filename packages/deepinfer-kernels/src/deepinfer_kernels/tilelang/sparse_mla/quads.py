"""TileLang builder of the quad shared-key sparse MLA kernel: four consecutive rows of 16 heads
attend their shared key list (``ops.shared_keys``, groups of 4) with the 64 query columns on the
wgmma's M side, in the FlashMLA layout (see ``bulk.py`` / ``producer.py`` for the copy / dequantization
side it shares with the other bulk kernels).

Why: the row-pair kernel (``groups.py``) puts keys on M and 2 x 16 query columns on N.
Its scores reach the softmax through shared memory (a key column's max spans the four warps) and
every block serializes QK -> softmax -> PV in one warpgroup: ~3.7 us per 64-key block at
prefill (H200, 2026-12-01), where the tensor work is ~0.5 us. With 4 rows x 16 heads = 64 query
columns, the queries fill M instead:

    S[64 q, 64 keys]      = Q[64 q, D] . K^T          (wgmma m64n64, both operands in shared memory)
    O[64 q, D / 2]       += P[64 q, 64 keys] . V       (wgmma m64n256, P from registers)

A query column's scores sit in one thread quad, so the online softmax stays in registers. The two
consumer warpgroups each compute the whole S (the QK is repeated, which costs less than trading
P and the rescale factors through shared memory, and there is no room for them: Q 64 KB + two
bf16 stages 128 KB + the FP8 stage 33 KB fill the 227 KB) and each owns half of D for PV and the
output. One producer warpgroup copies and dequantizes blocks as in the other bulk kernels.

One CTA walks ``QPC`` quads (their blocks as one work list; the producer runs ahead across quads,
the consumers reload Q between them). A quad's list is compacted (``counts[g]`` valid entries
first), so the CTA walks ``ceil(counts[g] / 64)`` blocks; quads with no key write 0 / -inf.
Results equal the reference up to float rounding (keys come in the quad list's order).
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations at
# decoration time against the builder locals.

from deepinfer_kernels.tilelang._common import PDL, pdl_sync
from deepinfer_kernels.tilelang._cuda import BULK_COPY_SRC, DEQUANT_SRC
from deepinfer_kernels.tilelang.sparse_mla.common import (
    BLOCK_TOKENS,
    LOG2E,
    NEG_INIT,
    _record_bytes,
    group_dims,
    key_group_kernel,
)
from deepinfer_kernels.tilelang.sparse_mla.producer import _bulk_macros, dequant_scratch_bytes

QUAD_ROWS = 4
QUAD_HEADS = 16            # 4 rows x 16 heads = the wgmma's M of 64
QUADS_PER_CTA = 2
MAX_QUAD_BLOCKS = 30       # 64-key blocks per quad list: lists up to 1,920 keys (the work list fits meta)
# setmaxnreg moves registers within what the CTA got at launch: 384 threads x 168 (65,536 / 384,
# rounded down to 8). A warpgroup's increase waits until the others' decreases free enough, so the
# budgets must sum to at most 3 x 168: 216 + 216 + 80 (65,536 registers) hung on the H200
# (2026-12-01). 216 / 72: no spill in ptxas (232 / 48 spilled).
LAUNCH_REGS = 168
CONSUMER_REGS = 216        # each consumer warpgroup (acc_o 64 x 256 fp32 = 128 registers a thread)
PRODUCER_REGS = 72
QUAD_LOAD_BATCH = 4         # _bulk_macros' load_batch within the producers' 72 registers (8 spills)
assert 2 * CONSUMER_REGS + PRODUCER_REGS <= 3 * LAUNCH_REGS
Q_BARRIER = 2              # named barrier of the 256 consumer threads (Q reloads)


def _build_quads(d: int, qpc: int = QUADS_PER_CTA, max_blocks: int = MAX_QUAD_BLOCKS,
                 load_batch: int = QUAD_LOAD_BATCH):
    """Q bf16 [R, 16, D], Pool uint8 [S, REC], Keys int32 [G, W] (``shared_key_lists(..., 4)``),
    Counts int32 [G] -> Out bf16 [R, 16, D], Lse float32 [R, 16]; ``G = ceil(R / 4)``.

    Block b of the CTA's work list goes through the FP8 stage and bf16 stage ``b % 2`` (each
    barrier's phase: how many times its stage was used, mod 2).

    The one FP8 stage's copy is exposed per block (issued once the block before is dequantized),
    but costs only ~5%; the producer's dequantization is what the consumers wait for (23-41% of
    the time goes without it; ``packages/deepinfer-kernels/diag/sparse_mla_quads_diag.py``, H200 2026-12-01). A producer with
    the stage's two halves on their own barriers, each next half copied as soon as this half was
    dequantized, was correct and slower (339.1 vs 318.9 us on `mini`'s prefill rows) and was
    removed."""
    import tilelang.language as T

    BI = BLOCK_TOKENS
    REC = _record_bytes(d)
    H = QUAD_HEADS
    M = QUAD_ROWS * H
    HALF_ROWS = QUAD_ROWS // 2     # rows whose queries each consumer warpgroup loads
    QCHUNKS = (M // 2) * d // 8 // 128   # 16-byte chunks of them per consumer thread
    DH = d // 2
    MAXI = qpc * max_blocks
    assert d % 128 == 0
    # meta, the kernel's one small int32 buffer [4, 64]: rows 0-1 the bf16 stages' key masks (row
    # bits), row 2 the FP8 stage's slots, row 3 the work list (MAXI items, their count, each quad's
    # block count). Q 64 KB + Kb 128 KB + K8 33 KB + meta 1 KB = 231,424 bytes of dynamic shared
    # memory: with the 1 KB the static barriers round up to, exactly the SM90 limit of 227 KB per
    # block (separate small buffers left alignment gaps and failed to launch, H200 2026-12-01).
    META = 64
    ITEMS = 3                  # meta row of the work list
    NITEMS = MAXI              # its count
    NBLK = MAXI + 1            # quad i's block count at NBLK + i
    assert MAXI + 1 + qpc <= META
    load_indices, issue_block, dequant_block = _bulk_macros(
        T, d, 1, group_rows=QUAD_ROWS, mask_bits=True, ix_row=2, load_batch=load_batch)

    R, G, W, S = dims = group_dims(T)

    @T.macro
    def load_block(Keys, g0, meta, b, ok, lane, ib):
        # the slots of the CTA's block b (a quad's block) into ib
        itb = meta[ITEMS, T.min(b, MAXI - 1)]
        load_indices(Keys, g0 + itb // max_blocks, W, itb % max_blocks, ok, lane, ib, 0)

    @T.macro
    def consume(half, tq, g0, nitems, Q, Q_s, Kb, meta, kb_full, kb_empty, Out, Lse, scale):
        # consumer warpgroup ``half`` (``tq``: its thread 0..127): every block's S and softmax, PV
        # and the output on D columns [half * DH, (half + 1) * DH)
        acc_s = T.alloc_fragment((M, BI), T.float32)
        p_f = T.alloc_fragment((M, BI), T.bfloat16)
        acc_o = T.alloc_fragment((M, DH), T.float32)
        m_i = T.alloc_fragment((M,), T.float32)
        m_prev = T.alloc_fragment((M,), T.float32)
        alpha = T.alloc_fragment((M,), T.float32)
        l_i = T.alloc_fragment((M,), T.float32)
        l_blk = T.alloc_fragment((M,), T.float32)
        l_inv = T.alloc_fragment((M,), T.float32)
        nbv = T.alloc_var(T.int32)
        itv = T.alloc_var(T.int32)
        # quads without a key: out 0, lse -inf (no item touches them)
        for i in T.serial(qpc):
            nbv = meta[ITEMS, NBLK + i]
            if (g0 + i < G) and (nbv == 0):
                for c, k in T.Parallel(M, DH):
                    if (g0 + i) * QUAD_ROWS + c // H < R:
                        Out[(g0 + i) * QUAD_ROWS + c // H, c % H, half * DH + k] = T.bfloat16(0)
                if half == 0:
                    for c in T.Parallel(M):
                        if (g0 + i) * QUAD_ROWS + c // H < R:
                            Lse[(g0 + i) * QUAD_ROWS + c // H, c % H] = -T.infinity(T.float32)
        for k in T.serial(nitems):
            itv = meta[ITEMS, k]
            grp = itv // max_blocks
            blk = itv % max_blocks
            nbv = meta[ITEMS, NBLK + grp]
            r0 = (g0 + grp) * QUAD_ROWS
            s = k % 2
            if blk == 0:                  # a quad starts: its queries (each warpgroup half the columns)
                T.sync_threads(Q_BARRIER, 256)     # both warpgroups are past the previous quad's QKs
                # this warpgroup's 32 query columns (rows r0 + half * 2, + 1), 16 bytes a thread per
                # step: column half * 32 + c is head c % 16 of row r0 + half * 2 + c // 16. Written
                # with the thread index explicit: as a T.Parallel the second warpgroup's copy lost its
                # vectorization (2-byte loads and stores)
                for it in T.serial(QCHUNKS):
                    flat = it * 128 + tq
                    c = flat // (d // 8)
                    ch = flat % (d // 8)
                    qr = r0 + half * HALF_ROWS + c // H
                    for v in T.vectorized(8):
                        Q_s[half * (M // 2) + c, ch * 8 + v] = T.if_then_else(
                            qr < R, Q[T.min(qr, R - 1), c % H, ch * 8 + v], T.bfloat16(0))
                T.fence_proxy_async()              # generic-proxy writes before the wgmma reads
                T.sync_threads(Q_BARRIER, 256)
                T.fill(acc_o, 0)
                T.fill(m_i, NEG_INIT)
                T.fill(l_i, 0)
            T.barrier_wait(kb_full[s], (k // 2) & 1)
            for i, j in T.Parallel(M, BI):        # 0 where query column i's row attends key j, else -inf
                acc_s[i, j] = T.if_then_else(((meta[s, j] >> (i // H)) & 1) == 1, 0.0, -T.infinity(T.float32))
            T.gemm(Q_s, Kb[s, :, :], acc_s, transpose_B=True)
            T.copy(m_i, m_prev)
            T.reduce_max(acc_s, m_i, dim=1, clear=False)
            for i in T.Parallel(M):
                m_i[i] = T.max(m_i[i], m_prev[i])
                alpha[i] = T.exp2((m_prev[i] - m_i[i]) * scale)
            for i, j in T.Parallel(M, BI):
                acc_s[i, j] = T.exp2(acc_s[i, j] * scale - m_i[i] * scale)
            T.reduce_sum(acc_s, l_blk, dim=1)
            for i in T.Parallel(M):
                l_i[i] = l_i[i] * alpha[i] + l_blk[i]
            for i, kk in T.Parallel(M, DH):
                acc_o[i, kk] *= alpha[i]
            T.copy(acc_s, p_f)
            T.gemm(p_f, Kb[s, :, half * DH:(half + 1) * DH], acc_o)
            T.barrier_arrive(kb_empty[s])
            if blk == nbv - 1:            # the quad's last block: its four rows' output
                # one reciprocal per query column, then products: a division per element compiled to
                # an IEEE division call each (128 a thread) and cost more than the quad's blocks
                for i in T.Parallel(M):
                    l_inv[i] = T.if_then_else(l_i[i] > 0, 1.0 / l_i[i], 0.0)
                for i, kk in T.Parallel(M, DH):
                    if r0 + i // H < R:
                        Out[r0 + i // H, i % H, half * DH + kk] = T.cast(acc_o[i, kk] * l_inv[i], T.bfloat16)
                if half == 0:
                    for i in T.Parallel(M):
                        if r0 + i // H < R:
                            Lse[r0 + i // H, i % H] = T.if_then_else(
                                l_i[i] > 0, (T.log2(l_i[i]) + m_i[i] * scale) / LOG2E, -T.infinity(T.float32))

    @T.macro
    def body(Q, Pool, Keys, Counts, Out, Lse, scale):
        with T.Kernel(T.ceildiv(G, qpc), threads=384) as bx:
            if PDL:   # wait for the previous kernel before touching memory (_common.PDL)
                T.evaluate(pdl_sync())
            g0 = bx * qpc
            T.import_source(DEQUANT_SRC + BULK_COPY_SRC)
            Q_s = T.alloc_shared((M, d), T.bfloat16)
            K8 = T.alloc_shared((1, BI, REC), T.uint8)
            Kb = T.alloc_shared((2, BI, d), T.bfloat16)
            # one buffer also keeps the planner from laying a buffer over another that slow threads
            # still read (TILELANG.md, pitfalls)
            meta = T.alloc_shared((4, META), T.int32)
            fp8_full = T.alloc_barrier(arrive_count=[1])
            fp8_empty = T.alloc_barrier(arrive_count=[128])
            kb_full = T.alloc_barrier(arrive_count=[128, 128])
            kb_empty = T.alloc_barrier(arrive_count=[256, 256])
            tx = T.get_thread_binding()
            nitems = T.alloc_var(T.int32)
            nbw = T.alloc_var(T.int32)          # shared values read into registers first: loop
                                                # bounds and branch conditions cannot load shared memory

            # ---------------------------------------------------------------- work list
            if tx == 0:
                nitems = 0
                for i in T.serial(qpc):
                    nbw = 0
                    if g0 + i < G:
                        nbw = T.min(max_blocks, T.ceildiv(T.min(Counts[T.min(g0 + i, G - 1)], W), BI))
                    meta[ITEMS, NBLK + i] = nbw
                    for j in T.serial(nbw):
                        meta[ITEMS, nitems] = i * max_blocks + j
                        nitems = nitems + 1
                meta[ITEMS, NITEMS] = nitems
            T.sync_threads()
            # each warpgroup reads the count after its register budget changes: read once before,
            # it is live across the change and nvcc spills it to local memory

            if tx < 128:
                T.inc_max_nreg(CONSUMER_REGS)
                nitems = meta[ITEMS, NITEMS]
                consume(0, tx, g0, nitems, Q, Q_s, Kb, meta, kb_full, kb_empty, Out, Lse, scale)
            elif tx < 256:
                T.inc_max_nreg(CONSUMER_REGS)
                nitems = meta[ITEMS, NITEMS]
                consume(1, tx - 128, g0, nitems, Q, Q_s, Kb, meta, kb_full, kb_empty, Out, Lse, scale)
            else:
                # ---------------------------------------------------------------- producer
                # warp 0 keeps one block in flight; ib holds the slots of the next block to issue
                T.dec_max_nreg(PRODUCER_REGS)
                nitems = meta[ITEMS, NITEMS]
                tp = tx - 256
                qv = T.alloc_local((dequant_scratch_bytes(load_batch),), T.uint8)
                bv = T.alloc_local((16,), T.bfloat16)
                ib = T.alloc_local((BI // 32 + 1,), T.int32)
                if tp < 32:
                    if nitems > 0:
                        load_block(Keys, g0, meta, 0, True, tp, ib)
                        issue_block(Pool, K8, meta, fp8_full, 0, tp, ib, 0)
                    load_block(Keys, g0, meta, 1, 1 < nitems, tp, ib)
                for b in T.serial(nitems):
                    kst = b % 2
                    T.barrier_wait(fp8_full[0], b & 1)
                    T.barrier_wait(kb_empty[kst], ((b // 2) & 1) ^ 1)
                    dequant_block(K8, meta, Kb, meta, 0, tp, qv, bv, kst)
                    T.fence_proxy_async()
                    T.barrier_arrive(kb_full[kst])
                    T.barrier_arrive(fp8_empty[0])
                    if (tp < 32) and (b + 1 < nitems):
                        T.barrier_wait(fp8_empty[0], b & 1)
                        issue_block(Pool, K8, meta, fp8_full, 0, tp, ib, 0)
                        load_block(Keys, g0, meta, b + 2, b + 2 < nitems, tp, ib)

    return key_group_kernel(T, H, d, dims, body)
