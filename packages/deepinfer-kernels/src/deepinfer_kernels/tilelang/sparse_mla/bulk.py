"""TileLang builder of the bulk-copy sparse MLA kernel ("bulk"; see ``common.py`` for the shared
layout and math, ``producer.py`` for the copies and the dequantization).

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

from deepinfer_kernels.tilelang._common import PDL, pdl_sync
from deepinfer_kernels.tilelang._cuda import BULK_COPY_SRC, DEQUANT_SRC
from deepinfer_kernels.tilelang.sparse_mla.common import (
    BLOCK_TOKENS,
    _record_bytes,
    _staged_consumer_macro,
    one_row_kernel,
    row_dims,
)
from deepinfer_kernels.tilelang.sparse_mla.producer import LOAD_BATCH, _bulk_macros, dequant_scratch_bytes

def _build_bulk(heads: int, d: int, hb: int, split: bool, producers: int = 1, trim: bool = False,
                load_batch: int = LOAD_BATCH):
    """Bulk-copy warp-specialized kernel; same signature and dynamic shapes as ``_build_ws``
    (``bps``, blocks per split, is even). ``producers`` dequantizing warpgroups (1 or 2) share
    each block; ``trim`` skips the block pairs past the row's last valid index; ``load_batch``:
    ``producer._bulk_macros``'s."""
    import tilelang.language as T

    BI = BLOCK_TOKENS
    REC = _record_bytes(d)
    PT = 128 * producers              # producer threads
    CT = 128                          # consumer threads
    H = heads
    HG = (H + hb - 1) // hb
    RPL = BI // 32                    # records issued per lane of the issuing warp
    consume = _staged_consumer_macro(T, hb, d, H, split, explicit_sync=True)
    load_indices, issue_block, dequant_block = _bulk_macros(T, d, producers, load_batch=load_batch)

    R, W, S, NS, RP = dims = row_dims(T)

    @T.macro
    def body(Q, Pool, Idx, Out, Lse, Opart, Lpart, scale, bps):
        with T.Kernel(R * HG, NS, threads=CT + PT) as (bx, sp):
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

    return one_row_kernel(T, H, d, dims, body)
