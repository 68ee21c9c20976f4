"""TileLang builder of the row-group bulk-copy sparse MLA kernel ("bulk" at prefill sizes; see
``bulk.py`` for the copy / dequantization pipeline and ``common.py`` for
the math).

Why: a prefill row attends a few blocks (2 to 6 for the engine's window + far layout), so a CTA of
the one-row kernel spends most of its life filling and draining its pipeline: Q load, the first
copies, the last PV, the output. Measured on the H200 (2026-11-30), 64 x 512 `mini` prefill: 29.4
ms in this op, ~3.4 us per 64-key block per SM where the pipeline's steady state is ~1 us.

Here one CTA owns ``RPC`` consecutive query rows (one head group) and walks their block pairs as
one stream: the producers copy and dequantize the next row's first pair while the consumer
finishes the previous row. Each row is trimmed to its last valid index (as the one-row kernel's
``trim``), rows without any valid index are written as 0 / ``-inf`` directly. The work list
(row, pair) of the CTA is built once in shared memory, so producer and consumer walk the same
items with the same barrier phases (item k uses each stage once: phase ``k & 1``).

Results equal the one-row kernel's bit for bit: same copies, same dequantization, same consumer
arithmetic per row (the online softmax state restarts at each row's first pair).
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations at
# decoration time against the builder locals.

from deepinfer_kernels.tilelang._common import PDL, pdl_sync
from deepinfer_kernels.tilelang._cuda import BULK_COPY_SRC, DEQUANT_SRC
from deepinfer_kernels.tilelang.sparse_mla.common import (
    BLOCK_TOKENS,
    NEG_INIT,
    _consume_block_macro,
    _consumer_sync,
    _record_bytes,
    _softmax_macros,
    one_row_kernel,
    row_dims,
)
from deepinfer_kernels.tilelang.sparse_mla.producer import LOAD_BATCH, _bulk_macros, dequant_scratch_bytes

ROWS_PER_CTA = 4
MAX_PAIRS = 8          # pairs of 64-key blocks per row: index lists up to 1,024 wide


def _build_bulk_rows(heads: int, d: int, hb: int, producers: int = 2, rpc: int = ROWS_PER_CTA,
                     max_pairs: int = MAX_PAIRS):
    """Same arguments and outputs as ``_build_bulk(..., split=False)`` (``Opart`` / ``Lpart`` /
    ``bps`` are accepted and unused); the launcher keeps it to widths <= 128 * ``max_pairs``."""
    import tilelang.language as T

    BI = BLOCK_TOKENS
    REC = _record_bytes(d)
    PT = 128 * producers
    NTH = 128 + PT
    H = heads
    HG = (H + hb - 1) // hb
    RPL = BI // 32
    MAXI = rpc * max_pairs
    block_softmax, finish = _softmax_macros(T, hb, d, H, False, explicit_sync=True)
    consume_block = _consume_block_macro(T, hb, d, block_softmax, explicit_sync=True)
    load_indices, issue_block, dequant_block = _bulk_macros(T, d, producers)

    R, W, S, NS, RP = dims = row_dims(T)

    @T.macro
    def body(Q, Pool, Idx, Out, Lse, Opart, Lpart, scale, bps):
        with T.Kernel(T.ceildiv(R, rpc) * HG, threads=NTH) as bx:
            if PDL:   # wait for the previous kernel before touching memory (_common.PDL)
                T.evaluate(pdl_sync())
            r0 = (bx // HG) * rpc
            hg = bx % HG
            T.import_source(DEQUANT_SRC + BULK_COPY_SRC)
            Q_s = T.alloc_shared((hb, d), T.bfloat16)
            K8 = T.alloc_shared((2, BI, REC), T.uint8)
            Kb = T.alloc_shared((2, BI, d), T.bfloat16)
            ix_s = T.alloc_shared((2, BI), T.int32)
            vm = T.alloc_shared((2, BI), T.float32)
            S_sm = T.alloc_shared((BI, hb + 1), T.float32)
            P_s = T.alloc_shared((BI, hb), T.bfloat16)
            alpha_s = T.alloc_shared((hb,), T.float32)
            inv_s = T.alloc_shared((hb,), T.float32)
            last_s = T.alloc_shared((rpc,), T.int32)         # each row's last valid column
            npair_s = T.alloc_shared((rpc,), T.int32)        # block pairs each row walks
            item_s = T.alloc_shared((MAXI,), T.int32)        # work list: row * max_pairs + pair
            nitem_s = T.alloc_shared((1,), T.int32)
            fp8_full = T.alloc_barrier(arrive_count=[1, 1])
            fp8_empty = T.alloc_barrier(arrive_count=[PT, PT])
            kb_full = T.alloc_barrier(arrive_count=[PT, PT])
            kb_empty = T.alloc_barrier(arrive_count=[128, 128])
            tx = T.get_thread_binding()
            lv = T.alloc_var(T.int32)
            nitems = T.alloc_var(T.int32)
            npv = T.alloc_var(T.int32)          # shared values read into registers first: loop
            itv = T.alloc_var(T.int32)          # bounds and branch conditions cannot load shared memory

            # ---------------------------------------------------------------- work list
            if tx < rpc:
                last_s[tx] = -1
            T.sync_threads()
            for i in T.serial(rpc):
                lv = -1
                for c in T.serial(T.ceildiv(W, NTH)):
                    col = c * NTH + tx
                    if (r0 + i < R) and (col < W):
                        if Idx[T.min(r0 + i, R - 1), col] >= 0:
                            lv = col
                T.atomic_max(last_s[i], lv)
            T.sync_threads()
            if tx == 0:
                nitems = 0
                for i in T.serial(rpc):
                    npv = T.min(max_pairs, (last_s[i] + 2 * BI) // (2 * BI))
                    npair_s[i] = npv
                    for j in T.serial(npv):
                        item_s[nitems] = i * max_pairs + j
                        nitems = nitems + 1
                nitem_s[0] = nitems
            T.sync_threads()
            nitems = nitem_s[0]

            if tx < 128:
                # ---------------------------------------------------------------- consumer
                acc_s = T.alloc_fragment((BI, hb), T.float32)
                acc_o = T.alloc_fragment((d, hb), T.float32)
                st = T.alloc_local((4,), T.float32)
                # rows without a valid index: out 0, lse -inf (no item touches them)
                for i in T.serial(rpc):
                    npv = npair_s[i]
                    if (r0 + i < R) and (npv == 0):
                        for h, k in T.Parallel(hb, d):
                            if hg * hb + h < H:
                                Out[r0 + i, hg * hb + h, k] = T.bfloat16(0)
                        for h in T.Parallel(hb):
                            if hg * hb + h < H:
                                Lse[r0 + i, hg * hb + h] = -T.infinity(T.float32)
                for k in T.serial(nitems):
                    itv = item_s[k]
                    row = itv // max_pairs
                    pair = itv % max_pairs
                    npv = npair_s[row]
                    if pair == 0:                 # a row starts: its queries, a fresh softmax state
                        for h, kk in T.Parallel(hb, d):
                            Q_s[h, kk] = T.if_then_else(hg * hb + h < H, Q[r0 + row, T.min(hg * hb + h, H - 1), kk],
                                                        T.bfloat16(0))
                        T.fill(acc_o, 0)
                        st[0] = NEG_INIT
                        st[1] = 0.0
                        _consumer_sync(T)          # Q_s complete before the row's first QK
                    for s in T.unroll(2):
                        consume_block(tx, s, k & 1, Q_s, Kb, vm, S_sm, P_s, alpha_s, acc_s, acc_o, st, kb_full,
                                      kb_empty, scale)
                    if pair == npv - 1:            # the row's last pair: its output
                        finish(tx, r0 + row, hg, 0, st, inv_s, acc_o, Out, Lse, Opart, Lpart, scale)
            else:
                # ---------------------------------------------------------------- producer
                tp = tx - 128
                qv = T.alloc_local((dequant_scratch_bytes(LOAD_BATCH),), T.uint8)
                bv = T.alloc_local((16,), T.bfloat16)
                ib = T.alloc_local((2 * (RPL + 1),), T.int32)   # slots + count, per stage
                if (tp < 32) and (nitems > 0):
                    for s in T.unroll(2):
                        # item 0's two blocks: copies now; item 1's slots into registers
                        load_indices(Idx, r0 + item_s[0] // max_pairs, W, 2 * (item_s[0] % max_pairs) + s,
                                     nitems > 0, tp, ib, s * (RPL + 1))
                        issue_block(Pool, K8, ix_s, fp8_full, s, tp, ib, s * (RPL + 1))
                        load_indices(Idx, r0 + item_s[T.min(1, MAXI - 1)] // max_pairs, W,
                                     2 * (item_s[T.min(1, MAXI - 1)] % max_pairs) + s, nitems > 1,
                                     tp, ib, s * (RPL + 1))
                for k in T.serial(nitems):
                    for s in T.unroll(2):
                        T.barrier_wait(fp8_full[s], k & 1)
                        T.barrier_wait(kb_empty[s], (k & 1) ^ 1)
                        dequant_block(K8, ix_s, Kb, vm, s, tp, qv, bv, s)
                        T.fence_proxy_async()
                        T.barrier_arrive(kb_full[s])
                        T.barrier_arrive(fp8_empty[s])
                        if (tp < 32) and (k + 1 < nitems):
                            T.barrier_wait(fp8_empty[s], k & 1)
                            issue_block(Pool, K8, ix_s, fp8_full, s, tp, ib, s * (RPL + 1))
                            nxt = T.min(k + 2, MAXI - 1)
                            load_indices(Idx, r0 + item_s[nxt] // max_pairs, W, 2 * (item_s[nxt] % max_pairs) + s,
                                         k + 2 < nitems, tp, ib, s * (RPL + 1))

    return one_row_kernel(T, H, d, dims, body)
