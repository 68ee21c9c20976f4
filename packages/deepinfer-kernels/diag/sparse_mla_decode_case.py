"""The sparse MLA decode case the measurement tools share (``sparse_mla_width_sweep.py``,
``sparse_mla_ncu.py``, ``sparse_mla_clock_probe.py``): 132 rows x 16 heads x D 512 (issue 5's
decode case), the kernels they compare, and the key layouts they read."""

from __future__ import annotations

ROWS, HEADS, D = 132, 16, 512
RECORD_BYTES = D + D // 32
# variant -> keyword arguments of sparse_mla_attention_tilelang
VARIANTS = {
    "bulk": {"variant": "bulk"},
    "mma": {"variant": "mma"},
}
# paged128: every row reads whole KV blocks of 128 consecutive slots (the engine's pool);
# random: distinct random slots (one TMA request per record for ``bulk``)
LAYOUTS = ("paged128", "random")


def make_decode_case(width: int, layout: str, slots: int, pool, rows: int = ROWS):
    """``rows`` rows of ``width`` keys over ``pool`` (``slots`` records) in ``layout``."""
    from deepinfer_kernels import testing as T

    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r}: expected one of {LAYOUTS}")
    kw = {"paged": 128} if layout == "paged128" else {"distinct": True}
    return T.make_sparse_mla_case(rows, HEADS, D, width, slots, "cuda", pool=pool, seed=1, **kw)


def attention_call(case, name: str, num_splits: int | None = None):
    """A no-argument call of ``case`` on variant ``name`` (for timing, capture or profiling);
    ``num_splits`` overrides the split-KV heuristic."""
    from deepinfer_kernels.tilelang.sparse_mla import sparse_mla_attention_tilelang

    kw = dict(VARIANTS[name], num_splits=num_splits)
    return lambda: sparse_mla_attention_tilelang(case.q, case.pool, case.indices, case.sm_scale, **kw)
