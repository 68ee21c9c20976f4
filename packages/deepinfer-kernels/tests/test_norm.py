"""RMSNorm op (`deepinfer_kernels.ops.norm`): the reference, the dispatcher's checks, the CPU path."""

import pytest
import torch

from deepinfer_kernels.ops.norm import rms_norm, rms_norm_ref


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_reference_is_the_float32_formula(dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 3, 64, generator=g).to(dtype)
    w = torch.randn(64, generator=g)
    x64 = x.double()
    truth = x64 / torch.sqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()
    got = rms_norm_ref(x, w, 1e-6)
    assert got.dtype == dtype and got.shape == x.shape
    torch.testing.assert_close(got.double(), truth.to(dtype).double(), rtol=2.0 ** -7, atol=1e-6)
    assert torch.equal(rms_norm(x, w, 1e-6), got)      # CPU: the reference itself


def test_bad_weight_names_the_field():
    x = torch.zeros(2, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="weight: expected \\[64\\]"):
        rms_norm(x, torch.ones(32), 1e-6)
    with pytest.raises(ValueError, match="weight: expected 1 dims"):
        rms_norm(x, torch.ones(1, 64), 1e-6)


def test_add_rms_norm_is_the_add_then_the_norm():
    from deepinfer_kernels.ops.norm import add_rms_norm, rms_norm

    x = torch.randn(4, 64).to(torch.bfloat16)
    r = torch.randn(4, 64).to(torch.bfloat16)
    w = torch.rand(64) + 0.5
    s, y = add_rms_norm(x, r, w, 1e-6)
    assert torch.equal(s, x + r) and torch.equal(y, rms_norm(x + r, w, 1e-6))
    with pytest.raises(ValueError, match="residual"):
        add_rms_norm(x, r[:, :32], w, 1e-6)
