"""Benchmarks: TileLang sparse MLA over the paged FP8 KV pool in the memory-bound regime.

Effective bytes = records read (each valid index once per row, and each distinct slot once) +
q + out + lse + indices; ratios against 4.29 TB/s. Three decode layouts: random slots (the worst
case), whole KV blocks of 128 consecutive slots (at 2,048 keys a row, and at 8,192: the shape of
the MLA decode anchor, 16 heads x batch 132 x 8K context), and the engine's mix (a 128-slot window
run + 16 blocks of 16 ratio-4 compressed entries, 4 slots apart). Run: pytest packages/deepinfer-kernels
--benchmark-only -k sparse_mla (GPU; skipped on CPU).
"""

import pytest

pytestmark = pytest.mark.gpu

T = pytest.importorskip("deepinfer_kernels.testing")
pytest.importorskip("deepinfer_kernels.ops.kv_fp8")

SLOTS = 400_000
LONG_SLOTS = 132 * 8192 + 4096    # every row its own 64 KV blocks at 8,192 keys
_pool = {}


def _case(name):
    if "pool" not in _pool:
        _pool["pool"] = T.make_pool(SLOTS, 512, "cuda", seed=0)
    pool = _pool["pool"]
    if name == "decode_132x16_w2048":
        return T.make_sparse_mla_case(132, 16, 512, 2048, SLOTS, "cuda", pool=pool, distinct=True, seed=1)
    if name == "decode_132x16_w2048_paged128":     # 16 KV blocks of 128 consecutive slots per row
        return T.make_sparse_mla_case(132, 16, 512, 2048, SLOTS, "cuda", pool=pool, paged=128, seed=1)
    if name == "decode_132x16_w8192_paged128":     # the MLA decode anchor's shape (16 heads, batch 132, 8K context)
        if "long" not in _pool:
            _pool["long"] = T.make_pool(LONG_SLOTS, 512, "cuda", seed=0)
        return T.make_sparse_mla_case(132, 16, 512, 8192, LONG_SLOTS, "cuda", pool=_pool["long"], paged=128, seed=1)
    if name == "decode_132x16_engine_w384":       # 128 window slots + 16 blocks of 16 ratio-4 entries
        return T.make_engine_decode_case(132, 16, 512, 128, 16, 16, 4, SLOTS, "cuda", pool=pool, seed=5)
    if name == "decode_132x16_engine_packed_w384":  # the same with packed entries (the engine's layout since 2026-12-01)
        return T.make_engine_decode_case(132, 16, 512, 128, 16, 16, 4, SLOTS, "cuda", pool=pool, seed=5, packed=True)
    if name == "verify_64req_x6_w2048":
        return T.make_verify_case(64, 6, 16, 512, 128, 1920, SLOTS, "cuda", pool=pool, seed=2)
    if name == "verify_64req_x6_w384":            # 6 verification rows per request, window 128 + 256 far entries
        return T.make_verify_case(64, 6, 16, 512, 128, 256, SLOTS, "cuda", pool=pool, seed=2)
    if name == "decode_16x16_w2048_splitkv":
        return T.make_sparse_mla_case(16, 16, 512, 2048, SLOTS, "cuda", pool=pool, distinct=True, seed=3)
    if name == "prefill_4096x16_w384":
        return T.make_prefill_case(4096, 16, 512, 128, 16, 16, SLOTS, "cuda", pool=pool, seed=4)
    if name == "prefill_16x512_engine_w384":     # `mini`'s rows (512-token prompts, ragged far entries), random slots
        return T.make_prefill_case(8192, 16, 512, 128, 16, 16, SLOTS, "cuda", pool=pool, seed=6, prompt_len=512)
    if name == "prefill_16x512_engine_paged128_w384":   # the same rows on the pool's KV blocks of 128 slots
        return T.make_prefill_case(8192, 16, 512, 128, 16, 16, SLOTS, "cuda", pool=pool, seed=6, prompt_len=512,
                                   paged=128)
    raise KeyError(name)


@pytest.mark.parametrize("variant", [pytest.param("ws", id="warpspec1"),
                                     pytest.param("bulk", id="bulkcopy"),
                                     pytest.param("mma", id="warpmma")])
@pytest.mark.parametrize("name", ["decode_132x16_w2048", "decode_132x16_w2048_paged128", "decode_132x16_w8192_paged128",
                                  "decode_132x16_engine_w384",
                                  "decode_132x16_engine_packed_w384",
                                  "verify_64req_x6_w2048", "decode_16x16_w2048_splitkv",
                                  "prefill_4096x16_w384", "prefill_16x512_engine_w384",
                                  "prefill_16x512_engine_paged128_w384"])
def test_bench_sparse_mla_tilelang(benchmark, name, variant):
    from deepinfer_kernels.ops.sparse_mla import sparse_mla_attention_ref
    from deepinfer_kernels.tilelang.sparse_mla import sparse_mla_attention_tilelang

    c = _case(name)

    def fn():
        return sparse_mla_attention_tilelang(c.q, c.pool, c.indices, c.sm_scale, variant=variant)

    rows, width = c.indices.shape
    ref_fn = None
    if rows * width * 512 * 4 < 1.5e9 and variant in ("ws", "bulk", "mma"):
        def ref_fn():
            return sparse_mla_attention_ref(c.q, c.pool, c.indices, c.sm_scale)
    gathered, unique = c.gathered_bytes(), c.unique_bytes()
    info = T.record_benchmark(benchmark, fn, bytes_moved=unique, ref_fn=ref_fn,
                              extra={"gathered_bytes": gathered, "rows": rows, "width": width, "heads": 16})
    info["gathered_TB/s"] = gathered / (info["median_us"] * 1e-6) / 1e12
    benchmark.extra_info["gathered_TB/s"] = info["gathered_TB/s"]


