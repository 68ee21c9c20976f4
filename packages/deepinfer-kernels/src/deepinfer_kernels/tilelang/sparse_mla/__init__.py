"""Sparse MLA attention over the paged FP8 KV pool (TileLang, SM90).

Same function as ``deepinfer_kernels.ops.sparse_mla.sparse_mla_attention_ref``: for query row r,
head h, over the pool slots ``indices[r, :]`` (``-1`` = empty), key = value = the dequantized
528-byte record (one shared KV head)::

    s_j = sm_scale * q[r, h] . kv_j      out = softmax(s) @ kv      lse = logsumexp(s)

rows with no valid index give ``out = 0`` and ``lse = -inf``.

This module compiles once per shape bucket and launches; ``plan.py`` picks the kernel and the
split count, ``common.py`` / ``producer.py`` hold what the kernels share, and each dispatched
kernel has its module (``ws``, ``bulk``, ``bulk_rows``, ``groups``, ``quads``, ``mma``; the
split-KV merge in ``combine``).
"""

import torch

from deepinfer_kernels.batch_invariant import batch_invariant_enabled
from deepinfer_kernels.envs import SPARSE_MLA_KERNEL_VARIANTS
from deepinfer_kernels.tilelang._common import compile_cached, num_sms, require, require_cuda
from deepinfer_kernels.tilelang.shared_keys import get_kernel as get_shared_keys_kernel  # noqa: F401  (precompile)
from deepinfer_kernels.tilelang.shared_keys import shared_key_lists_tilelang
from deepinfer_kernels.tilelang.sparse_mla.bulk import _build_bulk
from deepinfer_kernels.tilelang.sparse_mla.bulk_rows import ROWS_PER_CTA, _build_bulk_rows
from deepinfer_kernels.tilelang.sparse_mla.combine import _build_combine
from deepinfer_kernels.tilelang.sparse_mla.common import (  # noqa: F401  (BLOCK_TOKENS: public)
    BLOCK_TOKENS,
    LOG2E,
    NO_AUTO_SYNC,
    _record_bytes,
)
from deepinfer_kernels.tilelang.sparse_mla.groups import _build_bulk_groups
from deepinfer_kernels.tilelang.sparse_mla.mma import _build_mma
from deepinfer_kernels.tilelang.sparse_mla.plan import (  # noqa: F401  (the plan's names, re-exported)
    MMA_MAX_ROWS,
    TRIM_MIN_ROWS,
    _heads_per_cta,
    _mma_serves,
    _trims,
    _uses_groups_kernel,
    _uses_quads_kernel,
    _uses_rows_kernel,
    choose_num_splits,
    plan,
    resolve_variant,
)
from deepinfer_kernels.tilelang.sparse_mla.quads import QUAD_ROWS, _build_quads
from deepinfer_kernels.tilelang.sparse_mla.ws import _build_ws

VARIANTS = SPARSE_MLA_KERNEL_VARIANTS


def get_kernel(heads: int, d: int, variant: str = "ws", split: bool = False, hb: int | None = None,
               trim: bool = False):
    """Compiled one-row kernel for one shape bucket: (heads, D, heads per CTA, split) [+ trim for
    "bulk"]; "mma" has one bucket per (heads, D, split)."""
    hb = hb or _heads_per_cta(heads, variant)
    if variant == "mma":
        return compile_cached("sparse_mla_mma", (heads, d, split), lambda: _build_mma(heads, d, split),
                              pass_configs=NO_AUTO_SYNC)
    if variant == "bulk":
        # two dequantizing warpgroups: 1.25x one in the H200 diagnostics (2026-11-30)
        key = (heads, d, hb, split) + (("trim",) if trim else ())
        return compile_cached("sparse_mla_bulk", key, lambda: _build_bulk(heads, d, hb, split, 2, trim),
                              pass_configs=NO_AUTO_SYNC)
    require(variant == "ws", f"variant={variant!r}: a kernel is one of 'ws', 'bulk', 'mma'")
    return compile_cached("sparse_mla_ws", (heads, d, hb, split), lambda: _build_ws(heads, d, hb, split))


def get_groups_kernel(heads: int, d: int):
    """The shared-key kernel (row pairs attend the union of their index rows once)."""
    return compile_cached("sparse_mla_groups", (heads, d), lambda: _build_bulk_groups(heads, d),
                          pass_configs=NO_AUTO_SYNC)


def get_quads_kernel(d: int):
    """The quad shared-key kernel (4 rows x 16 heads on the wgmma's M; ``quads.py``)."""
    return compile_cached("sparse_mla_quads", (d,), lambda: _build_quads(d), pass_configs=NO_AUTO_SYNC)


def get_rows_kernel(heads: int, d: int, hb: int, rpc: int = ROWS_PER_CTA):
    """The row-group "bulk" kernel (prefill: ``rpc`` rows per CTA, one pipeline across them)."""
    return compile_cached("sparse_mla_bulk_rows", (heads, d, hb, rpc), lambda: _build_bulk_rows(heads, d, hb, 2, rpc),
                          pass_configs=NO_AUTO_SYNC)


def get_combine_kernel(heads: int, d: int):
    return compile_cached("sparse_mla_combine", (heads, d), lambda: _build_combine(heads, d))


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
    specs = [("get_kernel", (heads, d, variant, split, p["hb"], _trims(variant, rows)))]
    if split:
        specs.append(("get_combine_kernel", (heads, d)))
    return specs


def sparse_mla_attention_tilelang(q: torch.Tensor, kv_pool: torch.Tensor, indices: torch.Tensor,
                                  sm_scale: float, *, variant: str = "auto", num_splits: int | None = None,
                                  shared_keys: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """q bf16 [rows, heads, D], kv_pool uint8 [slots, D + D/32], indices int32 [rows, width]
    (-1 = empty) -> (out bf16 [rows, heads, D], lse float32 [rows, heads]).

    Same arguments and result as ``sparse_mla_attention_ref``. ``D`` must be a multiple of 64
    (512 in the model); int64 indices are converted to int32. ``num_splits`` overrides the
    split-KV heuristic. ``shared_keys``: consecutive rows attend nearly the same keys (prefill,
    verification rows); at the row-group kernel's sizes each quad (16 heads, ``quads.py``) or pair
    (``groups.py``) then attends the union of its index rows once. ``variant="mma"``: the warp-MMA
    decode kernel (``mma.py``; up to 16 heads at D 512 and multiples of 16 heads), what "auto" runs
    for decode calls (``plan.resolve_variant``): 1.15-1.51x ``bulk`` on the decode benchmarks
    (H200, 2026-12-03).
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
    if ns == 1:
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
        kernel = get_kernel(heads, d, variant, False, hb, _trims(variant, rows))
        kernel(q, kv_pool, indices, out, lse, dummy_o, dummy_l, scale, bps)
        return out, lse
    opart = torch.empty(ns, rows, heads, d, dtype=torch.float32, device=device)
    lpart = torch.empty(ns, rows, heads, dtype=torch.float32, device=device)
    kernel = get_kernel(heads, d, variant, True, hb, _trims(variant, rows))
    kernel(q, kv_pool, indices, out, lse, opart, lpart, scale, bps)
    get_combine_kernel(heads, d)(opart, lpart, out, lse)
    return out, lse
