"""deepinfer_model: the V4.1-Flash architecture (docs/model.md), its dense reference forward, the
engine-path forward over paged caches, HF-layout checkpoints, presets and capacity math."""

from deepinfer_model.capacity import (
    KVFootprint,
    ParamCounts,
    kv_bytes_per_token,
    kv_record_bytes,
    max_context_tokens,
    paged_kv_footprint,
    param_counts,
    spec_kv_footprint,
    swa_state_bytes_per_sequence,
)
from deepinfer_model.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from deepinfer_model.config import ConfigError, V41Config
from deepinfer_model.metadata import DraftMetadata, DraftOutput, ForwardMetadata, ForwardOutput, MetadataError
from deepinfer_model.model import V41ForCausalLM
from deepinfer_model.paged_cache import CacheLayout, PagedKVCache, WindowRing, allocate_kv_cache
from deepinfer_model.presets import PRESETS, get_preset
from deepinfer_model.topology import LayerKind, Topology

__version__ = "0.1.6"
__all__ = [
    "CacheLayout", "CheckpointError", "KVFootprint", "ConfigError", "DraftMetadata", "DraftOutput", "ForwardMetadata",
    "ForwardOutput", "LayerKind", "MetadataError", "PRESETS", "PagedKVCache", "ParamCounts", "Topology",
    "V41Config", "V41ForCausalLM", "WindowRing", "allocate_kv_cache", "get_preset", "kv_bytes_per_token", "kv_record_bytes",
    "load_checkpoint", "max_context_tokens", "paged_kv_footprint", "param_counts", "spec_kv_footprint", "save_checkpoint", "swa_state_bytes_per_sequence", "__version__",
]
