"""GPU tests of the warp-MMA decode kernel (``variant="mma"``, what "auto" runs for decode calls) and
of its build options (conversion, rescale, one team), each against ``sparse_mla_attention_ref`` and
the bulk kernel."""

import pytest
import torch

pytestmark = pytest.mark.gpu

T = pytest.importorskip("deepinfer_kernels.testing")


MMA_CASES = [
    (5, 16, 256, None, dict(empty_frac=0.1)),
    (9, 16, 200, None, dict(ragged=True, empty_rows=(0, 4))),     # width not a multiple of 64
    (6, 8, 130, None, dict(empty_frac=0.2, empty_rows=(5,))),     # heads < 16
    (3, 16, 2048, 3, dict(ragged=True, empty_rows=(1,))),         # split-KV partials
    (3, 16, 64, None, dict(q_scale=8.0)),                         # one block
    (2, 16, 1, None, dict()),                                     # width 1
    (4, 16, 300, None, dict(duplicates=True)),                    # duplicate slots count twice
    (7, 16, 640, None, dict(empty_frac=0.5)),                     # half the records invalid: never copied, masked
    (132, 16, 2048, None, dict(paged=128)),                       # the decode benchmark's KV-block layout
    (4, 16, 256, None, dict(pool_scale=2.0 ** 16, q_scale=2.0 ** -16)),   # large latents, small queries
    (4, 16, 256, None, dict(pool_scale=2.0 ** -20, q_scale=4.0)),  # tiny latents
    (3, 64, 300, None, dict(empty_frac=0.1)),                     # flash's 64 heads: a CTA per 16
    (2, 32, 1024, 2, dict(ragged=True)),                          # head groups with split-KV partials
]


@pytest.mark.parametrize("build_kw", [{}, dict(hw_cvt=False), dict(lazy_rescale=False), dict(teams=False),
                                      dict(teams=False, hw_cvt=False, lazy_rescale=False)],
                         ids=["default", "intcvt", "exact_rescale", "one_team", "one_team_intcvt_exact_rescale"])
@pytest.mark.parametrize("rows,heads,width,num_splits,kw", MMA_CASES)
def test_mma_kernel_matches_the_reference_and_bulk(rows, heads, width, num_splits, kw, build_kw):
    """The warp-MMA decode kernel (``sparse_mla_mma.py``: 16 heads as the M of ``mma.m16n8k16``, eight
    warps splitting the latent dims, f16 operands converted once and transposed in registers) against
    the reference and the bulk kernel: the default build (the hardware e4m3 conversion, the lazy
    rescale) through the variant's launcher, and builds with the integer conversion or a rescale
    whenever a maximum grows, or the one-team consumer (``_cuda_mma.py``; the default is the two-team
    one of ``_cuda_mma_teams.py``), compiled here with the same call."""
    from deepinfer_kernels.tilelang import sparse_mla as launcher
    from deepinfer_kernels.tilelang._common import TARGET
    from deepinfer_kernels.tilelang.sparse_mla.common import NO_AUTO_SYNC
    from deepinfer_kernels.tilelang.sparse_mla.mma import _build_mma

    slots = 300000 if kw.get("paged") else 5000
    kw = dict(kw)
    pool_scale = kw.pop("pool_scale", 1.0)
    pool = T.make_pool(slots, 512, "cuda", seed=rows + width, scale=pool_scale)
    case = T.make_sparse_mla_case(rows, heads, 512, width, slots, "cuda", seed=rows * 3 + width, pool=pool, **kw)
    if not build_kw:
        out, lse = launcher.sparse_mla_attention_tilelang(case.q, case.pool, case.indices, case.sm_scale,
                                                          variant="mma", num_splits=num_splits)
    else:
        import tilelang

        builds = {split: tilelang.compile(_build_mma(heads, 512, split, **build_kw), target=TARGET,
                                          pass_configs=NO_AUTO_SYNC) for split in (False, True)}
        original = launcher.get_kernel
        launcher.get_kernel = lambda h, d, variant, split, *a, **k: (builds[split] if variant == "mma"
                                                                     else original(h, d, variant, split, *a, **k))
        try:
            out, lse = launcher.sparse_mla_attention_tilelang(case.q, case.pool, case.indices, case.sm_scale,
                                                              variant="mma", num_splits=num_splits)
        finally:
            launcher.get_kernel = original
    bulk_out, bulk_lse = launcher.sparse_mla_attention_tilelang(case.q, case.pool, case.indices, case.sm_scale,
                                                                variant="bulk", num_splits=num_splits)
    torch.cuda.synchronize()
    # f16 operands with fp32 accumulation: scores as exact as bulk's bf16 ones; P rounded to f16
    T.check_sparse_mla(case, out, lse, atol=2e-2 * pool_scale)
    T.check_close_to_kernel(out, lse, bulk_out, bulk_lse, lse_atol=1e-3, out_atol=1e-2 * pool_scale)


