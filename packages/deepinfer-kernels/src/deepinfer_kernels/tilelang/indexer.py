"""Lightning indexer: scores over paged FP4 keys, block maxima, top-k blocks (TileLang, SM90).

Same functions as ``deepinfer_kernels.ops.indexer``:

* ``indexer_scores_tilelang(q, weights, k_pool, indices)``: ``score[r, j] = sum_h w[r, h] *
  relu(q[r, h] . k[indices[r, j]])``, ``-inf`` where ``indices[r, j] < 0``.
* ``candidate_block_max_tilelang(logits, valid_lens, block_size)``: block max of the first
  ``valid_lens[r]`` entries, clamped to the largest finite bf16, last valid block ``+inf``,
  blocks past it ``-inf``; also returns ``num_valid_blocks``.
* ``select_topk_blocks_tilelang(block_scores, num_valid_blocks, topk)``: the ``topk`` best
  blocks, descending, ties to the lower block index, ``-1`` padded.
* ``indexer_topk_blocks_tilelang(q, weights, k_pool, indices, valid_lens, block_size, topk)``:
  the three fused into two kernels; the per-entry scores never reach global memory.

Scores kernel: one CTA per (row, chunk of candidates). Each 64-candidate tile is gathered with
plain loads (the 68-byte FP4 records are only 4-byte aligned), dequantized exactly to bf16
(``_cuda.FP4_DEQUANT_SRC``) into shared memory, and multiplied with the row's queries by one
wgmma ``m64 n{heads} k16`` chain (candidates are M, so 8 indexer heads need no padding to 64).
relu, the head weights and the head sum run on the fp32 accumulator. Queries are used in bf16
(the reference multiplies in fp32: bf16 queries are exact when the model's are bf16).

Top-k kernel: one CTA per row sorts (score, block) keys -- the fp32 score mapped to an
order-preserving uint32 in the high half, ``~block`` in the low half -- with a shared-memory
bitonic sort and keeps the first ``topk``; keys are unique, so the order equals the reference's
stable descending sort.
"""

import math

import torch

from deepinfer_kernels.tilelang._common import PDL, compile_cached, pdl_sync, require, require_cuda
from deepinfer_kernels.tilelang._cuda import FP4_DEQUANT_SRC

# No `from __future__ import annotations` (TileLang evaluates prim_func annotations).

BF16_MAX = float(torch.finfo(torch.bfloat16).max)
TILE = 64              # candidates per wgmma tile
NT = 128
TILES_PER_CTA = 1      # candidates per CTA = 64: a decode row's few hundred candidates spread over
                       # CTAs (8 tiles per CTA ran them serially: ~12 us of a ~20 us call at batch 1)
MAX_SORT = 16384       # largest number of blocks the top-k kernel sorts
_W_DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def _fp4_record_bytes(di: int) -> int:
    return di // 2 + di // 32


