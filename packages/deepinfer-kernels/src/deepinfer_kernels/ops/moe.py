"""MoE ops: sigmoid routing with a selection bias, grouped expert GEMM, routed-experts forward.

Routing (`moe_route`), per token t over E experts::

    sigma = sigmoid(router_logits[t])                 # the gate values
    ids   = top_k(sigma + bias)                       # bias only chooses, never weighs;
                                                      # ties -> lower expert id
    w     = sigma[ids] / sum(sigma[ids]) if norm_topk_prob else sigma[ids]
    w     = w * routed_scaling_factor

Grouped GEMM (`grouped_expert_gemm`): tokens are permuted so that those of expert e are rows
`expert_offsets[e] .. expert_offsets[e+1]-1`; `out[rows of e] = x[rows of e] @ w[e].T`.

Routed experts (`routed_experts`): SwiGLU experts with stacked weights `w13 [E, 2I, H]`
(gate rows then up rows) and `w2 [E, H, I]`; `out[t] = sum_k w[t,k] * expert_{ids[t,k]}(x[t])`,
accumulated over k in order 0..top_k-1 (the permutation is stable, so the sum order is fixed).

Implementations of `routed_experts`:
- `routed_experts_ref`: the per-expert loop (CPU path and oracle; reads the offsets on the host).
- `routed_experts_grouped`: CUDA SM90, bf16. Same permutation (stable sort of the flat expert
  ids), group ends by `searchsorted` (int32, no bincount: that one syncs on CUDA), both expert
  GEMMs as one `torch._grouped_mm` each (fp32 accumulation, bf16 out, like the reference's
  per-expert GEMM then cast), unpermute by `index_copy_`. Static shapes ([T*k] rows whatever the
  routing), no host sync: capturable in a CUDA graph. On the CPU it runs only to check the CUDA
  code path (`force_capturable()`, dynamo tracing), through torch's CPU `_grouped_mm`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from deepinfer_kernels.batch_invariant import batch_invariant_enabled
from deepinfer_kernels.layouts import grouped_mm_order, permute_by_expert  # noqa: F401  (re-exported)
from deepinfer_kernels.ops._checks import (
    FLOAT_DTYPES,
    INDEX_DTYPES,
    check_dim,
    check_same_device,
    check_tensor,
)
from deepinfer_kernels.ops.capture import host_checks, use_capturable
from deepinfer_kernels.platform import (
    Backend,
    current_platform,
    forced_backend,
    tilelang_launcher,
)
from deepinfer_kernels.tilelang.torch_ops import register_cpu_reference


def moe_route_ref(router_logits: torch.Tensor, bias: torch.Tensor, top_k: int, norm_topk_prob: bool,
                  routed_scaling_factor: float) -> tuple[torch.Tensor, torch.Tensor]:
    """router_logits [T, E], bias [E] -> (weights float32 [T, k], expert ids int32 [T, k])."""
    sigma = torch.sigmoid(router_logits.float())
    choice = sigma + bias.float().unsqueeze(0)
    ids = torch.sort(choice, dim=-1, descending=True, stable=True).indices[:, :top_k]
    w = sigma.gather(1, ids)
    if norm_topk_prob:
        w = w / w.sum(-1, keepdim=True).clamp(min=1e-20)
    return w * routed_scaling_factor, ids.to(torch.int32)


def grouped_expert_gemm_ref(x: torch.Tensor, w: torch.Tensor, expert_offsets: torch.Tensor) -> torch.Tensor:
    """x [N, K] (rows grouped by expert), w [E, Nout, K], expert_offsets [E+1] -> [N, Nout]."""
    out = torch.empty(x.shape[0], w.shape[1], dtype=torch.float32, device=x.device)
    bounds = expert_offsets.tolist()
    for e in range(w.shape[0]):
        lo, hi = bounds[e], bounds[e + 1]
        if hi > lo:
            out[lo:hi] = x[lo:hi].float() @ w[e].float().t()
    return out.to(x.dtype)


def routed_experts_ref(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor,
                       w13: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """x [T, H], weights [T, k], ids [T, k], w13 [E, 2I, H], w2 [E, H, I] -> [T, H]."""
    t, k = ids.shape
    order, offsets = permute_by_expert(ids, w13.shape[0])
    token_of = order // k                                                      # [T*k]
    xp = x[token_of]                                                           # [T*k, H]
    gu = grouped_expert_gemm_ref(xp, w13, offsets)                             # [T*k, 2I]
    inter = w13.shape[1] // 2
    act = F.silu(gu[:, :inter].float()) * gu[:, inter:].float()
    y = grouped_expert_gemm_ref(act.to(x.dtype), w2, offsets).float()        # [T*k, H]
    y = y * weights.reshape(-1)[order].float().unsqueeze(1)
    # Unpermute then sum over k in slot order (deterministic).
    unperm = torch.empty_like(y)
    unperm[order] = y
    return unperm.reshape(t, k, -1).sum(1).to(x.dtype)


@register_cpu_reference("routed_experts")
def _(x, weights, ids, w13, w2):
    return routed_experts_ref(x, weights, ids, w13, w2).contiguous()


GROUPED_GEMM_TILELANG_MAX_ROWS_PER_EXPERT = 64   # grouped_expert_gemm: TileLang up to this average, cuBLAS above
TILELANG_MOE_MAX_TOKENS = 256  # tokens per call above which routed_experts uses torch's grouped GEMM


def routed_experts_masked(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor,
                          w13: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """Capturable routed experts without a grouped GEMM: every expert runs over every token and
    its output is weighted by the token's combine weight for it (0 when not routed there).
    E times the FLOPs of the reference, no host sync, static shapes: the fallback that keeps
    decode graphs capturable where `torch._grouped_mm` does not apply (fp32, non-SM90)."""
    num_experts, inter = w13.shape[0], w13.shape[1] // 2
    combine = torch.zeros(x.shape[0], num_experts, dtype=torch.float32, device=x.device)
    combine.scatter_add_(1, ids.long(), weights.float())                      # [T, E]
    out = torch.zeros(x.shape[0], x.shape[1], dtype=torch.float32, device=x.device)
    for e in range(num_experts):
        gu = (x @ w13[e].t()).float()
        act = F.silu(gu[:, :inter]) * gu[:, inter:]
        out += ((act.to(x.dtype) @ w2[e].t()).float()) * combine[:, e: e + 1]
    return out.to(x.dtype)


def grouped_mm_usable(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor) -> bool:
    """Whether `routed_experts` takes the grouped-GEMM path for these operands.

    CUDA: bf16 operands on SM90 (torch's grouped GEMM kernel; elsewhere torch falls back to a
    per-group loop that reads the offsets on the host). Row strides must be 16-byte aligned
    (hidden and expert widths multiples of 8). CPU: only to run the CUDA code path under
    `force_capturable()` or dynamo tracing (tracing needs bf16: the meta kernel checks it).
    `DEEPINFER_KERNEL_BACKEND=torch` forces the reference.
    """
    if not hasattr(torch, "_grouped_mm") or forced_backend() is Backend.TORCH:
        return False
    if not (x.dtype == w13.dtype == w2.dtype) or x.shape[1] % 8 or w2.shape[2] % 8:
        return False
    if x.device.type == "cuda":
        return x.dtype == torch.bfloat16 and current_platform().is_sm90
    if x.device.type != "cpu" or not use_capturable(x):
        return False
    return x.dtype == torch.bfloat16 or (x.dtype == torch.float32 and not torch.compiler.is_compiling())


def routed_experts_grouped(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor,
                           w13: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """`routed_experts_ref` through `torch._grouped_mm`: static shapes, no host sync."""
    t, k = ids.shape
    if t == 0:
        return torch.zeros_like(x)
    num_experts, inter = w13.shape[0], w13.shape[1] // 2
    order, ends = grouped_mm_order(ids, num_experts)
    xp = x[order // k]                                                         # [T*k, H]
    gu = torch._grouped_mm(xp, w13.transpose(1, 2), offs=ends)                 # [T*k, 2I]
    act = F.silu(gu[:, :inter].float()) * gu[:, inter:].float()
    y = torch._grouped_mm(act.to(x.dtype), w2.transpose(1, 2), offs=ends).float()   # [T*k, H]
    y = y * weights.reshape(-1)[order].float().unsqueeze(1)
    unperm = torch.empty_like(y).index_copy_(0, order, y)
    return unperm.reshape(t, k, -1).sum(1).to(x.dtype)


# ---------------------------------------------------------------- public wrappers


def moe_route(router_logits: torch.Tensor, bias: torch.Tensor, top_k: int, norm_topk_prob: bool = True,
              routed_scaling_factor: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """router_logits [T, E], bias [E] -> (weights float32 [T, top_k], ids int32 [T, top_k])."""
    check_tensor("router_logits", router_logits, 2, FLOAT_DTYPES)
    check_tensor("bias", bias, 1, FLOAT_DTYPES)
    check_dim("bias", bias, 0, router_logits.shape[1])
    if not 0 < top_k <= router_logits.shape[1]:
        raise ValueError(f"top_k={top_k}: must lie in [1, {router_logits.shape[1]}]")
    device = check_same_device(router_logits=router_logits, bias=bias)
    kernel = tilelang_launcher("moe_route", device, supported=top_k <= 16 and router_logits.shape[1] <= 1024)
    if kernel is not None:   # one launch instead of ~10 (sigmoid, bias, sort, gather, sum, ...)
        return kernel(router_logits, bias, top_k, norm_topk_prob, routed_scaling_factor)
    return moe_route_ref(router_logits, bias, top_k, norm_topk_prob, routed_scaling_factor)


def grouped_expert_gemm(x: torch.Tensor, w: torch.Tensor, expert_offsets: torch.Tensor) -> torch.Tensor:
    """x [N, K] grouped by expert, w [E, Nout, K], expert_offsets int64 [E+1] -> [N, Nout] (x.dtype)."""
    check_tensor("x", x, 2, FLOAT_DTYPES)
    check_tensor("w", w, 3, FLOAT_DTYPES)
    check_tensor("expert_offsets", expert_offsets, 1, INDEX_DTYPES)
    check_dim("w", w, 2, x.shape[1])
    check_dim("expert_offsets", expert_offsets, 0, w.shape[0] + 1)
    if host_checks(expert_offsets) and (int(expert_offsets[0]) != 0 or int(expert_offsets[-1]) != x.shape[0]):
        raise ValueError(f"expert_offsets: must start at 0 and end at N={x.shape[0]}")
    device = check_same_device(x=x, w=w, expert_offsets=expert_offsets)
    rows, k = x.shape
    e, nout = w.shape[0], w.shape[1]
    # decode sizes (the average expert <= 64 rows): the TileLang grouped GEMM; prefill sizes: cuBLAS's
    # grouped GEMM through torch._grouped_mm (70-80% of the bf16 matmul rate where the TileLang
    # prefill tiles reach 45%, H200 2026-11-30 / 12-01)
    kernel = tilelang_launcher("grouped_expert_gemm", device,
                               supported=x.dtype == w.dtype == torch.bfloat16 and rows <= GROUPED_GEMM_TILELANG_MAX_ROWS_PER_EXPERT * e
                               and k % 64 == 0 and nout % 128 == 0)
    if kernel is not None:
        return kernel(x, w, expert_offsets)
    if device.type == "cuda" and nout % 8 == 0 and grouped_mm_usable(x, w, w):   # K and Nout 16-byte rows
        return torch._grouped_mm(x.contiguous(), w.transpose(1, 2), offs=expert_offsets[1:].to(torch.int32))
    return grouped_expert_gemm_ref(x, w, expert_offsets)


def routed_experts(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor,
                   w13: torch.Tensor, w2: torch.Tensor, shared: torch.Tensor | None = None,
                   residual: torch.Tensor | None = None,
                   before_combine: Callable[[], None] | None = None) -> torch.Tensor:
    """x [T, H], weights [T, k] float32, ids int32 [T, k], w13 [E, 2I, H], w2 [E, H, I] -> [T, H].
    With `shared` / `residual` ([T, H], x's dtype): `residual + (routed + shared)`, rounded as those
    torch adds are (on SM90 the combine kernel adds them: two launches fewer per MoE layer).
    `before_combine`: called on the host right before anything reading `shared` or `residual` is
    launched (a caller computing them on another CUDA stream makes the current stream wait there,
    so the expert GEMMs run beside that work)."""
    check_tensor("x", x, 2, FLOAT_DTYPES)
    check_tensor("weights", weights, 2, FLOAT_DTYPES)
    check_tensor("ids", ids, 2, INDEX_DTYPES)
    check_tensor("w13", w13, 3, FLOAT_DTYPES)
    check_tensor("w2", w2, 3, FLOAT_DTYPES)
    check_dim("weights", weights, 0, x.shape[0])
    check_dim("ids", ids, 0, x.shape[0])
    check_dim("ids", ids, 1, weights.shape[1])
    check_dim("w13", w13, 2, x.shape[1])
    check_dim("w2", w2, 0, w13.shape[0])
    check_dim("w2", w2, 1, x.shape[1])
    check_dim("w2", w2, 2, w13.shape[1] // 2)
    if host_checks(ids) and ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= w13.shape[0]):
        raise ValueError(f"ids: expert ids must lie in [0, {w13.shape[0]})")
    for name, t in (("shared", shared), ("residual", residual)):
        if t is not None:
            check_tensor(name, t, 2, (x.dtype,))
            check_dim(name, t, 0, x.shape[0])
            check_dim(name, t, 1, x.shape[1])
    device = check_same_device(x=x, weights=weights, ids=ids, w13=w13, w2=w2)
    # Decode sizes only: the prefill-size gate/up kernel hung in its GPU tests (2026-11-30 run).
    invariant = batch_invariant_enabled()   # one kernel and one tile shape whatever the token count
    kernel = tilelang_launcher("routed_experts", device,
                               supported=x.dtype == torch.bfloat16
                               and (x.shape[0] <= TILELANG_MOE_MAX_TOKENS or invariant)
                               and x.shape[1] % 128 == 0 and w2.shape[2] % 128 == 0)  # tile-aligned widths
    if kernel is not None and not torch.compiler.is_compiling():
        return kernel(x, weights, ids, w13, w2, shared=shared, residual=residual, before_combine=before_combine)
    # prefill sizes on SM90: torch's grouped GEMMs with TileLang's activation and combine between them
    prefill = None if kernel is not None else tilelang_launcher(
        "routed_experts_prefill", device, supported=x.dtype == torch.bfloat16 and grouped_mm_usable(x, w13, w2))
    if prefill is not None:
        return prefill(x, weights, ids, w13, w2, shared=shared, residual=residual, before_combine=before_combine)
    if kernel is not None:   # the traced custom op takes no addends: inductor generates the adds
        out = kernel(x, weights, ids, w13, w2)
    elif grouped_mm_usable(x, w13, w2):
        out = routed_experts_grouped(x, weights, ids, w13, w2)
    elif use_capturable(x):  # CUDA without the grouped GEMM (fp32, other GPUs): static shapes, no sync
        out = routed_experts_masked(x, weights, ids, w13, w2)
    else:
        out = routed_experts_ref(x, weights, ids, w13, w2)
    if before_combine is not None:
        before_combine()
    out = out if shared is None else out + shared
    return out if residual is None else residual + out
