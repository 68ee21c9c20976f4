"""Acceptance 2: a prefill over the encoder side + the YOCO projection yields exactly the decoder
global (compressed) KV that the full stack yields."""

import copy

import torch

from deepinfer_kernels.ops.kv_fp4 import dequantize_index_k_fp4
from deepinfer_kernels.ops.kv_fp8 import dequantize_kv_fp8
from deepinfer_model.reference import encoder_side
from deepinfer_model.testing import Driver, Seq, tiny_model


def test_dense_encoder_prefill_equals_full_stack_and_ignores_decoder_layers():
    model = tiny_model()
    topo = model.config.topology
    tokens = torch.randint(4, 8192, (75,), generator=torch.Generator().manual_seed(0))
    full = model.reference_forward(tokens, mode="exact")
    _, _, entries, _ = encoder_side(model, tokens)
    assert topo.consumer_sources
    for src in topo.consumer_sources:
        assert torch.equal(entries[src][0], full.entries[src][0])
        assert torch.equal(entries[src][1], full.entries[src][1])
    # The decoder layers' own weights play no part: only the consumer compressors and the first
    # consumer's attention norm (which defines the shared hidden) do.
    other = copy.deepcopy(model)
    with torch.no_grad():
        for l in topo.consumer_layers:
            layer = other.model.layers[l]
            for name, p in layer.named_parameters():
                if "compressor" in name or (l == topo.first_consumer_layer and name.startswith("input_layernorm")):
                    continue
                p.add_(torch.randn_like(p))
    full2 = other.reference_forward(tokens, mode="exact")
    for src in topo.consumer_sources:
        assert torch.equal(full2.entries[src][0], full.entries[src][0])
    assert not torch.equal(full2.logits, full.logits)


def test_engine_prefill_writes_the_full_stack_decoder_kv():
    """Chunks that are not the last run no decoder layer; the consumer compressed planes then
    hold exactly the FP8/FP4 records of the full stack's entries (up to a rare FP8 rounding
    flip from different GEMM batch shapes, bounded by one e4m3 step)."""
    model = tiny_model()
    cfg, topo = model.config, model.config.topology
    tokens = torch.randint(4, 8192, (75,), generator=torch.Generator().manual_seed(1)).tolist()
    seq = Seq(tokens + [5] * 20, prompt_len=95)   # the prompt continues: 75 tokens stay non-last
    drv = Driver(model, num_blocks=16, block_size=8)
    meta, out = drv.prefill([seq], [40])
    meta, out = drv.prefill([seq], [35])
    assert out.full_rows.numel() == 0 and out.logits.shape[0] == 0
    full = model.reference_forward(torch.tensor(tokens), mode="exact", kv_quant=True)
    for src in topo.consumer_sources:
        r = cfg.compress_ratios[src]
        lat_ref, ik_ref = full.entries[src]
        pos = torch.arange(lat_ref.shape[0]) * r + r - 1
        slots = torch.tensor([seq.slot(p, 8, r) for p in pos.tolist()])
        lat = dequantize_kv_fp8(drv.cache.comp_plane(src)[slots], cfg.head_dim)
        ik = dequantize_index_k_fp4(drv.cache.index_plane(src)[slots], cfg.index_head_dim)
        same = (lat == lat_ref).float().mean().item()
        print(f"\nconsumer source {src}: {lat_ref.shape[0]} entries, {same:.2%} of FP8 values bit-identical")
        assert same > 0.99
        torch.testing.assert_close(lat, lat_ref, rtol=2**-3, atol=1e-6)
        torch.testing.assert_close(ik, ik_ref, rtol=0.5, atol=1e-6)
