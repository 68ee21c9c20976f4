"""Loads the model + tokenizer the engine serves: an HF-layout checkpoint, or the embedded default.

The default (no `model` argument) is the checkpoint shipped inside deepinfer-model; until one is
shipped there, a randomly initialised `tiny` model with the shipped tokenizer stands in.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from deepinfer_engine.tokenizer import TextTokenizer
from deepinfer_model import presets
from deepinfer_model.checkpoint import load_checkpoint
from deepinfer_model.engram_vocab import padded_vocab_map
from deepinfer_model.model import V41ForCausalLM

DEFAULT_MODEL_DIR = Path(presets.__file__).resolve().parent / "default"


@dataclass
class LoadedModel:
    model: V41ForCausalLM
    tokenizer: TextTokenizer | None
    eos_token_ids: list[int]
    source: str  # where the weights came from, for logs


def resolve_device(device: str | None) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device: {device!r} requested but no CUDA device is available")
    return dev


def _tokenizer(model_dir: Path, eos_ids: list[int], bos_id: int | None) -> TextTokenizer | None:
    path = model_dir / "tokenizer.json"
    return TextTokenizer.from_file(path, eos_ids, bos_id) if path.exists() else None


PRESET_PREFIX = "preset:"  # model="preset:mini" = that architecture preset with random weights (benchmarks)


def _dtype(name: str | None) -> torch.dtype | None:
    if name is None:
        return None
    table = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float32": torch.float32, "fp32": torch.float32}
    if name not in table:
        raise ValueError(f"dtype: expected one of {sorted(table)}, got {name!r}")
    return table[name]


def load_model(model: str | Path | None, device: torch.device, random_init_seed: int = 0,
               dtype: str | None = None) -> LoadedModel:
    if isinstance(model, str) and model.startswith(PRESET_PREFIX):
        cfg = presets.get_preset(model[len(PRESET_PREFIX):])
        # Generated on the CPU (the same weights on every device) unless large enough to be slow there.
        large = cfg.hidden_size * cfg.num_hidden_layers >= 8192
        net = V41ForCausalLM(cfg, device=device, dtype=_dtype(dtype)).init_random_weights(
            random_init_seed, on_device=device.type == "cuda" and large).keep_float32_params()
        return LoadedModel(net, None, list(cfg.eos_token_ids), f"{model} (random weights, seed {random_init_seed})")
    model_dir = Path(model) if model is not None else DEFAULT_MODEL_DIR
    if model is not None and not model_dir.is_dir():
        raise FileNotFoundError(f"model: {model_dir} is not a directory holding an HF-layout checkpoint")
    if (model_dir / "config.json").exists():
        net = load_checkpoint(model_dir, device=device, dtype=_dtype(dtype))
        source = str(model_dir)
    else:  # no trained default shipped yet: random tiny weights + the shipped tokenizer
        net = V41ForCausalLM(presets.tiny(), device=device, dtype=_dtype(dtype)).init_random_weights(random_init_seed)
        source = f"random tiny (seed {random_init_seed})"
    net.keep_float32_params()
    cfg = net.config
    eos_ids = list(cfg.eos_token_ids)
    tok = _tokenizer(model_dir, eos_ids, cfg.bos_token_id)
    if tok is not None:
        if tok.vocab_size > cfg.vocab_size:
            raise ValueError(f"tokenizer: {tok.vocab_size} tokens exceed the model's vocab_size {cfg.vocab_size}")
        if cfg.engram_layer_ids:
            net.set_engram_vocab_map(padded_vocab_map(tok.backend, cfg.vocab_size))
    return LoadedModel(net, tok, eos_ids, source)
