"""Benchmarks: routed experts (gate/up + SwiGLU grouped GEMM, down grouped GEMM, weighted combine)
over 64 experts, top-6, hidden 1024, expert width 512 (`mini`); the decode sizes also at the
V4.1-Flash expert shape (hidden 3072, expert width 3840: 70.8 MB of weights per expert).

Decode sizes are weight-streaming bound: ratio = active expert weight bytes / time against
4.29 TB/s (target >= 75%). Prefill sizes are compute bound: ratio against 793 TFLOP/s (target
>= 60%).
"""

import pytest
import torch

pytestmark = pytest.mark.gpu

pytest.importorskip("deepinfer_kernels.ops.moe")
T = pytest.importorskip("deepinfer_kernels.testing")

H, I, E, K = 1024, 512, 64, 6
FLASH_H, FLASH_I = 3072, 3840


def _flash_moe_case(tokens: int, seed: int):
    """make_moe_case's routing at the flash expert shape, the 4.5 GB of weights drawn on the GPU."""
    x, w, ids, _, _ = T.make_moe_case(tokens, FLASH_H, 64, E, K, "cuda", seed=seed)
    g = torch.Generator(device="cuda").manual_seed(seed)
    w13 = (torch.randn(E, 2 * FLASH_I, FLASH_H, device="cuda", generator=g) * FLASH_H ** -0.5).to(torch.bfloat16)
    w2 = (torch.randn(E, FLASH_H, FLASH_I, device="cuda", generator=g) * FLASH_I ** -0.5).to(torch.bfloat16)
    return x, w, ids, w13, w2


@pytest.mark.parametrize("tokens", [8, 32, 64, 128, 256])
def test_bench_routed_experts_flash_shape(benchmark, tokens):
    """Decode sizes at the flash expert shape, where each expert's weights are 70.8 MB: weight bytes
    read / time against copy bandwidth (target >= 75%)."""
    from deepinfer_kernels.ops.moe import routed_experts_ref
    from deepinfer_kernels.tilelang.moe import routed_experts_tilelang

    x, w, ids, w13, w2 = _flash_moe_case(tokens, seed=tokens)
    wbytes = T.moe_active_weight_bytes(ids, w13, w2)
    act_bytes = T.moe_activation_bytes(tokens, K, FLASH_H, FLASH_I)
    T.record_benchmark(benchmark, lambda: routed_experts_tilelang(x, w, ids, w13, w2),
                       bytes_moved=wbytes + act_bytes, flops=T.moe_flops(tokens, K, FLASH_H, FLASH_I),
                       ref_fn=lambda: routed_experts_ref(x, w, ids, w13, w2), reps=10,
                       extra={"tokens": tokens, "weight_bytes": wbytes, "regime": "decode", "shape": "flash"})


@pytest.mark.parametrize("tokens", [1, 8, 32, 64, 128, 256, 32768])   # 1: a batch-1 decode step's MoE
def test_bench_routed_experts_tilelang(benchmark, tokens):
    from deepinfer_kernels.ops.moe import routed_experts_ref
    from deepinfer_kernels.tilelang.moe import routed_experts_tilelang

    x, w, ids, w13, w2 = T.make_moe_case(tokens, H, I, E, K, "cuda", seed=tokens)
    wbytes = T.moe_active_weight_bytes(ids, w13, w2)
    flops = T.moe_flops(tokens, K, H, I)
    act_bytes = T.moe_activation_bytes(tokens, K, H, I)
    T.record_benchmark(benchmark, lambda: routed_experts_tilelang(x, w, ids, w13, w2),
                       bytes_moved=wbytes + act_bytes, flops=flops,
                       ref_fn=(lambda: routed_experts_ref(x, w, ids, w13, w2)) if tokens <= 256 else None,
                       extra={"tokens": tokens, "weight_bytes": wbytes,
                              "regime": "decode" if tokens <= 256 else "prefill"},
                       graph=tokens <= 256)   # past 16,384 rows the routing sorts with a bincount (host sync)


