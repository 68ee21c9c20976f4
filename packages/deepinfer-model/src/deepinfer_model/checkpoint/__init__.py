"""HF-layout checkpoints: config.json, sharded safetensors + index, generation_config.json, tokenizer.json."""

from deepinfer_model.checkpoint.loader import CheckpointError, load_checkpoint
from deepinfer_model.checkpoint.writer import save_checkpoint

__all__ = ["CheckpointError", "load_checkpoint", "save_checkpoint"]
