"""Sparse MLA attention over the paged FP8 KV pool (TileLang, SM90).

Same function as ``deepinfer_kernels.ops.sparse_mla.sparse_mla_attention_ref``: for query row r,
head h, over the pool slots ``indices[r, :]`` (``-1`` = empty), key = value = the dequantized
528-byte record (one shared KV head)::

    s_j = sm_scale * q[r, h] . kv_j      out = softmax(s) @ kv      lse = logsumexp(s)

rows with no valid index give ``out = 0`` and ``lse = -inf``.

The kernels themselves (layout, variants, dequantization) are built in
``sparse_mla_builders.py``; this module picks a variant and a split count, compiles once per
shape bucket and launches.
"""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations at
# decoration time against the builder locals.

import math

import torch

from deepinfer_kernels.batch_invariant import batch_invariant_enabled
from deepinfer_kernels.ops.shared_keys import MAX_SHARED_KEY_SLOT, max_shared_key_slot
from deepinfer_kernels.ops.sparse_mla import KERNEL_VARIANTS, shared_key_group_rows
from deepinfer_kernels.tilelang._common import compile_cached, num_sms, require, require_cuda
from deepinfer_kernels.tilelang.shared_keys import get_kernel as get_shared_keys_kernel  # noqa: F401  (precompile)
from deepinfer_kernels.tilelang.shared_keys import shared_key_lists_tilelang
from deepinfer_kernels.tilelang.sparse_mla_builders import (  # noqa: F401  (BLOCK_TOKENS: public)
    BLOCK_TOKENS,
    LOG2E,
    NO_AUTO_SYNC,
    _build_combine,
    _build_pipelined,
    _record_bytes,
)
from deepinfer_kernels.tilelang.sparse_mla_bulk import _build_bulk
from deepinfer_kernels.tilelang.sparse_mla_bulk_rows import MAX_PAIRS, ROWS_PER_CTA, _build_bulk_rows
from deepinfer_kernels.tilelang.sparse_mla_groups import _build_bulk_groups, group_columns
from deepinfer_kernels.tilelang.sparse_mla_mma import _build_mma
from deepinfer_kernels.tilelang.sparse_mla_quads import MAX_QUAD_BLOCKS, QUAD_HEADS, QUAD_ROWS, _build_quads
from deepinfer_kernels.tilelang.sparse_mla_regs import _build_regs
from deepinfer_kernels.tilelang.sparse_mla_ws import _build_ws

VARIANTS = KERNEL_VARIANTS


