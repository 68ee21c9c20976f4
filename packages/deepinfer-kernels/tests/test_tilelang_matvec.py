"""GPU tests: the one-row linear layer (TileLang matrix-vector kernel) against float32 F.linear,
and the public `linear` op's choice between it and cuBLAS."""

import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("n,k", [(1024, 8192), (8192, 384), (1552, 1024), (5632, 1024), (1024, 2816), (384, 1024),
                                 (8, 1024), (1088, 1024)])   # `mini`'s batch-1 projections
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_matvec_matches_float32_linear(n, k, dtype):
    from deepinfer_kernels.tilelang.matvec import matvec_tilelang

    g = torch.Generator().manual_seed(n + k)
    x = torch.randn(1, k, generator=g).to(dtype).cuda()
    w = (torch.randn(n, k, generator=g) * k ** -0.5).to(dtype).cuda()
    got = matvec_tilelang(x, w)
    want = F.linear(x.float(), w.float())
    torch.cuda.synchronize()
    assert got.shape == (1, n) and got.dtype == dtype
    torch.testing.assert_close(got.float(), want, atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(matvec_tilelang(x.view(1, 1, k), w).view(1, n), got, atol=0, rtol=0)   # [..., K]


@pytest.mark.parametrize("n,k", [(8064, 3072), (8192, 1024), (3072, 32768), (5632, 1024), (24576, 2048),
                                 (32000, 1024)])
def test_matvec_one_wave_tiles_match_float32_linear(n, k):
    """The one-wave tiles (flash's MoE input, indexer query and o_proj, `mini`'s dense gate/up, a
    64-row tile with 128-wide stages, `mini`'s lm_head: 128 rows, 64-wide stages) and the tiles
    before that rule both close to float32 F.linear."""
    from deepinfer_kernels.tilelang.matvec import _kernel, pick_tiles

    assert pick_tiles(n, k) != pick_tiles(n, k, one_wave=False)
    g = torch.Generator().manual_seed(n * 7 + k)
    x = torch.randn(1, k, generator=g).to(torch.bfloat16).cuda()
    w = (torch.randn(n, k, generator=g) * k ** -0.5).to(torch.bfloat16).cuda()
    want = F.linear(x.float(), w.float())
    for one_wave in (True, False):
        got = torch.empty(1, n, dtype=torch.bfloat16, device="cuda")
        _kernel(n, k, torch.bfloat16, one_wave=one_wave)(x, w, got)
        torch.cuda.synchronize()
        torch.testing.assert_close(got.float(), want, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("n,k", [(1552, 1024), (8192, 64), (8064, 3072)])
def test_matvec_float32_output_is_the_widened_projection(n, k):
    """``out_dtype=torch.float32`` (the logits): the bf16 output's values widened, bit for bit, with
    and without the norm in the prologue, and through the public ops."""
    from deepinfer_kernels.ops.linear import linear, rms_norm_linear
    from deepinfer_kernels.tilelang.matvec import matvec_tilelang, rms_norm_matvec_tilelang

    g = torch.Generator().manual_seed(n + 3 * k)
    x = torch.randn(1, k, generator=g).to(torch.bfloat16).cuda()
    w = (torch.randn(n, k, generator=g) * k ** -0.5).to(torch.bfloat16).cuda()
    nw = (torch.rand(k, generator=g) + 0.5).cuda()
    got = matvec_tilelang(x, w, out_dtype=torch.float32)
    assert got.dtype == torch.float32 and torch.equal(got, matvec_tilelang(x, w).float())
    assert torch.equal(linear(x, w, out_dtype=torch.float32), got)
    normed = rms_norm_matvec_tilelang(x, nw, 1e-6, w, out_dtype=torch.float32).y
    assert normed.dtype == torch.float32 and torch.equal(normed, rms_norm_matvec_tilelang(x, nw, 1e-6, w).y.float())
    assert torch.equal(rms_norm_linear(x, nw, 1e-6, w, out_dtype=torch.float32).y, normed)
    with pytest.raises(ValueError, match="out_dtype"):
        matvec_tilelang(x, w, out_dtype=torch.float16)


def test_linear_takes_the_kernel_for_one_row_only():
    from deepinfer_kernels.ops.linear import MATVEC_MAX_WEIGHT_BYTES, linear
    from deepinfer_kernels.tilelang.matvec import matvec_tilelang

    g = torch.Generator().manual_seed(3)
    w = (torch.randn(1024, 8192, generator=g) * 0.01).to(torch.bfloat16).cuda()
    x = torch.randn(2, 8192, generator=g).to(torch.bfloat16).cuda()
    assert torch.equal(linear(x[:1], w), matvec_tilelang(x[:1], w))       # one row: the kernel
    assert torch.equal(linear(x, w), F.linear(x, w))                      # two rows: cuBLAS
    big = torch.zeros(MATVEC_MAX_WEIGHT_BYTES // 2048 + 8, 1024, dtype=torch.bfloat16, device="cuda")
    assert torch.equal(linear(x[:1, :1024], big), F.linear(x[:1, :1024], big))   # past the size limit
    wg = w.detach().clone().requires_grad_(True)
    y = linear(x[:1], wg)                                                 # autograd: cuBLAS, differentiable
    assert y.grad_fn is not None and torch.equal(y.detach(), F.linear(x[:1], w))


def test_linear_takes_the_kernel_above_the_size_limit_with_several_steps():
    """A 37 MB weight with K = 3072 (three pipeline steps of 1024 per CTA): the kernel, close to float32."""
    from deepinfer_kernels.ops.linear import MATVEC_MAX_WEIGHT_BYTES, linear
    from deepinfer_kernels.tilelang.matvec import matvec_tilelang

    g = torch.Generator().manual_seed(5)
    w = (torch.randn(6000, 3072, generator=g) * 3072 ** -0.5).to(torch.bfloat16).cuda()
    x = torch.randn(1, 3072, generator=g).to(torch.bfloat16).cuda()
    assert w.numel() * 2 > MATVEC_MAX_WEIGHT_BYTES
    got = linear(x, w)
    assert torch.equal(got, matvec_tilelang(x, w))
    torch.testing.assert_close(got.float(), F.linear(x.float(), w.float()), atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("n,k", [(1088, 1024), (5632, 1024), (3072, 3072), (8192, 3072), (384, 2048)])
@pytest.mark.parametrize("add", [False, True])
@pytest.mark.parametrize("w_dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_matvec_equals_the_norm_then_the_matvec_bit_for_bit(n, k, add, w_dtype):
    """The layer input's norm in the matrix-vector kernel's prologue (`mini`'s fused input at K = 1024,
    one warp per row; flash's at K = 3072 and 2,048, the norm kernel's whole-CTA rows): the output, the
    sum (with a residual) and the normed row (asked with one) equal `rms_norm_tilelang` /
    `add_rms_norm_tilelang` then `matvec_tilelang`, bit for bit, and the public op takes the kernel."""
    from deepinfer_kernels.ops.linear import rms_norm_linear
    from deepinfer_kernels.tilelang.matvec import matvec_tilelang, rms_norm_matvec_tilelang
    from deepinfer_kernels.tilelang.norm import add_rms_norm_tilelang, rms_norm_tilelang

    g = torch.Generator().manual_seed(n + k + add)
    x = (torch.randn(1, k, generator=g) * 2).to(torch.bfloat16).cuda()
    res = torch.randn(1, k, generator=g).to(torch.bfloat16).cuda() if add else None
    nw = (torch.rand(k, generator=g) + 0.5).to(w_dtype).cuda()
    w = (torch.randn(n, k, generator=g) * k ** -0.5).to(torch.bfloat16).cuda()
    if add:
        want_s, u = add_rms_norm_tilelang(x, res, nw, 1e-6)
    else:
        want_s, u = None, rms_norm_tilelang(x, nw, 1e-6)
    want = matvec_tilelang(u, w)
    got = rms_norm_matvec_tilelang(x, nw, 1e-6, w, res, return_normed=add)
    op = rms_norm_linear(x, nw, 1e-6, w, res)
    torch.cuda.synchronize()
    assert torch.equal(got.y, want) and torch.equal(op.y, want)
    if add:
        assert torch.equal(got.s, want_s) and torch.equal(op.s, want_s) and torch.equal(got.u, u)
    else:
        assert got.s is None and got.u is None and op.s is None