def _padded_heads(h: int) -> int:
    return max(8, (h + 7) // 8 * 8)


# ----------------------------------------------------------------------------- scores kernel


def _block_dims(T):
    """Rows R and blocks NB of the block scores ([R, NB], with NValid [R]): the scores and block-max
    kernels write them, the top-k kernel reads them."""
    return T.dynamic("R"), T.dynamic("NB")


def _build_scores(heads: int, di: int, mode: str, block_size: int, vlen_dtype: str = "int32",
                  w_dtype: str = "float32"):
    """mode "scores": write per-entry scores [R, N]; mode "blocks": write block scores [R, NB]
    (candidate_block_max rules with valid_lens, of dtype ``vlen_dtype``) and the valid block
    counts [R], for block sizes that divide TILE * TILES_PER_CTA. Head weights: ``w_dtype`` rows
    with their own stride (a slice of the fused input GEMM), times the scalar ``wscale``."""
    import tilelang.language as T

    H = heads
    HP = _padded_heads(heads)
    REC = _fp4_record_bytes(di)
    WPC = di // 8                       # 4-byte words (8 codes) per candidate
    TPC = NT // TILE                    # threads per candidate = 2
    WPT = WPC // TPC                    # words per thread
    WV = 4 if REC % 4 == 0 else 1       # load vector width (bytes)
    CHUNK = TILE * TILES_PER_CTA
    BS = block_size
    assert di % 32 == 0 and WPC % TPC == 0
    assert mode == "scores" or CHUNK % BS == 0

    R, NB = _block_dims(T)
    N = T.dynamic("N")
    S = T.dynamic("S")
    NSC = T.dynamic("NSC")              # Scores columns (N in "scores" mode, else a 1-wide dummy)
    SW = T.dynamic("SW")                # row stride of the head weights

    @T.prim_func
    def main(
        Q: T.Tensor((R, H, di), T.bfloat16),
        Wt: T.StridedTensor((R, H), (SW, 1), w_dtype),
        Pool: T.Tensor((S, REC), T.uint8),
        Idx: T.Tensor((R, N), T.int32),
        VLen: T.Tensor((R,), vlen_dtype),
        Scores: T.Tensor((R, NSC), T.float32),
        Blocks: T.Tensor((R, NB), T.float32),
        NValid: T.Tensor((R,), T.int32),
        wscale: T.float32,
    ):
        with T.Kernel(R, T.ceildiv(N, CHUNK), threads=NT) as (r, cb):
            if PDL:   # wait for the previous kernel before touching memory (_common.PDL)
                T.evaluate(pdl_sync())
            T.import_source(FP4_DEQUANT_SRC)
            Q_s = T.alloc_shared((HP, di), T.bfloat16)
            Kb = T.alloc_shared((TILE, di), T.bfloat16)
            w_s = T.alloc_shared((HP,), T.float32)
            sc_s = T.alloc_shared((CHUNK,), T.float32)
            acc = T.alloc_fragment((TILE, HP), T.float32)
            sc = T.alloc_fragment((TILE,), T.float32)
            cw = T.alloc_local((WPT * 4,), T.uint8)
            sv = T.alloc_local((WPT,), T.uint8)
            bv = T.alloc_local((8,), T.bfloat16)
            mx = T.alloc_var(T.float32)
            tx = T.get_thread_binding()
            for h, k in T.Parallel(HP, di):
                Q_s[h, k] = T.if_then_else(h < H, Q[r, T.min(h, H - 1), k], T.bfloat16(0))
            for h in T.Parallel(HP):
                w_s[h] = T.if_then_else(h < H, T.cast(Wt[r, T.min(h, H - 1)], T.float32) * wscale, 0.0)
            for t in T.serial(TILES_PER_CTA):
                c0 = cb * CHUNK + t * TILE
                cand = tx // TPC
                col = c0 + cand
                idx = T.if_then_else(col < N, Idx[r, T.min(col, N - 1)], -1)
                w0 = (tx % TPC) * WPT
                if idx >= 0:
                    for u in T.unroll(WPT * 4 // WV):
                        for v in T.vectorized(WV):
                            cw[u * WV + v] = Pool[idx, w0 * 4 + u * WV + v]
                    for u in T.unroll(WPT):
                        sv[u] = Pool[idx, di // 2 + (w0 + u) // 4]
                for u in T.unroll(WPT):
                    if idx >= 0:
                        T.call_extern("handle", "di_dequant_fp4x8", T.access_ptr(cw[u * 4], "r"),
                                      T.access_ptr(bv, "w"), sv[u])
                    else:
                        for v in T.vectorized(8):
                            bv[v] = T.bfloat16(0)
                    for v in T.vectorized(8):
                        Kb[cand, (w0 + u) * 8 + v] = bv[v]
                T.clear(acc)
                T.gemm(Kb, Q_s, acc, transpose_B=True)
                for i, h in T.Parallel(TILE, HP):
                    acc[i, h] = T.max(acc[i, h], 0.0) * w_s[h]
                T.reduce_sum(acc, sc, dim=1)
                for i in T.Parallel(TILE):
                    sc_s[t * TILE + i] = T.if_then_else(
                        (c0 + i < N) & (Idx[r, T.min(c0 + i, N - 1)] >= 0), sc[i], -T.infinity(T.float32))
            if mode == "scores":
                for i in T.Parallel(CHUNK):
                    if (cb * CHUNK + i < N) and (cb * CHUNK + i < NSC):
                        Scores[r, cb * CHUNK + i] = sc_s[i]
            else:
                # candidate_block_max rules on this chunk's blocks
                vlen = T.cast(VLen[r], T.int32)
                nvb = (vlen + BS - 1) // BS
                if (cb == 0) and (tx == 0):
                    NValid[r] = nvb
                for b in T.serial((CHUNK // BS + NT - 1) // NT):
                    lb = b * NT + tx
                    gb = (cb * CHUNK) // BS + lb
                    if (lb < CHUNK // BS) and (gb < NB):
                        mx = -T.infinity(T.float32)
                        for e in T.serial(BS):
                            if gb * BS + e < vlen:
                                mx = T.max(mx, sc_s[lb * BS + e])
                        mx = T.min(mx, BF16_MAX)
                        if gb >= nvb:
                            mx = -T.infinity(T.float32)
                        if gb == nvb - 1:
                            mx = T.infinity(T.float32)
                        Blocks[r, gb] = mx

    return main


def _build_block_max(block_size: int):
    """candidate_block_max from logits: one thread per block."""
    import tilelang.language as T

    BS = block_size
    R, NB = _block_dims(T)
    N = T.dynamic("N")

    @T.prim_func
    def main(
        Logits: T.Tensor((R, N), T.float32),
        VLen: T.Tensor((R,), T.int32),
        Blocks: T.Tensor((R, NB), T.float32),
        NValid: T.Tensor((R,), T.int32),
    ):
        with T.Kernel(R, T.ceildiv(NB, NT), threads=NT) as (r, bb):
            if PDL:   # wait for the previous kernel before touching memory (_common.PDL)
                T.evaluate(pdl_sync())
            tx = T.get_thread_binding()
            mx = T.alloc_var(T.float32)
            vlen = VLen[r]
            nvb = (vlen + BS - 1) // BS
            gb = bb * NT + tx
            if gb < NB:
                mx = -T.infinity(T.float32)
                for e in T.serial(BS):
                    if (gb * BS + e < vlen) and (gb * BS + e < N):
                        mx = T.max(mx, Logits[r, gb * BS + e])
                mx = T.min(mx, BF16_MAX)
                if gb >= nvb:
                    mx = -T.infinity(T.float32)
                if gb == nvb - 1:
                    mx = T.infinity(T.float32)
                Blocks[r, gb] = mx
            if (bb == 0) and (tx == 0):
                NValid[r] = nvb

    return main


def _build_topk(p2: int, topk: int):
    """Bitonic sort of p2 (power of two >= number of blocks) uint64 keys per row."""
    import tilelang.language as T

    LOG = p2.bit_length() - 1
    NTS = min(256, max(32, p2 // 2))
    PAIRS = p2 // 2
    PPT = (PAIRS + NTS - 1) // NTS
    R, NB = _block_dims(T)

    @T.prim_func
    def main(
        Scores: T.Tensor((R, NB), T.float32),
        NValid: T.Tensor((R,), T.int32),
        Out: T.Tensor((R, topk), T.int32),
    ):
        with T.Kernel(R, threads=NTS) as r:
            if PDL:   # wait for the previous kernel before touching memory (_common.PDL)
                T.evaluate(pdl_sync())
            keys = T.alloc_shared((p2,), T.uint64)
            a = T.alloc_var(T.uint64)
            b = T.alloc_var(T.uint64)
            tx = T.get_thread_binding()
            for i in T.serial((p2 + NTS - 1) // NTS):
                e = i * NTS + tx
                if e < p2:
                    raw = T.reinterpret(Scores[r, T.min(e, NB - 1)], T.uint32)
                    bits = T.if_then_else(raw == T.uint32(0x80000000), T.uint32(0), raw)   # -0.0 ties +0.0
                    okey = T.if_then_else(bits >= T.uint32(0x80000000), ~bits, bits | T.uint32(0x80000000))
                    keys[e] = T.if_then_else(
                        e < NB, (T.cast(okey, T.uint64) << T.uint64(32)) | T.cast(T.uint32(0xFFFFFFFF) - T.cast(e, T.uint32), T.uint64),
                        T.uint64(0))
            for kk in T.serial(LOG):
                for jj in T.serial(kk + 1):
                    # pair p of stage (kk, jj) compares lo and lo + 2^s: int32 shifts and masks (the
                    # `//` and `%` by a loop-variant stride lowered to int64 divisions, ~3x the sort)
                    s = kk - jj
                    for i in T.serial(PPT):
                        p = i * NTS + tx
                        if p < PAIRS:
                            lo = ((p >> s) << (s + 1)) | (p & ((1 << s) - 1))
                            a = keys[lo]
                            b = keys[lo + (1 << s)]
                            # descending within blocks whose (lo & size) == 0, size = 2^(kk + 1)
                            if ((a < b) & ((lo & (2 << kk)) == 0)) | ((a > b) & ((lo & (2 << kk)) != 0)):
                                keys[lo] = b
                                keys[lo + (1 << s)] = a
            for i in T.serial((topk + NTS - 1) // NTS):
                k = i * NTS + tx
                if k < topk:
                    Out[r, k] = T.if_then_else(
                        (k < NValid[r]) & (k < NB),
                        T.cast(T.uint32(0xFFFFFFFF) - T.cast(keys[T.min(k, p2 - 1)] & T.uint64(0xFFFFFFFF), T.uint32),
                               T.int32),
                        -1)

    return main


# ----------------------------------------------------------------------------- launchers


def _scores_kernel(heads, di, mode, block_size, vlen_dtype="int32", w_dtype="float32"):
    return compile_cached("indexer_scores", (heads, di, mode, block_size, vlen_dtype, w_dtype, TILES_PER_CTA),
                          lambda: _build_scores(heads, di, mode, block_size, vlen_dtype, w_dtype))


def _block_max_kernel(block_size: int):
    return compile_cached("indexer_block_max", (block_size,), lambda: _build_block_max(block_size))


def _topk_kernel(nb: int, topk: int):
    p2 = max(2, 1 << max(0, (nb - 1).bit_length()))
    require(p2 <= MAX_SORT, f"select_topk_blocks: {nb} blocks > {MAX_SORT} supported by the TileLang kernel")
    return compile_cached("indexer_topk", (p2, topk), lambda: _build_topk(p2, topk))


def _check_scores_args(q, weights, k_pool, indices):
    require(q.dim() == 3, f"q: expected [rows, heads, Di], got {tuple(q.shape)}")
    rows, heads, di = q.shape
    require(di % 32 == 0 and di >= 32, f"q: Di={di} must be a multiple of 32")
    rec = _fp4_record_bytes(di)
    require(weights.shape == (rows, heads), f"weights: expected [{rows}, {heads}], got {tuple(weights.shape)}")
    require(k_pool.dim() == 2 and k_pool.dtype == torch.uint8 and k_pool.shape[1] == rec and k_pool.stride() == (rec, 1),
            f"k_pool: expected contiguous uint8 [slots, {rec}], got {k_pool.dtype} {tuple(k_pool.shape)}")
    require(indices.dim() == 2 and indices.shape[0] == rows and indices.dtype in (torch.int32, torch.int64),
            f"indices: expected int [{rows}, n], got {indices.dtype} {tuple(indices.shape)}")
    device = require_cuda(q=q, weights=weights, k_pool=k_pool, indices=indices)
    require(k_pool.data_ptr() % 4 == 0, "k_pool: base must be 4-byte aligned")
    return rows, heads, di, device


def indexer_scores_tilelang(q: torch.Tensor, weights: torch.Tensor, k_pool: torch.Tensor,
                            indices: torch.Tensor) -> torch.Tensor:
    """q [rows, heads, Di] (bf16; other float dtypes are rounded to bf16), weights [rows, heads],
    k_pool uint8 [slots, Di/2 + Di/32], indices [rows, n] -> float32 [rows, n] (-inf where -1)."""
    rows, heads, di, device = _check_scores_args(q, weights, k_pool, indices)
    n = indices.shape[1]
    out = torch.empty(rows, n, dtype=torch.float32, device=device)
    if rows == 0 or n == 0:
        return out
    dummy_b = torch.empty(rows, 1, dtype=torch.float32, device=device)
    vlen = torch.zeros(rows, dtype=torch.int32, device=device)
    _scores_kernel(heads, di, "scores", 1)(
        q.to(torch.bfloat16).contiguous(), weights.float().contiguous(), k_pool,
        indices.to(torch.int32).contiguous(), vlen, out, dummy_b, vlen, 1.0)
    return out


def candidate_block_max_tilelang(logits: torch.Tensor, valid_lens: torch.Tensor,
                                 block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [rows, n], valid_lens [rows] -> (block scores float32 [rows, ceil(n/B)], num_valid int32 [rows])."""
    require(logits.dim() == 2 and valid_lens.dim() == 1 and valid_lens.shape[0] == logits.shape[0],
            "logits [rows, n] and valid_lens [rows] expected")
    require(block_size > 0, f"block_size={block_size}: must be > 0")
    device = require_cuda(logits=logits, valid_lens=valid_lens)
    rows, n = logits.shape
    nb = (n + block_size - 1) // block_size
    blocks = torch.empty(rows, nb, dtype=torch.float32, device=device)
    nvalid = torch.empty(rows, dtype=torch.int32, device=device)
    if rows == 0:
        return blocks, nvalid
    if nb == 0:
        nvalid.copy_((valid_lens.long() + block_size - 1) // block_size)
        return blocks, nvalid
    _block_max_kernel(block_size)(logits.float().contiguous(), valid_lens.to(torch.int32).contiguous(), blocks, nvalid)
    return blocks, nvalid


def select_topk_blocks_tilelang(block_scores: torch.Tensor, num_valid_blocks: torch.Tensor,
                                topk: int) -> torch.Tensor:
    """block_scores float32 [rows, nb], num_valid_blocks [rows] -> int32 [rows, topk] (-1 padded)."""
    require(block_scores.dim() == 2 and block_scores.dtype == torch.float32, "block_scores: float32 [rows, nb]")
    require(topk > 0, f"topk={topk}: must be > 0")
    device = require_cuda(block_scores=block_scores, num_valid_blocks=num_valid_blocks)
    rows, nb = block_scores.shape
    out = torch.full((rows, topk), -1, dtype=torch.int32, device=device)
    if rows == 0 or nb == 0:
        return out
    _topk_kernel(nb, topk)(block_scores.contiguous(), num_valid_blocks.to(torch.int32).contiguous(), out)
    return out


def indexer_topk_blocks_tilelang(q: torch.Tensor, weights: torch.Tensor, k_pool: torch.Tensor,
                                 indices: torch.Tensor, valid_lens: torch.Tensor, block_size: int,
                                 topk: int, weight_scale: float = 1.0) -> torch.Tensor:
    """Fused ``select_topk_blocks(*candidate_block_max(indexer_scores(q, weights.float() * weight_scale,
    k_pool, indices), valid_lens, block_size), topk)`` -> int32 [rows, topk]. ``block_size`` must
    divide 64; weights bf16 / fp16 / fp32 with rows contiguous (any row stride)."""
    rows, heads, di, device = _check_scores_args(q, weights, k_pool, indices)
    require(block_size > 0 and (TILE * TILES_PER_CTA) % block_size == 0,
            f"block_size={block_size}: the fused kernel needs a divisor of {TILE * TILES_PER_CTA}")
    require(topk > 0, f"topk={topk}: must be > 0")
    require(valid_lens.dim() == 1 and valid_lens.shape[0] == rows, f"valid_lens: expected [{rows}]")
    n = indices.shape[1]
    nb = (n + block_size - 1) // block_size
    if rows == 0 or nb == 0:
        return torch.full((rows, topk), -1, dtype=torch.int32, device=device)
    out = torch.empty(rows, topk, dtype=torch.int32, device=device)     # the top-k kernel writes every entry
    # valid_lens as it comes (int32 or int64, the engine's counts): no conversion kernel
    vlen = valid_lens.contiguous() if valid_lens.dtype in (torch.int32, torch.int64) else valid_lens.to(torch.int32)
    blocks = torch.empty(rows, nb, dtype=torch.float32, device=device)
    nvalid = torch.empty(rows, dtype=torch.int32, device=device)
    dummy_s = torch.empty(rows, 1, dtype=torch.float32, device=device)
    w = weights if weights.dtype in _W_DTYPES and weights.stride(1) == 1 else weights.float().contiguous()
    _scores_kernel(heads, di, "blocks", block_size, str(vlen.dtype).removeprefix("torch."), _W_DTYPES[w.dtype])(
        q.to(torch.bfloat16).contiguous(), w, k_pool, indices.to(torch.int32).contiguous(), vlen, dummy_s, blocks,
        nvalid, float(weight_scale))
    _topk_kernel(nb, topk)(blocks, nvalid, out)
    return out


def num_blocks(n: int, block_size: int) -> int:
    return math.ceil(n / block_size)