@pytest.mark.parametrize("path", ["few_tokens", "grouped"])
@pytest.mark.parametrize("shape", ["mini", "flash"])
@pytest.mark.parametrize("tokens", [1, 2, 4, 8])
def test_bench_routed_experts_few_tokens(benchmark, tokens, shape, path):
    """Batch-1-ish decode: the matrix-vector kernels (two launches) against the grouped GEMMs (four),
    both in a CUDA graph, at the `mini` and flash expert shapes; active weight bytes / time against
    copy bandwidth. The measurements behind `moe.gemv_pays` (the matrix-vector kernels only at 1
    token over the narrow `mini` experts)."""
    from deepinfer_kernels.tilelang.moe import routed_experts_tilelang

    h, inter = (H, I) if shape == "mini" else (FLASH_H, FLASH_I)
    case = T.make_moe_case(tokens, H, I, E, K, "cuda", seed=tokens) if shape == "mini" else _flash_moe_case(tokens, tokens)
    x, w, ids, w13, w2 = case
    wbytes = T.moe_active_weight_bytes(ids, w13, w2)
    T.record_benchmark(benchmark, lambda: routed_experts_tilelang(x, w, ids, w13, w2, few_tokens=path == "few_tokens"),
                       bytes_moved=wbytes, flops=T.moe_flops(tokens, K, h, inter),
                       extra={"tokens": tokens, "weight_bytes": wbytes, "regime": "decode", "shape": shape,
                              "path": path})


@pytest.mark.parametrize("path", ["tilelang", "public"])
@pytest.mark.parametrize("tokens", [8, 256, 32768])
def test_bench_grouped_gemm_down(benchmark, tokens, path):
    """The down projection alone: the TileLang plain grouped GEMM (TMA-fed on both operands), or the
    public op (TileLang at decode sizes, cuBLAS's grouped GEMM above 64 rows per expert)."""
    from deepinfer_kernels.ops.moe import grouped_expert_gemm, permute_by_expert
    from deepinfer_kernels.tilelang.moe import grouped_expert_gemm_tilelang

    gemm = grouped_expert_gemm_tilelang if path == "tilelang" else grouped_expert_gemm
    x, w, ids, w13, w2 = T.make_moe_case(tokens, H, I, E, K, "cuda", seed=tokens + 1)
    _, off = permute_by_expert(ids, E)
    act = torch.randn(tokens * K, I, device="cuda").to(torch.bfloat16)
    active = int(torch.unique(ids).numel())
    T.record_benchmark(benchmark, lambda: gemm(act, w2, off),
                       bytes_moved=active * H * I * 2 + act.numel() * 2 + tokens * K * H * 2,
                       flops=2.0 * tokens * K * I * H, extra={"tokens": tokens, "path": path},
                       graph=path == "tilelang" or tokens <= 256)   # the public prefill case measured eagerly


def test_bench_routed_experts_public_prefill(benchmark):
    """The public op at a prefill size, as the engine runs it (`routed_experts_prefill_tilelang`:
    cuBLAS grouped GEMMs through torch._grouped_mm, TileLang SwiGLU and combine): FLOP rate
    against the bf16 matmul ceiling (target >= 60%)."""
    from deepinfer_kernels.ops.moe import routed_experts

    tokens = 32768
    x, w, ids, w13, w2 = T.make_moe_case(tokens, H, I, E, K, "cuda", seed=tokens)
    T.record_benchmark(benchmark, lambda: routed_experts(x, w, ids, w13, w2),
                       bytes_moved=T.moe_active_weight_bytes(ids, w13, w2), flops=T.moe_flops(tokens, K, H, I),
                       extra={"tokens": tokens, "regime": "prefill", "path": "public"}, graph=False)



@pytest.mark.parametrize("tokens", [1, 64])
@pytest.mark.parametrize("experts", [64, 385])
def test_bench_moe_route(benchmark, experts, tokens):
    """The routing kernel (sigmoid, biased top-6, normalised weights) at `mini`'s 64 and flash's 385
    experts: at batch 1 it is one warp's latency on the MoE layer's critical path."""
    from deepinfer_kernels.ops.moe import moe_route_ref
    from deepinfer_kernels.tilelang.moe_route import moe_route_tilelang

    logits = torch.randn(tokens, experts, device="cuda").to(torch.bfloat16)
    bias = torch.randn(experts, device="cuda") * 0.01
    T.record_benchmark(benchmark, lambda: moe_route_tilelang(logits, bias, K, True, 2.5),
                       bytes_moved=logits.numel() * 2 + experts * 4 + tokens * K * 8,
                       ref_fn=lambda: moe_route_ref(logits, bias, K, True, 2.5),
                       extra={"experts": experts, "tokens": tokens})
