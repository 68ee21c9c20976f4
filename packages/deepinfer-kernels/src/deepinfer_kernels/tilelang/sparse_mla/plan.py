"""Which sparse MLA kernel serves a call, and its launch plan (heads per CTA, split-KV). Plain
Python over the call's sizes: no TileLang, no tensors."""

from __future__ import annotations

import math

from deepinfer_kernels.batch_invariant import batch_invariant_enabled
from deepinfer_kernels.envs import shared_key_group_rows
from deepinfer_kernels.layouts import MAX_SHARED_KEY_SLOT, max_shared_key_slot
from deepinfer_kernels.tilelang.sparse_mla.bulk_rows import MAX_PAIRS
from deepinfer_kernels.tilelang.sparse_mla.common import BLOCK_TOKENS, _record_bytes
from deepinfer_kernels.tilelang.sparse_mla.groups import group_columns
from deepinfer_kernels.tilelang.sparse_mla.quads import MAX_QUAD_BLOCKS, QUAD_HEADS, QUAD_ROWS

TRIM_MIN_ROWS = 256   # "bulk" calls with more rows (prefill) skip each row's trailing empty blocks
MMA_MAX_ROWS = TRIM_MIN_ROWS   # "auto" runs "mma" up to this many rows (decode); above, "bulk"'s row pipelines


def resolve_variant(variant: str, heads: int, d: int, rows: int = 0, sms: int = 132) -> str:
    """"auto": "mma" for decode calls of one head group at D 512 (up to 16 heads, 1 to 256 rows,
    not in batch-invariant mode: ``_mma_serves``); "bulk" for one head group of 512-multiple
    records elsewhere (1.43x "ws" over the engine's block layout, 0.94x over random slots, H200
    2026-11-30), "ws" otherwise. "mma" against "bulk" (H200, 2026-12-03, one run, 132 rows x 16
    heads, CUDA graphs, L2 flushed): 1.42x / 1.51x over KV blocks at 2,048 / 8,192 keys, 1.17x over
    random slots, 1.27x / 1.15x on the engine's decode layouts; the engine's layout at 1 / 8 rows
    (split-KV): 1.05x / 1.10x. "bulk" copies whole records, so it needs them 16-byte sized (D a
    multiple of 512); other D run "ws". "mma" takes up to 16 heads at D 512 or a multiple of 16 (a
    CTA per 16); other shapes run what "auto" picks.

    More than 16 heads: "ws" takes 32 heads per CTA, "bulk" 16 (so twice the CTAs per row, each
    reading the row's records). Where "ws"'s CTAs would fill fewer than half the SMs
    (``rows * ceil(heads / 32) < sms / 2``: decode at a few rows, where a call is a few CTAs' latency)
    "auto" runs "bulk": flash's 64 heads at batch 1 (H200, 2026-12-02, in a graph, L2 flushed) 8.6 vs
    12.0 us over the 128-key window, 12.4 vs 16.4 us over window + ratio-4 entries; `flash-slice`
    decode 736.7 vs 720.0 tokens/s. Not in batch-invariant mode, where a row's kernel must not depend
    on the row count."""
    bulk_ok = _record_bytes(d) % 16 == 0
    if variant == "auto" and _mma_serves(heads, d, rows):
        return "mma"
    if variant == "mma":
        heads_ok = heads <= 16 or heads % 16 == 0
        return variant if heads_ok and d == 512 else resolve_variant("auto", heads, d, rows, sms)
    if variant == "bulk" and not bulk_ok:
        return "ws"
    if variant != "auto":
        return variant
    if not bulk_ok:
        return "ws"
    if heads <= 16:
        return "bulk"
    ws_ctas = rows * math.ceil(heads / _heads_per_cta(heads, "ws"))
    return "bulk" if rows > 0 and _leaves_most_sms_idle(ws_ctas, sms) and not batch_invariant_enabled() else "ws"


