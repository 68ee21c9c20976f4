import pytest
import torch

from deepinfer_kernels.ops.kv_fp4 import (
    E2M1_VALUES,
    _e2m1_values,
    dequantize_index_k_fp4,
    fp4_record_bytes,
    quantize_index_k_fp4,
    store_index_k_fp4,
)
from deepinfer_kernels.ops.kv_fp8 import (
    dequantize_kv_fp8,
    fp8_record_bytes,
    quantize_kv_fp8,
    store_kv_fp8,
    store_normed_kv_fp8,
)
from deepinfer_kernels.ops.norm import rms_norm_ref


def test_record_sizes():
    assert fp8_record_bytes(512) == 528
    assert fp4_record_bytes(128) == 68
    with pytest.raises(ValueError, match="multiple of 32"):
        fp8_record_bytes(100)


def test_fp8_roundtrip_error_and_layout():
    g = torch.Generator().manual_seed(0)
    kv = torch.randn(7, 512, generator=g) * torch.logspace(-3, 2, 7).unsqueeze(1)
    rec = quantize_kv_fp8(kv)
    assert rec.shape == (7, 528) and rec.dtype == torch.uint8
    back = dequantize_kv_fp8(rec, 512)
    # e4m3 has 3 mantissa bits: relative error <= 2^-4 of the group's scale-relative value.
    groups = kv.reshape(7, 16, 32)
    err = (back - kv).abs().reshape(7, 16, 32)
    assert bool((err <= groups.abs() * 2**-4 + 1e-30).all())
    # Scale bytes are power-of-two exponents: amax/2^e lies in (224, 448].
    e = rec[:, 512:].int() - 127
    ratio = groups.abs().amax(-1) / torch.exp2(e.float())
    assert bool(((ratio > 224) & (ratio <= 448)).all())


def test_fp8_zero_and_exact_values():
    kv = torch.zeros(2, 64)
    kv[1, :32] = torch.tensor([1.0, -2.0, 0.5, 448.0] * 8)
    back = dequantize_kv_fp8(quantize_kv_fp8(kv), 64)
    assert torch.equal(back, kv)


def test_store_fp8_skips_negative_slots():
    pool = torch.zeros(10, 66, dtype=torch.uint8)
    kv = torch.randn(3, 64)
    store_kv_fp8(kv, pool, torch.tensor([4, -1, 7]))
    assert torch.equal(pool[4], quantize_kv_fp8(kv[:1])[0])
    assert torch.equal(pool[7], quantize_kv_fp8(kv[2:])[0])
    untouched = [i for i in range(10) if i not in (4, 7)]
    assert int(pool[untouched].sum()) == 0
    with pytest.raises(ValueError, match="pool"):
        store_kv_fp8(kv, torch.zeros(10, 65, dtype=torch.uint8), torch.tensor([0, 1, 2]))


def test_store_normed_fp8_is_norm_cat_store():
    """The MLA latent store (CPU: the reference composition): the first norm_dim values normed and
    rounded to kv's dtype, the rest as they are, read from a column slice of a wider row; bad
    norm_dim / weight widths name the field."""
    g = torch.Generator().manual_seed(2)
    fused = torch.randn(5, 40 + 128, generator=g).to(torch.bfloat16)
    kv, w = fused[:, 40:], torch.rand(96, generator=g) + 0.5
    pool, want = torch.zeros(8, 132, dtype=torch.uint8), torch.zeros(8, 132, dtype=torch.uint8)
    slots = torch.tensor([3, -1, 0, 7, 5])
    store_normed_kv_fp8(kv, w, 1e-6, 96, pool, slots)
    store_kv_fp8(torch.cat([rms_norm_ref(kv[:, :96], w, 1e-6), kv[:, 96:]], -1), want, slots)
    assert torch.equal(pool, want) and int(pool[[1, 2, 4, 6]].sum()) == 0
    with pytest.raises(ValueError, match="norm_dim"):
        store_normed_kv_fp8(kv, w, 1e-6, 128, pool, slots)
    with pytest.raises(ValueError, match="norm_weight"):
        store_normed_kv_fp8(kv, w[:64], 1e-6, 96, pool, slots)