def resolve_variant(variant: str, heads: int, d: int, rows: int = 0, sms: int = 132) -> str:
    """"auto": "mma" for decode calls of one head group at D 512 (up to 16 heads, 1 to 256 rows,
    not in batch-invariant mode: ``_mma_serves``); "bulk" for one head group of 512-multiple
    records elsewhere (1.43x "ws" over the engine's block layout, 0.94x over random slots, H200
    2026-11-30), "ws" otherwise. "mma" against "bulk" (H200, 2026-12-03, session 33, one run,
    132 rows x 16 heads, CUDA graphs, L2 flushed): 1.42x / 1.51x over KV blocks at 2,048 / 8,192
    keys, 1.17x over random slots, 1.27x / 1.15x on the engine's decode layouts; the engine's
    layout at 1 / 8 rows (split-KV): 1.05x / 1.10x. "bulk" copies whole records, so it needs them
    16-byte sized (D a multiple of 512); other D run "ws". "regs" (experimental,
    ``sparse_mla_regs.py``) takes up to 16 heads at D 512, "mma" also a multiple of 16 (a CTA
    per 16); other shapes run what "auto" picks.

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
    if variant in ("regs", "mma"):
        heads_ok = heads <= 16 or (variant == "mma" and heads % 16 == 0)
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
    return 16 if heads <= 16 or variant in ("bulk", "regs", "mma") else 32


def pipelined_bucket(bps: int) -> int:
    return max(4, 1 << max(0, (bps - 1).bit_length()))


TRIM_MIN_ROWS = 256   # "bulk" calls with more rows (prefill) skip each row's trailing empty blocks
MMA_MAX_ROWS = TRIM_MIN_ROWS   # "auto" runs "mma" up to this many rows (decode); above, "bulk"'s row pipelines


def get_kernel(heads: int, d: int, variant: str = "ws", split: bool = False, hb: int | None = None,
               bps: int = 0, trim: bool = False, consumers: int = 1):
    """Compiled kernel for one shape bucket: (heads, D, heads per CTA, split) [+ the static block
    count bucket for the pipelined variant; + trim and two consumer warpgroups for "bulk"]."""
    hb = hb or _heads_per_cta(heads, variant)
    if variant == "regs":
        return compile_cached("sparse_mla_regs", (heads, d, split), lambda: _build_regs(heads, d, split),
                              pass_configs=NO_AUTO_SYNC)
    if variant == "mma":
        return compile_cached("sparse_mla_mma", (heads, d, split), lambda: _build_mma(heads, d, split),
                              pass_configs=NO_AUTO_SYNC)
    if variant == "bulk":
        # two dequantizing warpgroups: 1.25x one in the H200 diagnostics (2026-11-30)
        key = (heads, d, hb, split) + (("trim",) if trim else ()) + (("consumers", 2) if consumers == 2 else ())
        return compile_cached("sparse_mla_bulk", key,
                              lambda: _build_bulk(heads, d, hb, split, 2, trim, consumers=consumers),
                              pass_configs=NO_AUTO_SYNC)
    if variant == "ws":
        return compile_cached("sparse_mla_ws", (heads, d, hb, split), lambda: _build_ws(heads, d, hb, split))
    nblk = pipelined_bucket(bps)
    return compile_cached("sparse_mla_pipelined", (heads, d, hb, split, nblk),
                          lambda: _build_pipelined(heads, d, hb, split, nblk))


def get_groups_kernel(heads: int, d: int):
    """The shared-key kernel (row pairs attend the union of their index rows once)."""
    return compile_cached("sparse_mla_groups", (heads, d), lambda: _build_bulk_groups(heads, d),
                          pass_configs=NO_AUTO_SYNC)


def _uses_groups_kernel(variant: str, rows: int, heads: int, width: int, num_splits: int, slots: int,
                        shared_keys: bool) -> bool:
    """Row pairs share key lists: asked for by the caller (rows 2i, 2i + 1 attend nearly the same
    keys), at the rows kernel's sizes, up to 16 heads, pool slots taggable, and not in
    batch-invariant mode (a row's key blocks would depend on its neighbour)."""
    return (shared_keys and _uses_rows_kernel(variant, rows, width, num_splits)
            and group_columns(heads) in (16, 32) and slots <= MAX_SHARED_KEY_SLOT
            and not batch_invariant_enabled())


def get_quads_kernel(d: int):
    """The quad shared-key kernel (4 rows x 16 heads on the wgmma's M; ``sparse_mla_quads.py``)."""
    return compile_cached("sparse_mla_quads", (d,), lambda: _build_quads(d),
                          pass_configs=NO_AUTO_SYNC)


def _uses_quads_kernel(variant: str, rows: int, heads: int, width: int, num_splits: int, slots: int,
                       shared_keys: bool) -> bool:
    """Quads instead of pairs: asked for (``shared_key_group_rows() == 4``), exactly 16 heads (the
    4 rows fill M = 64), the quad's list within the kernel's blocks, pool slots taggable in 27 bits."""
    return (_uses_groups_kernel(variant, rows, heads, width, num_splits, slots, shared_keys)
            and heads == QUAD_HEADS and QUAD_ROWS * width <= MAX_QUAD_BLOCKS * BLOCK_TOKENS
            and slots <= max_shared_key_slot(QUAD_ROWS) and shared_key_group_rows() == QUAD_ROWS)


def get_rows_kernel(heads: int, d: int, hb: int, rpc: int = ROWS_PER_CTA):
    """The row-group "bulk" kernel (prefill: ``rpc`` rows per CTA, one pipeline across them)."""
    return compile_cached("sparse_mla_bulk_rows", (heads, d, hb, rpc), lambda: _build_bulk_rows(heads, d, hb, 2, rpc),
                          pass_configs=NO_AUTO_SYNC)


def _uses_rows_kernel(variant: str, rows: int, width: int, num_splits: int) -> bool:
    return _trims(variant, rows) and num_splits == 1 and width <= 2 * BLOCK_TOKENS * MAX_PAIRS


def get_combine_kernel(heads: int, d: int):
    return compile_cached("sparse_mla_combine", (heads, d), lambda: _build_combine(heads, d))


# ----------------------------------------------------------------------------- launcher


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


def precompile_specs(rows: int, heads: int, d: int, width: int, variant: str = "auto",
                     num_splits: int | None = None, sms: int = 132, shared_keys: bool = False,
                     slots: int = 0) -> list[tuple[str, tuple]]:
    """(function name in this module, args) of every kernel one call needs (for tools/tilelang_precompile.py)."""
    if rows == 0 or width == 0:
        return []
    variant = resolve_variant(variant, heads, d, rows, sms)
    p = plan(rows, heads, d, width, sms, num_splits, variant)
    split = p["num_splits"] > 1
    if _uses_quads_kernel(variant, rows, heads, width, p["num_splits"], slots, shared_keys):
        return [("get_shared_keys_kernel", (width, QUAD_ROWS)), ("get_quads_kernel", (d,))]
    if _uses_groups_kernel(variant, rows, heads, width, p["num_splits"], slots, shared_keys):
        return [("get_shared_keys_kernel", (width,)), ("get_groups_kernel", (heads, d))]
    if _uses_rows_kernel(variant, rows, width, p["num_splits"]):
        return [("get_rows_kernel", (heads, d, p["hb"]))]
    specs = [("get_kernel", (heads, d, variant, split, p["hb"], p["bps"], _trims(variant, rows)))]
    if split:
        specs.append(("get_combine_kernel", (heads, d)))
    return specs


def _trims(variant: str, rows: int) -> bool:
    return variant == "bulk" and rows > TRIM_MIN_ROWS


def sparse_mla_attention_tilelang(q: torch.Tensor, kv_pool: torch.Tensor, indices: torch.Tensor,
                                  sm_scale: float, *, variant: str = "auto",
                                  num_splits: int | None = None,
                                  shared_keys: bool = False, consumers: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """q bf16 [rows, heads, D], kv_pool uint8 [slots, D + D/32], indices int32 [rows, width]
    (-1 = empty) -> (out bf16 [rows, heads, D], lse float32 [rows, heads]).

    Same arguments and result as ``sparse_mla_attention_ref``. ``D`` must be a multiple of 64
    (512 in the model); int64 indices are converted to int32. ``num_splits`` overrides the
    split-KV heuristic. ``shared_keys``: consecutive rows attend nearly the same keys (prefill,
    verification rows); at the row-group kernel's sizes each quad (16 heads,
    ``sparse_mla_quads.py``) or pair (``sparse_mla_groups.py``) then attends the union of its
    index rows once. ``consumers=2`` (experimental, ``variant="bulk"`` only; no faster on the
    H200): the one-row ``bulk`` kernel with two consumer warpgroups on alternate blocks, merged by
    the split-KV combine (``_build_bulk``). ``variant="regs"`` (experimental): the register-operand
    decode kernel (``sparse_mla_regs.py``) for every row, up to 16 heads at D 512. ``variant="mma"``:
    the warp-MMA decode kernel (``sparse_mla_mma.py``; those shapes and multiples of 16 heads),
    what "auto" runs for decode calls (``resolve_variant``): 1.15-1.51x ``bulk`` on the decode
    benchmarks (H200, 2026-12-03, session 33).
    """
    require(variant in VARIANTS, f"variant={variant!r}: expected one of {VARIANTS}")
    require(q.dim() == 3 and q.dtype == torch.bfloat16, f"q: expected bf16 [rows, heads, D], got {q.dtype} {tuple(q.shape)}")
    rows, heads, d = q.shape
    require(d % 64 == 0 and d > 0, f"q: head dim {d} must be a positive multiple of 64")
    rec = _record_bytes(d)
    require(kv_pool.dim() == 2 and kv_pool.dtype == torch.uint8 and kv_pool.shape[1] == rec,
            f"kv_pool: expected uint8 [slots, {rec}], got {kv_pool.dtype} {tuple(kv_pool.shape)}")
    require(indices.dim() == 2 and indices.shape[0] == rows and indices.dtype in (torch.int32, torch.int64),
            f"indices: expected int32 [{rows}, width], got {indices.dtype} {tuple(indices.shape)}")
    device = require_cuda(q=q, kv_pool=kv_pool, indices=indices)
    sms = num_sms(device)
    variant = resolve_variant(variant, heads, d, rows, sms)
    require(kv_pool.stride() == (rec, 1), "kv_pool: rows must be contiguous records")
    require(kv_pool.data_ptr() % 16 == 0, "kv_pool: base must be 16-byte aligned")
    q = q.contiguous()
    indices = indices.to(torch.int32).contiguous()
    width = indices.shape[1]
    out = torch.empty(rows, heads, d, dtype=torch.bfloat16, device=device)
    lse = torch.empty(rows, heads, dtype=torch.float32, device=device)
    if rows == 0:
        return out, lse
    if width == 0:
        out.zero_()
        lse.fill_(float("-inf"))
        return out, lse
    if num_splits is None and batch_invariant_enabled():
        num_splits = 1    # split-KV changes the accumulation order with the row count
    p = plan(rows, heads, d, width, sms, num_splits, variant)
    hb, ns, bps = p["hb"], p["num_splits"], p["bps"]
    scale = float(sm_scale) * LOG2E
    require(consumers in (1, 2) and (consumers == 1 or (variant == "bulk" and not shared_keys)),
            f"consumers={consumers}: 1, or 2 on the bulk kernel (variant 'bulk' or 'auto' resolving to it: "
            f"D a multiple of 512, got {d}; resolved {variant!r}) without shared_keys")
    if ns == 1 and consumers == 1:
        dummy_o = torch.empty(1, 1, heads, d, dtype=torch.float32, device=device)
        dummy_l = torch.empty(1, 1, heads, dtype=torch.float32, device=device)
        if _uses_quads_kernel(variant, rows, heads, width, ns, kv_pool.shape[0], shared_keys):
            keys, counts = shared_key_lists_tilelang(indices, QUAD_ROWS)
            get_quads_kernel(d)(q, kv_pool, keys, counts, out, lse, scale)
            return out, lse
        if _uses_groups_kernel(variant, rows, heads, width, ns, kv_pool.shape[0], shared_keys):
            keys, counts = shared_key_lists_tilelang(indices)
            get_groups_kernel(heads, d)(q, kv_pool, keys, counts, out, lse, scale)
            return out, lse
        if _uses_rows_kernel(variant, rows, width, ns):   # prefill: one pipeline over several rows per CTA
            get_rows_kernel(heads, d, hb)(q, kv_pool, indices, out, lse, dummy_o, dummy_l, scale, bps)
            return out, lse
        kernel = get_kernel(heads, d, variant, False, hb, bps, _trims(variant, rows))
        kernel(q, kv_pool, indices, out, lse, dummy_o, dummy_l, scale, bps)
        return out, lse
    # split partials; two consumer warpgroups write two per split (their even and odd blocks)
    opart = torch.empty(ns * consumers, rows, heads, d, dtype=torch.float32, device=device)
    lpart = torch.empty(ns * consumers, rows, heads, dtype=torch.float32, device=device)
    kernel = get_kernel(heads, d, variant, True, hb, bps, _trims(variant, rows), consumers)
    kernel(q, kv_pool, indices, out, lse, opart, lpart, scale, bps)
    get_combine_kernel(heads, d)(opart, lpart, out, lse)
    return out, lse
