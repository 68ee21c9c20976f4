"""Mixture of experts: sigmoid router + selection bias, shared expert(s), stacked routed experts.

Routed expert weights are stacked (`experts.w13 [E, 2I, H]` = gate rows then up rows,
`experts.w2 [E, H, I]`) for the grouped GEMM; the checkpoint keeps HF's per-expert tensors
(`mlp.experts.{e}.{gate,up,down}_proj.weight`), mapped in `checkpoint/names.py`.
`forward` runs the kernels package's ops (engine path), the router and the shared expert's gate
and up projections (all read x) as one GEMM (see fused_projection.py); `forward_reference` is a
plain per-expert loop (the oracle).
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from deepinfer_kernels.ops.moe import moe_route, routed_experts
from deepinfer_model.modules.ffn import SwiGLU
from deepinfer_model.modules.fused_projection import FusedProjection

if TYPE_CHECKING:
    from deepinfer_model.paged.streams import DecodeStreams


class Router(nn.Module):
    def __init__(self, hidden: int, num_experts: int):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(num_experts, hidden))
        self.e_score_correction_bias = nn.Parameter(torch.zeros(num_experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [N, H] -> logits [N, E]
        return F.linear(x, self.weight)


class StackedExperts(nn.Module):
    def __init__(self, num_experts: int, hidden: int, inter: int):
        super().__init__()
        self.w13 = nn.Parameter(torch.zeros(num_experts, 2 * inter, hidden))  # [E, 2I, H]
        self.w2 = nn.Parameter(torch.zeros(num_experts, hidden, inter))       # [E, H, I]


class MoE(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.top_k = cfg.num_experts_per_tok
        self.norm_topk_prob = cfg.norm_topk_prob
        self.scaling = cfg.routed_scaling_factor
        self.gate = Router(cfg.hidden_size, cfg.n_routed_experts)
        self.experts = StackedExperts(cfg.n_routed_experts, cfg.hidden_size, cfg.moe_intermediate_size)
        n_shared = cfg.n_shared_experts * cfg.moe_intermediate_size
        self.shared_experts = SwiGLU(cfg.hidden_size, n_shared, fused=False) if n_shared > 0 else None
        self.input_projection = (None if self.shared_experts is None else FusedProjection(
            [self.gate, self.shared_experts.gate_proj, self.shared_experts.up_proj]))

    def route_logits(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """router logits [N, E] -> (weights float32 [N, k], ids int32 [N, k])."""
        return moe_route(logits, self.gate.e_score_correction_bias, self.top_k, self.norm_topk_prob, self.scaling)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [N, H] -> (weights float32 [N, k], ids int32 [N, k])."""
        return self.route_logits(self.gate(x))

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None,
                streams: DecodeStreams | None = None, projected: torch.Tensor | None = None) -> torch.Tensor:
        """x [N, H] -> [N, H]: the MoE output, plus `residual` [N, H] when given (`residual + moe(x)`,
        added inside the routed experts' combine on SM90 together with the shared expert's output).
        `streams` (decode): the shared expert runs beside the routing and the routed experts' GEMMs.
        `projected`: `input_projection(x)` already made (decode, batch 1: in the launch of the norm
        that made x, `RMSNorm.add_linear`)."""
        if self.input_projection is None:
            weights, ids = self.route(x)
            return routed_experts(x, weights, ids, self.experts.w13, self.experts.w2, residual=residual)
        fused = self.input_projection(x) if projected is None else projected
        logits, gate, up = self.input_projection.split(fused)
        with streams.on("shared", reads=(fused,)) if streams is not None else contextlib.nullcontext():
            shared = self.shared_experts.from_gate_up(gate, up)
        weights, ids = self.route_logits(logits)
        # decode: the routing and the expert GEMMs run beside the shared expert, joined at the combine
        join = None if streams is None else (lambda: streams.join("shared", outputs=(shared,)))
        return routed_experts(x, weights, ids, self.experts.w13, self.experts.w2, shared=shared, residual=residual,
                              before_combine=join)

    def route_reference(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The oracle's routing (written out, independent of the op): x [N, H] -> (weights float32
        [N, k], ids int64 [N, k]). Shared by `forward_reference` and the training forward."""
        sigma = torch.sigmoid(self.gate(x).float())                               # [N, E]
        choice = sigma + self.gate.e_score_correction_bias.float()
        ids = torch.sort(choice, dim=-1, descending=True, stable=True).indices[:, : self.top_k]
        w = sigma.gather(1, ids)
        if self.norm_topk_prob:
            w = w / w.sum(-1, keepdim=True)
        return w * self.scaling, ids

    def forward_reference(self, x: torch.Tensor) -> torch.Tensor:
        w, ids = self.route_reference(x)
        inter = self.experts.w2.shape[2]
        out = torch.zeros(x.shape[0], x.shape[1], dtype=torch.float32, device=x.device)
        for slot in range(self.top_k):  # slot order matches the op's deterministic sum
            contrib = torch.zeros_like(out)
            for e in ids[:, slot].unique().tolist():
                rows = (ids[:, slot] == e).nonzero().squeeze(1)
                w13 = self.experts.w13[e].float()
                h = x[rows].float() @ w13.t()
                a = F.silu(h[:, :inter]) * h[:, inter:]
                contrib[rows] = (a @ self.experts.w2[e].float().t()) * w[rows, slot].unsqueeze(1)
            out = out + contrib
        out = out.to(x.dtype)
        if self.shared_experts is not None:
            out = out + self.shared_experts.forward_reference(x)
        return out
