import math

import pytest
import torch

from deepinfer_kernels.ops.kv_fp8 import dequantize_kv_fp8, quantize_kv_fp8
from deepinfer_kernels.ops.sparse_mla import sparse_mla_attention


def test_sparse_attention_matches_dense_loop_and_empty_rows():
    g = torch.Generator().manual_seed(0)
    rows, heads, d, slots = 5, 3, 64, 20
    q = torch.randn(rows, heads, d, generator=g)
    pool = quantize_kv_fp8(torch.randn(slots, d, generator=g))
    kv = dequantize_kv_fp8(pool, d)
    idx = torch.tensor([[0, 1, 2, -1], [-1, -1, -1, -1], [19, 4, -1, 7], [3, -1, -1, -1], [5, 6, 7, 8]],
                       dtype=torch.int32)
    scale = 1 / math.sqrt(d)
    out, lse = sparse_mla_attention(q, pool, idx, scale)
    assert out.shape == (rows, heads, d) and lse.shape == (rows, heads)
    for r in range(rows):
        cols = [int(i) for i in idx[r] if i >= 0]
        if not cols:
            assert torch.equal(out[r], torch.zeros(heads, d))
            assert bool((lse[r] == float("-inf")).all())
            continue
        k = kv[cols]
        s = q[r] @ k.t() * scale
        torch.testing.assert_close(out[r], torch.softmax(s, -1) @ k, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(lse[r], torch.logsumexp(s, -1), rtol=1e-5, atol=1e-5)


def test_sparse_attention_bf16_output_dtype():
    q = torch.randn(2, 1, 32).bfloat16()
    pool = quantize_kv_fp8(torch.randn(4, 32))
    out, _ = sparse_mla_attention(q, pool, torch.tensor([[0, 1], [2, 3]], dtype=torch.int32), 0.1)
    assert out.dtype == torch.bfloat16


def test_kernel_variant_comes_from_the_environment(monkeypatch):
    from deepinfer_kernels.ops.sparse_mla import VARIANT_ENV, kernel_variant

    monkeypatch.delenv(VARIANT_ENV, raising=False)
    assert kernel_variant() == "auto"
    monkeypatch.setenv(VARIANT_ENV, " Bulk ")
    assert kernel_variant() == "bulk"
    monkeypatch.setenv(VARIANT_ENV, "fast")
    with pytest.raises(ValueError, match=VARIANT_ENV):
        kernel_variant()


def test_prefill_case_paged_layout_matches_the_pool_blocks():
    """The benchmark's prefill rows on the pool's KV blocks (`paged`): the same -1 pattern as the
    random-slot case; a row's window is consecutive slots except where it crosses a 128-slot block,
    its far entries are packed in the first 128 / ratio slots of their blocks, and the op (its CPU
    reference here) runs on it."""
    from deepinfer_kernels.testing import make_prefill_case

    args = (640, 4, 64, 128, 4, 16, 40_000, "cpu")
    rnd = make_prefill_case(*args, seed=3, prompt_len=512)
    pag = make_prefill_case(*args, seed=3, prompt_len=512, paged=128)
    assert torch.equal(rnd.indices < 0, pag.indices < 0)
    win, far = pag.indices[:, :128].long(), pag.indices[:, 128:].long()
    steps = win[:, 1:] - win[:, :-1]
    valid = (win[:, 1:] >= 0) & (win[:, :-1] >= 0)
    inside = valid & (win[:, 1:] % 128 != 0)               # the next slot stays in the same KV block
    assert bool((steps[inside] == 1).all()) and bool(inside.any())
    assert bool(((far[far >= 0] % 128) < 128 // 4).all())     # packed ratio-4 entries
    out, lse = sparse_mla_attention(pag.q, pag.pool, pag.indices, pag.sm_scale)
    assert out.shape == (640, 4, 64) and bool(torch.isfinite(out.float()).all())


def test_engine_decode_case_packed_entries_are_runs():
    """`packed`: each selected block of 16 compressed entries is 16 consecutive slots (one copy for
    the "bulk" kernel); unpacked, they are `ratio` slots apart, each in its last token's slot."""
    from deepinfer_kernels.testing import make_engine_decode_case

    for packed, step in ((True, 1), (False, 4)):
        case = make_engine_decode_case(3, 4, 64, 128, 2, 16, 4, 40_000, "cpu", seed=2, packed=packed)
        far = case.indices[:, 128:].long().view(3, 2, 16)
        assert bool((far[..., 1:] - far[..., :-1] == step).all())
        assert bool(((case.indices[:, 1:128] - case.indices[:, :127]) == 1).all())   # the window: one run


def test_auto_variant_runs_bulk_at_many_heads_only_where_ws_leaves_most_sms_idle():
    """The dispatch rule (CPU-checkable: no kernel is built): up to 16 heads of 512-wide latents
    "mma" at decode row counts (1 .. 256), "bulk" above and without a row count; more heads "bulk"
    (16 per CTA) while "ws"'s 32-head CTAs would fill < half the SMs, else "ws"; in batch-invariant
    mode a row's kernel must not depend on the row count: "bulk" at 16 heads, "ws" at 64."""
    from deepinfer_kernels.batch_invariant import batch_invariant_kernels
    from deepinfer_kernels.tilelang.sparse_mla import MMA_MAX_ROWS, resolve_variant

    assert [resolve_variant("auto", 16, 512, rows, 132) for rows in (1, 132, MMA_MAX_ROWS)] == ["mma"] * 3
    assert resolve_variant("auto", 8, 512, 64, 132) == "mma"
    assert resolve_variant("auto", 16, 512, MMA_MAX_ROWS + 1, 132) == "bulk"
    assert resolve_variant("auto", 16, 512) == "bulk"          # no row count
    assert resolve_variant("auto", 16, 1024, 8, 132) == "bulk"  # mma: D 512 only
    assert resolve_variant("bulk", 16, 512, 8, 132) == "bulk"
    assert resolve_variant("auto", 16, 512, 1000, 132) == "bulk"
    assert [resolve_variant("auto", 64, 512, rows, 132) for rows in (1, 32, 33, 64)] == ["bulk", "bulk", "ws", "ws"]
    assert resolve_variant("auto", 64, 512) == "ws"            # no row count: the old rule
    assert resolve_variant("auto", 64, 64, 1, 132) == "ws"     # records not 16-byte sized
    assert resolve_variant("ws", 64, 512, 1, 132) == "ws"      # an explicit variant stays
    assert resolve_variant("mma", 16, 512, 132, 132) == "mma"
    assert resolve_variant("mma", 64, 512, 1, 132) == "mma"    # a CTA per 16 heads
    assert resolve_variant("mma", 24, 512, 1, 132) == "bulk"   # and mma's (up to 16 heads or a multiple, D 512)
    assert resolve_variant("mma", 16, 64, 1, 132) == "ws"
    with batch_invariant_kernels():
        assert resolve_variant("auto", 64, 512, 1, 132) == "ws"
        assert resolve_variant("auto", 16, 512, 8, 132) == "bulk"
