"""GPU tests: the TileLang MoE router against `moe_route_ref` (ids exact, weights to the last bit)."""

import pytest
import torch

pytestmark = pytest.mark.gpu

ref = pytest.importorskip("deepinfer_kernels.ops.moe")


@pytest.mark.parametrize("experts, top_k", [(8, 2), (64, 6), (384, 6), (385, 6), (256, 8)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("normalise", [True, False])
@pytest.mark.parametrize("tokens", [1, 7, 1030])
def test_route_matches_reference(experts, top_k, dtype, normalise, tokens):
    from deepinfer_kernels.tilelang.moe_route import moe_route_tilelang

    g = torch.Generator(device="cuda").manual_seed(experts + tokens)
    logits = (torch.randn(tokens, experts, device="cuda", generator=g) * 3).to(dtype)
    bias = torch.randn(experts, device="cuda", generator=g) * 0.1
    w, ids = moe_route_tilelang(logits, bias, top_k, normalise, 2.5)
    w_ref, ids_ref = ref.moe_route_ref(logits, bias, top_k, normalise, 2.5)
    assert ids.dtype == torch.int32 and w.dtype == torch.float32
    assert torch.equal(ids, ids_ref)
    # the normalising sum adds the k weights in another order: a few float32 ulps
    torch.testing.assert_close(w, w_ref, rtol=1e-6, atol=0)


def test_ties_go_to_the_lower_expert_and_the_op_dispatches():
    from deepinfer_kernels.tilelang.moe_route import moe_route_tilelang

    logits = torch.zeros(3, 64, device="cuda")   # every gate 0.5: ties everywhere
    bias = torch.zeros(64, device="cuda")
    bias[[9, 40, 41]] = 1.0
    w, ids = moe_route_tilelang(logits, bias, 6, True, 1.0)
    assert ids.tolist() == [[9, 40, 41, 0, 1, 2]] * 3
    torch.testing.assert_close(w, torch.full((3, 6), 1 / 6, device="cuda"))
    w2, ids2 = ref.moe_route(logits, bias, 6, True, 1.0)    # the op picks the kernel on SM90
    assert torch.equal(ids2, ids) and torch.equal(w2, w)


def test_route_reads_a_column_slice_in_place():
    """The router logits as a column slice of the MoE's fused input GEMM output route exactly like
    their contiguous copy."""
    from deepinfer_kernels.tilelang.moe_route import moe_route_tilelang

    g = torch.Generator(device="cuda").manual_seed(3)
    wide = torch.randn(40, 1088, device="cuda", generator=g).to(torch.bfloat16)
    bias = torch.randn(64, device="cuda", generator=g) * 0.01
    view = wide[:, :64]
    w, ids = moe_route_tilelang(view, bias, 6, True, 2.5)
    w_c, ids_c = moe_route_tilelang(view.contiguous(), bias, 6, True, 2.5)
    assert torch.equal(ids, ids_c) and torch.equal(w, w_c)
