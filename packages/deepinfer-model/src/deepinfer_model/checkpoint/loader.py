"""Load an HF-layout checkpoint into `V41ForCausalLM`, validating strictly.

1. config.json -> `V41Config` (unsupported values raise `ConfigError` naming the key);
2. the shard index (model.safetensors.index.json, or a single model.safetensors) must map every
   expected tensor and nothing else: missing / unexpected tensors are named;
3. each tensor must be bfloat16 with the expected shape (the error names tensor, got, expected);
4. tokenizer.json, when present, builds the Engram compressed vocabulary.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from deepinfer_model.checkpoint.names import hf_tensors, read_param
from deepinfer_model.checkpoint.writer import INDEX_FILE
from deepinfer_model.config import V41Config
from deepinfer_model.model import V41ForCausalLM


class CheckpointError(ValueError):
    """The checkpoint does not match its config; the message names the tensor or file."""


def read_config(path: str | Path) -> V41Config:
    f = Path(path) / "config.json"
    if not f.is_file():
        raise CheckpointError(f"{f}: config.json is missing")
    return V41Config.from_hf_dict(json.loads(f.read_text()))


def _weight_map(root: Path) -> dict[str, str]:
    index = root / INDEX_FILE
    if index.is_file():
        return json.loads(index.read_text())["weight_map"]
    single = root / "model.safetensors"
    if single.is_file():
        with safe_open(str(single), framework="pt") as f:
            return {k: single.name for k in f.keys()}
    raise CheckpointError(f"{root}: neither {INDEX_FILE} nor model.safetensors found")


@torch.no_grad()
def load_checkpoint(path: str | Path, device: torch.device | str | None = None,
                    dtype: torch.dtype | None = None) -> V41ForCausalLM:
    root = Path(path)
    cfg = read_config(root)
    model = V41ForCausalLM(cfg, device=device, dtype=dtype)
    expected = {t.hf_name: t for t in hf_tensors(model)}
    weight_map = _weight_map(root)
    missing = sorted(set(expected) - set(weight_map))
    if missing:
        raise CheckpointError(f"missing tensor {missing[0]!r}" + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    unexpected = sorted(set(weight_map) - set(expected))
    if unexpected:
        raise CheckpointError(f"unexpected tensor {unexpected[0]!r} (not part of this config's architecture)")
    params = dict(model.named_parameters())
    by_file: dict[str, list[str]] = {}
    for name, fname in weight_map.items():
        by_file.setdefault(fname, []).append(name)
    for fname, names in sorted(by_file.items()):
        shard = root / fname
        if not shard.is_file():
            raise CheckpointError(f"{fname}: shard listed in the index is missing (holds {names[0]!r})")
        with safe_open(str(shard), framework="pt") as f:
            present = set(f.keys())
            for name in names:
                if name not in present:
                    raise CheckpointError(f"missing tensor {name!r} (index points to {fname})")
                t = expected[name]
                tensor = f.get_tensor(name)
                if tuple(tensor.shape) != t.shape:
                    raise CheckpointError(f"tensor {name!r}: shape {tuple(tensor.shape)}, expected {t.shape}")
                if tensor.dtype != torch.bfloat16:
                    raise CheckpointError(f"tensor {name!r}: dtype {tensor.dtype}, expected torch.bfloat16")
                read_param(params, t).copy_(tensor.to(model.dtype))
    tok = root / "tokenizer.json"
    if tok.is_file() and cfg.engram_layer_ids:
        from tokenizers import Tokenizer

        from deepinfer_model.engram_vocab import padded_vocab_map
        model.set_engram_vocab_map(padded_vocab_map(Tokenizer.from_file(str(tok)), cfg.vocab_size))
    return model.eval()
