"""Lightning indexer query side (per compressed layer).

`q_idx = W_iq · q_latent` -> [ni, Di] (q_latent = RMSNorm(W_qa · u), shared with MLA), and head
weights `w = W_iw · u / sqrt(ni)` -> [ni]. The key side (index_k of compressed entries) comes from
the source layer's compressor. Score of entry j: `sum_h w_h relu(q_idx_h · index_k_j)`.
"""

from __future__ import annotations

import torch
from torch import nn


class LightningIndexer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.n_heads = cfg.index_n_heads
        self.head_dim = cfg.index_head_dim
        self.wq_b = nn.Linear(cfg.q_lora_rank, self.n_heads * self.head_dim, bias=False)
        self.weights_proj = nn.Linear(cfg.hidden_size, self.n_heads, bias=False)

    def query(self, q_latent: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q_latent [N, qr], u [N, H] -> (q_idx [N, ni, Di] in the weights' dtype, w float32 [N, ni]).

        q_idx stays in the weights' dtype (bf16 on the GPU): the scores multiply it in fp32 either
        way, and a bf16 query is what the TileLang indexer kernel takes."""
        q = self.wq_b(q_latent).view(-1, self.n_heads, self.head_dim)
        w = self.weights_proj(u).float() * self.n_heads ** -0.5
        return q, w
