"""The engine-path forward: flat rows over paged caches, driven by `ForwardMetadata`.

Numbered steps of one call:
1. Write the Engram ids of every row (all writes of a step precede the reads that need them).
2. Row sets. Decode: every row runs every layer. Prefill: encoder layers run every row; YOCO
   consumer layers run only the *replay rows* of last-chunk requests, the last
   `R = min(W, context_len)` positions (decoder bounded replay; the scheduler guarantees the last
   chunk holds them), with their window branch truncated to the replay segment.
3. Encoder layers: window KV -> FP8 plane, compressor of encoder sources, sparse attention over
   window + indexer-selected far entries, FFN.
4. YOCO: shared hidden `s = RMSNorm_attn_{first consumer}(x)` for every row; consumer-side
   compressors consume it (the decoder's global KV is projected, never recomputed by layers).
5. Consumer layers over the full rows; logits of `meta.logit_rows` (must be full rows);
   DSpark target features of the full rows when asked.
Replay writes only the consumer layers' window planes: nothing prefix-cache visible.

Decode (`meta.is_prefill == False`) is CUDA-graph capturable: no host sync, and every shape
depends only on (total_q, req_cnt, block_tables width, config, `meta.context_bound`):
- every row is a full row (`full_rows = arange(total_q)`, no nonzero);
- the far-entry candidates of compressed layers have the static width
  `max_far = max(0, context_bound - W) // r` (prefill: the same with the runner's exact bound, else the batch's max read on the host);
- cache writes skip slot -1 through sync-free masked writes; compressor entries are combined for
  every row and stored only where a row completes one.
Extra masked work of a decode step, per compressed layer and row: indexer scores over `max_far`
candidates instead of the row's own `n_far` (`ni * Di` MACs each plus an FP4 key gather), and
`r` stage gathers + one `combine` per row instead of per completed entry (ratio > 1 sources).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from deepinfer_kernels.ops.attention_indices import attention_indices
from deepinfer_kernels.ops.capture import write_rows
from deepinfer_kernels.ops.engram import paged_id_windows
from deepinfer_kernels.ops.indexer import indexer_topk_blocks
from deepinfer_kernels.ops.sparse_mla import shared_keys_enabled, sparse_mla_attention
from deepinfer_model.metadata import ForwardMetadata, ForwardOutput, MetadataError
from deepinfer_model.modules.engram import PAD_ID
from deepinfer_model.modules.moe import MoE
from deepinfer_model.paged.compressed import update_compressed_source
from deepinfer_model.paged.prefill_plan import LOGIT_ROW_OUTSIDE_REPLAY, short_last_chunk_error
from deepinfer_model.paged.ring import RingRows, copy_to_ring
from deepinfer_model.paged.rows import StepRows, static_max_far
from deepinfer_model.paged.streams import DecodeStreams


def engram_windows(model, meta: ForwardMetadata, cache, rows: StepRows) -> torch.Tensor:
    return paged_id_windows(meta.block_tables, rows.req, rows.positions, cache.engram_ids,
                            model.config.engram_max_ngram_size, meta.block_size, PAD_ID)


@dataclass(frozen=True)
class FarSelection:
    """The far compressed entries a layer's indexer picked for each row."""

    blocks: torch.Tensor        # int32 [N, topk]: selected blocks of index_block_size entries, -1 = none
    n_far: torch.Tensor         # [N] far entries of each row
    entry_slots: torch.Tensor   # [N, max_far] slot of far entry j in the entries' plane, -1 = none
    base: int                   # flat pool row of that plane's slot 0


