"""Acceptance 3 (indexer, model level): in the engine path every row's far set contains the most
recent far block, and the selected blocks equal a brute-force selection over the FP4 keys."""

import math

import torch

from deepinfer_kernels.ops.attention_indices import attention_indices
from deepinfer_kernels.ops.indexer import BF16_MAX
from deepinfer_kernels.ops.kv_fp4 import dequantize_index_k_fp4
from deepinfer_model.paged.forward import far_selection
from deepinfer_model.paged.rows import StepRows
from deepinfer_model.testing import Driver, Seq, tiny_model


def far_indices(model, layer, q_lat, index_weights, rows, meta, cache) -> torch.Tensor:
    """The engine's far selection alone as flat pool rows, int32 [N, topk * B] (-1 = none): the
    attention index list of `run_layer` without its window part."""
    sel = far_selection(model, layer, q_lat, index_weights, rows, meta, cache)
    none = torch.empty(len(sel.blocks), 0, dtype=torch.long, device=sel.blocks.device)
    return attention_indices(none, 0, sel.blocks, sel.n_far, sel.entry_slots, sel.base,
                             model.config.index_block_size)


@torch.no_grad()
def test_far_selection_in_the_engine_path():
    model = tiny_model()
    cfg = model.config
    bsz, topk, w = cfg.index_block_size, cfg.index_topk, cfg.sliding_window
    seq = Seq(torch.randint(4, 8192, (120,), generator=torch.Generator().manual_seed(0)).tolist(), 120)
    drv = Driver(model, num_blocks=16, block_size=8)
    meta, _ = drv.prefill([seq], [120])
    layer = model.model.layers[2]            # ratio 4, reads source layer 1's entries
    r, base = layer.ratio, drv.cache.plane_base[drv.cache.layout.comp_planes[1]]
    g = torch.Generator().manual_seed(1)
    u = torch.randn(120, cfg.hidden_size, generator=g)
    q_lat = torch.randn(120, cfg.q_lora_rank, generator=g)
    rows = StepRows(meta.positions, meta.row_to_req, meta.slot_mapping, torch.zeros(120, dtype=torch.long), None)
    far = far_indices(model, layer, q_lat, layer.self_attn.indexer.weights_proj(u), rows, meta, drv.cache)
    q_idx, wts = layer.self_attn.indexer.query(q_lat, u)
    slot = lambda p: seq.slot(p, 8, r)  # noqa: E731  (the entry closing at p)
    keys = {}
    checked = 0
    for row in range(120):
        n_far = max(0, row - w + 1) // r
        got_entries = sorted({(int(i) - base) for i in far[row] if i >= 0})
        if n_far == 0:
            assert not got_entries
            continue
        scores = []
        for j in range(n_far):
            if j not in keys:
                rec = drv.cache.index_plane(1)[slot(j * r + r - 1)].unsqueeze(0)
                keys[j] = dequantize_index_k_fp4(rec, cfg.index_head_dim)[0]
            scores.append(sum(float(wts[row, h]) * max(0.0, float(q_idx[row, h] @ keys[j]))
                              for h in range(cfg.index_n_heads)))
        nb = math.ceil(n_far / bsz)
        blocks = [(math.inf if b == nb - 1 else min(max(scores[b * bsz:(b + 1) * bsz]), BF16_MAX), b)
                  for b in range(nb)]
        chosen = sorted(b for _, b in sorted(blocks, key=lambda sb: (-sb[0], sb[1]))[:topk])
        want = sorted(slot(j * r + r - 1) for b in chosen for j in range(b * bsz, min((b + 1) * bsz, n_far)))
        assert got_entries == want, f"row {row}"
        assert slot((n_far - 1) * r + r - 1) in got_entries        # most recent far entry always there
        checked += nb > topk
    assert checked > 20    # many rows really had to choose
