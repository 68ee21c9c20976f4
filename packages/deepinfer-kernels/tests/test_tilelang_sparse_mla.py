"""GPU tests: TileLang sparse MLA attention vs ``sparse_mla_attention_ref``."""

import math

import pytest
import torch

pytestmark = pytest.mark.gpu

T = pytest.importorskip("deepinfer_kernels.testing")

# ids: the device runner selects variants with -k (a bare "ws" would also match "rows"); the
# tests without a variant parameter run the default ("auto": bulk / ws by shape and row count,
# ``resolve_variant``) and are named "default".
VARIANTS = [pytest.param("ws", id="warpspec1"),
            pytest.param("bulk", id="bulkcopy"),
            pytest.param("mma", id="warpmma")]


def _run(case, variant, num_splits=None):
    from deepinfer_kernels.tilelang.sparse_mla import sparse_mla_attention_tilelang

    out, lse = sparse_mla_attention_tilelang(case.q, case.pool, case.indices, case.sm_scale,
                                             variant=variant, num_splits=num_splits)
    torch.cuda.synchronize()
    return out, lse


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("rows,heads,d,width,kw", [
    (5, 16, 512, 256, dict(empty_frac=0.1)),
    (9, 16, 512, 200, dict(ragged=True, empty_rows=(0, 4))),       # width not a multiple of 64
    (6, 8, 64, 130, dict(empty_frac=0.2, empty_rows=(5,))),         # heads < 16, small D
    (4, 24, 128, 96, dict(ragged=True)),                            # 32 heads per CTA, padded
    (3, 64, 512, 128, dict(empty_frac=0.05)),                       # two head groups
    (4, 16, 512, 300, dict(duplicates=True)),                       # duplicate slots count twice
    (3, 16, 512, 64, dict(q_scale=8.0)),                            # peaky softmax
    (2, 16, 512, 1, dict()),                                        # width 1
])
def test_sparse_mla_matches_reference(variant, rows, heads, d, width, kw):
    case = T.make_sparse_mla_case(rows, heads, d, width, 3000, "cuda", seed=rows * 7 + width, **kw)
    T.check_sparse_mla(case, *_run(case, variant))


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("num_splits", [None, 3, 8])
def test_sparse_mla_split_kv(variant, num_splits):
    case = T.make_sparse_mla_case(3, 16, 512, 2048, 20000, "cuda", seed=11, ragged=True, empty_rows=(1,))
    T.check_sparse_mla(case, *_run(case, variant, num_splits))


@pytest.mark.parametrize("rows", [1, 3, 40])
def test_default_at_64_heads_decode_layout_matches_reference(rows):
    """flash's 64 heads on its batch-1 decode layout (a 128-slot window run, then far entries whose
    unselected blocks are -1, split-KV): "auto" runs "bulk" at 1 and 3 rows, "ws" at 40."""
    from deepinfer_kernels.tilelang.sparse_mla import resolve_variant

    assert resolve_variant("auto", 64, 512, rows, 132) == ("ws" if rows == 40 else "bulk")
    case = T.make_engine_decode_case(rows, 64, 512, 128, 32, 64, 1, 180_000, "cuda", seed=rows, packed=True)
    case.indices[:, 128 + 64 * 4:] = -1                      # 4 of 32 far blocks selected
    case.indices[0, 128 + 64 * 3 + 17:] = -1                 # row 0: a ragged last block
    T.check_sparse_mla(case, *_run(case, "auto"))


@pytest.mark.parametrize("variant", VARIANTS)
def test_sparse_mla_verify_rows_and_prefill(variant):
    v = T.make_verify_case(4, 6, 16, 512, 128, 192, 20000, "cuda", seed=3)
    T.check_sparse_mla(v, *_run(v, variant))
    p = T.make_prefill_case(200, 16, 512, 128, 4, 16, 20000, "cuda", seed=4)
    T.check_sparse_mla(p, *_run(p, variant))


def test_sparse_mla_default_all_empty_and_zero_width():
    case = T.make_sparse_mla_case(4, 16, 512, 192, 500, "cuda", seed=5, empty_rows=(0, 1, 2, 3))
    out, lse = _run(case, "auto")
    assert bool((out == 0).all()) and bool((lse == float("-inf")).all())
    from deepinfer_kernels.tilelang.sparse_mla import sparse_mla_attention_tilelang

    out, lse = sparse_mla_attention_tilelang(case.q, case.pool, case.indices[:, :0], case.sm_scale)
    assert bool((out == 0).all()) and bool((lse == float("-inf")).all())


