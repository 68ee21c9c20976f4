import pytest

from deepinfer_model.config import ConfigError, V41Config
from deepinfer_model.presets import PRESETS, flash, get_preset, tiny
from deepinfer_model.topology import LayerKind


@pytest.mark.parametrize("key,value", [
    ("num_key_value_heads", 8), ("hidden_act", "gelu"), ("attention_bias", True),
    ("attention_dropout", 0.1), ("torch_dtype", "float16"),
])
def test_unsupported_values_are_rejected_naming_the_key(key, value):
    hf = tiny().to_hf_dict()
    hf["text_config"][key] = value
    with pytest.raises(ConfigError, match=key):
        V41Config.from_hf_dict(hf)


@pytest.mark.parametrize("key,value,match", [
    ("compress_ratios", [0, 4], "compress_ratios"),
    ("head_dim", 48, "head_dim"),
    ("kv_source_layer_ids", [1, 4], "kv_source_layer_ids"),     # layer 5 (ratio 2) would map to 4 (ratio 0)
    ("dspark_target_layer_ids", [99], "dspark_target_layer_ids"),
    ("engram_layer_ids", [7], "engram_layer_ids"),
])
def test_inconsistent_values_are_rejected(key, value, match):
    hf = tiny().to_hf_dict()
    hf["text_config"][key] = value
    with pytest.raises(ConfigError, match=match):
        V41Config.from_hf_dict(hf)


def test_missing_required_key_is_named():
    hf = tiny().to_hf_dict()
    del hf["text_config"]["sliding_window"]
    with pytest.raises(ConfigError, match="sliding_window"):
        V41Config.from_hf_dict(hf)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_hf_dict_round_trip(name):
    cfg = get_preset(name)
    assert V41Config.from_hf_dict(cfg.to_hf_dict()) == cfg


def test_unknown_keys_survive_a_round_trip():
    hf = tiny().to_hf_dict()
    hf["text_config"]["rope_scaling"] = {"type": "yarn"}
    assert V41Config.from_hf_dict(hf).to_hf_dict()["text_config"]["rope_scaling"] == {"type": "yarn"}


def test_tiny_derived_quantities():
    cfg = tiny()
    topo = cfg.topology
    assert cfg.kv_lora_rank == 48
    assert topo.n_prefill_layer == 3 and topo.yoco_enabled
    assert list(topo.encoder_layers) == [0, 1, 2, 3] and list(topo.consumer_layers) == [4, 5, 6]
    assert topo.layer_map == (0, 1, 1, 3, 3, 5, 5)
    assert topo.compressed_sources == (1, 3, 5) and topo.consumer_sources == (5,)
    assert [topo.kind(l) for l in range(7)] == [LayerKind.WINDOW, LayerKind.COMPRESSED, LayerKind.COMPRESSED,
                                                LayerKind.COMPRESSED, LayerKind.WINDOW, LayerKind.COMPRESSED,
                                                LayerKind.COMPRESSED]
    mods = topo.attention_modules
    assert len(mods) == 7 + 1 + cfg.nextn and mods[7] is None
    assert all(m.kind is LayerKind.DFLASH for m in mods[8:])
    assert topo.engram_tables == ((1, 2), (1, 3), (5, 2), (5, 3))   # (layer, n) per n-gram table


def test_flash_structure():
    cfg = flash()
    topo = cfg.topology
    assert cfg.num_hidden_layers == 40 and topo.num_encoder_layers == 20 and topo.n_prefill_layer == 19
    assert cfg.n_routed_experts == 384 and cfg.num_experts_per_tok == 6 and cfg.n_shared_experts == 1
    assert cfg.sliding_window == 128 and cfg.head_dim == 512


def test_no_ratio_one_layer_means_yoco_off():
    cfg = tiny().replace(compress_ratios=(0, 4, 4, 2, 0, 2, 2), kv_source_layer_ids=(1, 3))
    assert cfg.topology.n_prefill_layer is None and not cfg.topology.yoco_enabled
    assert cfg.topology.num_encoder_layers == 7
