"""Engine-path compressor of one compressed source: stage token terms, finish entries.

Per processed row (position t, slot s):
1. token terms (c, ik, g) -> `comp_stage[plane, s]` (ratio > 1 only; idempotent per slot, so
   rejected draft rows are simply overwritten next step);
2. rows with `t % r == r - 1` complete entry `j = t // r`: gather the stage rows of positions
   `t - r + 1 .. t` through the block table, `Compressor.combine` (the same function the
   reference uses), write the FP8 latent to the source's kv plane and the FP4 index key to its
   index plane at the entry's plane slot (`indexing.entry_slots_of`: a block's bs / r entries are
   consecutive records).

`static=True` (decode, capturable): no boolean indexing and no host sync; every row gathers
its would-be entry and runs `combine` (r stage gathers + one combine per row instead of per
completed entry), and only rows that complete an entry store it (the others get slot -1).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from deepinfer_kernels.ops.capture import host_checks, write_rows
from deepinfer_kernels.ops.kv_fp4 import store_index_k_fp4
from deepinfer_kernels.ops.kv_fp8 import store_kv_fp8
from deepinfer_model.paged.indexing import entry_slots_of, slots_of
from deepinfer_model.paged.ring import RingRows
from deepinfer_model.modules.rope import RopeTable


def update_compressed_source(model, src: int, terms: torch.Tensor, positions: torch.Tensor, req: torch.Tensor,
                             slots: torch.Tensor, block_tables: torch.Tensor, cache, static: bool = False,
                             entry_rope: Callable[[int], RopeTable] | None = None,
                             closing_rows: dict[int, torch.Tensor] | None = None,
                             ring: RingRows | None = None) -> None:
    """terms float32 [N, S]: the rows' `Compressor.token_terms` (an encoder-side source's come from
    its layer's fused input GEMM), positions/req/slots [N]; slot -1 rows write nothing.
    `entry_rope(r)` (static only): the RoPE table of the positions of the entries the rows close at
    ratio r, shared by the step's sources of that ratio (`StepRows.entry_rope`). `closing_rows`
    (prefill, from the host: `prefill_plan.plan_prefill_rows`, which checked their slots): ratio ->
    the rows closing an entry, so no row set is read from the device. `ring` (caches with rings): the
    rows' ring facts; the stage is then this step's scratch rows + per-request rings (paged/ring.py)."""
    comp = model.model.layers[src].self_attn.compressor
    layout = cache.layout
    r = comp.ratio
    rope = entry_rope(r) if static and entry_rope is not None else None
    if r == 1:   # every row closes an entry: no selection (rows with slot -1 are skipped by the stores)
        latent, ik = comp.combine(terms.unsqueeze(1), positions, rope)
        dslots = slots
    else:
        plane = layout.stage_planes[src]
        stage, stage_len = cache.comp_stage[plane], 0 if layout.ring is None else layout.ring.stage_len
        write_rows(stage, slots if ring is None else ring.scratch_rows(stage_len), terms)
        done = (slots >= 0) & (positions % r == r - 1)
        planned = not static and closing_rows is not None
        if static:
            t = positions
        else:   # the closing rows: the host's, or read once (one sync; the selections below index with them)
            closing = closing_rows[r] if planned else done.nonzero().squeeze(1)
            if closing.numel() == 0:   # nothing read: straight into the ring
                if ring is not None:
                    write_rows(stage, ring.ring_targets(stage_len), terms)
                return
            t = positions.index_select(0, closing)
        vpos = t.unsqueeze(1) - (r - 1) + torch.arange(r, device=t.device).unsqueeze(0)      # [E, r]
        if ring is not None:   # this step's positions in the scratch, earlier ones in the ring
            tok_slots = (ring if static else ring.subset(closing)).rows_of(vpos, stage_len)
        else:
            tok_slots = slots_of(block_tables, req if static else req.index_select(0, closing), vpos,
                                 cache.block_size)
        # checked here unless the host did (planned) or graphs run (no host checks); rings hold every position
        if ring is None and ((not static and not planned) or host_checks(tok_slots)):
            missing = (tok_slots < 0) & done.unsqueeze(1) if static else tok_slots < 0
            if bool(missing.any()):
                raise RuntimeError(f"layer {src}: a compressed entry's tokens have no slot in the block table")
        gathered = stage[tok_slots.clamp(min=0)].float()                              # [E, r, S]
        if ring is not None:   # the reads are done: the last stage_len positions into the ring
            write_rows(stage, ring.ring_targets(stage_len), terms)
        latent, ik = comp.combine(gathered, t // r, rope)
        # the entries' packed slots (indexing.py); at decode every row computes one, the closing rows keep it
        closing_pos = torch.where(done, positions, torch.full_like(positions, -1)) if static else t
        dslots = entry_slots_of(block_tables, req if static else req.index_select(0, closing),
                                closing_pos.unsqueeze(1), cache.block_size, r).squeeze(1)
    if dslots.numel() == 0:
        return
    store_kv_fp8(latent, cache.comp_plane(src), dslots)         # the source's planes: slots
    store_index_k_fp4(ik, cache.index_plane(src), dslots)       # index them directly
