"""`V41Config`: the `text_config` of an HF `config.json`, parsed and validated.

Unsupported values are rejected loudly with the key named (SPEC §1): one shared KV head, SiLU,
no attention bias, no dropout, BF16 parameters. Derived quantities (n_prefill_layer, the
cross-layer source map, YOCO consumers, ...) live in `topology.py`; byte and parameter
accounting in `capacity.py`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


class ConfigError(ValueError):
    """A config.json value the runtime does not support; the message names the key."""


@dataclass(frozen=True)
class V41Config:
    # --- backbone
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    head_dim: int                      # D = kv_lora_rank + qk_rope_head_dim (HF's KV vector includes RoPE)
    qk_rope_head_dim: int
    q_lora_rank: int
    max_position_embeddings: int
    sliding_window: int                # W: SWA width and the decoder bounded-replay length
    compress_ratios: tuple[int, ...]   # per layer: 0 window-only, r >= 1 window + compressed (r tokens/entry)
    num_key_value_heads: int = 1
    hidden_act: str = "silu"
    attention_bias: bool = False
    attention_dropout: float = 0.0
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    kv_source_layer_ids: tuple[int, ...] = ()
    # --- lightning indexer
    index_n_heads: int = 4
    index_head_dim: int = 64
    index_block_size: int = 16         # compressed entries per indexer block
    index_topk: int = 8                # blocks selected per query row
    # --- FFN / MoE
    n_routed_experts: int = 0
    n_shared_experts: int = 1
    num_experts_per_tok: int = 1
    moe_intermediate_size: int = 0
    routed_scaling_factor: float = 1.0
    norm_topk_prob: bool = True
    first_k_dense_replace: int = 0
    intermediate_size: int = 0         # dense SwiGLU width (layers < first_k_dense_replace)
    # --- Engram
    engram_layer_ids: tuple[int, ...] = ()
    engram_max_ngram_size: int = 3
    engram_table_size: int = 0
    engram_dim: int = 0
    # --- DSpark / DFlash draft block
    nextn: int = 0
    dspark_noise_token_id: int = 0
    dspark_target_layer_ids: tuple[int, ...] = ()
    dspark_markov_rank: int = 0
    dspark_confidence_temperature: float = 1.0
    dspark_intermediate_size: int = 0
    # --- misc
    tie_word_embeddings: bool = False
    bos_token_id: int = 0
    eos_token_id: int | tuple[int, ...] = 1
    torch_dtype: str = "bfloat16"
    extra: dict[str, Any] = field(default_factory=dict, compare=False)  # unknown keys, kept for round trips

    def __post_init__(self) -> None:
        validate(self)

    # ---- derived scalars (topology.py holds the structural ones)
    @property
    def kv_lora_rank(self) -> int:
        return self.head_dim - self.qk_rope_head_dim

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return tuple(self.eos_token_id) if isinstance(self.eos_token_id, tuple) else (self.eos_token_id,)

    @property
    def topology(self):  # -> topology.Topology (cached per config object)
        from deepinfer_model.topology import Topology
        cached = self.__dict__.get("_topology")
        if cached is None:
            cached = Topology.build(self)
            object.__setattr__(self, "_topology", cached)
        return cached

    def replace(self, **changes: Any) -> V41Config:
        return dataclasses.replace(self, **changes)

    # ---- HF dict round trip
    @classmethod
    def from_hf_dict(cls, hf: dict[str, Any]) -> V41Config:
        """Parse an HF config dict (keys under `text_config`, or flat)."""
        text = dict(hf.get("text_config", hf))
        if "torch_dtype" not in text and "torch_dtype" in hf:
            text["torch_dtype"] = hf["torch_dtype"]
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        required = [f.name for f in dataclasses.fields(cls)
                    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
        for key in required:
            if key not in text:
                raise ConfigError(f"config.json: text_config.{key} is missing (required)")
        kwargs: dict[str, Any] = {}
        for key, value in text.items():
            if key not in names:
                continue
            if isinstance(value, list):
                value = tuple(value)
            kwargs[key] = value
        extra = {k: v for k, v in text.items() if k not in names}
        return cls(**kwargs, extra=extra)

    def to_hf_dict(self) -> dict[str, Any]:
        text: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            if f.name == "extra":
                continue
            value = getattr(self, f.name)
            text[f.name] = list(value) if isinstance(value, tuple) else value
        text.update(self.extra)
        return {
            "architectures": ["DeepseekV41ForCausalLM"],
            "model_type": "deepseek_v41",
            "torch_dtype": self.torch_dtype,
            "text_config": text,
        }


_REQUIRED_VALUES = {
    "num_key_value_heads": 1,
    "hidden_act": "silu",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "torch_dtype": "bfloat16",
}


def _fail(key: str, msg: str) -> None:
    raise ConfigError(f"config.json: text_config.{key} {msg}")


def validate(c: V41Config) -> None:
    """Reject what the runtime does not support; every message names the offending key."""
    for key, expected in _REQUIRED_VALUES.items():
        if getattr(c, key) != expected:
            _fail(key, f"= {getattr(c, key)!r} is not supported (must be {expected!r})")
    for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "head_dim",
                "q_lora_rank", "max_position_embeddings", "sliding_window", "index_n_heads",
                "index_head_dim", "index_block_size", "index_topk"):
        if not isinstance(getattr(c, key), int) or getattr(c, key) <= 0:
            _fail(key, f"= {getattr(c, key)!r} must be a positive integer")
    if c.head_dim % 32:
        _fail("head_dim", f"= {c.head_dim} must be a multiple of 32 (one ue8m0 scale per 32 values)")
    if c.index_head_dim % 32:
        _fail("index_head_dim", f"= {c.index_head_dim} must be a multiple of 32")
    if not (0 < c.qk_rope_head_dim < c.head_dim) or c.qk_rope_head_dim % 2:
        _fail("qk_rope_head_dim", f"= {c.qk_rope_head_dim} must be even and in (0, head_dim)")
    n = c.num_hidden_layers
    if len(c.compress_ratios) != n:
        _fail("compress_ratios", f"has {len(c.compress_ratios)} entries, expected num_hidden_layers = {n}")
    if any((not isinstance(r, int)) or r < 0 for r in c.compress_ratios):
        _fail("compress_ratios", f"= {list(c.compress_ratios)}: entries must be integers >= 0")
    ids = c.kv_source_layer_ids
    if list(ids) != sorted(set(ids)) or any(not 0 <= s < n for s in ids):
        _fail("kv_source_layer_ids", f"= {list(ids)} must be sorted, unique and in [0, {n})")
    if ids:
        for layer in range(ids[0], n):
            src = max(s for s in ids if s <= layer)
            r, rs = c.compress_ratios[layer], c.compress_ratios[src]
            if r > 0 and rs != r:
                _fail("kv_source_layer_ids", f": compressed layer {layer} (ratio {r}) maps to source "
                      f"{src} with ratio {rs}; a source must have the same ratio")
    if c.n_routed_experts < 0 or c.first_k_dense_replace < 0 or c.first_k_dense_replace > n:
        _fail("first_k_dense_replace", f"= {c.first_k_dense_replace} must lie in [0, {n}]")
    if c.first_k_dense_replace > 0 and c.intermediate_size <= 0:
        _fail("intermediate_size", "must be > 0 when first_k_dense_replace > 0")
    if c.first_k_dense_replace < n:
        if c.n_routed_experts <= 0 or c.moe_intermediate_size <= 0:
            _fail("n_routed_experts", "and moe_intermediate_size must be > 0 for MoE layers")
        if not 0 < c.num_experts_per_tok <= c.n_routed_experts:
            _fail("num_experts_per_tok", f"= {c.num_experts_per_tok} must lie in [1, n_routed_experts]")
        if c.n_shared_experts < 0:
            _fail("n_shared_experts", "must be >= 0")
    if c.engram_layer_ids:
        if any(not 0 <= l < n for l in c.engram_layer_ids):
            _fail("engram_layer_ids", f"= {list(c.engram_layer_ids)} must lie in [0, {n})")
        if c.engram_max_ngram_size < 2:
            _fail("engram_max_ngram_size", "must be >= 2")
        if c.engram_table_size <= 0 or c.engram_dim <= 0:
            _fail("engram_table_size", "and engram_dim must be > 0 when engram_layer_ids is set")
    if c.nextn < 0:
        _fail("nextn", "must be >= 0")
    if c.nextn > 0:
        if not c.dspark_target_layer_ids or any(not 0 <= l < n for l in c.dspark_target_layer_ids):
            _fail("dspark_target_layer_ids", f"= {list(c.dspark_target_layer_ids)} must be non-empty, in [0, {n})")
        if c.dspark_intermediate_size <= 0:
            _fail("dspark_intermediate_size", "must be > 0 when nextn > 0")
        if not 0 <= c.dspark_noise_token_id < c.vocab_size:
            _fail("dspark_noise_token_id", f"= {c.dspark_noise_token_id} outside the vocabulary")
        if c.dspark_markov_rank < 0 or c.dspark_confidence_temperature <= 0:
            _fail("dspark_markov_rank", "must be >= 0 (and dspark_confidence_temperature > 0)")
    for key in ("bos_token_id",):
        if not 0 <= getattr(c, key) < c.vocab_size:
            _fail(key, f"= {getattr(c, key)} outside the vocabulary")
    if any(not 0 <= e < c.vocab_size for e in c.eos_token_ids):
        _fail("eos_token_id", f"= {c.eos_token_id} outside the vocabulary")