def _mma_serves(heads: int, d: int, rows: int) -> bool:
    """"auto" runs the warp-MMA kernel for decode calls: up to 16 heads of 512-wide latents (the
    `mini` shape), 1 to ``MMA_MAX_ROWS`` rows, not in batch-invariant mode (there a row's kernel must
    not depend on the row count: "bulk" everywhere). Above those rows "bulk" runs a pipeline over
    several rows per CTA and the shared-key kernels."""
    return heads <= 16 and d == 512 and 0 < rows <= MMA_MAX_ROWS and not batch_invariant_enabled()


def _heads_per_cta(heads: int, variant: str = "ws") -> int:
    # "bulk" holds two fp8 stages beside the bf16 ones: 32 heads' Q tile would not fit in 227 KB
    return 16 if heads <= 16 or variant in ("bulk", "mma") else 32


def _uses_groups_kernel(variant: str, rows: int, heads: int, width: int, num_splits: int, slots: int,
                        shared_keys: bool) -> bool:
    """Row pairs share key lists: asked for by the caller (rows 2i, 2i + 1 attend nearly the same
    keys), at the rows kernel's sizes, up to 16 heads, pool slots taggable, and not in
    batch-invariant mode (a row's key blocks would depend on its neighbour)."""
    return (shared_keys and _uses_rows_kernel(variant, rows, width, num_splits)
            and group_columns(heads) in (16, 32) and slots <= MAX_SHARED_KEY_SLOT
            and not batch_invariant_enabled())


def _uses_quads_kernel(variant: str, rows: int, heads: int, width: int, num_splits: int, slots: int,
                       shared_keys: bool) -> bool:
    """Quads instead of pairs: asked for (``shared_key_group_rows() == 4``), exactly 16 heads (the
    4 rows fill M = 64), the quad's list within the kernel's blocks, pool slots taggable in 27 bits."""
    return (_uses_groups_kernel(variant, rows, heads, width, num_splits, slots, shared_keys)
            and heads == QUAD_HEADS and QUAD_ROWS * width <= MAX_QUAD_BLOCKS * BLOCK_TOKENS
            and slots <= max_shared_key_slot(QUAD_ROWS) and shared_key_group_rows() == QUAD_ROWS)


def _uses_rows_kernel(variant: str, rows: int, width: int, num_splits: int) -> bool:
    return _trims(variant, rows) and num_splits == 1 and width <= 2 * BLOCK_TOKENS * MAX_PAIRS


def _trims(variant: str, rows: int) -> bool:
    return variant == "bulk" and rows > TRIM_MIN_ROWS


def _leaves_most_sms_idle(ctas: int, sms: int) -> bool:
    """A grid of ``ctas`` one-row CTAs fills fewer than half the SMs: a call is then a few CTAs'
    latency (the split-KV heuristic and the choice of "bulk" at many heads both ask this)."""
    return ctas < sms // 2


def choose_num_splits(rows: int, head_groups: int, width: int, sms: int) -> int:
    """Split the index list only when (rows x head groups) CTAs would leave most SMs idle."""
    ctas = rows * head_groups
    blocks = math.ceil(width / BLOCK_TOKENS)
    if not _leaves_most_sms_idle(ctas, sms) or blocks < 4:
        return 1
    want = math.ceil(sms / max(ctas, 1))
    return max(1, min(want, blocks // 2))


def plan(rows: int, heads: int, d: int, width: int, sms: int, num_splits: int | None = None,
         variant: str = "ws") -> dict:
    """Launch plan of one call: heads per CTA, number of splits, blocks per split."""
    hb = _heads_per_cta(heads, variant)
    hgroups = math.ceil(heads / hb)
    blocks = math.ceil(width / BLOCK_TOKENS)
    ns = num_splits if num_splits is not None else choose_num_splits(rows, hgroups, width, sms)
    ns = max(1, min(ns, blocks))
    bps = math.ceil(blocks / ns)
    bps += bps % 2                                   # the ws and bulk loops handle blocks in pairs
    ns = math.ceil(blocks / bps)
    return {"hb": hb, "num_splits": ns, "bps": bps}