def far_selection(model, layer, q_lat, index_weights, rows: StepRows, meta: ForwardMetadata, cache,
                  max_far: int | None = None) -> FarSelection | None:
    """The indexer's top-k blocks of far compressed entries (None: no row has any). q_lat [N, qr]
    (or `NormedRows`: at batch 1 the indexer's query projection normalises its own row),
    index_weights = W_iw u [N, ni] (`AttentionInputs.index_weights`).

    `max_far`: static candidate width (decode; rows' counts are clamped to it, which only matters
    for padding rows); None = the batch's max, read on the host (prefill)."""
    cfg = model.config
    r, src = layer.ratio, layer.source
    requested = max_far
    n_far, ent_slots, max_far = rows.far_entry_slots(meta, cfg.sliding_window, r, requested)
    if max_far == 0:
        return None
    indexer = layer.self_attn.indexer
    # the source's index plane, addressed by the entries' slots as they are; the head weights are
    # `indexer.head_weights(index_weights)`, scaled by the op as it reads them (no launch here)
    k_plane = cache.index_plane(src)
    blocks = indexer_topk_blocks(indexer.query_heads(q_lat), index_weights, k_plane,
                                 rows.far_entry_slots_int32(r, requested), n_far, cfg.index_block_size,
                                 cfg.index_topk, weight_scale=indexer.head_weight_scale)   # int32 [N, topk]
    return FarSelection(blocks, n_far, ent_slots, cache.plane_base[cache.layout.comp_planes[src]])


def _closing_rows(meta: ForwardMetadata) -> dict[int, torch.Tensor] | None:
    """Prefill with a host row plan: ratio -> the rows (of every row) closing a compressed entry."""
    return meta.row_plan.closing_rows if meta.is_prefill and meta.row_plan is not None else None


def run_layer(model, l: int, x: torch.Tensor, rows: StepRows, meta: ForwardMetadata, cache,
              streams: DecodeStreams) -> torch.Tensor:
    cfg = model.config
    layer = model.model.layers[l]
    attn = layer.self_attn
    if layer.engram is not None:   # the Engram add and the input norm: one launch
        streams.join_part("rows", "engram")
        x, u = layer.input_layernorm.add_forward(x, layer.engram.gated(x, rows.engram_memory(layer.engram, l)))
        fused = attn.fused_input(u)                  # every projection of u: one GEMM
    else:   # the norm and the projection: one launch at batch 1 on SM90
        fused = attn.fused_input_normed(x, layer.input_layernorm)
    streams.join_part("rows", "rope")                # the RoPE tables (decode: computed beside the GEMM)
    rope = rows.rope(attn.rope_dim, attn.theta)
    plane = cache.window_plane(l)
    if attn.compressor is not None and not layer.is_consumer:
        # later steps read the entries (streams.py): at decode the compressor runs beside the layer
        with streams.on("compress", reads=(fused,)):
            update_compressed_source(model, l, attn.fused_compressor_terms(fused), rows.positions, rows.req,
                                     rows.slots, meta.block_tables, cache, static=not meta.is_prefill,
                                     entry_rope=functools.partial(rows.entry_rope, dim=attn.rope_dim,
                                                                  theta=attn.theta),
                                     closing_rows=_closing_rows(meta), ring=rows.ring)
    far = None
    if layer.ratio > 0:    # the indexer reads the far-entry slots
        streams.join("rows")
    with streams.on("query", reads=(fused,)):
        q_lat = attn.fused_query_latent(fused)
        if layer.ratio > 0:   # the indexer's chain beside the q_b GEMM
            with streams.on("indexer", reads=(fused, q_lat.value)):
                # static when the metadata bounds the context on the host (decode always; prefill from the
                # engine's runner, whose bound is the step's exact max); else the batch's max, read on the host
                static = not meta.is_prefill or meta.max_context_len is not None
                max_far = static_max_far(meta, cfg.sliding_window, layer.ratio) if static else None
                far = far_selection(model, layer, q_lat, attn.fused_index_weights(fused), rows, meta, cache, max_far)
        q = attn.queries(q_lat, rope)
    # the latent's RoPE (columns no side stream reads) and store: the layer's own plane, slots index it
    attn.store_latent(fused, plane, rows.store_slots(), rope)
    streams.join("query", outputs=(q,))
    streams.join("indexer", outputs=(None if far is None else far.blocks,))
    streams.join_part("rows", "window")   # the window slots
    # a prefill chunk's rows are consecutive positions: row pairs may attend their shared key list once
    shared = meta.is_prefill and shared_keys_enabled()
    if far is None:   # window only: attend within the layer's plane
        o, _ = sparse_mla_attention(q, plane, rows.window_slots_int32(meta, cfg.sliding_window),
                                    attn.sm_scale, shared_keys=shared)
    else:             # window + far entries live in two planes: flat rows of the whole pool
        idx = attention_indices(rows.window_slots(meta, cfg.sliding_window),
                                cache.plane_base[cache.layout.window_planes[l]], far.blocks, far.n_far,
                                far.entry_slots, far.base, cfg.index_block_size)
        o, _ = sparse_mla_attention(q, cache.kv_flat, idx, attn.sm_scale, shared_keys=shared)
    if rows.ring is not None:   # every read of the layer is done: this step's records into the rings
        copy_to_ring(plane, rows.ring, rows.ring_len)
    post = layer.post_attention_layernorm
    if isinstance(layer.mlp, MoE) and layer.mlp.input_projection is not None and not torch.is_grad_enabled():
        # the add, the norm and the MoE input projection: one launch at batch 1 on SM90; the residual
        # add of the output happens in the routed experts' combine
        x, u, projected = post.add_linear(x, attn.output(o), layer.mlp.input_projection.weight())
        return layer.mlp(u, residual=x, streams=streams, projected=projected)
    x, u = post.add_forward(x, attn.output(o))   # the add and the norm: one launch
    if isinstance(layer.mlp, MoE):
        return layer.mlp(u, residual=x, streams=streams)
    return x + layer.mlp(u)


