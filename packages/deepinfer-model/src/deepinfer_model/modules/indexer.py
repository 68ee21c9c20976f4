"""Lightning indexer query side (per compressed layer).

`q_idx = W_iq · q_latent` -> [ni, Di] (q_latent = RMSNorm(W_qa · u), shared with MLA), and head
weights `w = W_iw · u / sqrt(ni)` -> [ni]. The key side (index_k of compressed entries) comes from
the source layer's compressor. Score of entry j: `sum_h w_h relu(q_idx_h · index_k_j)`.
"""

from __future__ import annotations

import torch
from torch import nn

from deepinfer_model.modules.linear import Linear
from deepinfer_model.modules.norm import NormedRows


class LightningIndexer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.n_heads = cfg.index_n_heads
        self.head_dim = cfg.index_head_dim
        self.wq_b = Linear(cfg.q_lora_rank, self.n_heads * self.head_dim, bias=False)
        self.weights_proj = Linear(cfg.hidden_size, self.n_heads, bias=False)

    def query(self, q_latent: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q_latent [N, qr], u [N, H] -> (q_idx [N, ni, Di] in the weights' dtype, w float32 [N, ni]).

        q_idx stays in the weights' dtype (bf16 on the GPU): the scores multiply it in fp32 either
        way, and a bf16 query is what the TileLang indexer kernel takes."""
        return self.query_heads(q_latent), self.head_weights(self.weights_proj(u))

    def query_heads(self, q_latent: torch.Tensor | NormedRows) -> torch.Tensor:
        """q_latent [N, qr] (or the rows its norm makes: one launch at batch 1 on SM90) -> q_idx
        [N, ni, Di] in the weights' dtype."""
        if isinstance(q_latent, NormedRows):
            return q_latent.project(self.wq_b.weight).view(-1, self.n_heads, self.head_dim)
        return self.wq_b(q_latent).view(-1, self.n_heads, self.head_dim)

    @property
    def head_weight_scale(self) -> float:
        return self.n_heads ** -0.5

    def head_weights(self, projected: torch.Tensor) -> torch.Tensor:
        """projected = W_iw u [N, ni] (the engine computes it in the layer's fused input GEMM) -> w float32 [N, ni]."""
        return projected.float() * self.head_weight_scale