def test_store_normed_fp8_with_rope_rotates_the_tail_of_a_copy():
    """`rope`: the record of the latent whose last r columns went through `rope_inplace` first
    (CPU: the reference composition); kv is not written; a rotary width reaching into the normed
    columns, or tables of the wrong rows, name the field."""
    from deepinfer_kernels.ops.rope import rope_inplace_ref

    g = torch.Generator().manual_seed(3)
    one = torch.randn(1, 128, generator=g).to(torch.bfloat16)   # one row: a slice of it is "contiguous"
    one_before, one_pool = one.clone(), torch.zeros(2, 99, dtype=torch.uint8)
    store_normed_kv_fp8(one[:, 32:], torch.ones(64), 1e-6, 64, one_pool, torch.tensor([1]),
                        rope=(torch.zeros(1, 32), torch.ones(1, 32)))   # a rotation by pi / 2
    assert torch.equal(one, one_before)
    fused = torch.randn(5, 40 + 128, generator=g).to(torch.bfloat16)
    kv, w = fused[:, 40:], torch.rand(96, generator=g) + 0.5
    ang = torch.rand(5, 8, generator=g) * 50
    cos, sin = torch.cat([ang.cos(), ang.cos()], -1), torch.cat([-ang.sin(), ang.sin()], -1)   # r = 16
    slots = torch.tensor([3, -1, 0, 7, 5])
    pool, want = torch.zeros(8, 132, dtype=torch.uint8), torch.zeros(8, 132, dtype=torch.uint8)
    before = fused.clone()
    store_normed_kv_fp8(kv, w, 1e-6, 96, pool, slots, rope=(cos, sin))
    tail = rope_inplace_ref(kv[:, 96:].clone().unsqueeze(1), cos, sin).squeeze(1)   # the last 16 of 32 rotated
    store_kv_fp8(torch.cat([rms_norm_ref(kv[:, :96], w, 1e-6), tail], -1), want, slots)
    assert torch.equal(pool, want) and torch.equal(fused, before)
    assert not torch.equal(tail, kv[:, 96:])
    wide = torch.ones(5, 48)
    with pytest.raises(ValueError, match="cos_full"):
        store_normed_kv_fp8(kv, w, 1e-6, 96, pool, slots, rope=(wide, wide))
    with pytest.raises(ValueError, match="cos_full"):
        store_normed_kv_fp8(kv, w, 1e-6, 96, pool, slots, rope=(cos[:4], sin[:4]))


def test_fp4_exact_grid_and_ties():
    # Scale exponent e = ceil(log2(6/6)) = 0 when the group max is 6.
    vals = torch.tensor(list(E2M1_VALUES) + [-v for v in E2M1_VALUES] + [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]
                        + [6.0] * 9)
    k = vals.reshape(1, 32)
    back = dequantize_index_k_fp4(quantize_index_k_fp4(k), 32)
    assert back[0, :16].tolist() == vals[:16].tolist()
    assert back[0, 16:23].tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]


def test_fp4_roundtrip_error_and_store():
    g = torch.Generator().manual_seed(1)
    k = torch.randn(5, 128, generator=g)
    rec = quantize_index_k_fp4(k)
    assert rec.shape == (5, 68)
    back = dequantize_index_k_fp4(rec, 128)
    scale = torch.exp2((rec[:, 64:].int() - 127).float()).repeat_interleave(32, dim=1)
    # Nearest e2m1 point: error <= half the widest gap (2 at the top) times the scale.
    assert bool(((back - k).abs() <= scale * 1.0 + 1e-6).all())
    pool = torch.zeros(8, 68, dtype=torch.uint8)
    store_index_k_fp4(k, pool, torch.tensor([0, -1, 3, -1, 5]))
    assert torch.equal(pool[[0, 3, 5]], rec[[0, 2, 4]])
    assert int(pool[[1, 2, 4, 6, 7]].sum()) == 0


def test_fp4_value_table_is_computed_exactly():
    # the dequantiser computes the e2m1 grid (no constant tensor: capturable on CUDA)
    assert _e2m1_values(torch.arange(8)).tolist() == list(E2M1_VALUES)
    packed = torch.arange(256, dtype=torch.uint8).reshape(16, 16)       # every byte value once
    rec = torch.cat([packed, torch.full((16, 1), 127, dtype=torch.uint8)], dim=1)
    vals = dequantize_index_k_fp4(rec, 32)
    codes = torch.stack([packed & 0xF, packed >> 4], -1).reshape(16, 32).long()
    table = torch.tensor(E2M1_VALUES)
    assert torch.equal(vals, table[codes & 7] * torch.where(codes >= 8, -1.0, 1.0))
