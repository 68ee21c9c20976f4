import pytest
import torch
import torch.nn.functional as F

from deepinfer_kernels.ops.capture import force_capturable
from deepinfer_kernels.ops.moe import (
    grouped_expert_gemm,
    grouped_mm_usable,
    moe_route,
    permute_by_expert,
    routed_experts,
    routed_experts_grouped,
    routed_experts_masked,
    routed_experts_ref,
)


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


def _moe_inputs(t, h, inter, e, k, dtype=torch.float32, device="cpu", seed=2):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, h, generator=g)
    w13 = torch.randn(e, 2 * inter, h, generator=g) * h ** -0.5
    w2 = torch.randn(e, h, inter, generator=g) * inter ** -0.5
    weights, ids = moe_route(torch.randn(t, e, generator=g), torch.zeros(e), k, routed_scaling_factor=1.5)
    return [a.to(device) for a in (x.to(dtype), weights, ids, w13.to(dtype), w2.to(dtype))]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("t", [1, 5, 37])
def test_grouped_path_equals_reference_on_cpu(dtype, t):
    """The CUDA path (sort + searchsorted ends + torch._grouped_mm + index_copy_ unpermute) run
    through torch's CPU _grouped_mm: same permutation, same sum order, so bit-identical here;
    experts without tokens (empty groups) included."""
    args = _moe_inputs(t, 16, 8, 6, 2, dtype)
    want = routed_experts_ref(*args)
    assert torch.equal(routed_experts_grouped(*args), want)
    with force_capturable():
        assert grouped_mm_usable(args[0], args[3], args[4])
        assert torch.equal(routed_experts(*args), want)
    assert not grouped_mm_usable(args[0], args[3], args[4])        # CPU default: the reference
    x, weights, ids, w13, w2 = _moe_inputs(1, 16, 8, 6, 2, dtype)
    assert routed_experts_grouped(x[:0], weights[:0], ids[:0], w13, w2).shape == (0, 16)


def test_grouped_path_needs_aligned_widths(monkeypatch):
    x, _, _, w13, w2 = _moe_inputs(3, 12, 8, 4, 2)                  # hidden 12: rows not 16-byte aligned
    with force_capturable():
        assert not grouped_mm_usable(x, w13, w2)
        monkeypatch.setenv("DEEPINFER_KERNEL_BACKEND", "torch")
        x, _, _, w13, w2 = _moe_inputs(3, 16, 8, 4, 2)
        assert not grouped_mm_usable(x, w13, w2)


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 7, 64, 300])
def test_grouped_path_on_cuda_matches_reference(t):
    """bf16 on SM90: torch._grouped_mm vs the per-expert reference (same bf16 rounding points;
    GEMM accumulation order may differ)."""
    from deepinfer_kernels.platform import current_platform
    if not current_platform().is_sm90:
        pytest.skip("the grouped-GEMM path runs on SM90")
    args = _moe_inputs(t, 256, 128, 16, 4, torch.bfloat16, "cuda")
    assert grouped_mm_usable(args[0], args[3], args[4])
    got = routed_experts(*args)
    want = routed_experts_ref(*args)
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
def test_grouped_path_captures_in_a_cuda_graph():
    from deepinfer_kernels.platform import current_platform
    if not current_platform().is_sm90:
        pytest.skip("the grouped-GEMM path runs on SM90")
    x, weights, ids, w13, w2 = _moe_inputs(48, 256, 128, 16, 4, torch.bfloat16, "cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            routed_experts(x, weights, ids, w13, w2)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = routed_experts(x, weights, ids, w13, w2)
    for seed in (3, 4):                                              # other routing, same buffers
        nx, nw, nids, _, _ = _moe_inputs(48, 256, 128, 16, 4, torch.bfloat16, "cuda", seed=seed)
        x.copy_(nx)
        weights.copy_(nw)
        ids.copy_(nids)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, routed_experts(x, weights, ids, w13, w2))


@pytest.mark.parametrize("t", [1, 9])
def test_masked_path_equals_reference_and_is_taken_when_grouped_gemm_cannot(t):
    """Capturable fallback (fp32, or widths the grouped GEMM cannot take): every expert over every
    token weighted by the combine weight; it must equal the reference up to fp32 summation order."""
    args = _moe_inputs(t, 12, 8, 6, 2, torch.float32)              # hidden 12: grouped GEMM unusable
    want = routed_experts_ref(*args)
    torch.testing.assert_close(routed_experts_masked(*args), want, rtol=1e-5, atol=1e-5)
    with force_capturable():
        assert not grouped_mm_usable(args[0], args[3], args[4])
        torch.testing.assert_close(routed_experts(*args), want, rtol=1e-5, atol=1e-5)


