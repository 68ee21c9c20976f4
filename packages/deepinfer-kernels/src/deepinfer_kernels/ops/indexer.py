"""Lightning indexer: score compressed entries, reduce to block scores, select top-k blocks.

1. `indexer_scores`: for each query row and candidate entry j (an index into a paged FP4
   indexer-key pool, `-1` = no entry), `score_j = sum_h w_h * relu(q_h . k_j)`; `-inf` where empty.
   No softmax: only the order matters.
2. `candidate_block_max`: entries are grouped in blocks of `block_size` along the candidate axis;
   only the first `valid_lens[r]` entries of row r are valid. Block score = max valid score,
   clamped to the largest finite bf16 (3.3895e38); the last valid block gets `+inf` so it is
   always selected; blocks past the last valid one are `-inf`.
3. `select_topk_blocks`: the `topk` highest valid blocks per row, sorted by score (descending),
   ties broken by the lower block index; `-1` padded when a row has fewer valid blocks.
4. `indexer_topk_blocks`: the three in one call (on SM90 one fused TileLang kernel for the scores
   and block maxima, which never writes the per-entry scores, and one for the top-k).
"""

from __future__ import annotations

import torch

from deepinfer_kernels.ops._checks import (
    FLOAT_DTYPES,
    INDEX_DTYPES,
    check_dim,
    check_same_device,
    check_tensor,
)
from deepinfer_kernels.ops.capture import host_checks
from deepinfer_kernels.ops.kv_fp4 import dequantize_index_k_fp4_ref, fp4_record_bytes
from deepinfer_kernels.platform import tilelang_launcher
from deepinfer_kernels.tilelang.indexer import (  # constants only (no TileLang import)
    MAX_SORT,
    TILE,
    TILES_PER_CTA,
)
from deepinfer_kernels.tilelang.torch_ops import register_cpu_reference

BF16_MAX = torch.finfo(torch.bfloat16).max
FUSED_CANDIDATES = TILE * TILES_PER_CTA   # candidates per CTA of the fused kernel: its block size divides it


def indexer_scores_ref(q: torch.Tensor, weights: torch.Tensor, k_pool: torch.Tensor,
                       indices: torch.Tensor) -> torch.Tensor:
    """q [rows, heads, Di], weights [rows, heads], k_pool uint8 [slots, Di/2 + Di/32],
    indices [rows, n] (-1 = empty) -> float32 [rows, n]."""
    rows, _, di = q.shape
    n = indices.shape[1]
    valid = indices >= 0
    flat = indices.clamp(min=0).long().reshape(-1)
    k = dequantize_index_k_fp4_ref(k_pool[flat], di).reshape(rows, n, di)           # [rows, n, Di]
    s = torch.einsum("rhd,rnd->rhn", q.float(), k).relu()                            # [rows, heads, n]
    out = torch.einsum("rhn,rh->rn", s, weights.float())
    return out.masked_fill(~valid, float("-inf"))


@register_cpu_reference("indexer_scores")
def _(q, weights, k_pool, indices):
    return indexer_scores_ref(q, weights, k_pool, indices).contiguous()


