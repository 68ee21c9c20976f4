"""GPU test: RMSNorm's fused CUDA path (torch's kernel) against the float32 formula it replaces."""

import pytest
import torch

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("weight_dtype", [torch.float32, None])    # None: the input's dtype (a bf16 model)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_cuda_rms_norm_matches_the_float32_formula(dtype, weight_dtype):
    from deepinfer_kernels.batch_invariant import batch_invariant_kernels
    from deepinfer_model.modules.norm import rms_norm

    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(300, 1024, device="cuda", generator=g).to(dtype)
    w = torch.randn(1024, device="cuda", generator=g).to(weight_dtype or dtype)
    got = rms_norm(x, w, 1e-6)
    with batch_invariant_kernels():   # the explicit formula (what the CPU and invariant mode run)
        want = rms_norm(x, w, 1e-6)
    assert got.dtype == dtype and got.shape == x.shape
    ulp = 2.0 ** -7 if dtype == torch.bfloat16 else 2.0 ** -20
    torch.testing.assert_close(got.float(), want.float(), rtol=ulp, atol=1e-6)
