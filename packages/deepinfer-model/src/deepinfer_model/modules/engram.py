"""Engram: hashed n-gram lookups gated into the residual stream.

For n = 2..N (N = engram_max_ngram_size), over compressed token ids (see engram_vocab.py)::

    h_n     = fold(cid_{t-n+1} .. cid_t)          fold: h = (h * 1000003 + cid + 1) mod (2^31 - 1), h0 = 0
    bucket  = h_n mod engram_table_size           (positions before 0 use the pad id -1)
    y_t     = W_proj · concat_n T_n[bucket_n]
    x_t    += sigmoid(w_gate · RMSNorm(x_t)) · y_t

One table per n (`tables.{n-2}`); tables shard by rows across ranks (one rank here). The hash is
`deepinfer_kernels.ops.engram.ngram_buckets` (re-exported here).
"""

from __future__ import annotations

import torch
from torch import nn

from deepinfer_kernels.ops.engram import ngram_buckets
from deepinfer_model.modules.linear import Linear
from deepinfer_model.modules.norm import RMSNorm

PAD_ID = -1
__all__ = ["PAD_ID", "Engram", "dense_windows", "ngram_buckets"]


def dense_windows(cids: torch.Tensor, n_max: int) -> torch.Tensor:
    """cids [T] for positions 0..T-1 -> windows [T, n_max] (PAD_ID before position 0)."""
    pad = torch.full((n_max - 1,), PAD_ID, dtype=torch.long, device=cids.device)
    padded = torch.cat([pad, cids.long()])
    return padded.unfold(0, n_max, 1)


class Engram(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.n_max = cfg.engram_max_ngram_size
        self.table_size = cfg.engram_table_size
        self.tables = nn.ModuleList(nn.Embedding(cfg.engram_table_size, cfg.engram_dim)
                                    for _ in range(self.n_max - 1))
        self.proj = Linear((self.n_max - 1) * cfg.engram_dim, cfg.hidden_size, bias=False)
        self.gate = Linear(cfg.hidden_size, 1, bias=False)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x: torch.Tensor, windows: torch.Tensor) -> torch.Tensor:
        """x [N, H], windows [N, n_max] -> the residual delta [N, H]."""
        return self.from_buckets(x, ngram_buckets(windows, self.table_size))

    def from_buckets(self, x: torch.Tensor, buckets: torch.Tensor) -> torch.Tensor:
        """x [N, H], buckets [N, n_max - 1] (`ngram_buckets` of the rows' windows) -> the residual delta [N, H]."""
        return self.gated(x, self.memory(buckets))

    def memory(self, buckets: torch.Tensor) -> torch.Tensor:
        """buckets [N, n_max - 1] -> y [N, H], the projected lookups: independent of x, so a decode
        step computes it beside the layers before (engine/forward.py)."""
        looked = torch.cat([t(buckets[:, i]) for i, t in enumerate(self.tables)], dim=-1)
        return self.proj(looked)

    def gated(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """x [N, H], y [N, H] (`memory`) -> sigmoid(w_gate · RMSNorm(x)) · y. The sigmoid of a bf16 /
        fp16 gate computes in float32 and rounds once, as a float32 sigmoid cast back would."""
        return torch.sigmoid(self.gate(self.norm(x))) * y
