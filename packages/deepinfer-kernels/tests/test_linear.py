"""CPU tests: the `linear` op (F.linear off SM90) and the matrix-vector kernel's tile choice."""

import torch
import torch.nn.functional as F

from deepinfer_kernels.ops.linear import linear
from deepinfer_kernels.tilelang.matvec import MIN_CTAS, STAGE_ELEMENTS, pick_tiles


def test_linear_is_f_linear_on_the_cpu():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(48, 64, generator=g).to(torch.bfloat16)
    for x in (torch.randn(1, 64, generator=g), torch.randn(3, 2, 64, generator=g)):
        x = x.to(torch.bfloat16)
        assert torch.equal(linear(x, w), F.linear(x, w))


def test_matvec_tiles():
    """16 KB stages (bn * bk = STAGE_ELEMENTS), the widest K tile dividing K, output tiles halved
    down to 4 rows until the grid has MIN_CTAS CTAs; None when no tile divides the weight."""
    assert pick_tiles(1024, 8192) == (4, 2048)          # o_proj: 256 CTAs
    assert pick_tiles(8192, 384) == (16, 128)           # q_b: 512 CTAs (a 256-wide stage does not divide K)
    assert pick_tiles(5632, 1024, one_wave=False) == (8, 1024)   # dense gate/up: 704 CTAs
    bn, bk = pick_tiles(1024, 2816)                      # 2816 = 11 x 256
    assert bk == 256 and bn == 4 and bn * bk <= STAGE_ELEMENTS
    assert 65536 // pick_tiles(65536, 1024)[0] >= MIN_CTAS
    assert pick_tiles(1024, 1000) is None                # K not a multiple of 64
    assert pick_tiles(1, 1024) is None and pick_tiles(6, 1024) is None


def test_matvec_tiles_fit_one_resident_wave_where_they_can():
    """A grid over RESIDENT_CTAS gets taller tiles with narrower stages (>= ONE_WAVE_MIN_BK) until it
    is one wave; weights too tall for that keep the first tiles."""
    from deepinfer_kernels.tilelang.matvec import ONE_WAVE_MIN_BK, RESIDENT_CTAS

    assert pick_tiles(5632, 1024) == (16, 512)          # mini's dense gate/up: 704 -> 352 CTAs x 2 steps
    assert pick_tiles(8064, 3072) == (32, 256)          # flash's MoE input: 1,008 x 3 -> 252 x 12
    assert pick_tiles(8192, 1024) == (32, 256)          # flash's indexer query: 1,024 x 1 -> 256 x 4
    assert pick_tiles(3072, 32768) == (8, 1024)         # flash's o_proj: 768 x 16 -> 384 x 32
    assert pick_tiles(3072, 32768, one_wave=False) == (4, 2048)
    assert pick_tiles(32768, 1024) == (128, 64)         # flash's q_b: 4,096 x 1 -> 256 x 16
    assert pick_tiles(32000, 1024) == (128, 64)         # mini's lm_head: 4,000 x 1 -> 250 x 16
    for n, k in ((129280, 3072), (53760, 3072)):        # too tall: unchanged
        assert pick_tiles(n, k) == pick_tiles(n, k, one_wave=False)
    assert pick_tiles(1552, 1024) == (4, 256 * 4) == pick_tiles(1552, 1024, one_wave=False)   # 388 CTAs: fits
    for n, k in ((5632, 1024), (8064, 3072), (8192, 1024), (3072, 32768), (4096, 4096), (24576, 2048)):
        bn, bk = pick_tiles(n, k)
        assert bn * bk == STAGE_ELEMENTS and n % bn == 0 and k % bk == 0 and bk >= ONE_WAVE_MIN_BK
        assert n // bn <= RESIDENT_CTAS


def test_linear_launcher_is_the_matvec_kernel():
    """`linear` asks `tilelang_launcher("linear", ...)`: the registry resolves it to the kernel."""
    from deepinfer_kernels.tilelang import get_launcher
    from deepinfer_kernels.tilelang.matvec import matvec_tilelang

    assert get_launcher("linear") is matvec_tilelang


def test_matvec_serves_large_weights_only_with_several_pipeline_steps():
    """Up to 32 MB every tileable weight; above, only weights whose CTAs stream >= 3 pipeline steps of
    K on the tiles the kernel runs (one-wave): flash's o_proj, dense FFN and lm_head, and K = 1024
    weights that fit one wave of 64-wide stages (q_b, `mini`'s lm_head: 16 steps); not a K = 1024
    weight too tall for one wave (its CTAs keep one step of K)."""
    from deepinfer_kernels.ops.linear import MATVEC_MAX_WEIGHT_BYTES, matvec_serves
    from deepinfer_kernels.tilelang.matvec import pick_tiles

    def serves(n, k):
        return matvec_serves(n, k, n * k * 2)

    assert serves(1024, 8192) and serves(8192, 1024)                  # mini-size: <= 32 MB
    assert serves(3072, 32768) and serves(53760, 3072) and serves(3072, 26880) and serves(129280, 3072)
    assert serves(32768, 1024) and serves(32000, 1024)                # > 32 MB, 16 steps of 64 a CTA
    assert pick_tiles(32000, 1024) == (128, 64)
    assert not serves(129280, 1024) and pick_tiles(129280, 1024) == (8, 1024)   # > 32 MB, one step of K
    assert not serves(8065, 3072)                                     # no tile divides it
    assert 32768 * 1024 * 2 > MATVEC_MAX_WEIGHT_BYTES


def test_rms_norm_linear_is_the_norm_then_the_projection_on_the_cpu():
    """The fused op's reference: the norm (after the residual add) then the projection, each the public
    op; the sum with a residual, the normed rows when asked, None otherwise."""
    from deepinfer_kernels.ops.linear import linear, rms_norm_linear
    from deepinfer_kernels.ops.norm import rms_norm

    g = torch.Generator().manual_seed(5)
    x, res = torch.randn(1, 64, generator=g).bfloat16(), torch.randn(1, 64, generator=g).bfloat16()
    nw, w = torch.rand(64, generator=g) + 0.5, torch.randn(48, 64, generator=g).bfloat16()
    p = rms_norm_linear(x, nw, 1e-6, w)
    assert p.s is None and p.u is None and torch.equal(p.y, linear(rms_norm(x, nw, 1e-6), w))
    p = rms_norm_linear(x, nw, 1e-6, w, res, return_normed=True)
    u = rms_norm(x + res, nw, 1e-6)
    assert torch.equal(p.s, x + res) and torch.equal(p.u, u) and torch.equal(p.y, linear(u, w))


def test_linear_out_dtype_widens_the_values():
    """``out_dtype=torch.float32``: the bf16 projection's values widened (what the logits are: the
    lm_head's output, then ``.float()``), in the fused norm + projection's reference too."""
    from deepinfer_kernels.ops.linear import rms_norm_linear, rms_norm_linear_ref

    g = torch.Generator().manual_seed(11)
    w = torch.randn(40, 64, generator=g).to(torch.bfloat16)
    x = torch.randn(1, 64, generator=g).to(torch.bfloat16)
    got = linear(x, w, out_dtype=torch.float32)
    assert got.dtype == torch.float32 and torch.equal(got, F.linear(x, w).float())
    assert linear(x, w, out_dtype=torch.bfloat16).dtype == torch.bfloat16
    nw = torch.rand(64, generator=g) + 0.5
    p = rms_norm_linear(x, nw, 1e-6, w, out_dtype=torch.float32)
    q = rms_norm_linear_ref(x, nw, 1e-6, w)
    assert p.y.dtype == torch.float32 and torch.equal(p.y, q.y.float())
