"""What the sparse MLA kernels share: the layout, the constants, the online softmax and the
staged consumer warpgroup (``__init__.py`` launches them; ``producer.py`` holds the bulk-copy
producer side; one module per kernel).

Kernel layout ("transposed" MQA): one CTA owns one query row and ``HB`` (16 or 32) heads, and
walks the row's index list in blocks of 64 tokens. Tokens are the MMA M dimension, so a wgmma
``m64 n{HB} k16`` serves 16 heads without padding them to 64:

    S^T[64 tok, HB]  = K[64 tok, D] . Q^T          (wgmma, K bf16 tile in shared memory)
    O^T[D, HB]      += V^T[D, 64 tok] . P^T        (wgmma, the same tile read transposed)

Every one-row kernel takes the same arguments (``one_row_kernel``: ``Q, Pool, Idx, Out, Lse,
Opart, Lpart, scale, bps``; ``__init__.sparse_mla_attention_tilelang`` launches them alike):

* ``ws.py`` ("ws"): a producer warpgroup gathers the FP8 records with 128-bit loads into
  registers and dequantizes them into the bf16 stage; more than 16 heads, D not a multiple of 512.
* ``bulk.py`` ("bulk"): one producer warp stages records with TMA bulk copies, two dequantizing
  warpgroups; ``bulk_rows.py`` runs several prefill rows per CTA as one pipeline.
* ``mma.py`` ("mma", decode): warp-level ``mma.sync`` over register operands, no bf16 tile.
* ``groups.py`` / ``quads.py``: row pairs / quads attending their shared key list once.

Dequantization is exact (``_cuda.DEQUANT_SRC``), the QK dot products are bf16 x bf16 with fp32
accumulation (as exact as the reference's fp32 math), P is rounded to bf16 for the PV product.

Split-KV: when there are too few (row, head-group) CTAs to fill the GPU, the index list is cut
into ``num_splits`` contiguous ranges whose partial (normalized out, lse) are merged by a small
second kernel (``combine.py``).
"""


BLOCK_TOKENS = 64           # tokens per block (the wgmma M)
LOG2E = 1.4426950408889634
NEG_INIT = -(2.0 ** 30)     # running-max start: finite, so exp2(m_prev - m) never sees inf - inf


def row_dims(T):
    """The one-row kernels' dynamic sizes: rows R, index width W, pool slots S, splits NS and the
    split partials' rows RP (1 when not splitting)."""
    return T.dynamic("R"), T.dynamic("W"), T.dynamic("S"), T.dynamic("NS"), T.dynamic("RP")


def one_row_kernel(T, heads: int, d: int, dims, body):
    """The prim_func of a one-row kernel ("ws", "bulk", its row groups, "mma"): the signature the
    launcher calls them all with, around ``body`` (a ``T.macro`` of the same arguments that opens
    the kernel). ``dims``: ``row_dims``'s, which ``body`` reads too."""
    R, W, S, NS, RP = dims

    @T.prim_func
    def main(
        Q: T.Tensor((R, heads, d), T.bfloat16),
        Pool: T.Tensor((S, _record_bytes(d)), T.uint8),
        Idx: T.Tensor((R, W), T.int32),
        Out: T.Tensor((R, heads, d), T.bfloat16),
        Lse: T.Tensor((R, heads), T.float32),
        Opart: T.Tensor((NS, RP, heads, d), T.float32),
        Lpart: T.Tensor((NS, RP, heads), T.float32),
        scale: T.float32,          # sm_scale * log2(e)
        bps: T.int32,              # blocks per split (even for "ws" / "bulk"; unused by the row groups)
    ):
        body(Q, Pool, Idx, Out, Lse, Opart, Lpart, scale, bps)

    return main


def group_dims(T):
    """The key-group kernels' dynamic sizes: rows R, groups G (of 2 or 4 rows), key-list width W,
    pool slots S."""
    return T.dynamic("R"), T.dynamic("G"), T.dynamic("W"), T.dynamic("S")


def key_group_kernel(T, heads: int, d: int, dims, body):
    """The prim_func of a key-group kernel ("groups", "quads": the rows of a group attend to their
    merged key list ``Keys[g, :Counts[g]]``), around ``body`` (a ``T.macro`` of the same arguments
    that opens the kernel). ``dims``: ``group_dims``'s, which ``body`` reads too."""
    R, G, W, S = dims

    @T.prim_func
    def main(
        Q: T.Tensor((R, heads, d), T.bfloat16),
        Pool: T.Tensor((S, _record_bytes(d)), T.uint8),
        Keys: T.Tensor((G, W), T.int32),
        Counts: T.Tensor((G,), T.int32),
        Out: T.Tensor((R, heads, d), T.bfloat16),
        Lse: T.Tensor((R, heads), T.float32),
        scale: T.float32,          # sm_scale * log2(e)
    ):
        body(Q, Pool, Keys, Counts, Out, Lse, scale)

    return main


