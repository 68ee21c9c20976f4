"""Write a model in HF layout: config.json, model-0000i-of-0000n.safetensors shards (bf16) +
model.safetensors.index.json, generation_config.json, and tokenizer.json when given."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from deepinfer_model.checkpoint.names import hf_tensors, read_param

INDEX_FILE = "model.safetensors.index.json"


def save_checkpoint(model, path: str | Path, max_shard_bytes: int = 2 * 1024**3, tokenizer=None,
                    generation_config: dict | None = None) -> Path:
    """Weights are stored bf16 (the module's values are bf16-representable on the CPU too)."""
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    cfg = model.config
    (out / "config.json").write_text(json.dumps(cfg.to_hf_dict(), indent=2) + "\n")
    gen = {"bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id, "do_sample": False}
    gen.update(generation_config or {})
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    if tokenizer is not None:
        tokenizer.save(str(out / "tokenizer.json"))
    params = dict(model.named_parameters())
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for t in hf_tensors(model):
        tensor = read_param(params, t).detach().to("cpu", torch.bfloat16).contiguous()
        nbytes = tensor.numel() * 2
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][t.hf_name] = tensor
        size += nbytes
    weight_map, total = {}, 0
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(out / fname), metadata={"format": "pt"})
        for name, tensor in shard.items():
            weight_map[name] = fname
            total += tensor.numel() * 2
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (out / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
    return out
