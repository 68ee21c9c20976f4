"""Acceptance 5: HF-layout checkpoints fail loudly naming the problem; save -> load round-trips."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from deepinfer_model.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from deepinfer_model.config import ConfigError
from deepinfer_model.model import V41ForCausalLM
from deepinfer_model.testing import Driver, Seq, tiny_model

EXPERT = "model.layers.2.mlp.experts.5.up_proj.weight"
ATTN = "model.layers.3.self_attn.kv_a_proj_with_mqa.weight"


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny")
    save_checkpoint(tiny_model(), path, max_shard_bytes=1 << 20)
    return path


def _edit(src: Path, dst: Path, fn):
    """Copy a checkpoint, letting fn(name, tensor) -> tensor | None rewrite (None drops) tensors."""
    dst.mkdir()
    index = json.loads((src / "model.safetensors.index.json").read_text())
    for f in src.iterdir():
        if f.suffix != ".safetensors":
            (dst / f.name).write_bytes(f.read_bytes())
    for shard in sorted({*index["weight_map"].values()}):
        tensors = {}
        for name, t in load_file(str(src / shard)).items():
            t2 = fn(name, t)
            if t2 is not None:
                tensors[name] = t2
        save_file(tensors, str(dst / shard))


def test_layout_and_round_trip_identical_logits(ckpt):
    files = sorted(p.name for p in ckpt.iterdir())
    assert {"config.json", "generation_config.json", "model.safetensors.index.json"} <= set(files)
    assert sum(f.endswith(".safetensors") for f in files) > 1                    # sharded
    index = json.loads((ckpt / "model.safetensors.index.json").read_text())
    assert EXPERT in index["weight_map"] and ATTN in index["weight_map"]
    model = tiny_model()
    loaded = load_checkpoint(ckpt)
    for (n1, p1), (n2, p2) in zip(model.named_parameters(), loaded.named_parameters(), strict=False):
        assert n1 == n2 and torch.equal(p1, p2), n1
    toks = torch.randint(4, 8192, (45,), generator=torch.Generator().manual_seed(0))
    assert torch.equal(model.reference_forward(toks).logits, loaded.reference_forward(toks).logits)
    outs = []
    for m in (model, loaded):
        drv = Driver(m, num_blocks=8, block_size=8)
        outs.append(drv.prefill([Seq(toks.tolist(), 45)], [45])[1].logits)
    assert torch.equal(outs[0], outs[1])


def test_missing_tensor_is_named(ckpt, tmp_path):
    _edit(ckpt, tmp_path / "c", lambda n, t: None if n == EXPERT else t)
    with pytest.raises(CheckpointError, match=EXPERT.replace(".", r"\.")):
        load_checkpoint(tmp_path / "c")


def test_index_without_the_tensor_is_named(ckpt, tmp_path):
    _edit(ckpt, tmp_path / "c", lambda n, t: t)
    index_file = tmp_path / "c" / "model.safetensors.index.json"
    index = json.loads(index_file.read_text())
    del index["weight_map"][ATTN]
    index_file.write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=r"missing tensor .*kv_a_proj_with_mqa"):
        load_checkpoint(tmp_path / "c")


def test_wrong_shape_is_named(ckpt, tmp_path):
    _edit(ckpt, tmp_path / "c", lambda n, t: t[:, :-1].contiguous() if n == ATTN else t)
    with pytest.raises(CheckpointError, match=r"kv_a_proj_with_mqa.*shape \(64, 63\), expected \(64, 64\)"):
        load_checkpoint(tmp_path / "c")


def test_wrong_dtype_is_named(ckpt, tmp_path):
    _edit(ckpt, tmp_path / "c", lambda n, t: t.float() if n == ATTN else t)
    with pytest.raises(CheckpointError, match=r"kv_a_proj_with_mqa.*dtype torch.float32"):
        load_checkpoint(tmp_path / "c")


def test_unexpected_tensor_is_named(ckpt, tmp_path):
    _edit(ckpt, tmp_path / "c", lambda n, t: t)
    extra = {"model.layers.0.self_attn.k_b_proj.weight": torch.zeros(2, 2, dtype=torch.bfloat16)}
    save_file(extra, str(tmp_path / "c" / "extra.safetensors"))
    index_file = tmp_path / "c" / "model.safetensors.index.json"
    index = json.loads(index_file.read_text())
    index["weight_map"]["model.layers.0.self_attn.k_b_proj.weight"] = "extra.safetensors"
    index_file.write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="k_b_proj"):
        load_checkpoint(tmp_path / "c")


@pytest.mark.parametrize("key,value", [("num_key_value_heads", 2), ("hidden_act", "relu"), ("torch_dtype", "float32")])
def test_unsupported_config_value_is_named(ckpt, tmp_path, key, value):
    _edit(ckpt, tmp_path / "c", lambda n, t: t)
    cfg_file = tmp_path / "c" / "config.json"
    hf = json.loads(cfg_file.read_text())
    hf["text_config"][key] = value
    cfg_file.write_text(json.dumps(hf))
    with pytest.raises(ConfigError, match=key):
        load_checkpoint(tmp_path / "c")


def test_tokenizer_json_builds_the_engram_map(tmp_path):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel()
    tok.train_from_iterator(["Hello hello HELLO world"] * 10,
                            trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>"],
                                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    model = V41ForCausalLM(tiny_model().config).init_random_weights(1)
    save_checkpoint(model, tmp_path / "c", tokenizer=tok)
    loaded = load_checkpoint(tmp_path / "c")
    assert (tmp_path / "c" / "tokenizer.json").is_file()
    vm = loaded.engram_vocab_map
    assert vm.shape == (8192,) and int(vm[: tok.get_vocab_size()].max()) < tok.get_vocab_size()
    assert not torch.equal(vm, torch.arange(8192, dtype=torch.int32))
