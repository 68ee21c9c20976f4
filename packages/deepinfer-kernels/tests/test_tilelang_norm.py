"""GPU tests: the TileLang mixed-dtype RMSNorm against `rms_norm_ref` (float32 math, rounding apart)."""

import pytest
import torch

pytestmark = pytest.mark.gpu

ref = pytest.importorskip("deepinfer_kernels.ops.norm")


@pytest.mark.parametrize("d", [64, 192, 448, 1024, 3072])
@pytest.mark.parametrize("dtype, weight_dtype", [(torch.bfloat16, torch.float32), (torch.float16, torch.float32),
                                                 (torch.bfloat16, torch.bfloat16)])
@pytest.mark.parametrize("rows", [1, 5, 1027])
def test_rms_norm_matches_reference(d, dtype, weight_dtype, rows):
    from deepinfer_kernels.tilelang.norm import rms_norm_tilelang

    g = torch.Generator(device="cuda").manual_seed(d + rows)
    x = (torch.randn(rows, d, device="cuda", generator=g) * torch.logspace(-2, 2, rows, device="cuda")[:, None])
    x = x.to(dtype)
    w = torch.randn(d, device="cuda", generator=g).to(weight_dtype)
    got = rms_norm_tilelang(x, w, 1e-6)
    want = ref.rms_norm_ref(x, w, 1e-6)
    assert got.dtype == dtype and got.shape == x.shape
    ulp = 2.0 ** -7 if dtype == torch.bfloat16 else 2.0 ** -10
    torch.testing.assert_close(got.float(), want.float(), rtol=ulp, atol=1e-6)
    assert (got == want).float().mean() > 0.95      # the same value but for rounding near-ties


def test_rms_norm_keeps_leading_dims_and_dispatches():
    from deepinfer_kernels.tilelang.norm import rms_norm_tilelang

    x = torch.randn(3, 7, 256, device="cuda").to(torch.bfloat16)
    w = torch.rand(256, device="cuda") + 0.5
    got = rms_norm_tilelang(x, w, 1e-5)
    assert got.shape == (3, 7, 256)
    torch.testing.assert_close(got.float(), ref.rms_norm_ref(x, w, 1e-5).float(), rtol=2.0 ** -7, atol=1e-6)
    assert torch.equal(ref.rms_norm(x, w, 1e-5), got)   # the op picks the kernel on SM90
    assert rms_norm_tilelang(x[:0], w, 1e-5).shape == (0, 7, 256)


def test_rms_norm_reads_a_column_slice_in_place():
    """A column slice of a wider output (the fused projections' q_a / KV latent) gives exactly the
    contiguous copy's result."""
    from deepinfer_kernels.tilelang.norm import rms_norm_tilelang

    g = torch.Generator(device="cuda").manual_seed(7)
    wide = torch.randn(33, 1552, device="cuda", generator=g).to(torch.bfloat16)
    w = torch.randn(448, device="cuda", generator=g)
    for start in (0, 1040):
        view = wide[:, start: start + 448]
        assert not view.is_contiguous()
        assert torch.equal(rms_norm_tilelang(view, w, 1e-6), rms_norm_tilelang(view.contiguous(), w, 1e-6))


@pytest.mark.parametrize("d,rows", [(1024, 1), (1024, 67), (192, 5), (3072, 1), (3072, 9)])
def test_add_rms_norm_equals_the_add_then_the_norm_bit_for_bit(d, rows):
    from deepinfer_kernels.tilelang.norm import add_rms_norm_tilelang, rms_norm_tilelang

    g = torch.Generator(device="cuda").manual_seed(d + rows)
    x = (torch.randn(rows, d, device="cuda", generator=g) * 3).to(torch.bfloat16)
    r = torch.randn(rows, d, device="cuda", generator=g).to(torch.bfloat16)
    w = torch.randn(d, device="cuda", generator=g)
    s, y = add_rms_norm_tilelang(x, r, w, 1e-6)
    assert torch.equal(s, x + r)
    assert torch.equal(y, rms_norm_tilelang(x + r, w, 1e-6))