@pytest.mark.parametrize("teams", [False, True], ids=["one_team", "teams"])
@pytest.mark.parametrize("hw_cvt", [True, False], ids=["hwcvt", "intcvt"])
def test_mma_one_exponent_a_row_bounds_the_error_of_far_smaller_groups(hw_cvt, teams):
    """The mma kernel carries one scale exponent a row (C, the largest group scale so far): a value of a
    group whose scale sits more than 2^15 below it becomes an f16 subnormal (fewer bits), and past
    2^24 below (its f16 factor 0), zero. With one valid key per row the output is that record's
    values, so the error is that rounding alone: under 2^-25 of the largest value the largest scale
    expresses (448 x 2^(C - 127)), on records whose group scales span up to 2^40; within 2^15 of the
    largest every value stays exact. The two-team consumer keeps one exponent per team (per half of
    every stage): the same bound."""
    import tilelang

    from deepinfer_kernels.ops.kv_fp8 import dequantize_kv_fp8_ref
    from deepinfer_kernels.tilelang import sparse_mla as launcher
    from deepinfer_kernels.tilelang._common import TARGET
    from deepinfer_kernels.tilelang.sparse_mla.common import NO_AUTO_SYNC
    from deepinfer_kernels.tilelang.sparse_mla.mma import _build_mma

    d, rows, slots = 512, 40, 64
    g = torch.Generator().manual_seed(7)
    body = torch.randint(0, 256, (slots, d), generator=g, dtype=torch.uint8)
    body[(body & 0x7F) == 0x7F] = 0x3C                    # no e4m3 NaN codes
    top = torch.randint(60, 161, (slots, 1), generator=g)
    scales = (top - torch.randint(0, 41, (slots, d // 32), generator=g)).clamp(min=1)
    scales[:, 0] = top[:, 0]                               # group 0 holds the record's largest scale
    pool = torch.cat([body, scales.to(torch.uint8)], dim=1).cuda()
    q = (torch.randn(rows, 16, d, generator=g) * 1e-13).to(torch.bfloat16).cuda()   # the lone key's weight is 1
    idx = torch.full((rows, 64), -1, dtype=torch.int32)
    slot_of_row = torch.randperm(slots, generator=g)[:rows]
    idx[torch.arange(rows), torch.randint(0, 64, (rows,), generator=g)] = slot_of_row.int()
    kernel = tilelang.compile(_build_mma(16, 512, False, hw_cvt=hw_cvt, teams=teams), target=TARGET,
                              pass_configs=NO_AUTO_SYNC)
    original = launcher.get_kernel
    launcher.get_kernel = lambda h, dd, variant, split, *a, **k: (kernel if variant == "mma" and not split
                                                                  else original(h, dd, variant, split, *a, **k))
    try:
        out, lse = launcher.sparse_mla_attention_tilelang(q, pool, idx.cuda(), 0.04, variant="mma", num_splits=1)
    finally:
        launcher.get_kernel = original
    want = dequantize_kv_fp8_ref(pool[slot_of_row.cuda().long()], d).float()             # [rows, d]
    unit = torch.pow(2.0, top[slot_of_row].double() - 127).float().cuda()               # [rows, 1]
    got = out.float()                                                                    # [rows, 16, d]
    err = (got - want.unsqueeze(1)).abs()
    bf16_rounding = want.abs().unsqueeze(1) * 2.0 ** -8
    assert bool((err <= unit.unsqueeze(1) * (448 * 2.0 ** -25) + bf16_rounding).all())
    exact = (scales[slot_of_row] >= top[slot_of_row] - 15).repeat_interleave(32, dim=1).cuda()   # [rows, d]
    mask = exact.unsqueeze(1).expand_as(got)
    assert torch.equal(got[mask], want.to(torch.bfloat16).float().unsqueeze(1).expand_as(got)[mask])
    assert bool(torch.isfinite(lse).all())