def test_sparse_mla_default_int64_indices_and_pool_plane_view():
    """The engine passes one plane of a [planes, slots, rec] cache and may hold int64 indices."""
    from deepinfer_kernels.tilelang.sparse_mla import sparse_mla_attention_tilelang

    d = 512
    planes = T.make_pool(3 * 1000, d, "cuda", seed=9).view(3, 1000, d + d // 32)
    case = T.make_sparse_mla_case(5, 16, d, 160, 1000, "cuda", seed=6, pool=planes[1], empty_frac=0.1)
    out, lse = sparse_mla_attention_tilelang(case.q, planes[1], case.indices.long(), case.sm_scale)
    T.check_sparse_mla(case, out, lse)


def test_sparse_mla_default_rejects_bad_inputs():
    from deepinfer_kernels.tilelang.sparse_mla import sparse_mla_attention_tilelang

    case = T.make_sparse_mla_case(2, 16, 512, 64, 100, "cuda", seed=1)
    with pytest.raises(ValueError):
        sparse_mla_attention_tilelang(case.q.float(), case.pool, case.indices, case.sm_scale)
    with pytest.raises(ValueError):
        sparse_mla_attention_tilelang(case.q, case.pool[:, :500], case.indices, case.sm_scale)
    with pytest.raises(ValueError):
        sparse_mla_attention_tilelang(case.q, case.pool, case.indices[:1], case.sm_scale)
    assert math.isfinite(case.sm_scale)


@pytest.mark.parametrize("variant", VARIANTS)
def test_sparse_mla_one_key_returns_its_dequantized_record_exactly(variant):
    """With one valid key per row the softmax weight is exactly 1, so ``out`` is the record's
    dequantized bf16 value: a bit-exact check of the kernel's FP8 dequantization over random
    e4m3 codes and ue8m0 scales from 2^-126 to 2^33 (both of its multiply paths)."""
    from deepinfer_kernels.ops.kv_fp8 import dequantize_kv_fp8_ref

    d, rows, slots = 512, 40, 64
    g = torch.Generator().manual_seed(5)
    body = torch.randint(0, 256, (slots, d), generator=g, dtype=torch.uint8)
    body[(body & 0x7F) == 0x7F] = 0x3C                    # no e4m3 NaN codes
    if variant == "mma":
        # one exponent a row (sparse_mla/mma.py): exact while every group scale of the row sits within
        # 2^15 of its largest; each record's scales span 2^15, from 2^-126 up to 2^33 over the records
        # (test_tilelang_sparse_mla_mma.py bounds the error past that)
        base = torch.randint(1, 161 - 15, (slots, 1), generator=g)
        scales = (base + torch.randint(0, 16, (slots, d // 32), generator=g)).to(torch.uint8)
    else:
        scales = torch.randint(1, 161, (slots, d // 32), generator=g, dtype=torch.uint8)
    pool = torch.cat([body, scales], dim=1).cuda()
    # tiny queries: |score x scale| < 1 for every key (up to 448 x 2^33 here), so the softmax
    # exponent's rounding (~ulp of that product) leaves the lone key's weight at exactly 1
    q = (torch.randn(rows, 16, d, generator=g) * 1e-13).to(torch.bfloat16).cuda()
    idx = torch.full((rows, 64), -1, dtype=torch.int32)
    idx[torch.arange(rows), torch.randint(0, 64, (rows,), generator=g)] = torch.randperm(slots, generator=g)[:rows].int()
    idx = idx.cuda()
    from deepinfer_kernels.tilelang.sparse_mla import sparse_mla_attention_tilelang

    out, lse = sparse_mla_attention_tilelang(q, pool, idx, 0.04, variant=variant)
    want = dequantize_kv_fp8_ref(pool[idx.max(dim=1).values.long()], d).to(torch.bfloat16)
    assert torch.equal(out, want.unsqueeze(1).expand(rows, 16, d))
    assert bool(torch.isfinite(lse).all())


@pytest.mark.parametrize("variant", VARIANTS)
def test_sparse_mla_runs_of_consecutive_slots(variant):
    """The engine's index lists are runs of consecutive slots (KV blocks of 128 tokens), which the
    bulk kernel copies one run at a time: runs of every length, crossing lane 31/32 and block
    boundaries, broken by -1 holes and by a slot repeated or stepping back."""
    case = T.make_sparse_mla_case(6, 16, 512, 640, 20000, "cuda", seed=21)
    g = torch.Generator().manual_seed(22)
    idx = torch.empty(6, 640, dtype=torch.int64)
    for r in range(6):
        row, n = [], 0
        while n < 640:
            length = int(torch.randint(1, 150, (1,), generator=g))
            start = int(torch.randint(0, 20000 - 150, (1,), generator=g))
            row.extend(range(start, start + length))
            n += length
        idx[r] = torch.tensor(row[:640])
    idx[0, 100:103] = -1                  # holes inside a run
    idx[1, 31] = -1                       # a hole at the lane 31 / 32 seam
    idx[2, 64:70] = idx[2, 63]            # a repeated slot
    idx[3, 200] = idx[3, 199] - 1         # a step back
    idx[4, :] = torch.arange(1000, 1640)  # one run through every block
    idx[5, 320:] = -1                     # ragged tail
    case.indices = idx.to(torch.int32).cuda()
    T.check_sparse_mla(case, *_run(case, variant))


@pytest.mark.parametrize("case_kw", [
    dict(rows=132, width=2048, distinct=True),                 # random slots
    dict(rows=40, width=2048, paged=128),                      # the engine's KV-block layout
    dict(rows=9, width=200, ragged=True, empty_rows=(0, 4)),   # ragged, empty rows
    dict(rows=3, width=2048, paged=64),                        # few rows: split-KV
    dict(rows=11, width=448, paged=32),                        # 7 blocks
    dict(rows=7, width=320, paged=64, empty_frac=0.1),         # 5 blocks: one past the FP8 stages
    dict(rows=5, width=130, distinct=True),                    # 3 blocks: fewer than the FP8 stages
], ids=["random", "paged", "ragged", "splitkv", "blocks7", "blocks5", "blocks3"])
def test_bulk_and_ws_agree_bit_for_bit(case_kw):
    """Same dequantization, same consumer code, same launch plan at <= 16 heads: "bulk" and "ws"
    differ only in how records reach shared memory, so their outputs are identical."""
    kw = dict(case_kw)
    rows, width = kw.pop("rows"), kw.pop("width")
    case = T.make_sparse_mla_case(rows, 16, 512, width, 120000, "cuda", seed=rows + width, **kw)
    ws_out, ws_lse = _run(case, "ws")
    bulk_out, bulk_lse = _run(case, "bulk")
    assert torch.equal(bulk_out, ws_out) and torch.equal(bulk_lse, ws_lse)


def _assert_same_out_lse_to_rounding(out, lse, ref_out, ref_lse):
    """Outputs bit for bit; lse to a few float32 ulps. The row-group kernel computes the same
    ``(log2(l) + m * scale) / log2(e)``, but nvcc may reuse the softmax's rounded ``m * scale``
    product there instead of fusing it into an FMA (measured on the H200: the bf16 outputs equal,
    lse differing in the last bits). The model reads only the outputs."""
    assert torch.equal(out, ref_out)
    finite = torch.isfinite(ref_lse)
    assert torch.equal(finite, torch.isfinite(lse)) and torch.equal(lse[~finite], ref_lse[~finite])
    torch.testing.assert_close(lse[finite], ref_lse[finite], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("num_splits", [None, 3])
def test_bulk_trims_trailing_empty_blocks_bit_for_bit(num_splits):
    """Above TRIM_MIN_ROWS rows "bulk" walks each row only up to its last valid index: ragged rows
    (some empty, some with -1 holes) give exactly the untrimmed "ws" result, and match the reference."""
    from deepinfer_kernels.tilelang.sparse_mla import TRIM_MIN_ROWS

    rows = TRIM_MIN_ROWS + 44
    case = T.make_sparse_mla_case(rows, 16, 512, 384, 120000, "cuda", seed=77, ragged=True, empty_frac=0.05,
                                  empty_rows=(0, 5, rows - 1))
    ws_out, ws_lse = _run(case, "ws", num_splits)
    bulk_out, bulk_lse = _run(case, "bulk", num_splits)
    _assert_same_out_lse_to_rounding(bulk_out, bulk_lse, ws_out, ws_lse)
    T.check_sparse_mla(case, bulk_out, bulk_lse)


@pytest.mark.parametrize("rows,heads,width", [(301, 16, 384), (257, 32, 1024), (262, 16, 200)])
def test_bulk_row_groups_equal_the_one_row_kernel_bit_for_bit(rows, heads, width):
    """The row-group kernel (prefill sizes: several rows per CTA, one pipeline over their block
    pairs) gives exactly the one-row trimmed kernel's result: ragged rows, -1 holes, empty rows
    (first, inside a group, last), a row count that is not a multiple of the group, two head groups."""
    from deepinfer_kernels.tilelang.sparse_mla import LOG2E, get_kernel, get_rows_kernel, plan

    case = T.make_sparse_mla_case(rows, heads, 512, width, 120000, "cuda", seed=rows + width, ragged=True,
                                  empty_frac=0.03, empty_rows=(0, 6, rows - 1))
    p = plan(rows, heads, 512, width, 132, 1, "bulk")
    outs = []
    for kernel in (get_kernel(heads, 512, "bulk", False, p["hb"], trim=True), get_rows_kernel(heads, 512, p["hb"])):
        out = torch.empty(rows, heads, 512, dtype=torch.bfloat16, device="cuda")
        lse = torch.empty(rows, heads, dtype=torch.float32, device="cuda")
        dummy_o = torch.empty(1, 1, heads, 512, dtype=torch.float32, device="cuda")
        dummy_l = torch.empty(1, 1, heads, dtype=torch.float32, device="cuda")
        kernel(case.q, case.pool, case.indices, out, lse, dummy_o, dummy_l, case.sm_scale * LOG2E, p["bps"])
        outs.append((out, lse))
    torch.cuda.synchronize()
    (one_out, one_lse), (grp_out, grp_lse) = outs
    _assert_same_out_lse_to_rounding(grp_out, grp_lse, one_out, one_lse)
    T.check_sparse_mla(case, grp_out, grp_lse)



_SLOTS = 120000
# the shared-key tests' cases: the engine's prefill layout, verification rows, unrelated pairs,
# holes, empty rows and pairs, duplicates, an odd row count, heads 4 / 8 / 16 (built in the test)
SHARED_KEY_CASES = {
    "prefill_paged": lambda: T.make_prefill_case(1024, 16, 512, 128, 16, 16, _SLOTS, "cuda", seed=1, prompt_len=512,
                                                 paged=64),
    "prefill_random": lambda: T.make_prefill_case(515, 16, 512, 128, 4, 16, _SLOTS, "cuda", seed=2, prompt_len=200),
    "verify": lambda: T.make_verify_case(50, 6, 16, 512, 128, 256, _SLOTS, "cuda", seed=3),
    "unrelated_rows": lambda: T.make_sparse_mla_case(301, 16, 512, 384, _SLOTS, "cuda", seed=4, ragged=True,
                                                     empty_frac=0.05, empty_rows=(0, 1, 6, 300)),
    "duplicates_heads8": lambda: T.make_sparse_mla_case(263, 8, 512, 1024, _SLOTS, "cuda", seed=5, duplicates=True,
                                                        empty_rows=(7,)),
    "window_only_w128": lambda: T.make_prefill_case(700, 16, 512, 128, 0, 16, _SLOTS, "cuda", seed=7, prompt_len=300,
                                                    paged=64),   # a window-only layer: hash sets of 256 slots
    "heads4": lambda: T.make_prefill_case(300, 4, 512, 128, 2, 16, _SLOTS, "cuda", seed=6, prompt_len=150, paged=64),
}


@pytest.mark.parametrize("name", ["prefill_paged", "verify", "duplicates_heads8", "window_only_w128"])
def test_shared_keys_kernel_pipeline_shapes_agree(name):
    """The grouped kernel with one dequantizing warpgroup (the earlier default) and with the default
    two: the same dequantization and consumer code, only the producer split differs, so the outputs
    agree to rounding and both match the reference."""
    from deepinfer_kernels.tilelang._common import compile_cached
    from deepinfer_kernels.tilelang.shared_keys import shared_key_lists_tilelang
    from deepinfer_kernels.tilelang.sparse_mla import LOG2E, get_groups_kernel
    from deepinfer_kernels.tilelang.sparse_mla.common import NO_AUTO_SYNC
    from deepinfer_kernels.tilelang.sparse_mla.groups import PRODUCERS, _build_bulk_groups

    assert PRODUCERS == 2
    case = SHARED_KEY_CASES[name]()
    rows, heads, d = case.q.shape
    keys, counts = shared_key_lists_tilelang(case.indices)
    one_producer = compile_cached("sparse_mla_groups_test", (heads, d, 1),
                                  lambda: _build_bulk_groups(heads, d, producers=1), pass_configs=NO_AUTO_SYNC)
    outs = []
    for kernel in (one_producer, get_groups_kernel(heads, d)):
        out = torch.empty_like(case.q)
        lse = torch.empty(rows, heads, dtype=torch.float32, device="cuda")
        kernel(case.q, case.pool, keys, counts, out, lse, case.sm_scale * LOG2E)
        outs.append((out, lse))
    torch.cuda.synchronize()
    for out, lse in outs:
        T.check_sparse_mla(case, out, lse)
    (one_out, one_lse), (two_out, two_lse) = outs
    torch.testing.assert_close(two_out.float(), one_out.float(), atol=1e-2, rtol=1e-2)
    fin = torch.isfinite(one_lse)
    assert torch.equal(fin, torch.isfinite(two_lse))
    torch.testing.assert_close(two_lse[fin], one_lse[fin], atol=1e-5, rtol=1e-6)


@pytest.mark.parametrize("group_rows", [2, 4])
@pytest.mark.parametrize("name", list(SHARED_KEY_CASES))
def test_shared_key_lists_kernel_equals_reference(name, group_rows):
    from deepinfer_kernels.ops.shared_keys import shared_key_lists_ref
    from deepinfer_kernels.tilelang.shared_keys import shared_key_lists_tilelang

    case = SHARED_KEY_CASES[name]()
    keys, counts = shared_key_lists_tilelang(case.indices, group_rows)
    want_keys, want_counts = shared_key_lists_ref(case.indices, group_rows)
    torch.cuda.synchronize()
    assert torch.equal(counts, want_counts)
    assert torch.equal(keys, want_keys)


@pytest.mark.parametrize("group_rows", [2, 4])
@pytest.mark.parametrize("name", list(SHARED_KEY_CASES))
def test_shared_keys_sparse_mla_matches_reference(name, group_rows, monkeypatch):
    """Row pairs / quads attending their shared key list (``shared_keys=True`` at prefill sizes)
    give the reference's result, and the per-row kernel's up to float rounding (the keys come in
    the group list's order). Quads where 16 heads allow them, pairs otherwise."""
    from deepinfer_kernels.envs import SPARSE_MLA_GROUP_ROWS_ENV as GROUP_ROWS_ENV
    from deepinfer_kernels.tilelang.sparse_mla import (
        _uses_groups_kernel,
        _uses_quads_kernel,
        plan,
        sparse_mla_attention_tilelang,
    )

    monkeypatch.setenv(GROUP_ROWS_ENV, str(group_rows))
    case = SHARED_KEY_CASES[name]()
    rows, heads, d = case.q.shape
    width = case.indices.shape[1]
    ns = plan(rows, heads, d, width, 132, None, "bulk")["num_splits"]
    assert _uses_groups_kernel("bulk", rows, heads, width, ns, case.pool.shape[0], True)
    assert _uses_quads_kernel("bulk", rows, heads, width, ns, case.pool.shape[0], True) == (
        group_rows == 4 and heads == 16 and width <= 512)
    out, lse = sparse_mla_attention_tilelang(case.q, case.pool, case.indices, case.sm_scale, variant="bulk",
                                             shared_keys=True)
    row_out, row_lse = sparse_mla_attention_tilelang(case.q, case.pool, case.indices, case.sm_scale, variant="bulk")
    torch.cuda.synchronize()
    T.check_sparse_mla(case, out, lse)
    torch.testing.assert_close(out.float(), row_out.float(), atol=1e-2, rtol=1e-2)
    fin = torch.isfinite(row_lse)
    assert torch.equal(fin, torch.isfinite(lse))
    torch.testing.assert_close(lse[fin], row_lse[fin], atol=1e-4, rtol=1e-5)