def test_moe_decode_tiles_by_rows_per_expert():
    """The launcher's tile choice (CPU: no kernel runs): operand-swapped tiles up to 16 rows per
    expert on average (staged whole-K only while a slot's rows fit in shared memory), 64-row decode
    tiles to 64, prefill tiles beyond."""
    from deepinfer_kernels.tilelang import moe

    assert moe.pick_config(6, 64, True, k=1024, nout=512) is moe.DECODE_SWAP
    assert moe.pick_config(64 * 6, 64, False, k=512, nout=1024) is moe.DECODE_SWAP_DOWN
    assert moe.pick_config(256 * 6, 64, True, k=1024, nout=512) is moe.DECODE
    assert moe.pick_config(256 * 6, 64, False, k=512, nout=1024) is moe.DECODE_DOWN
    assert moe.pick_config(6, 384, True, k=3072, nout=3840) is moe.DECODE_SWAP   # flash dims: rows pipelined
    staged = dict(moe.DECODE_SWAP, swap=moe.SWAP_STAGED)
    with pytest.MonkeyPatch.context() as mp:   # staged whole-K, 16 x 3072 bf16 rows exceed 64 KB
        mp.setattr(moe, "DECODE_SWAP", staged)
        assert moe.pick_config(6, 384, True, k=3072, nout=3840) is moe.DECODE
        assert moe.pick_config(6, 64, True, k=1024, nout=512) is staged
    assert moe.pick_config(6, 64, False, k=512, nout=96) is moe.DECODE       # Nout not a multiple of 64
    assert moe.pick_config(64 * 64 + 1, 64, False, k=512, nout=1024) is moe.PREFILL


def test_moe_few_token_kernels_tiles_and_precompile_specs():
    """The few-token (matrix-vector) path's tiles (CPU: no kernel runs): the widest K tile dividing
    each width, None when a width does not divide them; where it pays (batch 1, narrow experts);
    precompile lists its two kernels there and the grouped GEMMs elsewhere."""
    from deepinfer_kernels.tilelang import moe

    up, down = moe._gemv_configs(1024, 512)                    # mini: the swept tiles (H200, 2026-12-01)
    assert (up["bn"], up["bk"], up["stages"], down["bn"], down["bk"]) == (8, 128, 8, 8, 512)
    up, down = moe._gemv_configs(3072, 3840)                   # flash: 3840 is not a multiple of 512
    assert (up["bk"], down["bk"]) == (128, 256)
    up, down = moe._gemv_configs(128, 384)                     # hidden narrower than the K tile
    assert (up["bk"], down["bk"]) == (128, 128)
    assert moe._gemv_configs(1024, 520) is None                # 520: no down K tile (512, 256, 128) divides it
    assert moe._gemv_configs(1024, 516) is None                # 516 columns: not a multiple of 8
    assert moe.gemv_pays(1, 6, 512)                            # mini, batch 1: 48 grouped CTAs
    assert not moe.gemv_pays(2, 6, 512)                        # measured slower from 2 tokens
    assert not moe.gemv_pays(1, 6, 3840)                       # flash experts: 360 grouped CTAs
    names = [fn for fn, _ in moe.precompile_specs("routed", 1, 64, 1024, 512)]
    assert names == ["_gate_up_gemv_kernel", "_down_combine_gemv_kernel", "_down_combine_gemv_kernel"]
    names = [fn for fn, _ in moe.precompile_specs("routed", 2, 64, 1024, 512)]
    assert "_gate_up_gemv_kernel" not in names and "_permute_kernel" in names


def test_routed_experts_adds_shared_and_residual_as_torch_does():
    """`residual + (routed + shared)`, each add rounded in x's dtype (the CPU path: the torch adds)."""
    from deepinfer_kernels import testing as T

    x, w, ids, w13, w2 = T.make_moe_case(7, 256, 128, 16, 4, "cpu", seed=3)
    g = torch.Generator().manual_seed(4)
    shared = torch.randn(x.shape, generator=g).to(x.dtype)
    residual = (torch.randn(x.shape, generator=g) * 10).to(x.dtype)
    routed = routed_experts(x, w, ids, w13, w2)
    assert torch.equal(routed_experts(x, w, ids, w13, w2, shared=shared, residual=residual),
                       residual + (routed + shared))
    assert torch.equal(routed_experts(x, w, ids, w13, w2, residual=residual), residual + routed)
    with pytest.raises(ValueError, match="shared"):
        routed_experts(x, w, ids, w13, w2, shared=shared.float())


def test_routed_experts_calls_before_combine_once_before_the_addends_are_read():
    """`before_combine` (a caller waiting for the stream that computes `shared`) runs once, after the
    expert work and before the adds; the result is the same as without it."""
    from deepinfer_kernels import testing as T

    x, w, ids, w13, w2 = T.make_moe_case(5, 256, 128, 16, 4, "cpu", seed=5)
    shared = torch.randn(x.shape, generator=torch.Generator().manual_seed(6)).to(x.dtype)
    want = routed_experts(x, w, ids, w13, w2, shared=shared, residual=x)
    filled = torch.zeros_like(shared)
    calls = []

    def before_combine():   # the addend only becomes ready here
        calls.append(1)
        filled.copy_(shared)

    got = routed_experts(x, w, ids, w13, w2, shared=filled, residual=x, before_combine=before_combine)
    assert calls == [1] and torch.equal(got, want)
