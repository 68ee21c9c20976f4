"""MLA attention weights with one shared KV head (the latent is both key and value).

```
q      = W_qb · RMSNorm(W_qa · u)               -> [nh, D], RoPE on the last dr dims
kv     = W_kva · u                              -> [D]     (no up-projection: only "A")
latent = [RMSNorm(kv[:dc]), RoPE(kv[dc:])]      -> [D]     cached as the 528-byte record
out    = W_o · concat_h o_h
```
The visible-set logic (window, compressed background) lives in the forward paths; this module
only owns the projections. Compressed layers also own an indexer query; compressed *sources*
own a compressor (see compressor.py).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from deepinfer_model.modules.compressor import Compressor
from deepinfer_model.modules.indexer import LightningIndexer
from deepinfer_model.modules.norm import RMSNorm
from deepinfer_model.modules.rope import RopeTable, apply_rope, apply_rope_inplace, rope_table


class MLAAttention(nn.Module):
    def __init__(self, cfg, ratio: int = 0, has_compressor: bool = False):
        super().__init__()
        h, d, qr = cfg.hidden_size, cfg.head_dim, cfg.q_lora_rank
        self.num_heads = cfg.num_attention_heads
        self.head_dim = d
        self.rope_dim = cfg.qk_rope_head_dim
        self.dc = d - self.rope_dim
        self.theta = cfg.rope_theta
        self.sm_scale = 1.0 / math.sqrt(d)
        self.ratio = ratio
        self.q_a_proj = nn.Linear(h, qr, bias=False)
        self.q_a_layernorm = RMSNorm(qr, cfg.rms_norm_eps)
        self.q_b_proj = nn.Linear(qr, self.num_heads * d, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(h, d, bias=False)
        self.kv_a_layernorm = RMSNorm(self.dc, cfg.rms_norm_eps)
        self.o_proj = nn.Linear(self.num_heads * d, h, bias=False)
        self.indexer = LightningIndexer(cfg) if ratio > 0 else None
        self.compressor = Compressor(cfg, ratio) if has_compressor else None

    def query(self, u: torch.Tensor, positions: torch.Tensor | RopeTable) -> tuple[torch.Tensor, torch.Tensor]:
        """u [N, H], positions [N] (or their RopeTable) -> (q [N, nh, D], q_latent [N, qr])."""
        q_lat = self.q_a_layernorm(self.q_a_proj(u))
        q = self.q_b_proj(q_lat).view(u.shape[0], self.num_heads, self.head_dim)
        q = torch.cat([q[..., : self.dc], apply_rope(q[..., self.dc:], positions, self.theta)], dim=-1)
        return q, q_lat

    def latent(self, u: torch.Tensor, positions: torch.Tensor | RopeTable) -> torch.Tensor:
        """u [N, H], positions [N] (or their RopeTable) -> KV latent [N, D] (key and value of the one KV head)."""
        kv = self.kv_a_proj_with_mqa(u)
        return torch.cat([self.kv_a_layernorm(kv[:, : self.dc]),
                          apply_rope(kv[:, self.dc:], positions, self.theta)], dim=-1)

    def query_and_latent(self, u: torch.Tensor, positions: torch.Tensor | RopeTable
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """`query` and `latent` of the same rows, their RoPE applied in place to the fresh
        projections: (q [N, nh, D], q_latent [N, qr], latent [N, D]), bit-identical to the two calls."""
        n, dc = u.shape[0], self.dc
        table = positions if isinstance(positions, RopeTable) else rope_table(positions, self.rope_dim, self.theta)
        q_lat = self.q_a_layernorm(self.q_a_proj(u))
        q = self.q_b_proj(q_lat).view(n, self.num_heads, self.head_dim)   # fresh: rotated in place
        kv = self.kv_a_proj_with_mqa(u)
        apply_rope_inplace(q, table, self.theta)
        apply_rope_inplace(kv.view(n, 1, self.head_dim), table, self.theta)
        latent = torch.cat([self.kv_a_layernorm(kv[:, :dc]), kv[:, dc:]], dim=-1)
        return q, q_lat, latent

    def output(self, o: torch.Tensor) -> torch.Tensor:
        """o [N, nh, D] -> [N, H]."""
        return self.o_proj(o.reshape(o.shape[0], self.num_heads * self.head_dim).to(self.o_proj.weight.dtype))
