"""rope_inplace: the in-place reference equals the out-of-place formula bit for bit (CPU); the
TileLang kernel equals the reference bit for bit (GPU)."""

import pytest
import torch

from deepinfer_kernels.ops.rope import rope_inplace, rope_inplace_ref


def _table(n, r, seed, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    pos = torch.randint(0, 60000, (n,), generator=g).float()
    inv = 10000.0 ** (-torch.arange(r // 2, dtype=torch.float32) * 2 / r)
    ang = pos.unsqueeze(1) * inv
    cos, sin = ang.cos(), ang.sin()
    return torch.cat([cos, cos], -1).to(device), torch.cat([-sin, sin], -1).to(device)


def _formula(x, cos_full, sin_signed):
    r = cos_full.shape[1]
    xf = x[..., x.shape[-1] - r:].float()
    rot = torch.cat([xf[..., r // 2:], xf[..., : r // 2]], -1)
    out = x.clone()
    out[..., x.shape[-1] - r:] = (xf * cos_full.unsqueeze(1) + rot * sin_signed.unsqueeze(1)).to(x.dtype)
    return out


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("n,h,d,r", [(5, 16, 512, 64), (3, 1, 64, 16), (0, 4, 32, 8), (7, 3, 16, 16)])
def test_reference_is_the_formula_in_place(dtype, n, h, d, r):
    cos_full, sin_signed = _table(n, r, seed=n + h)
    x = (torch.randn(n, h, d, generator=torch.Generator().manual_seed(d)) * 4).to(dtype)
    want = _formula(x, cos_full, sin_signed)
    got = rope_inplace(x, cos_full, sin_signed)
    assert got.data_ptr() == x.data_ptr() and torch.equal(got, want)


def test_bad_inputs_name_the_field():
    cos_full, sin_signed = _table(4, 8, seed=1)
    x = torch.randn(4, 2, 16)
    with pytest.raises(ValueError, match="cos_full"):
        rope_inplace(x, cos_full[:, :7], sin_signed[:, :7])
    with pytest.raises(ValueError, match="contiguous"):
        rope_inplace(torch.randn(4, 16, 2).transpose(1, 2), cos_full, sin_signed)
    with pytest.raises(ValueError, match="sin_signed"):
        rope_inplace(x, cos_full, sin_signed[:3])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("n,h,d,r", [(1, 17, 512, 64), (300, 16, 512, 64), (9, 1, 512, 64), (5, 8, 128, 32)])
def test_tilelang_kernel_equals_reference(dtype, n, h, d, r):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    pytest.importorskip("tilelang")
    from deepinfer_kernels.tilelang.rope import rope_inplace_tilelang

    cos_full, sin_signed = _table(n, r, seed=n, device="cuda")
    x = (torch.randn(n, h, d, generator=torch.Generator().manual_seed(n + d)) * 4).to(dtype).cuda()
    want = rope_inplace_ref(x.clone(), cos_full, sin_signed)
    assert torch.equal(rope_inplace_tilelang(x, cos_full, sin_signed), want)
