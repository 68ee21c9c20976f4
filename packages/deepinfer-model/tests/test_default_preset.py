"""The `default` preset (the embedded default model): tiny-family feature coverage within the size budget."""

from deepinfer_model import param_counts
from deepinfer_model.presets import default, tiny
from deepinfer_model.topology import LayerKind


def test_default_covers_every_tiny_feature():
    cfg, ref = default(), tiny()
    topo = cfg.topology
    assert cfg.compress_ratios == ref.compress_ratios and cfg.kv_source_layer_ids == ref.kv_source_layer_ids
    assert topo.yoco_enabled and topo.n_prefill_layer == 3 and topo.consumer_sources == (5,)
    assert {topo.kind(l) for l in range(cfg.num_hidden_layers)} == {LayerKind.WINDOW, LayerKind.COMPRESSED}
    assert cfg.n_routed_experts > cfg.num_experts_per_tok >= 2 and cfg.n_shared_experts == 1
    assert cfg.engram_layer_ids and cfg.nextn == 5 and cfg.dspark_markov_rank > 0
    # tokenizer ids: <|bos|> 1, <|eos|> 2, <|noise|> 6
    assert (cfg.bos_token_id, cfg.eos_token_id, cfg.dspark_noise_token_id, cfg.vocab_size) == (1, 2, 6, 8192)
    # the engine tests prefill with budgets of 32 tokens: the bounded replay (window) must fit
    assert cfg.sliding_window <= 32


def test_default_fits_the_size_budget():
    counts = param_counts(default())
    assert cfg_bytes(counts.total) <= 12 * 2**20 - 600_000   # bf16 weights + tokenizer.json <= 12 MiB
    assert counts.total == 5_772_119


def cfg_bytes(n_params: int) -> int:
    return 2 * n_params
