"""GPU tests: TileLang grouped expert GEMM / routed experts vs ``deepinfer_kernels.ops.moe``."""

import pytest
import torch

pytestmark = pytest.mark.gpu

ref = pytest.importorskip("deepinfer_kernels.ops.moe")
T = pytest.importorskip("deepinfer_kernels.testing")


def _offsets(counts):
    off = torch.zeros(len(counts) + 1, dtype=torch.int64)
    off[1:] = torch.cumsum(torch.tensor(counts), 0)
    return off


@pytest.mark.parametrize("counts,k,nout,cfg", [
    ([3, 0, 1, 70, 0, 5, 130, 2], 1024, 512, None),                       # ragged, empty experts, >64 rows
    ([1] * 48 + [0] * 16, 1024, 512, None),                                # decode: one row per expert
    ([2, 5, 0, 1], 256, 320, None),                                        # decode, Nout not 128-aligned
    ([300, 0, 700, 45, 1000, 0, 3, 2000], 512, 1024, None),               # prefill tiles (rows > 64 E)
    ([200, 129, 0, 257], 512, 1024, "prefill"),                           # prefill config, small
    ([3, 0, 1, 70, 0, 5, 130, 2], 512, 1024, "swap"),                     # swapped, staged: 16-row slots
    ([16, 17, 0, 1, 33], 1024, 512, "swap8"),                             # swapped, staged, 8-row slots
    ([3, 0, 1, 70, 0, 5, 130, 2], 512, 1024, "pipe"),                     # swapped, rows pipelined
    ([2, 0, 5, 1], 3072, 3840, None),                                      # flash widths, auto: swapped
])
def test_grouped_expert_gemm(counts, k, nout, cfg):
    from deepinfer_kernels.tilelang.moe import (
        DECODE_SWAP_DOWN,
        PREFILL,
        SWAP_PIPELINED,
        SWAP_STAGED,
        grouped_expert_gemm_tilelang,
    )

    staged = dict(DECODE_SWAP_DOWN, swap=SWAP_STAGED)
    config = {"prefill": PREFILL, "swap": staged, "swap8": dict(staged, bm=8),
              "pipe": dict(DECODE_SWAP_DOWN, swap=SWAP_PIPELINED), None: None}[cfg]

    g = torch.Generator().manual_seed(sum(counts))
    e, n = len(counts), sum(counts)
    x = torch.randn(n, k, generator=g).to(torch.bfloat16).cuda()
    w = (torch.randn(e, nout, k, generator=g) * k ** -0.5).to(torch.bfloat16).cuda()
    off = _offsets(counts).cuda()
    got = grouped_expert_gemm_tilelang(x, w, off, config=config)
    want = ref.grouped_expert_gemm_ref(x, w, off)
    torch.cuda.synchronize()
    torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)
    off32 = off.to(torch.int32)
    torch.testing.assert_close(grouped_expert_gemm_tilelang(x, w, off32, config=config).float(), want.float(),
                               atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("counts,nout", [([1] * 48 + [0] * 16, 1024),                  # decode: TileLang
                                         ([300, 0, 700, 45, 1000, 0, 3, 2000], 1024),  # prefill: cuBLAS grouped
                                         ([5000, 0, 7000, 1], 1000)])                  # prefill, Nout not 128-aligned
def test_grouped_expert_gemm_public_op_dispatch(counts, nout):
    """The public op on CUDA: TileLang at decode sizes, torch._grouped_mm above 64 rows per expert."""
    g = torch.Generator().manual_seed(len(counts))
    e, n, k = len(counts), sum(counts), 512
    x = torch.randn(n, k, generator=g).to(torch.bfloat16).cuda()
    w = (torch.randn(e, nout, k, generator=g) * k ** -0.5).to(torch.bfloat16).cuda()
    off = _offsets(counts).cuda()
    got = ref.grouped_expert_gemm(x, w, off)
    want = ref.grouped_expert_gemm_ref(x, w, off)
    assert got.dtype == torch.bfloat16 and got.shape == (n, nout)
    torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("tokens,skew,gate_up", [(8, 0.0, None), (64, 3.0, None), (256, 0.0, None),
                                                 (1024, 1.0, None), (2048, 0.0, "pipelined")])
def test_routed_experts(tokens, skew, gate_up):
    from deepinfer_kernels.tilelang.moe import PREFILL_SWIGLU_PIPELINED, routed_experts_tilelang

    x, w, ids, w13, w2 = T.make_moe_case(tokens, 1024, 512, 64, 6, "cuda", seed=tokens, skew=skew)
    cfg = PREFILL_SWIGLU_PIPELINED if gate_up == "pipelined" else None
    got = routed_experts_tilelang(x, w, ids, w13, w2, gate_up_config=cfg)
    want = ref.routed_experts_ref(x, w, ids, w13, w2)
    torch.cuda.synchronize()
    assert got.shape == want.shape and got.dtype == want.dtype
    torch.testing.assert_close(got.float(), want.float(), atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("tokens,skew,kind", [(1, 0.0, "swap"), (8, 3.0, "swap8"), (256, 0.0, "swap"),
                                              (1, 0.0, "pipe"), (8, 3.0, "pipe8"), (256, 0.0, "pipe"),
                                              (64, 0.0, "plain")])
def test_routed_experts_swapped_and_plain_decode_tiles(tokens, skew, kind):
    """Both decode kernels at token counts either may meet: the operand-swapped one (auto up to 16
    rows per expert on average; forced here at 256 tokens, 24 rows per expert, several slots each),
    its rows staged whole-K or pipelined beside the weights, and the 64-row tiles (forced at 64 tokens)."""
    from deepinfer_kernels.tilelang.moe import (
        DECODE,
        DECODE_DOWN,
        DECODE_SWAP,
        DECODE_SWAP_DOWN,
        SWAP_PIPELINED,
        SWAP_STAGED,
        routed_experts_tilelang,
    )

    x, w, ids, w13, w2 = T.make_moe_case(tokens, 1024, 512, 64, 6, "cuda", seed=tokens + 7, skew=skew)
    bm = 8 if kind.endswith("8") else 16
    staging = dict(bm=bm, swap=SWAP_PIPELINED if kind.startswith("pipe") else SWAP_STAGED)
    gate_up, down = ((DECODE, DECODE_DOWN) if kind == "plain" else
                     (dict(DECODE_SWAP, **staging), dict(DECODE_SWAP_DOWN, **staging)))
    got = routed_experts_tilelang(x, w, ids, w13, w2, gate_up_config=gate_up, down_config=down)
    want = ref.routed_experts_ref(x, w, ids, w13, w2)
    torch.cuda.synchronize()
    torch.testing.assert_close(got.float(), want.float(), atol=3e-2, rtol=3e-2)


def test_routed_experts_small_dims():
    from deepinfer_kernels.tilelang.moe import routed_experts_tilelang

    x, w, ids, w13, w2 = T.make_moe_case(5, 256, 128, 16, 4, "cuda", seed=1)
    torch.testing.assert_close(routed_experts_tilelang(x, w, ids, w13, w2).float(),
                               ref.routed_experts_ref(x, w, ids, w13, w2).float(), atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("h,inter,experts", [(1024, 512, 64), (3072, 768, 16)])   # one / three CTAs a token
@pytest.mark.parametrize("tokens", [1, 64, 300])
def test_routed_experts_combine_adds_shared_and_residual_bit_for_bit(tokens, h, inter, experts):
    """The combine kernel's fused `residual + (routed + shared)` equals the two torch adds exactly."""
    from deepinfer_kernels.tilelang.moe import routed_experts_tilelang

    x, w, ids, w13, w2 = T.make_moe_case(tokens, h, inter, experts, 6, "cuda", seed=tokens + 11)
    g = torch.Generator().manual_seed(tokens)
    shared = torch.randn(x.shape, generator=g).to(x.dtype).cuda()
    residual = (torch.randn(x.shape, generator=g) * 10).to(x.dtype).cuda()
    routed = routed_experts_tilelang(x, w, ids, w13, w2)
    fused = routed_experts_tilelang(x, w, ids, w13, w2, shared=shared, residual=residual)
    torch.cuda.synchronize()
    assert torch.equal(fused, residual + (routed + shared))
    assert torch.equal(routed_experts_tilelang(x, w, ids, w13, w2, residual=residual), residual + routed)


@pytest.mark.parametrize("tokens,h,inter,experts", [(1, 1024, 512, 64), (4, 1024, 512, 64), (3, 256, 128, 8),
                                                    (2, 3072, 3840, 8)])
def test_routed_experts_few_token_kernels(tokens, h, inter, experts):
    """The matrix-vector path (batch-1 decode; `mini`, narrow, flash widths; 8 experts top-6 make
    tokens share experts): against the reference and the grouped GEMMs; the automatic choice takes
    it where `gemv_pays`; shared expert and residual added with the torch adds' roundings."""
    from deepinfer_kernels.tilelang.moe import gemv_pays, routed_experts_tilelang

    x, w, ids, w13, w2 = T.make_moe_case(tokens, h, inter, experts, 6, "cuda", seed=tokens + h)
    got = routed_experts_tilelang(x, w, ids, w13, w2, few_tokens=True)
    want = ref.routed_experts_ref(x, w, ids, w13, w2)
    grouped = routed_experts_tilelang(x, w, ids, w13, w2, few_tokens=False)
    torch.cuda.synchronize()
    assert got.shape == want.shape and got.dtype == want.dtype
    torch.testing.assert_close(got.float(), want.float(), atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(got.float(), grouped.float(), atol=3e-2, rtol=3e-2)
    auto = routed_experts_tilelang(x, w, ids, w13, w2)
    assert torch.equal(auto, got if gemv_pays(tokens, 6, inter) else grouped)   # the automatic choice
    g = torch.Generator().manual_seed(tokens)
    shared = torch.randn(x.shape, generator=g).to(x.dtype).cuda()
    residual = (torch.randn(x.shape, generator=g) * 10).to(x.dtype).cuda()
    fused = routed_experts_tilelang(x, w, ids, w13, w2, shared=shared, residual=residual, few_tokens=True)
    assert torch.equal(fused, residual + (got + shared))


@pytest.mark.parametrize("tokens,skew", [(300, 0.0), (2048, 2.0)])
def test_routed_experts_prefill_path(tokens, skew):
    """Prefill sizes: torch's grouped GEMMs with the TileLang SwiGLU and combine between them match
    the reference (and the torch grouped path); the fused addends equal the torch adds exactly;
    the public op picks this path above the decode kernels' token range."""
    from deepinfer_kernels.tilelang.moe import routed_experts_prefill_tilelang

    x, w, ids, w13, w2 = T.make_moe_case(tokens, 1024, 512, 64, 6, "cuda", seed=tokens + 5, skew=skew)
    got = routed_experts_prefill_tilelang(x, w, ids, w13, w2)
    want = ref.routed_experts_ref(x, w, ids, w13, w2)
    grouped = ref.routed_experts_grouped(x, w, ids, w13, w2)
    torch.cuda.synchronize()
    assert got.shape == want.shape and got.dtype == want.dtype
    torch.testing.assert_close(got.float(), want.float(), atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(got.float(), grouped.float(), atol=1e-2, rtol=1e-2)
    g = torch.Generator().manual_seed(tokens)
    shared = torch.randn(x.shape, generator=g).to(x.dtype).cuda()
    residual = (torch.randn(x.shape, generator=g) * 10).to(x.dtype).cuda()
    fused = routed_experts_prefill_tilelang(x, w, ids, w13, w2, shared=shared, residual=residual)
    assert torch.equal(fused, residual + (got + shared))
    assert torch.equal(ref.routed_experts(x, w, ids, w13, w2, shared=shared, residual=residual), fused)


@pytest.mark.parametrize("experts,tokens,topk,bm,skew", [(64, 1, 6, 16, 0.0), (384, 1, 6, 16, 0.0),
                                                         (384, 64, 6, 16, 3.0), (64, 300, 6, 8, 1.0),
                                                         (1500, 200, 8, 16, 0.0), (16, 2731, 6, 64, 2.0)])
def test_permute_schedule_matches_torch(experts, tokens, topk, bm, skew):
    """The one-CTA decode permutation (parallel scans, each expert writing its own tiles): offsets
    and the tile schedule equal torch's; every (token, slot) lands once, inside its expert's rows."""
    from deepinfer_kernels.tilelang.moe import _permute_kernel

    g = torch.Generator().manual_seed(experts + tokens)
    weights = torch.rand(experts, generator=g) ** (1.0 + 4.0 * skew)   # skew: a few experts take most rows
    ids = torch.multinomial(weights.expand(tokens, -1).contiguous(), topk, generator=g).to(torch.int32)
    n = tokens * topk
    nsl = (n + bm - 1) // bm + experts
    dev = torch.device("cuda")
    token_of = torch.full((n,), -1, dtype=torch.int32, device=dev)
    inv = torch.full((n,), -1, dtype=torch.int32, device=dev)
    offsets = torch.full((experts + 1,), -1, dtype=torch.int32, device=dev)
    slots = torch.full((3, nsl), -7, dtype=torch.int32, device=dev)
    _permute_kernel(experts, topk, bm)(ids.reshape(-1).to(dev), token_of, inv, offsets, slots)
    torch.cuda.synchronize()

    counts = torch.bincount(ids.reshape(-1).long(), minlength=experts)
    want_off = torch.zeros(experts + 1, dtype=torch.int64)
    want_off[1:] = counts.cumsum(0)
    assert torch.equal(offsets.cpu().long(), want_off)
    want_slots = torch.zeros(3, nsl, dtype=torch.int64)
    s = 0
    for e in range(experts):
        for r0 in range(int(want_off[e]), int(want_off[e + 1]), bm):
            want_slots[:, s] = torch.tensor([e, r0, min(bm, int(want_off[e + 1]) - r0)])
            s += 1
    assert torch.equal(slots.cpu().long(), want_slots)
    inv_c, tok_c, flat = inv.cpu().long(), token_of.cpu().long(), ids.reshape(-1).long()
    assert torch.equal(torch.sort(inv_c).values, torch.arange(n))                 # a permutation
    assert torch.equal(tok_c[inv_c], torch.arange(n) // topk)                      # rows know their token
    assert bool(((inv_c >= want_off[flat]) & (inv_c < want_off[flat + 1])).all())  # inside the expert's rows


def test_silu_mul_kernel_matches_torch():
    from deepinfer_kernels.tilelang.activation import silu_mul_tilelang

    gu = (torch.randn(777, 1024, device="cuda") * 4).to(torch.bfloat16)
    act = silu_mul_tilelang(gu[:, :512], gu[:, 512:], round_silu=False)   # the MoE prefill's single rounding
    want = (torch.nn.functional.silu(gu[:, :512].float()) * gu[:, 512:].float()).to(torch.bfloat16)
    torch.testing.assert_close(act.float(), want.float(), atol=0, rtol=8e-3)   # within one bf16 ulp
