"""GPU tests: the TileLang SwiGLU activation against torch's `F.silu(gate) * up` (both roundings)."""

import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.gpu

ops = pytest.importorskip("deepinfer_kernels.ops.activation")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows,inter", [(1, 512), (7, 2816), (1025, 48), (3, 26880)])
@pytest.mark.parametrize("lead", [64, 3])     # 3: slices off the 16-byte alignment the vector loads need (copied)
def test_silu_mul_matches_torch_on_slices_of_the_fused_output(dtype, rows, inter, lead):
    from deepinfer_kernels.tilelang.activation import silu_mul_tilelang

    g = torch.Generator(device="cuda").manual_seed(rows + inter)
    wide = (torch.randn(rows, lead + 2 * inter, device="cuda", generator=g) * 4).to(dtype)   # router | gate | up
    gate, up = wide[:, lead: lead + inter], wide[:, lead + inter:]
    got = silu_mul_tilelang(gate, up)
    want = F.silu(gate) * up
    assert got.shape == want.shape and got.dtype == dtype and got.is_contiguous()
    ulp = 2.0 ** -7 if dtype == torch.bfloat16 else 2.0 ** -10
    torch.testing.assert_close(got.float(), want.float(), rtol=2 * ulp, atol=1e-6)
    assert (got == want).float().mean() > 0.99      # exp rounding apart, the same value
    assert torch.equal(silu_mul_tilelang(gate.contiguous(), up.contiguous()), got)


def test_silu_mul_dispatches_to_the_kernel_without_grad_only():
    gate = torch.randn(4, 64, device="cuda").to(torch.bfloat16)
    up = torch.randn(4, 64, device="cuda").to(torch.bfloat16)
    from deepinfer_kernels.tilelang.activation import silu_mul_tilelang

    assert torch.equal(ops.silu_mul(gate, up), silu_mul_tilelang(gate, up))
    gate.requires_grad_(True)
    ops.silu_mul(gate, up).float().sum().backward()                   # the reference: differentiable
    assert gate.grad is not None
