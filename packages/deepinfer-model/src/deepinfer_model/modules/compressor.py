"""Compressor of a compressed source layer: r consecutive tokens -> one KV entry + index key.

Per token t (input v_t = u_t on the encoder side, the YOCO shared hidden s_t on the consumer
side): `c_t = W_kv v_t` [D], `ik_t = W_k v_t` [Di], `g_t = w_gate · v_t` (the *token terms*,
what the engine's stage plane keeps). Entry j covers positions `j*r .. j*r + r - 1`::

    a        = softmax_i(g_{j*r+i} + pos_bias[i])                      i = 0 .. r-1
    latent_j = [RMSNorm(sum_i a_i c[:dc]), RoPE(sum_i a_i c[dc:], position j*r + r - 1)]
    index_kj = sum_i a_i ik

`combine` is the single definition used by both forward paths. `project_terms` is the engine's
`token_terms`: one GEMM, when the compressor owns its projections' stack (`fused_terms`; an
encoder-side source's projections join its layer's fused input GEMM instead, see mla.py).
"""

from __future__ import annotations

import torch
from torch import nn

from deepinfer_model.modules.fused_projection import FusedProjection
from deepinfer_model.modules.linear import Linear
from deepinfer_model.modules.norm import RMSNorm
from deepinfer_model.modules.rope import RopeTable, apply_rope, apply_rope_inplace


class Compressor(nn.Module):
    def __init__(self, cfg, ratio: int, fused_terms: bool = False):
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.ratio = ratio
        self.dc = d - cfg.qk_rope_head_dim
        self.theta = cfg.rope_theta
        self.wkv = Linear(h, d, bias=False)
        self.wk = Linear(h, cfg.index_head_dim, bias=False)
        self.gate = Linear(h, 1, bias=False)
        self.pos_bias = nn.Parameter(torch.zeros(ratio))
        self.kv_norm = RMSNorm(self.dc, cfg.rms_norm_eps)
        self.terms_projection = FusedProjection(self.token_projections) if fused_terms else None

    @property
    def token_projections(self) -> tuple[nn.Linear, nn.Linear, nn.Linear]:
        """The projections of the token terms, in their packed order (c, ik, g)."""
        return self.wkv, self.wk, self.gate

    @property
    def stage_width(self) -> int:
        return self.wkv.out_features + self.wk.out_features + 1

    def token_terms(self, v: torch.Tensor) -> torch.Tensor:
        """v [N, H] -> packed token terms [N, D + Di + 1] = (c, ik, g) in float32."""
        return torch.cat([self.wkv(v).float(), self.wk(v).float(), self.gate(v).float()], dim=-1)

    def project_terms(self, v: torch.Tensor) -> torch.Tensor:
        """`token_terms` of the engine path: v [N, H] -> float32 [N, D + Di + 1], one GEMM when fused."""
        if self.terms_projection is None:
            return self.token_terms(v)
        return self.terms_projection(v)[:, : self.stage_width].float()   # the padding columns dropped

    def combine(self, terms: torch.Tensor, entry_ids: torch.Tensor, rope: RopeTable | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """terms [E, r, D + Di + 1] (tokens of each entry in order), entry_ids [E]
        -> (latent [E, D] float32, index_k [E, Di] float32). `rope`: the table of the entries'
        positions (`entry_positions(entry_ids)`) when the caller has it (the engine shares one per
        step): the fresh sum is then rotated in place, bit-identical to the formula."""
        d = self.wkv.out_features
        c, ik, g = terms[..., :d], terms[..., d:-1], terms[..., -1]
        a = torch.softmax(g + self.pos_bias.float(), dim=-1).unsqueeze(-1)        # [E, r, 1]
        cs, iks = (a * c).sum(1), (a * ik).sum(1)
        if rope is None:
            rotated = apply_rope(cs[:, self.dc:], self.entry_positions(entry_ids), self.theta)
        else:
            apply_rope_inplace(cs.view(cs.shape[0], 1, d), rope, self.theta)
            rotated = cs[:, self.dc:]
        return torch.cat([self.kv_norm(cs[:, : self.dc]), rotated], -1), iks

    def entry_positions(self, entry_ids: torch.Tensor) -> torch.Tensor:
        """entry_ids [E] -> int64 [E] the position each entry's RoPE uses (its last token's)."""
        return entry_ids.long() * self.ratio + self.ratio - 1

    def entries(self, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Dense: v [T, H] for positions 0..T-1 -> complete entries (latent [T//r, D], index_k [T//r, Di])."""
        n = v.shape[0] // self.ratio
        width = self.wkv.out_features + self.wk.out_features + 1
        terms = self.token_terms(v[: n * self.ratio]).reshape(n, self.ratio, width)  # n may be 0 (short prefix)
        return self.combine(terms, torch.arange(n, device=v.device))