def _replay_start(model, meta: ForwardMetadata) -> torch.Tensor | None:
    """int64 [R] each request's replay start `context - min(W, context)` (None: every row runs every
    layer, at decode or without YOCO). No host sync."""
    if not meta.is_prefill or not model.config.topology.yoco_enabled:
        return None
    ctx = meta.context_lens.long()
    return ctx - torch.clamp(ctx, max=model.config.sliding_window)


def replay_lower_bound(model, meta: ForwardMetadata, req: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """int64 [N] each row's consumer window lower bound (its request's replay start; 0 without
    YOCO or at decode). No host sync."""
    replay_start = _replay_start(model, meta)
    return torch.zeros_like(positions) if replay_start is None else replay_start[req]


def full_row_mask(model, meta: ForwardMetadata, req: torch.Tensor, positions: torch.Tensor) -> tuple:
    """-> (bool [N] rows that run every layer, int64 [N] consumer window lower bound). Checks the
    replay segment on the device (a sync; `prefill_plan.plan_prefill_rows` is the host version)."""
    replay_start = _replay_start(model, meta)                                     # [R]
    if replay_start is None:
        return torch.ones_like(positions, dtype=torch.bool), torch.zeros_like(positions)
    ctx = meta.context_lens.long()
    num_computed = ctx - meta.seqlens_q.long()
    short = meta.is_last_chunk & (num_computed > replay_start)
    if bool(short.any()):
        i = int(short.nonzero()[0])
        raise short_last_chunk_error(i, int(ctx[i] - replay_start[i]), int(num_computed[i]))
    lo = replay_start[req]
    return meta.is_last_chunk[req] & (positions >= lo), lo


def paged_forward(model, meta: ForwardMetadata, cache) -> ForwardOutput:
    cfg, topo = model.config, model.config.topology
    decode = not meta.is_prefill
    req = meta.row_to_req
    positions, slots = meta.positions.long(), meta.slot_mapping.long()
    streams = DecodeStreams(positions.device, DecodeStreams.usable(model, decode))
    # 1. Engram ids first. At decode the rows' RoPE tables, the Engram windows and buckets and the
    # rows' window / far-entry slots are computed on side stream "rows" (joined where a layer first
    # reads them): none of it waits on the main stream's chain to the first GEMM.
    # In the order the layers read them, each part marked: a layer waits only for the part it
    # reads (the window slots before the first attention, not the whole stream).
    ring = cache.layout.ring
    if ring is not None and meta.total_q > ring.max_step_rows:
        raise MetadataError(f"total_q={meta.total_q}: the cache's ring scratch holds {ring.max_step_rows} rows")
    with streams.on("rows"):
        rows = StepRows(positions, req, slots, torch.zeros_like(positions), None,
                        None if ring is None else RingRows(meta, req, positions, ring.num_seqs + 1))
        rows.ring_len = 0 if ring is None else ring.ring_len
        if decode:
            rows.precompute_rope(model)
            streams.mark("rows", "rope")
            rows.precompute_window(model, meta)
            streams.mark("rows", "window")
        if cfg.engram_layer_ids:
            cids = meta.engram_ids if meta.engram_ids is not None else model.engram_vocab_map[meta.input_ids.long()]
            write_rows(cache.engram_ids, slots, cids.to(torch.int32))
            if decode:
                rows.precompute_engram(model, meta, cache)
            else:
                rows.windows = engram_windows(model, meta, cache, rows)
            streams.mark("rows", "engram")
        if decode:
            rows.precompute_far(model, meta)
            full_rows = torch.arange(meta.total_q, device=positions.device)   # read after join_all only
    # 2. Row sets (decode: every row, static; prefill: nonzero of the replay mask).
    if decode:
        take = lambda t: t  # noqa: E731  (full_rows is every row)
    elif meta.row_plan is not None:   # the host's row sets (checked there): no device read
        full_rows, lo = meta.row_plan.full_rows, replay_lower_bound(model, meta, req, positions)
        take = lambda t: t[full_rows]  # noqa: E731
    else:
        full, lo = full_row_mask(model, meta, req, positions)
        full_rows = full.nonzero().squeeze(1)
        take = lambda t: t[full_rows]  # noqa: E731
    targets = set(model.model.dspark.target_layer_ids) if (meta.return_dspark_features and
                                                           model.model.dspark is not None) else set()
    feats: dict[int, torch.Tensor] = {}
    # 3. Encoder layers over every row.
    x = model.model.embed_tokens(meta.input_ids.long())
    for l in topo.encoder_layers:
        x = run_layer(model, l, x, rows, meta, cache, streams)
        if l in targets:
            feats[l] = take(x)
    # 4./5. YOCO shared hidden, consumer compressors, consumer layers over the full rows.
    if topo.yoco_enabled:
        s = model.model.layers[topo.first_consumer_layer].input_layernorm(x)
        for src in topo.consumer_sources:
            with streams.on("compress", reads=(s,)):   # read by later steps only (streams.py)
                terms = model.model.layers[src].self_attn.compressor.project_terms(s)
                update_compressed_source(model, src, terms, positions, req, slots, meta.block_tables, cache,
                                         static=decode, entry_rope=functools.partial(
                                             rows.entry_rope, dim=cfg.qk_rope_head_dim, theta=cfg.rope_theta),
                                         closing_rows=_closing_rows(meta), ring=rows.ring)
        x = take(x)
        frows = rows if decode else rows.subset(full_rows, lo[full_rows])
        frows.ring_len = rows.ring_len
        for l in (topo.consumer_layers if full_rows.numel() else ()):  # no last chunk: encoder side only
            x = run_layer(model, l, x, frows, meta, cache, streams)
            if l in targets:
                feats[l] = x
    else:
        x = take(x)
    if decode and meta.logits_every_row:   # every row is a full row and a logit row: x as it is
        lrows = None
    elif decode:  # every row is a full row: logit_rows index x directly
        lrows = meta.logit_rows.long()
    elif meta.row_plan is not None:
        lrows = meta.row_plan.logit_rows_in_full
    else:
        inv = torch.full((meta.total_q,), -1, dtype=torch.long, device=positions.device)
        inv[full_rows] = torch.arange(full_rows.numel(), device=positions.device)
        lrows = inv[meta.logit_rows.long()]
        if bool((lrows < 0).any()):
            raise MetadataError(LOGIT_ROW_OUTSIDE_REPLAY)
    # the final norm, lm_head and the float32 widening: one launch for a batch-1 row on SM90
    logits = model.model.norm.linear(x if lrows is None else x[lrows], model.lm_head.weight, out_dtype=torch.float32)
    streams.join_all()   # the compressors' writes (a captured graph ends on its capture stream)
    out = ForwardOutput(logits=logits, full_rows=full_rows)
    if targets:  # no full row (a prefill step of non-last chunks only): no features either
        hs = [feats.get(l, x[:0]) for l in model.model.dspark.target_layer_ids]
        out.dspark_features = model.model.dspark.features(hs)
    return out