def _record_bytes(d: int) -> int:
    return d + d // 32


def _vec_bytes(rec: int) -> int:
    """Widest power-of-two vector (<= 16 bytes) that keeps every record start aligned."""
    v = 16
    while rec % v:
        v //= 2
    return v


# Pass config of the kernels that place their own syncs. TileLang's automatic sync pass treats the
# dequantization helper (an extern call with pointer arguments) as touching all shared memory and
# put a 256-thread barrier around every 16-byte chunk the producers convert (8 per block): the
# producers then dequantized a block in ~1.8 us instead of overlapping their loads (H200
# diagnostics, 2026-12-01). Producer / consumer order comes from the mbarriers anyway.
NO_AUTO_SYNC = {"tl.disable_thread_storage_sync": True}
CONSUMER_BARRIER = 1   # named barrier of the 128 consumer threads (kernels built with explicit syncs)


def _consumer_sync(T, barrier: int = CONSUMER_BARRIER):
    return T.sync_threads(barrier, 128)


def _softmax_macros(T, hb: int, d: int, H: int, split: bool, explicit_sync: bool = False, group_rows: int = 0,
                    barrier: int = CONSUMER_BARRIER):
    """Macros shared by every variant (128 "consumer" threads ``t`` in 0..127).

    ``explicit_sync``: the kernel is compiled without TileLang's automatic shared-memory syncs
    (``NO_AUTO_SYNC``) and these macros place their own consumer barriers (named ``barrier``:
    a kernel with two consumer warpgroups gives each its own).

    ``group_rows`` > 0: the ``hb`` columns are ``group_rows`` query rows x ``HC = hb / group_rows``
    columns each (column c is row ``r + c // HC``, head ``c % HC``; heads ``>= H`` are padding)
    sharing one key list; the mask is per key and row (``vm[stage, key, row]``) and ``finish``
    writes each column to its row (not split).

    Online softmax in a column-per-thread-group layout: the 64 x hb score tile goes through
    shared memory (fp32), thread t owns head column ``t // TPC`` and tokens ``k * TPC + t % TPC``;
    the column max and sum are reduced with warp shuffles only (a column's TPC threads are
    adjacent lanes). Each thread keeps the running (max, sum) of its column in registers, so no
    cross-warp reduction is needed per block.
    """
    BI = BLOCK_TOKENS
    TPC = 128 // hb           # threads per head column
    TOK = BI // TPC           # tokens per thread
    LOGT = TPC.bit_length() - 1
    HC = hb // group_rows if group_rows else hb     # columns per row of a group
    assert not (group_rows and split) and (not group_rows or (HC * group_rows == hb and HC >= H))

    def key_mask(vm, vs, tok, col):
        # 0 where column ``col`` attends key ``tok`` of stage ``vs``, -inf where not
        return vm[vs, tok, col // HC] if group_rows else vm[vs, tok]

    def row_lse(st, scale):
        # natural-log lse of a column from its running (max, sum); -inf when nothing was attended
        return T.if_then_else(st[1] > 0, (T.log2(st[1]) + st[0] * scale) / LOG2E, -T.infinity(T.float32))

    @T.macro
    def block_softmax(t, S_sm, vm, vs, P_s, alpha_s, st, scale):
        # st: [m_run, l_run, tmp_max, tmp_sum] of column t // TPC
        st[2] = -T.infinity(T.float32)
        for k in T.serial(TOK):
            st[2] = T.max(st[2], S_sm[k * TPC + t % TPC, t // TPC] + key_mask(vm, vs, k * TPC + t % TPC, t // TPC))
        for o in T.unroll(LOGT):
            st[2] = T.max(st[2], T.shfl_xor(st[2], 1 << o))
        st[2] = T.max(st[2], st[0])                                   # new running max
        st[3] = 0.0
        for k in T.serial(TOK):
            pv = T.exp2((S_sm[k * TPC + t % TPC, t // TPC] + key_mask(vm, vs, k * TPC + t % TPC, t // TPC)) * scale
                        - st[2] * scale)
            P_s[k * TPC + t % TPC, t // TPC] = T.cast(pv, T.bfloat16)
            st[3] = st[3] + pv
        for o in T.unroll(LOGT):
            st[3] = st[3] + T.shfl_xor(st[3], 1 << o)
        if t % TPC == 0:
            alpha_s[t // TPC] = T.exp2((st[0] - st[2]) * scale)
        st[1] = st[1] * T.exp2((st[0] - st[2]) * scale) + st[3]
        st[0] = st[2]

    @T.macro
    def finish_group(t, r, st, inv_s, acc_o, Out, Lse, scale):
        # columns of rows r .. r + group_rows - 1 (rows past the end of Out are skipped)
        c = t // TPC
        if t % TPC == 0:
            inv_s[c] = T.if_then_else(st[1] > 0, 1.0 / st[1], 0.0)
            if (r + c // HC < Out.shape[0]) and (c % HC < H):
                Lse[r + c // HC, c % HC] = row_lse(st, scale)
        _consumer_sync(T, barrier)     # inv_s written above, read by every thread below
        for k, c2 in T.Parallel(d, hb):
            if (r + c2 // HC < Out.shape[0]) and (c2 % HC < H):
                Out[r + c2 // HC, c2 % HC, k] = T.cast(acc_o[k, c2] * inv_s[c2], T.bfloat16)

    @T.macro
    def finish(t, r, hg, sp, st, inv_s, acc_o, Out, Lse, Opart, Lpart, scale):
        c = t // TPC
        if t % TPC == 0:
            inv_s[c] = T.if_then_else(st[1] > 0, 1.0 / st[1], 0.0)
            if hg * hb + c < H:
                if split:
                    Lpart[sp, r, hg * hb + c] = T.if_then_else(st[1] > 0, T.log2(st[1]) + st[0] * scale,
                                                               -T.infinity(T.float32))
                else:
                    Lse[r, hg * hb + c] = row_lse(st, scale)
        if explicit_sync:
            _consumer_sync(T, barrier)  # inv_s written above, read by every thread below
        if split:
            for k, h in T.Parallel(d, hb):
                if hg * hb + h < H:
                    Opart[sp, r, hg * hb + h, k] = acc_o[k, h] * inv_s[h]
        else:
            for k, h in T.Parallel(d, hb):
                if hg * hb + h < H:
                    Out[r, hg * hb + h, k] = T.cast(acc_o[k, h] * inv_s[h], T.bfloat16)

    if group_rows:
        return block_softmax, finish_group
    return block_softmax, finish


def _consume_block_macro(T, hb: int, d: int, block_softmax, explicit_sync: bool, barrier: int = CONSUMER_BARRIER):
    """One 64-token block of the consumer warpgroup: wait for bf16 stage ``s`` (``bar_full[s]``,
    parity ``phase``), QK, the online softmax, PV, then hand the stage back (``bar_empty[s]``).
    Shared by the one-row consumer below and the row-group kernel."""

    @T.macro
    def consume_block(tx, s, phase, Q_s, Kb, vm, S_sm, P_s, alpha_s, acc_s, acc_o, st, bar_full, bar_empty, scale):
        T.barrier_wait(bar_full[s], phase)
        T.clear(acc_s)
        T.gemm(Kb[s, :, :], Q_s, acc_s, transpose_B=True)
        T.copy(acc_s, S_sm[:, 0:hb])
        if explicit_sync:
            _consumer_sync(T, barrier)  # S_sm complete; the previous block's readers passed the sync below
        block_softmax(tx, S_sm, vm, s, P_s, alpha_s, st, scale)
        if explicit_sync:
            _consumer_sync(T, barrier)  # P_s and alpha_s complete before the rescale and PV
        for k, h in T.Parallel(d, hb):
            acc_o[k, h] *= alpha_s[h]
        T.gemm(Kb[s, :, :], P_s, acc_o, transpose_A=True)
        T.barrier_arrive(bar_empty[s])

    return consume_block


def _staged_consumer_macro(T, hb: int, d: int, H: int, split: bool, explicit_sync: bool = False):
    """The consumer warpgroup of the warp-specialized variants ("ws", "bulk"): for each of the
    ``2 * nj`` blocks it waits for bf16 stage ``s`` (``bar_full[s]``), runs QK, the online softmax
    and PV over it, and hands the stage back (``bar_empty[s]``); then it writes the row's output.
    ``explicit_sync``: see ``_softmax_macros``."""
    BI = BLOCK_TOKENS
    block_softmax, finish = _softmax_macros(T, hb, d, H, split, explicit_sync)
    consume_block = _consume_block_macro(T, hb, d, block_softmax, explicit_sync)

    @T.macro
    def consume(tx, r, hg, sp, nj, Q, Q_s, Kb, vm, S_sm, P_s, alpha_s, inv_s, bar_full, bar_empty,
                Out, Lse, Opart, Lpart, scale):
        acc_s = T.alloc_fragment((BI, hb), T.float32)
        acc_o = T.alloc_fragment((d, hb), T.float32)
        st = T.alloc_local((4,), T.float32)
        for h, k in T.Parallel(hb, d):
            Q_s[h, k] = T.if_then_else(hg * hb + h < H, Q[r, T.min(hg * hb + h, H - 1), k], T.bfloat16(0))
        T.fill(acc_o, 0)
        st[0] = NEG_INIT
        st[1] = 0.0
        if explicit_sync:
            _consumer_sync(T)          # Q_s complete before the first QK
        for j in T.serial(nj):
            for s in T.unroll(2):
                consume_block(tx, s, j & 1, Q_s, Kb, vm, S_sm, P_s, alpha_s, acc_s, acc_o, st, bar_full, bar_empty,
                              scale)
        finish(tx, r, hg, sp, st, inv_s, acc_o, Out, Lse, Opart, Lpart, scale)

    return consume
