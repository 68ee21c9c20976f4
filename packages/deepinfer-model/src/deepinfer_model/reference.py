"""`reference_forward`: the dense, unpaged, plain-torch oracle of docs/model.md (one sequence).

Modes:
- `"exact"`: every layer over every position.
- `"bounded_replay"` (needs `prompt_len = P`): the engine's function. Encoder layers run every
  position; YOCO consumer layers run only positions `>= P - min(W, P)` (the replay segment plus
  whatever follows the prompt), and their window branch never sees positions before that start.
  Logits exist only for those positions (`logit_start`).
`kv_quant=True` round-trips every cached tensor through its storage format (window latents and
compressed latents FP8, index keys FP4) so the engine path can be compared tightly.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from deepinfer_kernels.ops.indexer import candidate_block_max_ref, select_topk_blocks_ref
from deepinfer_kernels.ops.kv_fp4 import dequantize_index_k_fp4_ref, quantize_index_k_fp4_ref
from deepinfer_kernels.ops.kv_fp8 import dequantize_kv_fp8_ref, quantize_kv_fp8_ref
from deepinfer_model.metadata import DraftOutput
from deepinfer_model.modules.engram import dense_windows


@dataclass
class ReferenceOutput:
    logits: torch.Tensor                  # [T - logit_start, vocab] float32, positions logit_start..T-1
    logit_start: int
    residuals: dict[int, torch.Tensor]    # layer -> residual after it, rows from row_start[layer]
    row_start: dict[int, int]
    entries: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    # compressed source -> (latent [T//r, D], index_k [T//r, Di]) as used (quantised if kv_quant)
    dspark_features: torch.Tensor | None = None   # [T - logit_start, H]


def fp8_roundtrip(x: torch.Tensor) -> torch.Tensor:
    return dequantize_kv_fp8_ref(quantize_kv_fp8_ref(x), x.shape[-1]).to(x.dtype)


def fp4_roundtrip(x: torch.Tensor) -> torch.Tensor:
    return dequantize_index_k_fp4_ref(quantize_index_k_fp4_ref(x), x.shape[-1]).to(x.dtype)


def compressed_entries(comp, v: torch.Tensor, kv_quant: bool) -> tuple[torch.Tensor, torch.Tensor]:
    lat, ik = comp.entries(v)
    if kv_quant:
        lat, ik = fp8_roundtrip(lat), fp4_roundtrip(ik)
    return lat, ik


def select_far(indexer, q_lat, u, index_k, n_far, cfg) -> torch.Tensor:
    """Indexer selection, dense: -> bool [N, nE] (entry e visible to row n)."""
    q_idx, w = indexer.query(q_lat, u)
    s = torch.einsum("nhd,ed->nhe", q_idx.float(), index_k.float()).relu()
    s = torch.einsum("nhe,nh->ne", s, w)
    bsz = cfg.index_block_size
    scores, nvalid = candidate_block_max_ref(s, n_far, bsz)
    blocks = select_topk_blocks_ref(scores, nvalid, cfg.index_topk)              # [N, topk]
    e = torch.arange(index_k.shape[0], device=s.device)
    chosen = ((e // bsz).unsqueeze(0).unsqueeze(2) == blocks.long().unsqueeze(1)).any(-1)
    return chosen & (e.unsqueeze(0) < n_far.unsqueeze(1))


def attend(q, keys, mask, scale) -> torch.Tensor:
    """q [N, nh, D], keys [M, D], mask bool [N, M] -> [N, nh, D] (float32 softmax)."""
    s = torch.einsum("nhd,md->nhm", q.float(), keys.float()) * scale
    s = s.masked_fill(~mask.unsqueeze(1), float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    return torch.einsum("nhm,md->nhd", p, keys.float())


def window_mask(pos_q, pos_k, lo, w) -> torch.Tensor:
    """bool [N, M]: key position in [max(lo, p - W + 1), p]."""
    start = torch.maximum(pos_q - w + 1, torch.as_tensor(lo, device=pos_q.device))
    return (pos_k.unsqueeze(0) <= pos_q.unsqueeze(1)) & (pos_k.unsqueeze(0) >= start.unsqueeze(1))


def layer_forward(model, l, x, pos, lo, windows, entries, kv_quant):
    cfg = model.config
    layer = model.model.layers[l]
    attn = layer.self_attn
    if layer.engram is not None:
        x = x + layer.engram(x, windows)
    u = layer.input_layernorm(x)
    q, q_lat = attn.query(u, pos)
    lat = attn.latent(u, pos)
    if kv_quant:
        lat = fp8_roundtrip(lat)
    if attn.compressor is not None and not layer.is_consumer:
        entries[l] = compressed_entries(attn.compressor, u, kv_quant)
    keys, mask = lat, window_mask(pos, pos, lo, cfg.sliding_window)
    if layer.ratio > 0:
        lat_e, ik_e = entries[layer.source]
        n_far = (pos - cfg.sliding_window + 1).clamp(min=0) // layer.ratio
        far = select_far(attn.indexer, q_lat, u, ik_e, n_far, cfg)
        keys, mask = torch.cat([lat, lat_e]), torch.cat([mask, far], dim=1)
    x = x + attn.output(attend(q, keys, mask, attn.sm_scale))
    return x + layer.mlp.forward_reference(layer.post_attention_layernorm(x))


def encoder_side(model, tokens: torch.Tensor, kv_quant: bool = False):
    """YOCO prefill, densely: encoder layers over every position, then the consumer-side
    compressors over the shared hidden. -> (x after the last encoder layer [T, H], Engram
    windows, entries of every compressed source, residuals of the encoder layers)."""
    cfg, topo = model.config, model.config.topology
    tokens = torch.as_tensor(tokens, device=model.device).long().reshape(-1)
    pos = torch.arange(tokens.shape[0], device=model.device)
    x = model.model.embed_tokens(tokens)
    windows = None
    if cfg.engram_layer_ids:
        windows = dense_windows(model.engram_vocab_map[tokens], cfg.engram_max_ngram_size)
    entries: dict = {}
    residuals = {}
    for l in topo.encoder_layers:
        x = layer_forward(model, l, x, pos, 0, windows, entries, kv_quant)
        residuals[l] = x
    if topo.yoco_enabled:
        s = model.model.layers[topo.first_consumer_layer].input_layernorm(x)     # YOCO shared hidden
        for src in topo.consumer_sources:
            entries[src] = compressed_entries(model.model.layers[src].self_attn.compressor, s, kv_quant)
    return x, windows, entries, residuals


def reference_forward(model, token_ids: torch.Tensor, mode: str = "exact", prompt_len: int | None = None,
                      kv_quant: bool = False, return_dspark_features: bool = False,
                      enable_grad: bool = False) -> ReferenceOutput:
    """Dense forward of one sequence. `enable_grad=True` keeps autograd on (training; use
    `kv_quant=False` there: the storage round trips are not differentiable)."""
    with torch.set_grad_enabled(enable_grad):
        return _reference_forward(model, token_ids, mode, prompt_len, kv_quant, return_dspark_features)


def _reference_forward(model, token_ids, mode, prompt_len, kv_quant, return_dspark_features) -> ReferenceOutput:
    cfg, topo = model.config, model.config.topology
    tokens = torch.as_tensor(token_ids, device=model.device).long().reshape(-1)
    t = tokens.shape[0]
    if mode == "exact":
        start = 0
    elif mode == "bounded_replay":
        if prompt_len is None or not 1 <= prompt_len <= t:
            raise ValueError(f"prompt_len={prompt_len}: bounded_replay needs 1 <= prompt_len <= {t}")
        start = prompt_len - min(cfg.sliding_window, prompt_len) if topo.yoco_enabled else 0
    else:
        raise ValueError(f"mode={mode!r}: expected 'exact' or 'bounded_replay'")
    pos = torch.arange(t, device=model.device)
    x, windows, entries, residuals = encoder_side(model, tokens, kv_quant)
    row_start = {l: 0 for l in residuals}
    if topo.yoco_enabled:
        x = x[start:]
        for l in topo.consumer_layers:
            x = layer_forward(model, l, x, pos[start:], start, None if windows is None else windows[start:],
                              entries, kv_quant)
            residuals[l], row_start[l] = x, start
    else:
        x = x[start:]
    logits = model.lm_head(model.model.norm(x)).float()
    out = ReferenceOutput(logits, start, residuals, row_start, entries)
    if return_dspark_features and model.model.dspark is not None:
        hs = [residuals[l][start - row_start[l]:] for l in model.model.dspark.target_layer_ids]
        out.dspark_features = model.model.dspark.features(hs)
    return out


@torch.no_grad()
def reference_draft(model, token_ids: torch.Tensor, main_token: int, prompt_len: int | None = None,
                    kv_quant: bool = False, uniforms: torch.Tensor | None = None) -> DraftOutput:
    """Dense DSpark draft after the target processed `token_ids` (positions 0..p) and sampled
    `main_token` (position p + 1). Main keys exist for positions >= logit_start."""
    cfg, ds = model.config, model.model.dspark
    mode = "exact" if prompt_len is None else "bounded_replay"
    ref = reference_forward(model, token_ids, mode=mode, prompt_len=prompt_len, kv_quant=kv_quant,
                            return_dspark_features=True)
    p = len(token_ids) - 1
    fpos = torch.arange(ref.logit_start, p + 1, device=model.device)
    bpos = torch.arange(p + 1, p + 1 + ds.nextn, device=model.device)
    main = torch.tensor([main_token], device=model.device)
    h = ds.block_inputs(main, model.model.embed_tokens)[0]                         # [n, H]
    kpos = torch.cat([fpos, bpos])
    mask = window_mask(bpos, kpos, 0, cfg.sliding_window)
    for layer in ds.layers:
        mk = layer.main_keys(ref.dspark_features, fpos)
        if kv_quant:
            mk = fp8_roundtrip(mk)
        u = layer.input_layernorm(h)
        q, _ = layer.self_attn.query(u, bpos)
        bk = layer.self_attn.latent(u, bpos)
        h = h + layer.self_attn.output(attend(q, torch.cat([mk, bk]), mask, layer.self_attn.sm_scale))
        h = h + layer.mlp.forward_reference(layer.post_attention_layernorm(h))
    return ds.heads(h.unsqueeze(0), model.lm_head.weight, main,
                    None if uniforms is None else uniforms.reshape(1, -1))
