import torch
import torch.nn.functional as F
from deepinfer_kernels.ops.moe import grouped_expert_gemm, moe_route, permute_by_expert, routed_experts


def test_route_bias_selects_but_does_not_weigh():
    logits = torch.tensor([[0.0, 1.0, 2.0, -1.0]])
    bias = torch.tensor([0.0, 0.0, -5.0, 5.0])
    w, ids = moe_route(logits, bias, top_k=2, norm_topk_prob=True, routed_scaling_factor=2.5)
    assert ids.tolist() == [[3, 1]]
    s = torch.sigmoid(logits[0])
    want = torch.stack([s[3], s[1]]) / (s[3] + s[1]) * 2.5
    torch.testing.assert_close(w[0], want)


def test_route_ties_prefer_lower_id():
    w, ids = moe_route(torch.zeros(1, 5), torch.zeros(5), top_k=3, norm_topk_prob=False)
    assert ids.tolist() == [[0, 1, 2]]
    torch.testing.assert_close(w, torch.full((1, 3), 0.5))


def test_grouped_gemm_matches_per_expert():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(9, 8, generator=g)
    w = torch.randn(3, 5, 8, generator=g)
    offsets = torch.tensor([0, 4, 4, 9])
    out = grouped_expert_gemm(x, w, offsets)
    torch.testing.assert_close(out[:4], x[:4] @ w[0].t())
    torch.testing.assert_close(out[4:], x[4:] @ w[2].t())


def test_routed_experts_matches_dense_loop():
    g = torch.Generator().manual_seed(1)
    t, h, inter, e, k = 11, 16, 8, 6, 2
    x = torch.randn(t, h, generator=g)
    w13 = torch.randn(e, 2 * inter, h, generator=g) * 0.2
    w2 = torch.randn(e, h, inter, generator=g) * 0.2
    weights, ids = moe_route(torch.randn(t, e, generator=g), torch.zeros(e), k)
    out = routed_experts(x, weights, ids, w13, w2)
    want = torch.zeros(t, h)
    for i in range(t):
        for j in range(k):
            ex = int(ids[i, j])
            a = F.silu(w13[ex, :inter] @ x[i]) * (w13[ex, inter:] @ x[i])
            want[i] += weights[i, j] * (w2[ex] @ a)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    order, offsets = permute_by_expert(ids, e)
    assert offsets[-1] == t * k
    assert bool((ids.reshape(-1)[order].diff() >= 0).all())
