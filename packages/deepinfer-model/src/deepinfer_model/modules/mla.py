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

Engine path: every projection of u (W_qa, the indexer's W_iw, an encoder-side compressor's
W_kv / W_k / w_gate, W_kva) is one GEMM (`project_input`, see fused_projection.py). W_kva's
columns come last, so RoPE of the latent's tail is the in-place RoPE of the whole fused row.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from deepinfer_kernels.batch_invariant import batch_invariant_enabled
from deepinfer_kernels.ops.kv_fp8 import store_kv_fp8, store_normed_kv_fp8
from deepinfer_model.modules.compressor import Compressor
from deepinfer_model.modules.fused_projection import FusedProjection
from deepinfer_model.modules.indexer import LightningIndexer
from deepinfer_model.modules.linear import Linear
from deepinfer_model.modules.norm import NormedRows, RMSNorm
from deepinfer_model.modules.rope import RopeTable, apply_rope, apply_rope_inplace, rope_table


@dataclass(frozen=True)
class AttentionInputs:
    """Everything a layer's engine path projects from its attention input u [N, H]."""

    q: torch.Tensor                        # [N, nh, D], RoPE applied
    q_latent: torch.Tensor                 # [N, qr] = RMSNorm(W_qa u)
    latent: torch.Tensor                   # [N, D] KV latent (the cached record's values)
    index_weights: torch.Tensor | None     # [N, ni] W_iw u (compressed layers), before `head_weights`
    compressor_terms: torch.Tensor | None  # float32 [N, D + Di + 1] token terms (encoder-side sources)


