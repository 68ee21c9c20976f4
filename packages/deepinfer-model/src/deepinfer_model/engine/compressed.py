"""Engine-path compressor of one compressed source: stage token terms, finish entries.

Per processed row (position t, slot s):
1. token terms (c, ik, g) -> `comp_stage[plane, s]` (ratio > 1 only; idempotent per slot, so
   rejected draft rows are simply overwritten next step);
2. rows with `t % r == r - 1` complete entry `j = t // r`: gather the stage rows of positions
   `t - r + 1 .. t` through the block table, `Compressor.combine` (the same function the
   reference uses), write the FP8 latent to the source's kv plane and the FP4 index key to its
   index plane at the slot of position t.
"""

from __future__ import annotations

import torch
from deepinfer_kernels.ops.kv_fp4 import store_index_k_fp4
from deepinfer_kernels.ops.kv_fp8 import store_kv_fp8

from deepinfer_model.engine.indexing import slots_of, to_flat


def update_compressed_source(model, src: int, v: torch.Tensor, positions: torch.Tensor, req: torch.Tensor,
                             slots: torch.Tensor, block_tables: torch.Tensor, cache) -> None:
    """v [N, H] compressor input of the rows, positions/req/slots [N]."""
    comp = model.model.layers[src].self_attn.compressor
    layout, ns = cache.layout, cache.num_slots
    r = comp.ratio
    terms = comp.token_terms(v)                                                   # [N, S] float32
    if r == 1:
        done = slots >= 0
        latent, ik = comp.combine(terms[done].unsqueeze(1), positions[done])
        dslots = slots[done]
    else:
        plane = layout.stage_planes[src]
        keep = slots >= 0
        cache.comp_stage[plane, slots[keep]] = terms[keep].to(cache.comp_stage.dtype)
        done = keep & (positions % r == r - 1)
        if not bool(done.any()):
            return
        t = positions[done]
        vpos = t.unsqueeze(1) - (r - 1) + torch.arange(r, device=t.device).unsqueeze(0)      # [E, r]
        tok_slots = slots_of(block_tables, req[done], vpos, cache.block_size)
        if bool((tok_slots < 0).any()):
            raise RuntimeError(f"layer {src}: a compressed entry's tokens have no slot in the block table")
        gathered = cache.comp_stage[plane, tok_slots].float()                         # [E, r, S]
        latent, ik = comp.combine(gathered, t // r)
        dslots = slots[done]
    if dslots.numel() == 0:
        return
    store_kv_fp8(latent, cache.kv_flat, to_flat(dslots, layout.comp_planes[src], ns))
    store_index_k_fp4(ik, cache.index_flat, to_flat(dslots, layout.index_planes[src], ns))
