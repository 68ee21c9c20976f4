"""Acceptance 6: KV record size, SWA state per sequence, parameter counts beside SPEC's."""

from deepinfer_model.capacity import kv_bytes_per_token, param_counts, swa_state_bytes_per_sequence
from deepinfer_model.model import V41ForCausalLM
from deepinfer_model.presets import flash, flash_slice, mini, tiny


def test_kv_record_is_528_bytes():
    for cfg in (flash(), mini(), flash_slice()):
        b = kv_bytes_per_token(cfg)
        assert b["main_record"] == 528 and b["index_record"] == 68
    assert abs(kv_bytes_per_token(flash())["global_compressed"] - 890) < 10   # SPEC: ~890 B/token


def test_flash_swa_state_per_sequence():
    assert swa_state_bytes_per_sequence(flash()) == 20 * 134 * 528 == 1_415_040


def test_flash_parameter_counts_beside_spec():
    pc = param_counts(flash())
    rows = [("backbone", pc.backbone, 552e9), ("active prefill", pc.active_prefill, 8e9),
            ("active decode", pc.active_decode, 16e9), ("engram tables", pc.engram, 196.6e9)]
    print()
    for name, got, spec in rows:
        print(f"flash {name:15s} {got / 1e9:8.2f}B   SPEC {spec / 1e9:7.1f}B   ({got / spec - 1:+.1%})")
        assert abs(got / spec - 1) < 0.02, name
    print(f"flash total (backbone + engram + dspark) {pc.total / 1e9:.1f}B")


def test_analytic_count_equals_built_module():
    for cfg in (tiny(), tiny().replace(tie_word_embeddings=True)):
        model = V41ForCausalLM(cfg)
        assert param_counts(cfg).total == sum(p.numel() for p in model.parameters())


def test_bytes_per_block_matches_allocation():
    model = V41ForCausalLM(tiny())
    cache = model.allocate_kv_cache(num_blocks=3, block_size=8)
    assert model.kv_cache_bytes_per_block(8) * 3 == cache.nbytes()


def test_analytic_count_equals_module_for_large_presets_on_meta():
    import torch

    for cfg in (mini(), flash_slice()):
        with torch.device("meta"):
            model = V41ForCausalLM(cfg, device="meta")
        assert param_counts(cfg).total == sum(p.numel() for p in model.parameters())


def test_kv_footprint_spec_vs_paged_at_flash_widths():
    """SPEC's layout (894 B/token at flash, fixed rings per sequence) beside the paged layout as
    allocated: the allocator's bytes for one block equal `paged_kv_footprint` per token."""
    import torch

    from deepinfer_model.capacity import (H200_HBM_BYTES, max_context_tokens, paged_kv_footprint,
                                          spec_kv_footprint)
    from deepinfer_model.paged_cache import allocate_kv_cache

    spec = spec_kv_footprint(flash())
    assert spec.per_token == {"compressed": 528 + 2 * 528 / 4, "index_k": 68 + 2 * 68 / 4}
    assert spec.bytes_per_token == 894                                   # SPEC: ~890 B/token
    assert spec.per_sequence["window"] == (40 + 5) * 134 * 528           # rings of W + nextn + 1
    print()
    for name, cfg in (("flash", flash()), ("flash-slice", flash_slice())):
        for stage_dtype in (torch.float32, torch.bfloat16):
            size = torch.empty((), dtype=stage_dtype).element_size()
            paged = paged_kv_footprint(cfg, stage_bytes=size)
            measured = allocate_kv_cache(cfg, num_blocks=1, block_size=128, stage_dtype=stage_dtype).nbytes() / 128
            assert measured == paged.bytes_per_token
            print(f"{name:11s} stage {str(stage_dtype):14s} paged {paged.bytes_per_token:7.0f} B/token (allocator "
                  f"{measured:7.0f}), SPEC {spec_kv_footprint(cfg).bytes_per_token:.0f}: "
                  f"{paged.bytes_per_token / spec_kv_footprint(cfg).bytes_per_token:.1f}x")
    sl = flash_slice()
    before = max_context_tokens(sl, paged_kv_footprint(sl, stage_bytes=2), H200_HBM_BYTES)
    target = max_context_tokens(sl, spec_kv_footprint(sl, stage_bytes=2), H200_HBM_BYTES)
    print(f"flash-slice on one H200 (0.9 x HBM - bf16 weights): max context {before:,} tokens paged, "
          f"{target:,} in SPEC's layout")
    assert 1_000_000 < before < target / 5
