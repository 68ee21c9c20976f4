"""The producer side of the bulk-copy sparse MLA kernels ("bulk", its row groups, the shared-key
pairs and quads, "mma"): one warp issues TMA bulk copies of a block's FP8 records into a stage
(one request per run of consecutive slots, ``_cuda.di_issue_record_runs``), the dequantizing
threads turn a stage into the bf16 tile and its mask (``bulk.py`` for the pipeline they serve)."""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations at
# decoration time against the builder locals.

from deepinfer_kernels.layouts import row_bits_shift
from deepinfer_kernels.tilelang.sparse_mla.common import BLOCK_TOKENS, _record_bytes

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
    """The issuing warp of the kernel whose consumers read FP8 stages themselves ("mma"):
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