def candidate_block_max_ref(logits: torch.Tensor, valid_lens: torch.Tensor,
                            block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [rows, n] float, valid_lens [rows] -> (block_scores float32 [rows, ceil(n/B)],
    num_valid_blocks int32 [rows])."""
    rows, n = logits.shape
    nb = (n + block_size - 1) // block_size
    col = torch.arange(nb * block_size, device=logits.device)
    padded = torch.full((rows, nb * block_size), float("-inf"), device=logits.device)
    padded[:, :n] = logits.float()
    padded = padded.masked_fill(col.unsqueeze(0) >= valid_lens.long().unsqueeze(1), float("-inf"))
    scores = padded.reshape(rows, nb, block_size).amax(-1).clamp(max=BF16_MAX)
    num_valid = (valid_lens.long() + block_size - 1) // block_size                  # [rows]
    bidx = torch.arange(nb, device=logits.device).unsqueeze(0)
    scores = scores.masked_fill(bidx >= num_valid.unsqueeze(1), float("-inf"))
    scores = torch.where(bidx == (num_valid - 1).unsqueeze(1), float("inf"), scores)
    return scores, num_valid.to(torch.int32)


def select_topk_blocks_ref(block_scores: torch.Tensor, num_valid_blocks: torch.Tensor,
                           topk: int) -> torch.Tensor:
    """block_scores [rows, nb], num_valid_blocks [rows] -> block ids int32 [rows, topk], -1 padded."""
    rows, nb = block_scores.shape
    # Stable descending sort: equal scores keep ascending block order (lower index wins).
    order = torch.sort(block_scores, dim=1, descending=True, stable=True).indices   # [rows, nb]
    k = min(topk, nb)
    chosen = order[:, :k]
    keep = torch.arange(k, device=block_scores.device).unsqueeze(0) < num_valid_blocks.long().unsqueeze(1)
    out = torch.full((rows, topk), -1, dtype=torch.int32, device=block_scores.device)
    out[:, :k] = torch.where(keep, chosen, -1).to(torch.int32)
    return out


def indexer_topk_blocks_ref(q: torch.Tensor, weights: torch.Tensor, k_pool: torch.Tensor, indices: torch.Tensor,
                           valid_lens: torch.Tensor, block_size: int, topk: int,
                           weight_scale: float = 1.0) -> torch.Tensor:
    """The three references chained, with head weights `weights.float() * weight_scale`
    -> block ids int32 [rows, topk], -1 padded."""
    scores = indexer_scores_ref(q, weights.float() * weight_scale, k_pool, indices)
    return select_topk_blocks_ref(*candidate_block_max_ref(scores, valid_lens, block_size), topk)


@register_cpu_reference("indexer_topk_blocks")
def _(q, weights, k_pool, indices, valid_lens, block_size, topk, weight_scale=1.0):
    return indexer_topk_blocks_ref(q, weights, k_pool, indices, valid_lens, block_size, topk,
                                   weight_scale).contiguous()


# ---------------------------------------------------------------- public wrappers


def indexer_scores(q: torch.Tensor, weights: torch.Tensor, k_pool: torch.Tensor,
                   indices: torch.Tensor) -> torch.Tensor:
    """q [rows, heads, Di], weights [rows, heads], k_pool uint8 [slots, Di/2+Di/32],
    indices int32 [rows, n] -> float32 [rows, n] (-inf where indices == -1)."""
    check_tensor("q", q, 3, FLOAT_DTYPES)
    check_tensor("weights", weights, 2, FLOAT_DTYPES)
    check_tensor("k_pool", k_pool, 2, (torch.uint8,))
    check_tensor("indices", indices, 2, INDEX_DTYPES)
    check_dim("weights", weights, 0, q.shape[0])
    check_dim("weights", weights, 1, q.shape[1])
    check_dim("k_pool", k_pool, 1, fp4_record_bytes(q.shape[2]))
    check_dim("indices", indices, 0, q.shape[0])
    device = check_same_device(q=q, weights=weights, k_pool=k_pool, indices=indices)
    kernel = tilelang_launcher("indexer_scores", device, supported=q.dtype == torch.bfloat16)
    if kernel is not None:
        return kernel(q, weights, k_pool, indices)
    return indexer_scores_ref(q, weights, k_pool, indices)


def candidate_block_max(logits: torch.Tensor, valid_lens: torch.Tensor,
                        block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [rows, n], valid_lens int [rows] (<= n) -> (block scores float32 [rows, ceil(n/B)],
    num_valid_blocks int32 [rows])."""
    check_tensor("logits", logits, 2, FLOAT_DTYPES)
    check_tensor("valid_lens", valid_lens, 1, INDEX_DTYPES)
    check_dim("valid_lens", valid_lens, 0, logits.shape[0])
    if block_size <= 0:
        raise ValueError(f"block_size={block_size}: must be > 0")
    if host_checks(valid_lens) and valid_lens.numel() and (int(valid_lens.max()) > logits.shape[1]
                                                           or int(valid_lens.min()) < 0):
        raise ValueError(f"valid_lens: must lie in [0, {logits.shape[1]}]")
    device = check_same_device(logits=logits, valid_lens=valid_lens)
    kernel = tilelang_launcher("candidate_block_max", device)
    if kernel is not None:
        return kernel(logits, valid_lens, block_size)
    return candidate_block_max_ref(logits, valid_lens, block_size)


def select_topk_blocks(block_scores: torch.Tensor, num_valid_blocks: torch.Tensor, topk: int) -> torch.Tensor:
    """block_scores float32 [rows, nb], num_valid_blocks [rows] -> int32 [rows, topk] (-1 padded)."""
    check_tensor("block_scores", block_scores, 2, (torch.float32,))
    check_tensor("num_valid_blocks", num_valid_blocks, 1, INDEX_DTYPES)
    check_dim("num_valid_blocks", num_valid_blocks, 0, block_scores.shape[0])
    if topk <= 0:
        raise ValueError(f"topk={topk}: must be > 0")
    device = check_same_device(block_scores=block_scores, num_valid_blocks=num_valid_blocks)
    kernel = tilelang_launcher("select_topk_blocks", device, supported=block_scores.shape[1] <= MAX_SORT)
    if kernel is not None:
        return kernel(block_scores, num_valid_blocks, topk)
    return select_topk_blocks_ref(block_scores, num_valid_blocks, topk)


def indexer_topk_blocks(q: torch.Tensor, weights: torch.Tensor, k_pool: torch.Tensor, indices: torch.Tensor,
                        valid_lens: torch.Tensor, block_size: int, topk: int, weight_scale: float = 1.0) -> torch.Tensor:
    """`select_topk_blocks(*candidate_block_max(indexer_scores(q, weights.float() * weight_scale, k_pool,
    indices), valid_lens, block_size), topk)`: q [rows, heads, Di], weights [rows, heads] (any float
    dtype; a column slice is read in place by the kernel), k_pool uint8 [slots, Di/2+Di/32], indices
    int32 [rows, n], valid_lens [rows] -> block ids int32 [rows, topk] (-1 padded). The kernel
    scales the weights as it loads them (the same float32 product as torch's).

    On SM90 with a bf16 q and a block size dividing 64: the fused TileLang kernels. Its scores
    round like `indexer_scores`' kernel (fp32 sums in another order than the reference), so a
    near-tie between two blocks may resolve the other way; everything else runs the chain above."""
    check_tensor("q", q, 3, FLOAT_DTYPES)
    check_tensor("indices", indices, 2, INDEX_DTYPES)
    check_tensor("valid_lens", valid_lens, 1, INDEX_DTYPES)
    check_dim("valid_lens", valid_lens, 0, q.shape[0])
    if block_size <= 0 or topk <= 0:
        raise ValueError(f"block_size={block_size}, topk={topk}: both must be > 0")
    device = check_same_device(q=q, weights=weights, k_pool=k_pool, indices=indices, valid_lens=valid_lens)
    nb = (indices.shape[1] + block_size - 1) // block_size
    kernel = tilelang_launcher("indexer_topk_blocks", device,
                               supported=q.dtype == torch.bfloat16 and FUSED_CANDIDATES % block_size == 0
                               and nb <= MAX_SORT)
    if kernel is not None:
        check_tensor("weights", weights, 2, FLOAT_DTYPES)
        check_tensor("k_pool", k_pool, 2, (torch.uint8,))
        check_dim("k_pool", k_pool, 1, fp4_record_bytes(q.shape[2]))
        return kernel(q, weights, k_pool, indices, valid_lens, block_size, topk, weight_scale)
    scores = indexer_scores(q, weights.float() * weight_scale, k_pool, indices)
    return select_topk_blocks(*candidate_block_max(scores, valid_lens, block_size), topk)
