"""TileLang builder of the shared-key sparse MLA kernel (prefill and verification rows; see
``bulk.py`` for the copy / dequantization pipeline and ``common.py`` for
the math).

Why: consecutive rows of one request attend nearly the same keys (their windows differ in one key,
their far entries mostly coincide), and the one-row kernels read and dequantize every key once per
row. Here a CTA walks a row *pair*'s shared key list (``ops.shared_keys``: the union in the rows'
order, each key tagged with the rows that attend it) once, with both rows' queries on the wgmma's N
side: ``2 x H`` columns (32 at 16 heads; 8 per row at the least), the per-(key, row) -inf mask applied in the softmax.
Each block of 64 keys costs one copy and one dequantization for two rows, and the wgmmas run at
N = 32 instead of 16.

Shared memory (H = 16): Q 32 KB, two bf16 stages 128 KB, and *one* FP8 stage (33 KB; two would
not fit beside the 32-column Q). The producers dequantize block b, release the FP8 stage, and
warp 0 issues block b + 1 at once: its copy overlaps the consumer's work on block b, which at
N = 32 takes longer than the dequantization. The ring sizes and the producer count are builder
arguments; the defaults below are the fastest of the measured shapes.

One CTA walks ``GPC`` pairs (their block pairs as one work list, as in ``bulk_rows.py``).
A pair's list is compacted (its ``counts[g]`` valid entries first), so the CTA walks exactly
``ceil(counts[g] / 128)`` block pairs; pairs with no key write 0 / -inf. Results equal the
reference up to float rounding (keys come in the pair list's order and 64-key blocks, not each row's).
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations at
# decoration time against the builder locals.

from deepinfer_kernels.layouts import ROWS_PER_GROUP
from deepinfer_kernels.tilelang._common import PDL, pdl_sync
from deepinfer_kernels.tilelang._cuda import BULK_COPY_SRC, DEQUANT_SRC
from deepinfer_kernels.tilelang.sparse_mla.common import (
    BLOCK_TOKENS,
    NEG_INIT,
    _consume_block_macro,
    _consumer_sync,
    _record_bytes,
    _softmax_macros,
    group_dims,
    key_group_kernel,
)
from deepinfer_kernels.tilelang.sparse_mla.producer import LOAD_BATCH, _bulk_macros, dequant_scratch_bytes

GROUPS_PER_CTA = 2
MAX_GROUP_PAIRS = 16    # block pairs per row pair: shared key lists up to 2,048 wide
# pipeline shape, from the H200 sweep of 2026-12-01 (8,192 prefill rows of `mini`, KV blocks of 128):
# 1 FP8 + 2 bf16 stages with two producer warpgroups 455.7 us, with one 498.6 us; 3 FP8 + 1 bf16
# 704.0 us (the consumer then waits for every dequantization); 2 FP8 + 1 bf16, two producers 647.3 us
FP8_STAGES = 1          # copies in flight ahead of the dequantization
BF16_STAGES = 2         # dequantized blocks (the consumer works on one while the next is converted)
PRODUCERS = 2           # dequantizing warpgroups
CONSUMER_REGS = 240     # register budgets when two producer warpgroups share the SM with the consumer
PRODUCER_REGS = 96


def row_columns(heads: int) -> int:
    """wgmma N columns per row of a pair: the heads, padded to 8 (N = 16 at the least)."""
    return max(8, heads)


def group_columns(heads: int) -> int:
    return ROWS_PER_GROUP * row_columns(heads)


def _build_bulk_groups(heads: int, d: int, gpc: int = GROUPS_PER_CTA, max_pairs: int = MAX_GROUP_PAIRS,
                       fp8_stages: int = FP8_STAGES, bf16_stages: int = BF16_STAGES, producers: int = PRODUCERS):
    """Q bf16 [R, H, D], Pool uint8 [S, REC], Keys int32 [G, W] (``shared_key_lists``), Counts
    int32 [G] -> Out bf16 [R, H, D], Lse float32 [R, H]; ``G = ceil(R / 2)``.

    Blocks b = 0, 1, ... of the CTA's work list go through FP8 stage ``b % fp8_stages`` and bf16
    stage ``b % bf16_stages`` (each barrier's phase: how many times its stage was used, mod 2)."""
    import tilelang.language as T

    BI = BLOCK_TOKENS
    REC = _record_bytes(d)
    PT = 128 * producers              # dequantizing threads
    NTH = 128 + PT
    H = heads
    HC = row_columns(H)
    C = group_columns(H)              # wgmma N: both rows' heads (padded to 8 each)
    RPL = BI // 32
    MAXI = gpc * max_pairs
    F = fp8_stages
    K = bf16_stages
    assert C in (16, 32), f"{ROWS_PER_GROUP} rows x {H} heads: the kernel takes up to 16 heads"
    block_softmax, finish = _softmax_macros(T, C, d, H, False, explicit_sync=True, group_rows=ROWS_PER_GROUP)
    consume_block = _consume_block_macro(T, C, d, block_softmax, explicit_sync=True)
    load_indices, issue_block, dequant_block = _bulk_macros(T, d, producers, group_rows=ROWS_PER_GROUP)

    R, G, W, S = dims = group_dims(T)

    @T.macro
    def load_block(Keys, g0, item_s, b, ok, lane, ib):
        # the slots of the CTA's block b (item b // 2, half b % 2) into ib
        itb = item_s[T.min(b // 2, MAXI - 1)]
        load_indices(Keys, g0 + itb // max_pairs, W, 2 * (itb % max_pairs) + b % 2, ok, lane, ib, 0)

    @T.macro
    def body(Q, Pool, Keys, Counts, Out, Lse, scale):
        with T.Kernel(T.ceildiv(G, gpc), threads=NTH) as bx:
            if PDL:   # wait for the previous kernel before touching memory (_common.PDL)
                T.evaluate(pdl_sync())
            g0 = bx * gpc
            T.import_source(DEQUANT_SRC + BULK_COPY_SRC)
            Q_s = T.alloc_shared((C, d), T.bfloat16)
            K8 = T.alloc_shared((F, BI, REC), T.uint8)
            Kb = T.alloc_shared((K, BI, d), T.bfloat16)
            ix_s = T.alloc_shared((F, BI), T.int32)
            vm = T.alloc_shared((K, BI, ROWS_PER_GROUP), T.float32)
            S_sm = T.alloc_shared((BI, C + 1), T.float32)
            P_s = T.alloc_shared((BI, C), T.bfloat16)
            alpha_s = T.alloc_shared((C,), T.float32)
            inv_s = T.alloc_shared((C,), T.float32)
            npair_s = T.alloc_shared((gpc,), T.int32)        # block pairs each row pair walks
            item_s = T.alloc_shared((MAXI,), T.int32)        # work list: pair * max_pairs + block pair
            nitem_s = T.alloc_shared((1,), T.int32)
            fp8_full = T.alloc_barrier(arrive_count=[1] * F)
            fp8_empty = T.alloc_barrier(arrive_count=[PT] * F)
            kb_full = T.alloc_barrier(arrive_count=[PT] * K)
            kb_empty = T.alloc_barrier(arrive_count=[128] * K)
            tx = T.get_thread_binding()
            nitems = T.alloc_var(T.int32)
            npv = T.alloc_var(T.int32)          # shared values read into registers first: loop
            itv = T.alloc_var(T.int32)          # bounds and branch conditions cannot load shared memory

            # ---------------------------------------------------------------- work list
            if tx == 0:
                nitems = 0
                for i in T.serial(gpc):
                    npv = 0
                    if g0 + i < G:
                        npv = T.min(max_pairs, T.ceildiv(T.min(Counts[T.min(g0 + i, G - 1)], W), 2 * BI))
                    npair_s[i] = npv
                    for j in T.serial(npv):
                        item_s[nitems] = i * max_pairs + j
                        nitems = nitems + 1
                nitem_s[0] = nitems
            T.sync_threads()
            nitems = nitem_s[0]
            nblk = 2 * nitems

            if tx < 128:
                # ---------------------------------------------------------------- consumer
                if producers > 1:
                    T.inc_max_nreg(CONSUMER_REGS)
                acc_s = T.alloc_fragment((BI, C), T.float32)
                acc_o = T.alloc_fragment((d, C), T.float32)
                st = T.alloc_local((4,), T.float32)
                # row pairs without a key: out 0, lse -inf (no item touches them)
                for i in T.serial(gpc):
                    npv = npair_s[i]
                    if (g0 + i < G) and (npv == 0):
                        for c, k in T.Parallel(C, d):
                            if ((g0 + i) * ROWS_PER_GROUP + c // HC < R) and (c % HC < H):
                                Out[(g0 + i) * ROWS_PER_GROUP + c // HC, c % HC, k] = T.bfloat16(0)
                        for c in T.Parallel(C):
                            if ((g0 + i) * ROWS_PER_GROUP + c // HC < R) and (c % HC < H):
                                Lse[(g0 + i) * ROWS_PER_GROUP + c // HC, c % HC] = -T.infinity(T.float32)
                for k in T.serial(nitems):
                    itv = item_s[k]
                    grp = itv // max_pairs
                    pair = itv % max_pairs
                    npv = npair_s[grp]
                    r0 = (g0 + grp) * ROWS_PER_GROUP
                    if pair == 0:                 # a row pair starts: its queries, a fresh softmax state
                        for c, kk in T.Parallel(C, d):
                            Q_s[c, kk] = T.if_then_else((r0 + c // HC < R) and (c % HC < H),
                                                        Q[T.min(r0 + c // HC, R - 1), T.min(c % HC, H - 1), kk],
                                                        T.bfloat16(0))
                        T.fill(acc_o, 0)
                        st[0] = NEG_INIT
                        st[1] = 0.0
                        _consumer_sync(T)          # Q_s complete before the pair's first QK
                    for s in T.unroll(2):
                        consume_block(tx, (2 * k + s) % K, ((2 * k + s) // K) & 1, Q_s, Kb, vm, S_sm, P_s, alpha_s,
                                      acc_s, acc_o, st, kb_full, kb_empty, scale)
                    if pair == npv - 1:            # the pair's last block pair: its two rows' output
                        finish(tx, r0, st, inv_s, acc_o, Out, Lse, scale)
            else:
                # ---------------------------------------------------------------- producer
                # warp 0 keeps F blocks in flight; ib holds the slots of the next block to issue
                if producers > 1:
                    T.dec_max_nreg(PRODUCER_REGS)
                tp = tx - 128
                qv = T.alloc_local((dequant_scratch_bytes(LOAD_BATCH),), T.uint8)
                bv = T.alloc_local((16,), T.bfloat16)
                ib = T.alloc_local((RPL + 1,), T.int32)
                if tp < 32:
                    for b in T.serial(F):
                        if b < nblk:
                            load_block(Keys, g0, item_s, b, True, tp, ib)
                            issue_block(Pool, K8, ix_s, fp8_full, b, tp, ib, 0)
                    load_block(Keys, g0, item_s, F, F < nblk, tp, ib)
                for b in T.serial(nblk):
                    f = b % F
                    kst = b % K
                    T.barrier_wait(fp8_full[f], (b // F) & 1)
                    T.barrier_wait(kb_empty[kst], ((b // K) & 1) ^ 1)
                    dequant_block(K8, ix_s, Kb, vm, f, tp, qv, bv, kst)
                    T.fence_proxy_async()
                    T.barrier_arrive(kb_full[kst])
                    T.barrier_arrive(fp8_empty[f])
                    if (tp < 32) and (b + F < nblk):
                        T.barrier_wait(fp8_empty[f], (b // F) & 1)
                        issue_block(Pool, K8, ix_s, fp8_full, f, tp, ib, 0)
                        load_block(Keys, g0, item_s, b + F + 1, b + F + 1 < nblk, tp, ib)

    return key_group_kernel(T, H, d, dims, body)
