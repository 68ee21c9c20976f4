"""MoE routing in one launch (TileLang, SM90): sigmoid gates, biased top-k, normalised weights.

Same function as ``deepinfer_kernels.ops.moe.moe_route_ref``. One warp per token: lane l owns
experts l, l + 32, ...; it computes their gates ``sigmoid(logit)`` (``1 / (1 + expf(-x))``, torch's
formula, no fast math) into shared memory and their choice values ``gate + bias``. Then ``top_k``
rounds of a warp argmax (butterfly over (value, expert id); equal values go to the lower id, as
the reference's stable descending sort) pick the experts in order. Ids and gates match the
reference exactly; the normalised weights can differ in the last bit (the reference sums the k
gates in the reduction order of torch's sum).
"""

import torch

from deepinfer_kernels.tilelang._common import PDL, compile_cached, pdl_sync, require, require_cuda

# No `from __future__ import annotations` (TileLang evaluates prim_func annotations).

NT = 128
TOKENS_PER_CTA = NT // 32
_DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}
MAX_EXPERTS = 1024
MAX_TOP_K = 16


def _build(e: int, k: int, logit_dtype: str, bias_dtype: str, normalise: bool, scale: float):
    import tilelang.language as T

    PER_LANE = (e + 31) // 32
    N = T.dynamic("N")
    SL = T.dynamic("SL")                # row stride of the logits: the MoE's fused input GEMM's slice reads in place
    NEG_INF = -T.infinity(T.float32)

    @T.prim_func
    def main(
        Logits: T.StridedTensor((N, e), (SL, 1), logit_dtype),
        Bias: T.Tensor((e,), bias_dtype),
        Weights: T.Tensor((N, k), T.float32),
        Ids: T.Tensor((N, k), T.int32),
    ):
        with T.Kernel(T.ceildiv(N, TOKENS_PER_CTA), threads=NT) as bx:
            if PDL:   # wait for the previous kernel before touching memory (_common.PDL)
                T.evaluate(pdl_sync())
            tx = T.get_thread_binding()
            lane = tx % 32
            warp = tx // 32
            row = bx * TOKENS_PER_CTA + warp
            safe_row = T.min(row, N - 1)
            gates = T.alloc_shared((TOKENS_PER_CTA, e), T.float32)
            choice = T.alloc_local((PER_LANE,), T.float32)
            logit = T.alloc_local((PER_LANE,), T.float32)
            bias = T.alloc_local((PER_LANE,), T.float32)
            picked = T.alloc_local((k,), T.float32)
            best_v = T.alloc_var(T.float32)
            best_i = T.alloc_var(T.int32)
            other_v = T.alloc_var(T.float32)
            other_i = T.alloc_var(T.int32)
            total = T.alloc_var(T.float32)
            # every load first, unconditional (clamped columns): one memory latency, not PER_LANE in turn
            for j in T.unroll(PER_LANE):
                logit[j] = T.cast(Logits[safe_row, T.min(lane + 32 * j, e - 1)], T.float32)
                bias[j] = T.cast(Bias[T.min(lane + 32 * j, e - 1)], T.float32)
            for j in T.unroll(PER_LANE):
                ex = lane + 32 * j
                if ex < e:
                    g = 1.0 / (1.0 + T.exp(-logit[j]))
                    gates[warp, ex] = g
                    choice[j] = g + bias[j]
                else:
                    choice[j] = NEG_INF
            T.sync_threads()
            total = 0.0
            for r in T.serial(k):
                best_v = NEG_INF
                best_i = e
                for j in T.unroll(PER_LANE):   # ascending ids: strict > keeps the lowest of equals
                    if choice[j] > best_v:
                        best_v = choice[j]
                        best_i = lane + 32 * j
                for step in T.unroll(5):
                    other_v = T.shfl_xor(best_v, 16 >> step)
                    other_i = T.shfl_xor(best_i, 16 >> step)
                    if (other_v > best_v) or ((other_v == best_v) and (other_i < best_i)):
                        best_v = other_v
                        best_i = other_i
                for j in T.unroll(PER_LANE):
                    if lane + 32 * j == best_i:
                        choice[j] = NEG_INF
                picked[r] = gates[warp, T.min(best_i, e - 1)]
                total = total + picked[r]
                if (lane == 0) and (row < N):
                    Ids[row, r] = best_i
            if (lane == 0) and (row < N):
                for r in T.serial(k):
                    if normalise:
                        Weights[row, r] = picked[r] / T.max(total, T.float32(1e-20)) * T.float32(scale)
                    else:
                        Weights[row, r] = picked[r] * T.float32(scale)

    return main


def _kernel(e, k, logit_dtype, bias_dtype, normalise, scale):
    key = (e, k, _DTYPES[logit_dtype], _DTYPES[bias_dtype], bool(normalise), float(scale))
    return compile_cached("moe_route", key, lambda: _build(e, k, _DTYPES[logit_dtype], _DTYPES[bias_dtype],
                                                          bool(normalise), float(scale)))


def moe_route_tilelang(router_logits: torch.Tensor, bias: torch.Tensor, top_k: int, norm_topk_prob: bool,
                       routed_scaling_factor: float) -> tuple[torch.Tensor, torch.Tensor]:
    """router_logits [T, E], bias [E] -> (weights float32 [T, k], ids int32 [T, k]); like ``moe_route_ref``."""
    require(router_logits.dim() == 2 and router_logits.dtype in _DTYPES, "router_logits: [T, E] float")
    t, e = router_logits.shape
    require(bias.dim() == 1 and bias.shape[0] == e and bias.dtype in _DTYPES, f"bias: [{e}] float")
    require(0 < top_k <= min(e, MAX_TOP_K) and e <= MAX_EXPERTS, f"top_k={top_k}, E={e}: k <= 16, E <= 1024")
    device = require_cuda(router_logits=router_logits, bias=bias)
    weights = torch.empty(t, top_k, dtype=torch.float32, device=device)
    ids = torch.empty(t, top_k, dtype=torch.int32, device=device)
    if t:
        _kernel(e, top_k, router_logits.dtype, bias.dtype, norm_topk_prob, routed_scaling_factor)(
            router_logits if router_logits.stride(1) == 1 else router_logits.contiguous(), bias.contiguous(),
            weights, ids)
    return weights, ids
