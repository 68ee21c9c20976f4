"""Window KV and compressor stages as per-request rings (paged/ring.py): the forward over a ring
cache computes bit-for-bit what it computes over the paged layout (the same records, read from
other rows), through chunked prefill at random points, long chunks (past the ring), decode steps
with right and wrong drafts (up to nextn) and DSpark drafts; and the ring cache's bytes per token
are SPEC's (capacity.spec_kv_footprint) plus the 4-byte Engram id."""

import pytest
import torch

from deepinfer_model.capacity import spec_kv_footprint
from deepinfer_model.metadata import MetadataError
from deepinfer_model.paged_cache import WindowRing, allocate_kv_cache
from deepinfer_model.presets import flash, flash_slice
from deepinfer_model.testing import Driver, Seq, tiny_model

PROMPT_LENS = (75, 40, 9, 23)


def _seqs(seed: int) -> list[Seq]:
    g = torch.Generator().manual_seed(seed)
    return [Seq(torch.randint(4, 8192, (n,), generator=g).tolist(), n) for n in PROMPT_LENS]


def _chunks(seqs: list[Seq], w: int, g: torch.Generator) -> list[int]:
    out = []
    for s in seqs:   # finish (the last chunk holds >= min(W, P) tokens) or cut at a random point
        left, replay = s.prompt_len - s.num_computed, min(w, s.prompt_len)
        can_cut = left - replay
        cut = int(torch.randint(1, can_cut + 1, (1,), generator=g)) if can_cut > 0 else 0
        out.append(left if cut == 0 or torch.rand(1, generator=g).item() < 0.3 else cut)
    return out


def _entries(drv: Driver, seqs: list[Seq]) -> list[torch.Tensor]:
    """Every committed compressed entry (FP8 record + FP4 key) of every sequence and source, in order."""
    out = []
    for s in seqs:
        for src, r in drv.cache.layout.ratios.items():
            slots = [s.slot(j * r + r - 1, drv.block_size, r) for j in range(s.num_computed // r)]
            out += [drv.cache.comp_plane(src)[slots], drv.cache.index_plane(src)[slots]]
    return out


@pytest.mark.parametrize("seed", [0, 1])
def test_ring_cache_matches_paged_layout_bit_for_bit(seed):
    model = tiny_model()
    cfg = model.config
    ring = WindowRing.for_config(cfg, num_seqs=6, max_step_rows=256)
    assert (ring.ring_len, ring.stage_len) == (cfg.sliding_window + cfg.nextn + 1, 4 + cfg.nextn)
    runs = [(Driver(model, num_blocks=64, block_size=8, shuffle_seed=seed), _seqs(seed)),
            (Driver(model, num_blocks=64, block_size=8, shuffle_seed=seed + 7, ring=ring), _seqs(seed))]
    g = torch.Generator().manual_seed(seed)
    while any(s.num_computed < s.prompt_len for s in runs[0][1]):
        active = [i for i, s in enumerate(runs[0][1]) if s.num_computed < s.prompt_len]
        chunks = _chunks([runs[0][1][i] for i in active], cfg.sliding_window, g)
        outs = [drv.prefill([seqs[i] for i in active], chunks)[1] for drv, seqs in runs]
        assert torch.equal(outs[0].logits, outs[1].logits)
        k = 0
        for i, n in zip(active, chunks, strict=True):
            if runs[0][1][i].num_computed == runs[0][1][i].prompt_len:   # that chunk was the last
                for _, seqs in runs:
                    seqs[i].tokens.append(int(outs[0].logits[k].argmax()))
                k += 1
    num_rejected = 0
    for _ in range(12):   # decode: up to nextn drafts, some of them wrong (rejected rows rewrite the rings)
        drafts = [torch.randint(4, 8192, (int(torch.randint(0, cfg.nextn + 1, (1,), generator=g)),),
                                generator=g).tolist() for _ in PROMPT_LENS]
        outs = [drv.decode(seqs, drafts, features=True) for drv, seqs in runs]
        assert torch.equal(outs[0][1].logits, outs[1][1].logits)
        for (drv, seqs), (meta, out) in zip(runs, outs, strict=True):
            model.dspark_write_main_keys(meta, out, drv.cache)
        row, mains = 0, []
        for i, d in enumerate(drafts):
            greedy = outs[0][1].logits[row: row + len(d) + 1].argmax(-1).tolist()
            acc = 0
            while acc < len(d) and d[acc] == greedy[acc]:
                acc += 1
            num_rejected += len(d) - acc
            for _, seqs in runs:
                seqs[i].tokens.extend(d[:acc] + [greedy[acc]])
            mains.append(greedy[acc])
            row += len(d) + 1
        for _, seqs in runs:   # the committed tokens: the last one has no KV yet
            for s in seqs:
                s.num_computed = len(s.tokens) - 1
        drafts_out = [model.dspark_draft(drv.draft_meta(seqs, [s.tokens[-1] for s in seqs]), drv.cache)
                      for drv, seqs in runs]
        assert torch.equal(drafts_out[0].logits, drafts_out[1].logits)
    assert num_rejected > 0
    # the entries closed at decode (read as far entries only W positions later) are identical too
    for a, b in zip(*(_entries(drv, seqs) for drv, seqs in runs), strict=True):
        assert torch.equal(a, b)


def test_ring_cache_needs_state_slots_and_scratch():
    model = tiny_model()
    drv = Driver(model, num_blocks=16, block_size=8, ring=WindowRing.for_config(model.config, 2, 32))
    meta = drv.prefill_meta([Seq(list(range(4, 44)), 40)], [40])
    with pytest.raises(MetadataError, match="scratch holds 32 rows"):
        model.forward(meta, drv.cache)
    meta.state_slots = None
    drv2 = Driver(model, num_blocks=16, block_size=8, ring=WindowRing.for_config(model.config, 2, 64))
    with pytest.raises(MetadataError, match="state_slots"):
        model.forward(meta, drv2.cache)


def test_ring_bytes_per_token_are_specs_at_flash_widths():
    """Allocator bytes per block / block_size = SPEC's per-token bytes + the Engram id (4 B); the
    rings are fixed bytes per state slot: (W + nextn + 1) records per window plane."""
    print()
    for name, cfg in (("flash", flash()), ("flash-slice", flash_slice())):
        ring = WindowRing.for_config(cfg, num_seqs=1, max_step_rows=128)
        one, two = (allocate_kv_cache(cfg, n, 128, ring=ring, stage_dtype=torch.bfloat16).nbytes() for n in (1, 2))
        per_token = (two - one) / 128
        spec = spec_kv_footprint(cfg)
        assert per_token == spec.bytes_per_token + 4
        layers = cfg.num_hidden_layers + cfg.nextn
        fixed = one - 128 * per_token
        assert fixed == layers * (2 * ring.ring_len + 128) * 528 + sum(
            (2 * ring.stage_len + 128) * 641 * 2 for s in cfg.topology.compressed_sources if cfg.compress_ratios[s] > 1)
        print(f"{name:11s} rings: {per_token:.0f} B/token (SPEC {spec.bytes_per_token:.0f}: "
              f"{per_token / spec.bytes_per_token:.3f}x), {ring.ring_len * layers * 528:,} B of window ring per sequence")
        assert per_token / spec.bytes_per_token < 1.2