@pytest.mark.parametrize("variant", [pytest.param("bulk", id="bulkcopy"), pytest.param("mma", id="warpmma")])
@pytest.mark.parametrize("num_splits", [pytest.param(None, id="auto"), pytest.param(1, id="nosplit")])
@pytest.mark.parametrize("rows", [1, 8])
def test_bench_sparse_mla_small_batch_splits(benchmark, rows, num_splits, variant):
    """The engine's decode layout at batch 1 and 8: the split-KV heuristic (a split per block pair
    plus the combine kernel) against one CTA per row, side by side, on both decode kernels."""
    from deepinfer_kernels.tilelang.sparse_mla import sparse_mla_attention_tilelang

    if "pool" not in _pool:
        _pool["pool"] = T.make_pool(SLOTS, 512, "cuda", seed=0)
    c = T.make_engine_decode_case(rows, 16, 512, 128, 16, 16, 4, SLOTS, "cuda", pool=_pool["pool"], seed=7)
    T.record_benchmark(benchmark, lambda: sparse_mla_attention_tilelang(c.q, c.pool, c.indices, c.sm_scale,
                                                                        variant=variant, num_splits=num_splits),
                       bytes_moved=c.unique_bytes(), extra={"rows": rows, "num_splits": num_splits or 0})


@pytest.mark.parametrize("group_rows", [pytest.param(0, id="per_row"), pytest.param(2, id="pairs"),
                                        pytest.param(4, id="quads")])
@pytest.mark.parametrize("name", ["prefill_16x512_engine_paged128_w384", "prefill_16x512_engine_w384",
                                  "verify_64req_x6_w384"])
def test_bench_sparse_mla_shared_keys(benchmark, name, group_rows, monkeypatch):
    """Row pairs / quads attending their shared key list once (``shared_keys=True``; the time
    includes building the lists) beside the per-row kernel, same rows, same effective bytes."""
    from deepinfer_kernels.envs import SPARSE_MLA_GROUP_ROWS_ENV as GROUP_ROWS_ENV
    from deepinfer_kernels.tilelang.sparse_mla import sparse_mla_attention_tilelang

    monkeypatch.setenv(GROUP_ROWS_ENV, str(group_rows or 2))
    c = _case(name)
    rows, width = c.indices.shape
    info = T.record_benchmark(
        benchmark, lambda: sparse_mla_attention_tilelang(c.q, c.pool, c.indices, c.sm_scale, variant="bulk",
                                                         shared_keys=group_rows > 0),
        bytes_moved=c.unique_bytes(), extra={"gathered_bytes": c.gathered_bytes(), "rows": rows, "width": width,
                                             "group_rows": group_rows})
    benchmark.extra_info["gathered_TB/s"] = c.gathered_bytes() / (info["median_us"] * 1e-6) / 1e12


@pytest.mark.parametrize("group_rows", [2, 4])
def test_bench_shared_key_lists(benchmark, group_rows):
    """The row groups' shared key lists alone (one launch), `mini`'s 8,192 prefill rows of 384 columns."""
    from deepinfer_kernels.tilelang.shared_keys import shared_key_lists_tilelang

    c = _case("prefill_16x512_engine_paged128_w384")
    rows, width = c.indices.shape
    T.record_benchmark(benchmark, lambda: shared_key_lists_tilelang(c.indices, group_rows),
                       bytes_moved=c.indices.numel() * 4 * 2 + (rows + 1) // 2 * 4,
                       extra={"rows": rows, "width": width, "group_rows": group_rows})


@pytest.mark.parametrize("variant", [pytest.param("ws", id="warpspec1"), pytest.param("bulk", id="bulkcopy")])
@pytest.mark.parametrize("valid_far", [0, 224, 896], ids=["window", "ratio4", "ratio1"])
def test_bench_sparse_mla_64_heads_batch1(benchmark, valid_far, variant):
    """flash's 64 heads at batch 1 (the engine's decode layout: a 128-slot window run, then 2,048
    far-entry columns of which ``valid_far`` are selected, the rest -1): "ws" with 32 heads per CTA
    beside "bulk" with 16, auto split-KV. "auto" picks "bulk" there (``resolve_variant``)."""
    from deepinfer_kernels.tilelang.sparse_mla import sparse_mla_attention_tilelang

    if "pool" not in _pool:
        _pool["pool"] = T.make_pool(SLOTS, 512, "cuda", seed=0)
    c = T.make_engine_decode_case(1, 64, 512, 128, 32 if valid_far else 0, 64, 1, SLOTS, "cuda",
                                  pool=_pool["pool"], seed=9, packed=True)
    if valid_far:
        c.indices[:, 128 + valid_far:] = -1
    T.record_benchmark(benchmark, lambda: sparse_mla_attention_tilelang(c.q, c.pool, c.indices, c.sm_scale,
                                                                        variant=variant),
                       bytes_moved=c.unique_bytes(), extra={"valid_far": valid_far, "heads": 64})

