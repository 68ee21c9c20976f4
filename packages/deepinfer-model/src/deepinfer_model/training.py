"""Batched forwards for training: the function of `reference_forward(mode="exact")` and of the dense
DSpark draft (`reference_draft`), over a batch of equal-length sequences that all start at position 0.

`reference.py` is the oracle for one sequence at a time; this module computes the same equations
for `[B, T]` token batches with autograd (tests/test_training_forward.py compares them):

- per-token projections run on the flattened `[B*T, H]` rows (the module methods of both paths);
- attention: window mask `[T, T]` (shared by the batch) + the far compressed entries the indexer
  selects, through `scaled_dot_product_attention` (one KV head, expanded over the query heads);
- MoE: every routed expert on every row, weighted by the (sparse) routing weights: the same sum as
  the per-expert loop of `MoE.forward_reference`, without data-dependent shapes or host syncs;
- the DSpark block for anchors `p` (target features of positions `<= p`, block inputs
  `embed(tokens[p + 1])` then noise): window attention over a `[W]` band of main keys plus the
  causal block keys; the Markov head takes *given* previous tokens (teacher forcing; with the
  draft's own tokens it is exactly `DSparkDraft.heads`).

Training-only extras, off by default (so the default call is the reference function): residual
dropout, the lightning-indexer distillation loss (the indexer gets no gradient through its top-k:
it is trained to match the attention mass over the far entries, as in DeepSeek-V3.2, with its
inputs detached from the language model), and per-expert load counts for bias balancing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from deepinfer_kernels.ops.indexer import candidate_block_max_ref, select_topk_blocks_ref
from deepinfer_model.modules.ffn import SwiGLU


@dataclass
class BatchedOutput:
    logits: torch.Tensor | None                 # [B, T, V] float32 (or [B, V] for logits="last")
    residuals: dict[int, torch.Tensor]          # layer -> residual after it [B, T, H] (kept layers)
    dspark_features: torch.Tensor | None = None  # [B, T, H]
    indexer_kl: torch.Tensor | None = None       # scalar: mean over compressed layers (indexer_loss=True)
    expert_counts: dict[int, torch.Tensor] = field(default_factory=dict)  # MoE layer -> [E] selections


def _drop(x: torch.Tensor, p: float) -> torch.Tensor:
    return F.dropout(x, p, training=True) if p > 0 else x


def window_mask(t: int, w: int, device) -> torch.Tensor:
    """bool [T, T]: key j visible to query i iff i - W + 1 <= j <= i."""
    i = torch.arange(t, device=device)
    d = i.unsqueeze(1) - i.unsqueeze(0)
    return (d >= 0) & (d < w)


def batched_entries(comp, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """v [B, T, H] -> complete compressed entries (latent [B, T//r, D], index_k [B, T//r, Di]) float32."""
    b, t, h = v.shape
    n = t // comp.ratio
    if n == 0:
        return (v.new_zeros(b, 0, comp.wkv.out_features, dtype=torch.float32),
                v.new_zeros(b, 0, comp.wk.out_features, dtype=torch.float32))
    terms = comp.token_terms(v[:, : n * comp.ratio].reshape(-1, h)).reshape(b * n, comp.ratio, -1)
    ids = torch.arange(n, device=v.device).repeat(b)
    lat, ik = comp.combine(terms, ids)
    return lat.reshape(b, n, -1), ik.reshape(b, n, -1)


def _index_keys_for_loss(comp, v: torch.Tensor) -> torch.Tensor:
    """Index keys with gradient only into the compressor's `wk` (input and gate weights detached)."""
    b, t, h = v.shape
    n = t // comp.ratio
    v = v[:, : n * comp.ratio].detach()
    g = comp.gate(v).float().reshape(b, n, comp.ratio) + comp.pos_bias.float()
    a = torch.softmax(g, dim=-1).detach().unsqueeze(-1)                          # [B, n, r, 1]
    ik = comp.wk(v).float().reshape(b, n, comp.ratio, -1)
    return (a * ik).sum(2)


def _indexer_scores(indexer, q_lat: torch.Tensor, u: torch.Tensor, index_k: torch.Tensor) -> torch.Tensor:
    """q_lat [B*T, qr], u [B*T, H], index_k [B, nE, Di] -> scores float32 [B, T, nE]."""
    b, ne, _ = index_k.shape
    q_idx, w = indexer.query(q_lat, u)                                            # [BT, ni, Di], [BT, ni]
    q_idx = q_idx.reshape(b, -1, q_idx.shape[1], q_idx.shape[2])
    with torch.autocast(q_idx.device.type, enabled=False):                        # float32 scores
        s = torch.einsum("bthd,bed->bthe", q_idx.float(), index_k.float()).relu()
        return torch.einsum("bthe,bth->bte", s, w.reshape(b, -1, w.shape[1]).float())


def select_far_batched(indexer, q_lat, u, index_k, n_far, cfg) -> torch.Tensor:
    """Indexer top-k selection -> bool [B, T, nE]: far entry e visible to row t (reference.select_far)."""
    b, ne, _ = index_k.shape
    t = n_far.shape[0]
    with torch.no_grad():
        s = _indexer_scores(indexer, q_lat, u, index_k).reshape(b * t, ne)
        bsz = cfg.index_block_size
        scores, nvalid = candidate_block_max_ref(s, n_far.repeat(b), bsz)
        blocks = select_topk_blocks_ref(scores, nvalid, cfg.index_topk).long()    # [BT, topk], -1 pad
        nb = scores.shape[1]
        sel = torch.zeros(b * t, nb + 1, dtype=torch.bool, device=s.device)
        sel.scatter_(1, torch.where(blocks >= 0, blocks, nb), True)
        chosen = sel[:, :nb].repeat_interleave(bsz, dim=1)[:, :ne].reshape(b, t, ne)
        e = torch.arange(ne, device=s.device)
        return chosen & (e.view(1, 1, -1) < n_far.view(1, -1, 1))


def _indexer_kl(indexer, comp_src, v_src, q, q_lat, u, lat, lat_e, mask_win, n_far, scale,
                first_row: int) -> torch.Tensor | None:
    """KL(attention mass over all visible far entries || softmax(indexer scores)), mean over the rows
    with far entries (positions >= first_row = W + r - 1). Target without gradient; the indexer sees
    detached inputs."""
    b, t = lat.shape[:2]
    ne = lat_e.shape[1]
    if ne == 0 or first_row >= t:
        return None
    e = torch.arange(ne, device=lat.device)
    far_ok = e.view(1, -1) < n_far.view(-1, 1)                                     # [T, nE]
    rows = slice(first_row, t)
    with torch.no_grad(), torch.autocast(lat.device.type, enabled=False):
        keys = torch.cat([lat.float(), lat_e.float()], dim=1)                       # [B, T+nE, D]
        qf = q.float().reshape(b, t, q.shape[1], q.shape[2])
        sc = torch.einsum("bthd,bmd->bhtm", qf, keys) * scale
        m = torch.cat([mask_win, far_ok], dim=1)                                   # [T, T+nE]
        p = torch.softmax(sc.masked_fill(~m, float("-inf")), dim=-1)[..., t:].sum(1)  # [B, T, nE]
        p = p / p.sum(-1, keepdim=True).clamp_min(1e-20)
    ik = _index_keys_for_loss(comp_src, v_src)
    s = _indexer_scores(indexer, q_lat.detach(), u.detach(), ik)[:, rows]         # [B, R, nE]
    ok, p = far_ok[rows], p[:, rows]
    logq = torch.log_softmax(s.masked_fill(~ok, float("-inf")), dim=-1).masked_fill(~ok, 0.0)
    return (p * (torch.log(p.clamp_min(1e-20)) - logq)).sum(-1).mean()          # p = 0 where masked


def attention(q: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    """q [B, T, nh, D], keys [B, M, D] (key = value, one head), mask bool [B or 1, T, M] -> [B, T, nh, D]."""
    b, t, nh, d = q.shape
    k = keys.to(q.dtype).unsqueeze(1).expand(b, nh, keys.shape[1], d)
    o = F.scaled_dot_product_attention(q.transpose(1, 2), k, k, attn_mask=mask.unsqueeze(1), scale=scale)
    return o.transpose(1, 2)


def moe_dense(moe, x: torch.Tensor, counts: dict | None = None, layer: int | None = None) -> torch.Tensor:
    """MoE.forward_reference for x [N, H], every routed expert computed on every row (training)."""
    w, ids = moe.route_reference(x)                                                 # [N, k]
    w13, w2 = moe.experts.w13, moe.experts.w2                                       # [E, 2I, H], [E, H, I]
    e, i2, h = w13.shape
    dense_w = torch.zeros(x.shape[0], e, dtype=w.dtype, device=x.device).scatter(1, ids, w)   # [N, E]
    inter = i2 // 2
    gu = F.linear(x, w13.reshape(e * i2, h)).reshape(-1, e, i2)                   # [N, E, 2I]
    act = F.silu(gu[..., :inter]) * gu[..., inter:]                                # [N, E, I]
    act = act * dense_w.unsqueeze(-1).to(act.dtype)
    out = F.linear(act.reshape(-1, e * inter), w2.permute(1, 0, 2).reshape(h, e * inter))
    if counts is not None:   # not bincount / one_hot: those sync with the host on CUDA
        flat = ids.reshape(-1, 1)
        counts[layer] = torch.zeros(flat.shape[0], e, device=x.device).scatter_(1, flat, 1.0).sum(0)
    if moe.shared_experts is not None:
        out = out + moe.shared_experts(x)
    return out


def _ffn(mlp, x: torch.Tensor, counts, layer) -> torch.Tensor:
    if isinstance(mlp, SwiGLU):
        return mlp(x)
    return moe_dense(mlp, x, counts, layer)


def batched_forward(model, tokens: torch.Tensor, *, logits: str | None = "all", dropout: float = 0.0,
                    indexer_loss: bool = False, return_dspark_features: bool = False,
                    keep_residuals: tuple[int, ...] = (), count_experts: bool = False,
                    logit_positions: torch.Tensor | None = None) -> BatchedOutput:
    """`reference_forward(mode="exact")` for every row of tokens [B, T] (positions 0..T-1).
    logits: "all" -> [B, T, V], "last" -> [B, V], "positions" -> [B, V] at `logit_positions` [B]
    (right-padded rows: the function is causal, so padding never changes earlier positions),
    None -> no lm_head."""
    cfg, topo = model.config, model.config.topology
    tokens = tokens.long()
    b, t = tokens.shape
    dev = tokens.device
    pos = torch.arange(t, device=dev)
    pos_flat = pos.repeat(b)
    w = cfg.sliding_window
    mask_win = window_mask(t, w, dev)
    windows = None
    if cfg.engram_layer_ids:
        cids = model.engram_vocab_map[tokens].long()                               # [B, T]
        windows = dense_windows_batched(cids, cfg.engram_max_ngram_size)
    want = set(keep_residuals)
    ds = model.model.dspark
    if return_dspark_features and ds is not None:
        want |= set(ds.target_layer_ids)
    entries: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    compressor_inputs: dict[int, torch.Tensor] = {}
    residuals: dict[int, torch.Tensor] = {}
    kls: list[torch.Tensor] = []
    counts: dict | None = {} if count_experts else None
    x = _drop(model.model.embed_tokens(tokens), dropout)

    def run_layer(l: int, x: torch.Tensor) -> torch.Tensor:
        layer = model.model.layers[l]
        attn = layer.self_attn
        h = x.shape[-1]
        if layer.engram is not None:
            x = x + _drop(layer.engram(x.reshape(b * t, h), windows).reshape(b, t, h), dropout)
        u = layer.input_layernorm(x)
        uf = u.reshape(b * t, h)
        q, q_lat = attn.query(uf, pos_flat)
        lat = attn.latent(uf, pos_flat).reshape(b, t, -1)
        if attn.compressor is not None and not layer.is_consumer:
            entries[l] = batched_entries(attn.compressor, u)
            compressor_inputs[l] = u
        q4 = q.reshape(b, t, attn.num_heads, attn.head_dim)
        if layer.ratio > 0:
            lat_e, ik_e = entries[layer.source]
            n_far = (pos - w + 1).clamp(min=0) // layer.ratio
            far = select_far_batched(attn.indexer, q_lat, uf, ik_e, n_far, cfg)
            keys = torch.cat([lat, lat_e.to(lat.dtype)], dim=1)
            mask = torch.cat([mask_win.unsqueeze(0).expand(b, t, t), far], dim=2)
            if indexer_loss:
                kl = _indexer_kl(attn.indexer, model.model.layers[layer.source].self_attn.compressor,
                                 compressor_inputs[layer.source], q, q_lat, uf, lat, lat_e, mask_win, n_far,
                                 attn.sm_scale, w + layer.ratio - 1)
                if kl is not None:
                    kls.append(kl)
        else:
            keys, mask = lat, mask_win.unsqueeze(0)
        o = attention(q4, keys, mask, attn.sm_scale)
        x = x + _drop(attn.output(o.reshape(b * t, attn.num_heads, attn.head_dim)).reshape(b, t, h), dropout)
        y = _ffn(layer.mlp, layer.post_attention_layernorm(x).reshape(b * t, h), counts, l)
        return x + _drop(y.reshape(b, t, h).to(x.dtype), dropout)

    for l in topo.encoder_layers:
        x = run_layer(l, x)
        if l in want:
            residuals[l] = x
    if topo.yoco_enabled:
        s = model.model.layers[topo.first_consumer_layer].input_layernorm(x)          # YOCO shared hidden
        for src in topo.consumer_sources:
            entries[src] = batched_entries(model.model.layers[src].self_attn.compressor, s)
            compressor_inputs[src] = s
        for l in topo.consumer_layers:
            x = run_layer(l, x)
            if l in want:
                residuals[l] = x
    out = BatchedOutput(None, residuals)
    if logits == "all":
        out.logits = model.lm_head(model.model.norm(x)).float()
    elif logits == "last":
        out.logits = model.lm_head(model.model.norm(x[:, -1])).float()
    elif logits == "positions":
        last = x.gather(1, logit_positions.long().view(b, 1, 1).expand(b, 1, x.shape[-1])).squeeze(1)
        out.logits = model.lm_head(model.model.norm(last)).float()
    elif logits is not None:
        raise ValueError(f"logits={logits!r}: expected 'all', 'last', 'positions' or None")
    if return_dspark_features and ds is not None:
        out.dspark_features = ds.features([residuals[l] for l in ds.target_layer_ids])
    if kls:
        out.indexer_kl = torch.stack(kls).mean()
    if counts is not None:
        out.expert_counts = counts
    return out


def dense_windows_batched(cids: torch.Tensor, n_max: int) -> torch.Tensor:
    """cids [B, T] -> windows [B*T, n_max] (`modules.engram.dense_windows` of every row)."""
    b, t = cids.shape
    pad = torch.full((b, n_max - 1), -1, dtype=torch.long, device=cids.device)
    return torch.cat([pad, cids.long()], dim=1).unfold(1, n_max, 1).reshape(b * t, n_max)


# ---------------------------------------------------------------------------------- DSpark draft


@dataclass
class DraftBatch:
    logits: torch.Tensor       # [B, K, n, V] float32 (Markov head included, given previous tokens)
    conf_logits: torch.Tensor  # [B, K, n] float32: w_conf . cat(h, e) / T (confidence = sigmoid)
    block_out: torch.Tensor    # [B, K, n, H] DFlash output before the final norm (DSparkDraft.heads input)
    main_tokens: torch.Tensor  # [B, K] tokens[p + 1]


def batched_draft(model, features: torch.Tensor, tokens: torch.Tensor, anchors: torch.Tensor,
                  prev_tokens: torch.Tensor, detach_confidence_input: bool = True) -> DraftBatch:
    """Dense DSpark draft for anchors: features [B, L, H] (target features at every position),
    tokens [B, L], anchors [B, K] positions p (p + 1 < L: the main token is tokens[p + 1]),
    prev_tokens [B, K, n] the Markov head's previous token of each block position (prev_0 is the
    main token; with prev_j = the draft's own token j-1 this is `reference_draft`)."""
    cfg, ds = model.config, model.model.dspark
    b, l_len, hdim = features.shape
    k = anchors.shape[1]
    n, w = ds.nextn, cfg.sliding_window
    dev = features.device
    anchors = anchors.long()
    main = tokens.gather(1, anchors + 1)                                           # [B, K]
    h = ds.block_inputs(main.reshape(-1), model.model.embed_tokens).reshape(b, k, n, hdim)
    j = torch.arange(n, device=dev)
    bpos = (anchors.unsqueeze(-1) + 1 + j).reshape(-1)                              # [B*K*n]
    band = anchors.unsqueeze(-1) - w + 1 + torch.arange(w, device=dev)              # [B, K, W] positions
    band_ok = band >= 0
    # row j of the block sees band entry i iff its position >= p + 1 + j - W + 1, i.e. i >= j + 1
    i = torch.arange(w, device=dev)
    mask_band = (i.view(1, -1) >= (j + 1).view(-1, 1)).view(1, 1, n, w) & band_ok.unsqueeze(2)
    mask_blk = (j.view(1, -1) <= j.view(-1, 1)).view(1, 1, n, n).expand(b, k, n, n)
    mask = torch.cat([mask_band, mask_blk], dim=-1)                                # [B, K, n, W + n]
    fpos = torch.arange(l_len, device=dev).repeat(b)
    gidx = band.clamp(min=0).reshape(b, k * w)
    for layer in ds.layers:
        attn = layer.self_attn
        mk = layer.main_keys(features.reshape(b * l_len, hdim), fpos).reshape(b, l_len, -1)   # [B, L, D]
        kb = mk.gather(1, gidx.unsqueeze(-1).expand(b, k * w, mk.shape[-1])).reshape(b, k, w, -1)
        u = layer.input_layernorm(h)
        q, _ = attn.query(u.reshape(-1, hdim), bpos)
        bk = attn.latent(u.reshape(-1, hdim), bpos).reshape(b, k, n, -1)
        keys = torch.cat([kb, bk.to(kb.dtype)], dim=2)                               # [B, K, W + n, D]
        q = q.reshape(b, k, n, attn.num_heads, -1)
        sc = torch.einsum("bkjhd,bkmd->bkjhm", q.float(), keys.float()) * attn.sm_scale
        sc = sc.masked_fill(~mask.unsqueeze(3), float("-inf"))
        o = torch.einsum("bkjhm,bkmd->bkjhd", torch.softmax(sc, dim=-1), keys.float())
        h = h + attn.output(o.reshape(-1, attn.num_heads, o.shape[-1]).to(h.dtype)).reshape(b, k, n, hdim)
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    hn = ds.norm(h)
    logits = F.linear(hn, model.lm_head.weight).float()                            # [B, K, n, V]
    cat = hn.float()
    if ds.markov_rank > 0:
        e = ds.markov_embed(prev_tokens.long()).float()                            # [B, K, n, rank]
        logits = logits + F.linear(e, ds.markov_proj.weight.float())
        cat = torch.cat([cat, e], dim=-1)
    if detach_confidence_input:
        cat = cat.detach()
    conf = F.linear(cat, ds.confidence_head.weight.float()).squeeze(-1) / ds.temperature
    return DraftBatch(logits, conf, h, main)
