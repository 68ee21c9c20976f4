"""Compressor.combine with the step's shared RoPE table (rotated in place) against the formula."""

import pytest
import torch

from deepinfer_model import presets
from deepinfer_model.modules.compressor import Compressor
from deepinfer_model.modules.rope import rope_table
from deepinfer_model.paged.rows import StepRows


@pytest.mark.parametrize("ratio", [1, 4])
def test_combine_with_the_shared_table_is_bit_identical(ratio):
    cfg = presets.tiny()
    torch.manual_seed(ratio)
    comp = Compressor(cfg, ratio)
    with torch.no_grad():
        comp.pos_bias.normal_()
    positions = torch.tensor([0, 3, 7, 8, 130, 511, 4095])
    rows = StepRows(positions, torch.zeros_like(positions), positions, torch.zeros_like(positions), None)
    entry_ids = positions // ratio
    terms = torch.randn(positions.shape[0], ratio, comp.stage_width) * 3
    want_latent, want_ik = comp.combine(terms, entry_ids)
    table = rows.entry_rope(ratio, cfg.qk_rope_head_dim, cfg.rope_theta)
    got_latent, got_ik = comp.combine(terms, entry_ids, table)
    assert torch.equal(got_latent, want_latent) and torch.equal(got_ik, want_ik)
    ref = rope_table(comp.entry_positions(entry_ids), cfg.qk_rope_head_dim, cfg.rope_theta)
    assert torch.equal(table.cos_full, ref.cos_full) and torch.equal(table.sin_signed, ref.sin_signed)
    assert rows.entry_rope(ratio, cfg.qk_rope_head_dim, cfg.rope_theta) is table        # one per step
    if ratio == 1:
        assert table is rows.rope(cfg.qk_rope_head_dim, cfg.rope_theta)                 # the rows' own
