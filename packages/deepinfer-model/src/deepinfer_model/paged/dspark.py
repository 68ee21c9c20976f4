"""Engine path of the DSpark draft block.

- `write_main_keys`: every DFlash layer's main-token latent from the target features of the rows
  the target just processed, written at their slots in the layer's DFlash plane (optimistically,
  including draft rows that may be rejected: the next step rewrites those slots first).
- `draft_forward`: per request, block positions p+1 .. p+nextn (inputs embed(m), embed(noise)..).
  Attention of block row j = softmax over [main keys at positions max(0, q-W+1) .. p, read from
  the pool by `sparse_mla_attention`] + [block keys 0..j, in flight, never cached]; the two
  partial results are merged through their log-sum-exps. Then `DSparkDraft.heads`.

Both are capturable (no host sync; shapes from the row / request counts only). Padding: rows with
slot -1 write no main key; draft requests with `valid == False` (or an all -1 block table) read no
main key and give finite garbage (position and main token are replaced by 0 for them).
"""

from __future__ import annotations

import torch

from deepinfer_kernels.ops.kv_fp8 import store_kv_fp8
from deepinfer_kernels.ops.sparse_mla import sparse_mla_attention
from deepinfer_kernels.ops.swa_index import window_positions
from deepinfer_model.paged.indexing import slots_of
from deepinfer_model.paged.ring import RingRows
from deepinfer_model.metadata import DraftMetadata, DraftOutput, ForwardMetadata, ForwardOutput, MetadataError
from deepinfer_model.modules.rope import rope_table


def write_main_keys(model, meta: ForwardMetadata, out: ForwardOutput, cache) -> None:
    ds = model.model.dspark
    if ds is None or out.dspark_features is None:
        raise ValueError("dspark_write_main_keys: needs a DSpark model and meta.return_dspark_features=True")
    pos = meta.positions.long()[out.full_rows]
    slots = meta.slot_mapping.long()[out.full_rows]
    rope = rope_table(pos, model.config.qk_rope_head_dim, model.config.rope_theta)   # shared by the layers
    latents = ds.main_keys_all(out.dspark_features, rope)                                 # [K, N, D]
    k = latents.shape[0]
    ring = cache.layout.ring
    if ring is not None:   # rings: the full rows among their request's last ring_len positions
        slots = RingRows(meta, meta.row_to_req, meta.positions.long(), ring.num_seqs + 1).subset(
            out.full_rows).ring_targets(ring.ring_len)
    rows = _plane_rows(slots, cache, k)                                                 # [K, N]
    store_kv_fp8(latents.reshape(-1, latents.shape[-1]), cache.kv_flat, rows.reshape(-1))   # one store, all layers


def _plane_rows(slots: torch.Tensor, cache, num_layers: int) -> torch.Tensor:
    """slots [...] (-1 = empty) -> flat pool rows [num_layers, ...] of each DFlash layer's plane."""
    planes = cache.layout.dflash_planes
    if planes != tuple(range(planes[0], planes[0] + num_layers)):
        raise ValueError(f"DFlash planes {planes} are not consecutive")
    rows = cache.plane_rows[planes[0]]                                                # equal for every DFlash plane
    first = torch.where(slots >= 0, slots + cache.plane_base[planes[0]], -1)           # layer 0's rows
    offset = (torch.arange(num_layers, device=slots.device) * rows).reshape((num_layers,) + (1,) * slots.dim())
    return torch.where(first >= 0, first + offset, -1)


def merge_attention(o1, lse1, o2, lse2) -> torch.Tensor:
    """Combine two softmax-attention partials over disjoint key sets: o [N, h, D], lse [N, h]."""
    m = torch.maximum(lse1, lse2)
    w1, w2 = torch.exp(lse1 - m).nan_to_num(0.0), torch.exp(lse2 - m).nan_to_num(0.0)
    return (o1.float() * w1.unsqueeze(-1) + o2.float() * w2.unsqueeze(-1)) / (w1 + w2).unsqueeze(-1)


def draft_forward(model, meta: DraftMetadata, cache, uniforms: torch.Tensor | None,
                  greedy: torch.Tensor | None = None) -> DraftOutput:
    cfg, ds = model.config, model.model.dspark
    if ds is None:
        raise ValueError("dspark_draft: the model has no DSpark block (nextn = 0)")
    n_req, n, w = meta.positions.shape[0], ds.nextn, cfg.sliding_window
    p, mains, tables = meta.positions.long(), meta.main_token_ids.long(), meta.block_tables
    if meta.valid is not None:  # padding requests: read nothing, stay finite
        p = torch.where(meta.valid, p, torch.zeros_like(p))
        mains = torch.where(meta.valid, mains, torch.zeros_like(mains))
        tables = torch.where(meta.valid.unsqueeze(1), tables, torch.full_like(tables, -1))
    bpos = (p.unsqueeze(1) + 1 + torch.arange(n, device=p.device)).reshape(-1)     # [R*n]
    req = torch.arange(n_req, device=p.device).repeat_interleave(n)
    main_pos = window_positions(bpos, torch.zeros_like(bpos), w)                     # [R*n, W]
    main_pos = torch.where(main_pos <= p[req].unsqueeze(1), main_pos, torch.full_like(main_pos, -1))
    ring = cache.layout.ring
    if ring is None:
        main_slots = slots_of(tables, req, main_pos, meta.block_size)
    else:   # every main key read (positions <= p) is in the ring (paged/ring.py)
        if meta.state_slots is None:
            raise MetadataError("state_slots: a cache with rings needs each request's state slot")
        state = meta.state_slots.long()[req].unsqueeze(1)
        reads = main_pos >= 0 if meta.valid is None else (main_pos >= 0) & meta.valid[req].unsqueeze(1)
        main_slots = torch.where(reads, state * ring.ring_len + main_pos.clamp(min=0) % ring.ring_len, -1)
    j = torch.arange(n, device=p.device)
    bmask = (j.unsqueeze(0) <= j.unsqueeze(1)) & (j.unsqueeze(0) > j.unsqueeze(1) - w)   # [n(q), n(k)]
    h = ds.block_inputs(mains, model.model.embed_tokens).reshape(n_req * n, -1)
    rope = rope_table(bpos, cfg.qk_rope_head_dim, cfg.rope_theta)   # shared by the DFlash layers
    main_rows = _plane_rows(main_slots, cache, len(ds.layers)).to(torch.int32)      # [K, R*n, W]
    for k, layer in enumerate(ds.layers):
        attn = layer.self_attn
        u = layer.input_layernorm(h)
        q, _, latent = attn.query_and_latent(u, rope)
        o1, lse1 = sparse_mla_attention(q, cache.kv_flat, main_rows[k], attn.sm_scale)
        bk = latent.float().reshape(n_req, n, -1)                                   # [R, n, D]
        qb = q.float().reshape(n_req, n, attn.num_heads, -1)
        s = torch.einsum("rjhd,rid->rjhi", qb, bk) * attn.sm_scale
        s = s.masked_fill(~bmask.unsqueeze(0).unsqueeze(2), float("-inf"))
        lse2 = torch.logsumexp(s, -1)
        o2 = torch.einsum("rjhi,rid->rjhd", torch.softmax(s, -1), bk)
        o = merge_attention(o1, lse1, o2.reshape(n_req * n, attn.num_heads, -1), lse2.reshape(n_req * n, -1))
        h = h + attn.output(o.to(h.dtype))
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    return ds.heads(h.reshape(n_req, n, -1), model.lm_head.weight, mains, uniforms, greedy)
