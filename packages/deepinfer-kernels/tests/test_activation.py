"""silu_mul: the reference is torch's `F.silu(gate) * up` (CPU), bad operands are named."""

import pytest
import torch
import torch.nn.functional as F

from deepinfer_kernels.ops.activation import silu_mul, silu_mul_ref


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_mul_is_torchs_formula_on_column_slices(dtype):
    gu = (torch.randn(5, 64, generator=torch.Generator().manual_seed(0)) * 3).to(dtype)
    gate, up = gu[:, :32], gu[:, 32:]
    want = F.silu(gate) * up
    assert torch.equal(silu_mul_ref(gate, up), want)
    got = silu_mul(gate, up)
    assert torch.equal(got, want) and got.dtype == dtype


def test_silu_mul_keeps_gradients():
    gate = torch.randn(3, 16, requires_grad=True)
    up = torch.randn(3, 16, requires_grad=True)
    silu_mul(gate, up).sum().backward()
    assert gate.grad is not None and up.grad is not None


def test_silu_mul_names_bad_operands():
    with pytest.raises(ValueError, match="up"):
        silu_mul(torch.randn(2, 8), torch.randn(2, 16))
    with pytest.raises(ValueError, match="up"):
        silu_mul(torch.randn(2, 8), torch.randn(2, 8, dtype=torch.float64))
