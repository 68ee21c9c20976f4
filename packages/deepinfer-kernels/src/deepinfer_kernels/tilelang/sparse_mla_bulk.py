"""TileLang builder of the bulk-copy sparse MLA kernel ("bulk"; see ``sparse_mla_builders.py``
for the shared layout and math).

Why a third variant: in ``"ws"`` the producer warpgroup gathers each 64-token block into its
registers, so at most one block (33 KB) per SM is in flight. Here one producer warp stages
records with ``cp.async.bulk`` (global -> shared by the TMA unit, completion counted in bytes on
an mbarrier): no registers hold data in flight, and two FP8 stages (2 x 33 KB) load while two
dequantizing warpgroups turn a third block into the bf16 stage.

The TMA unit takes ~40 ns per request whatever its size (H200 diagnostics, 2026-11-30), so the
warp issues one copy per *run* of consecutive slots (``_cuda.di_issue_record_runs``): a KV block
of the engine's pool is one request, while random slots are one request each and stay slower
than ``"ws"`` (1.44x and 0.95x ``"ws"`` at 132 rows x 2,048 keys; kernels README).

Pipeline of one CTA (one query row x ``HB`` heads, blocks of 64 tokens, two of each stage):

    producer warp 0:   issue block i+2 -> fp8[s]          (after fp8_empty[s]; slots loaded 2 blocks ahead)
    producers:         fp8[s] -> dequant -> kb[s]         (after fp8_full[s], kb_empty[s])
    consumer (128):    S = K q, online softmax, O += V p  (after kb_full[s])

Only valid indices are copied (the barrier expects 528 bytes per valid record); the producers
write zeros and a ``-inf`` mask for the others, as in ``"ws"``.

``trim``: the CTA first finds its row's last valid index (every thread scans a few columns, one
shared-memory atomic max) and walks only the block pairs up to it. A fully masked block leaves the
online softmax exactly as it was (alpha 1, P 0), so the result is bit-identical; prefill rows
early in a prompt have most of their far entries empty (padding to the widest row).
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations at
# decoration time against the builder locals.

from deepinfer_kernels.ops.shared_keys import row_bits_shift
from deepinfer_kernels.tilelang._common import PDL, pdl_sync
from deepinfer_kernels.tilelang._cuda import BULK_COPY_SRC, DEQUANT_SRC
from deepinfer_kernels.tilelang.sparse_mla_builders import (
    BLOCK_TOKENS,
    _record_bytes,
    _staged_consumer_macro,
)

LOAD_BATCH = 8   # FP8 chunks a dequantizing thread loads before it converts any (``_bulk_macros``)


def dequant_scratch_bytes(load_batch: int) -> int:
    """Bytes of the dequantizers' ``qv`` scratch for ``_bulk_macros(..., load_batch=load_batch)``:
    the batch's FP8 chunks and the record part's 4 scale bytes."""
    return load_batch * 16 + 4


def _bulk_macros(T, d: int, producers: int, group_rows: int = 0, mask_bits: bool = False, ix_row: int = 0,
                 load_batch: int = LOAD_BATCH):
    """The producer side shared by the bulk kernels: ``load_indices`` (a block's slots into
    registers), ``issue_block`` (one warp's bulk copies of a block into an FP8 stage) and
    ``dequant_block`` (the producers turn an FP8 stage into a bf16 stage and the -inf mask).

    ``group_rows`` > 0: the index list is a row group's shared key list (``ops.shared_keys``:
    slot | row bits << row_bits_shift); the copies strip the bits and the mask is per key and row,
    ``vm[stage, key, row]`` (0 / -inf), or with ``mask_bits`` the key's row bits, ``vm[stage, key]``
    (int32, 0 for an invalid key). ``ix_row``: FP8 stage s's slots are row ``ix_row + s`` of
    ``ix_s`` (a kernel short of shared memory keeps them in one buffer with its masks).
    ``load_batch``: ``dequant_block`` reads that many of a record part's FP8 chunks (and the part's
    scales, first) before it converts and stores any (``qv`` holds ``dequant_scratch_bytes``).
    Chunk by chunk, nvcc cannot move the next chunk's shared load above this chunk's shared stores
    (they may alias), so every load's latency is exposed, and with the consumers' wgmmas streaming
    shared memory that latency is long. H200, 2026-12-01, bit-identical outputs: decode over KV
    blocks 86.3 -> 74.7 us (8 chunks; 4: 74.5), the quad kernel 329.5 -> 318.9 us on `mini`'s
    prefill rows (4 chunks: its producers' 72 registers)."""
    BI = BLOCK_TOKENS
    REC = _record_bytes(d)
    CH = d // 16                      # 16-byte chunks per record body
    PT = 128 * producers              # producer threads
    NCH = BI * CH // PT               # chunks per producer thread per block
    RPL = BI // 32                    # records issued per lane of the issuing warp
    assert BI * CH % PT == 0 and d % 64 == 0 and REC % 16 == 0 and BI == 64 and producers in (1, 2)

    # Dequant thread layout (as in "ws"): a thread owns RPT records x CPR consecutive 16-byte
    # chunks of each; lane L of warp w takes row L % RW and part L // RW, so the 8 lanes of a
    # quarter-warp touch 8 different rows: the fp8 reads (row stride 528 B = 4 banks apart) and the
    # swizzled bf16 writes are both conflict-free.
    CPR = min(8, NCH)
    RPT = NCH // CPR
    P = CH // CPR
    RW = 32 // P
    SB = CPR // 2                     # scale bytes per thread-part (CPR chunks = CPR/2 groups)
    assert RPT * CPR == NCH and P * CPR == CH and RW * P == 32 and SB >= 1
    LB = load_batch
    assert LB >= 1 and CPR % LB == 0 and SB == 4, "load_batch: whole batches of a part, 4 scale bytes"
    SHIFT = row_bits_shift(group_rows) if group_rows else 0
    SLOT_MASK = (1 << SHIFT) - 1

    @T.macro
    def load_indices(Idx, r, W, blk, ok_blk, lane, ib, o):
        # the slots of records k * 32 + lane of block ``blk`` (-1: none) into ib[o:o + RPL],
        # two blocks ahead of their copies: a copy never waits on its index load
        for k in T.unroll(RPL):
            col = blk * BI + k * 32 + lane
            ib[o + k] = T.if_then_else(ok_blk & (col < W), Idx[r, T.min(col, W - 1)], -1)

    @T.macro
    def issue_block(Pool, K8, ix_s, fp8_full, stage, lane, ib, o):
        # lanes 0..31 of producer warp 0: block's slots to ix_s (the dequantizers' validity), then
        # one bulk copy per run of consecutive slots into fp8[stage] (``di_issue_record_runs``)
        for k in T.unroll(RPL):
            ix_s[ix_row + stage, k * 32 + lane] = ib[o + k]
        T.sync_warp()                                   # ix_s writes before the release below
        if group_rows:
            for k in T.unroll(RPL):                     # the row bits off: pool slots
                ib[o + k] = T.if_then_else(ib[o + k] >= 0, ib[o + k] & SLOT_MASK, -1)
        ib[o + RPL] = T.call_extern("int32", "di_issue_record_runs", ib[o], ib[o + 1],
                                    T.access_ptr(Pool[0, 0], "r"), REC,
                                    T.access_ptr(K8[stage, 0, 0], "w"), T.access_ptr(fp8_full[stage], "rw"),
                                    lane)

    @T.macro
    def dequant_block(K8, ix_s, Kb, vm, stage, tp, qv, bv, dst):
        # FP8 stage ``stage`` (and its slots in ix_s) -> bf16 stage ``dst`` of Kb and vm
        for k in T.unroll(RPT):
            rec = k * (PT // P) + (tp // 32) * RW + (tp % 32) % RW
            part = (tp % 32) // RW
            ok = ix_s[ix_row + stage, rec] >= 0
            if ok:
                for v in T.vectorized(SB):
                    qv[LB * 16 + v] = K8[stage, rec, d + part * SB + v]
                for bt in T.unroll(CPR // LB):
                    for c in T.unroll(LB):
                        for v in T.vectorized(16):
                            qv[c * 16 + v] = K8[stage, rec, (part * CPR + bt * LB + c) * 16 + v]
                    for c in T.unroll(LB):
                        T.call_extern("handle", "di_dequant16", T.access_ptr(qv[c * 16], "r"),
                                      T.access_ptr(bv, "w"), qv[LB * 16 + (bt * LB + c) // 2])
                        for v in T.vectorized(16):
                            Kb[dst, rec, (part * CPR + bt * LB + c) * 16 + v] = bv[v]
            else:
                for jj in T.unroll(CPR):
                    for v in T.vectorized(16):
                        Kb[dst, rec, (part * CPR + jj) * 16 + v] = T.bfloat16(0)
            if part == 0:
                if mask_bits:
                    vm[dst, rec] = T.if_then_else(ok, (ix_s[ix_row + stage, rec] >> SHIFT) & ((1 << group_rows) - 1), 0)
                elif group_rows:
                    for j in T.unroll(group_rows):
                        vm[dst, rec, j] = T.if_then_else(ok & ((((ix_s[ix_row + stage, rec] >> SHIFT) >> j) & 1) == 1),
                                                         0.0, -T.infinity(T.float32))
                else:
                    vm[dst, rec] = T.if_then_else(ok, 0.0, -T.infinity(T.float32))

    return load_indices, issue_block, dequant_block


def _issue_stream_macro(T, load_indices, issue_block, nst: int):
    """The issuing warp of the kernels whose consumers read FP8 stages themselves ("regs", "mma"):
    blocks 0 .. nst - 1 into their stages, then block i + nst into block i's stage once its
    consumers free it (``empty``), two blocks a loop step, each block's index loads two blocks ahead
    of its copies (``load_indices`` / ``issue_block`` of ``_bulk_macros``)."""
    RPL = BLOCK_TOKENS // 32

    @T.macro
    def issue_stream(Idx, Pool, K8, ix_s, full, empty, r, W, b0, nblk, tp):
        ib = T.alloc_local((nst * (RPL + 1),), T.int32)
        for s in T.unroll(nst):                      # blocks 0 .. nst - 1: every index load first
            load_indices(Idx, r, W, b0 + s, s < nblk, tp, ib, s * (RPL + 1))
        for s in T.unroll(nst):
            issue_block(Pool, K8, ix_s, full, s, tp, ib, s * (RPL + 1))
        for u in T.unroll(2):
            load_indices(Idx, r, W, b0 + nst + u, nst + u < nblk, tp, ib, u * (RPL + 1))
        for i2 in T.serial(T.ceildiv(T.max(nblk - nst, 0), 2)):
            for u in T.unroll(2):                    # block i + nst into block i's stage
                i = 2 * i2 + u
                if i + nst < nblk:
                    T.barrier_wait(empty[i % nst], (i // nst) & 1)
                    issue_block(Pool, K8, ix_s, full, i % nst, tp, ib, u * (RPL + 1))
                    load_indices(Idx, r, W, b0 + i + nst + 2, i + nst + 2 < nblk, tp, ib, u * (RPL + 1))

    return issue_stream


def _build_bulk(heads: int, d: int, hb: int, split: bool, producers: int = 1, trim: bool = False,
                load_batch: int = LOAD_BATCH, consumers: int = 1):
    """Bulk-copy warp-specialized kernel; same signature and dynamic shapes as ``_build_ws``
    (``bps``, blocks per split, is even). ``producers`` dequantizing warpgroups (1 or 2) share
    each block; ``trim`` skips the block pairs past the row's last valid index; ``load_batch``:
    ``_bulk_macros``'s.

    ``consumers=2`` (experimental, not dispatched: correct on the H200 but 84.2 vs 90.8 us over KV
    blocks and slower elsewhere, 2026-12-01; the dequantizing producers then bound it): two consumer
    warpgroups take a split's even and odd blocks (``_staged_consumer_macro(pair_member=w)``) and always write
    partials: ``Opart`` / ``Lpart`` hold ``2 * splits`` of them (split ``sp``'s at ``2 sp`` and
    ``2 sp + 1``), the grid's y is ``splits``, and the split-KV combine kernel merges them. Needs
    ``split=True``."""
    import tilelang.language as T

    BI = BLOCK_TOKENS
    REC = _record_bytes(d)
    PT = 128 * producers              # producer threads
    CT = 128 * consumers              # consumer threads
    H = heads
    HG = (H + hb - 1) // hb
    RPL = BI // 32                    # records issued per lane of the issuing warp
    assert consumers in (1, 2) and (consumers == 1 or split), "two consumers write split partials"
    # the (first) consumer warpgroup; with two, the odd blocks' one beside it
    consume = _staged_consumer_macro(T, hb, d, H, split, explicit_sync=True, pair_member=None if consumers == 1 else 0)
    if consumers == 2:
        consume_odd = _staged_consumer_macro(T, hb, d, H, split, explicit_sync=True, pair_member=1)
    load_indices, issue_block, dequant_block = _bulk_macros(T, d, producers, load_batch=load_batch)

    R = T.dynamic("R")
    W = T.dynamic("W")
    S = T.dynamic("S")
    NS = T.dynamic("NS")
    RP = T.dynamic("RP")          # rows of the split partials (1 when not splitting)

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
        bps: T.int32,              # blocks per split (even)
    ):
        with T.Kernel(R * HG, NS // consumers, threads=CT + PT) as (bx, sp):
            if PDL:   # wait for the previous kernel before touching memory (_common.PDL)
                T.evaluate(pdl_sync())
            r = bx // HG
            hg = bx % HG
            T.import_source(DEQUANT_SRC + BULK_COPY_SRC)     # one import per kernel
            Q_s = T.alloc_shared((hb, d), T.bfloat16)
            K8 = T.alloc_shared((2, BI, REC), T.uint8)
            Kb = T.alloc_shared((2, BI, d), T.bfloat16)
            ix_s = T.alloc_shared((2, BI), T.int32)
            vm = T.alloc_shared((2, BI), T.float32)
            S_sm = T.alloc_shared((BI, hb + 1), T.float32)
            P_s = T.alloc_shared((BI, hb), T.bfloat16)
            alpha_s = T.alloc_shared((hb,), T.float32)
            inv_s = T.alloc_shared((hb,), T.float32)
            if consumers == 2:        # the odd blocks' consumer: its own scores, P and scales
                S_sm1 = T.alloc_shared((BI, hb + 1), T.float32)
                P_s1 = T.alloc_shared((BI, hb), T.bfloat16)
                alpha_s1 = T.alloc_shared((hb,), T.float32)
                inv_s1 = T.alloc_shared((hb,), T.float32)
            fp8_full = T.alloc_barrier(arrive_count=[1, 1])
            fp8_empty = T.alloc_barrier(arrive_count=[PT, PT])
            kb_full = T.alloc_barrier(arrive_count=[PT, PT])
            kb_empty = T.alloc_barrier(arrive_count=[128, 128])
            tx = T.get_thread_binding()
            b0 = sp * bps                 # first block of this split
            nj = T.alloc_var(T.int32)
            nj = bps // 2
            if trim:
                last_s = T.alloc_shared((1,), T.int32)
                lv = T.alloc_var(T.int32)
                if tx == 0:
                    last_s[0] = -1
                T.sync_threads()
                lv = -1
                for c in T.serial(T.ceildiv(W, CT + PT)):
                    col = c * (CT + PT) + tx
                    if col < W:
                        if Idx[r, col] >= 0:
                            lv = col
                T.atomic_max(last_s[0], lv)
                T.sync_threads()
                # pairs of this split that hold a block with a valid index
                nj = T.max(0, T.min(bps // 2, ((last_s[0] + BI) // BI - b0 + 1) // 2))
                T.sync_threads()          # every thread has read last_s: the planner may reuse its bytes
            nblk = 2 * nj                 # blocks this split walks
            if tx < 128:
                # ---------------------------------------------------------------- consumer
                consume(tx, r, hg, sp, nj, Q, Q_s, Kb, vm, S_sm, P_s, alpha_s, inv_s, kb_full, kb_empty,
                        Out, Lse, Opart, Lpart, scale)
            elif consumers == 2 and tx < 256:
                consume_odd(tx - 128, r, hg, sp, nj, Q, Q_s, Kb, vm, S_sm1, P_s1, alpha_s1, inv_s1, kb_full,
                            kb_empty, Out, Lse, Opart, Lpart, scale)
            else:
                # ---------------------------------------------------------------- producer
                tp = tx - CT
                qv = T.alloc_local((dequant_scratch_bytes(load_batch),), T.uint8)
                bv = T.alloc_local((16,), T.bfloat16)
                ib = T.alloc_local((2 * (RPL + 1),), T.int32)   # slots + count, per stage
                if tp < 32:
                    for s in T.unroll(2):
                        load_indices(Idx, r, W, b0 + s, s < nblk, tp, ib, s * (RPL + 1))
                        issue_block(Pool, K8, ix_s, fp8_full, s, tp, ib, s * (RPL + 1))
                        load_indices(Idx, r, W, b0 + 2 + s, 2 + s < nblk, tp, ib, s * (RPL + 1))
                for j in T.serial(nj):
                    for s in T.unroll(2):
                        T.barrier_wait(fp8_full[s], j & 1)
                        T.barrier_wait(kb_empty[s], (j & 1) ^ 1)
                        dequant_block(K8, ix_s, Kb, vm, s, tp, qv, bv, s)
                        T.fence_proxy_async()
                        T.barrier_arrive(kb_full[s])
                        T.barrier_arrive(fp8_empty[s])
                        if (tp < 32) and (j + 1 < nj):
                            T.barrier_wait(fp8_empty[s], j & 1)
                            issue_block(Pool, K8, ix_s, fp8_full, s, tp, ib, s * (RPL + 1))
                            load_indices(Idx, r, W, b0 + 2 * j + 4 + s, 2 * j + 4 + s < nblk, tp, ib, s * (RPL + 1))

    return main