class MLAAttention(nn.Module):
    def __init__(self, cfg, ratio: int = 0, has_compressor: bool = False, compressor_reads_input: bool = True):
        """`compressor_reads_input`: the compressor's input is this layer's u (encoder side), so its
        projections join the fused input GEMM; False for YOCO consumers (their compressors read the
        shared hidden)."""
        super().__init__()
        h, d, qr = cfg.hidden_size, cfg.head_dim, cfg.q_lora_rank
        self.num_heads = cfg.num_attention_heads
        self.head_dim = d
        self.rope_dim = cfg.qk_rope_head_dim
        self.dc = d - self.rope_dim
        self.theta = cfg.rope_theta
        self.sm_scale = 1.0 / math.sqrt(d)
        self.ratio = ratio
        self.q_a_proj = Linear(h, qr, bias=False)
        self.q_a_layernorm = RMSNorm(qr, cfg.rms_norm_eps)
        self.q_b_proj = Linear(qr, self.num_heads * d, bias=False)
        self.kv_a_proj_with_mqa = Linear(h, d, bias=False)
        self.kv_a_layernorm = RMSNorm(self.dc, cfg.rms_norm_eps)
        self.o_proj = Linear(self.num_heads * d, h, bias=False)
        self.indexer = LightningIndexer(cfg) if ratio > 0 else None
        self.compressor_reads_input = has_compressor and compressor_reads_input
        self.compressor = (Compressor(cfg, ratio, fused_terms=not compressor_reads_input) if has_compressor
                           else None)
        members = [self.q_a_proj]
        if self.indexer is not None:
            members.append(self.indexer.weights_proj)
        if self.compressor_reads_input:
            members.extend(self.compressor.token_projections)
        # kv last (see project_input), the alignment padding before it
        self.input_projection = FusedProjection(members + [self.kv_a_proj_with_mqa], pad_before=len(members))

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

    def project_input(self, u: torch.Tensor, positions: torch.Tensor | RopeTable) -> AttentionInputs:
        """u [N, H], positions [N] (or their RopeTable) -> every projection of u, from one GEMM;
        q, q_latent and latent equal `query` and `latent` up to the GEMM's summation order."""
        table = positions if isinstance(positions, RopeTable) else rope_table(positions, self.rope_dim, self.theta)
        fused = self.fused_input(u)
        self.rotate_latent_tail(fused, table)
        q_lat = self.fused_query_latent(fused)
        return AttentionInputs(self.queries(q_lat, table), q_lat.normed(), self.fused_latent(fused),
                               self.fused_index_weights(fused), self.fused_compressor_terms(fused))

    # `project_input` in parts (the engine's decode runs the query and the latent on two streams)
    def fused_input(self, u: torch.Tensor) -> torch.Tensor:
        """u [N, H] -> the fused projection [N, qr + ... + pad + D] (contiguous; pad: fused_projection.py)."""
        return self.input_projection(u)

    def fused_input_normed(self, x: torch.Tensor, norm) -> torch.Tensor:
        """`fused_input(norm(x))` (the layer's input norm and projection): one launch for one row on SM90."""
        return self.input_projection.normed(x, norm)

    def rotate_latent_tail(self, fused: torch.Tensor, table: RopeTable) -> None:
        """RoPE of the latent's tail kv[:, dc:], in place (the last columns of the fused row; the
        other columns are not touched)."""
        apply_rope_inplace(fused.view(fused.shape[0], 1, -1), table, self.theta)

    def fused_query_latent(self, fused: torch.Tensor) -> NormedRows:
        """-> q_latent [N, qr] = RMSNorm(W_qa u), as rows its projections read (at batch 1 on SM90
        each of them, q_b and the indexer's query, normalises W_qa u in its own launch)."""
        return NormedRows(fused[:, : self.q_a_proj.out_features], self.q_a_layernorm)

    def queries(self, q_lat: NormedRows, table: RopeTable) -> torch.Tensor:
        """q_latent [N, qr] -> q [N, nh, D] with RoPE."""
        q = q_lat.project(self.q_b_proj.weight).view(q_lat.x.shape[0], self.num_heads, self.head_dim)   # fresh:
        apply_rope_inplace(q, table, self.theta)                                                         # rotated in place
        return q

    def fused_latent(self, fused: torch.Tensor) -> torch.Tensor:
        """-> the KV latent [N, D] (normed content, rotated tail)."""
        kv = fused[:, -self.head_dim:]
        return torch.cat([self.kv_a_layernorm(kv[:, : self.dc]), kv[:, self.dc:]], dim=-1)

    def store_latent(self, fused: torch.Tensor, pool: torch.Tensor, slots: torch.Tensor, table: RopeTable) -> None:
        """The latent's tail rotated (`rotate_latent_tail`), then `store_kv_fp8(self.fused_latent(fused),
        pool, slots)`. Where the latent norm is the kernels package's mixed-dtype norm (CUDA, bf16 /
        fp16 rows, float32 weight, not batch-invariant) the RoPE, the norm, the concatenation and the
        store are one launch, bit-identical to the four (the rotation then lands in the record only,
        not in `fused`: nothing else reads those columns)."""
        kv, norm = fused[:, -self.head_dim:], self.kv_a_layernorm
        if kv.is_cuda and kv.dtype != norm.weight.dtype and not batch_invariant_enabled():
            store_normed_kv_fp8(kv, norm.weight, norm.eps, self.dc, pool, slots, rope=(table.cos_full, table.sin_signed))
        else:
            self.rotate_latent_tail(fused, table)
            store_kv_fp8(self.fused_latent(fused), pool, slots)

    def fused_index_weights(self, fused: torch.Tensor) -> torch.Tensor | None:
        """-> W_iw u [N, ni] (compressed layers), a view."""
        if self.indexer is None:
            return None
        qr = self.q_a_proj.out_features
        return fused[:, qr: qr + self.indexer.n_heads]

    def fused_compressor_terms(self, fused: torch.Tensor) -> torch.Tensor | None:
        """-> float32 [N, stage] token terms of an encoder-side compressor (c, ik, g: the packed layout)."""
        if not self.compressor_reads_input:
            return None
        start = self.q_a_proj.out_features + (self.indexer.n_heads if self.indexer is not None else 0)
        return fused[:, start: start + self.compressor.stage_width].float()

    def query_and_latent(self, u: torch.Tensor, positions: torch.Tensor | RopeTable
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(q [N, nh, D], q_latent [N, qr], latent [N, D]) of `project_input`."""
        inputs = self.project_input(u, positions)
        return inputs.q, inputs.q_latent, inputs.latent

    def output(self, o: torch.Tensor) -> torch.Tensor:
        """o [N, nh, D] -> [N, H]."""
        return self.o_proj(o.reshape(o.shape[0], self.num_heads * self.head_dim).to(self.o_proj.weight.dtype))
