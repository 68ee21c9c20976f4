"""Capacity helpers: bytes per token per cache format, SWA state per sequence, parameter counts.

Parameter accounting (analytic, from the config alone, so `flash` never has to be built):
- `total`: every parameter; `engram`: the Engram n-gram tables (conditional memory, looked up,
  not multiplied); `dspark`: the draft block; `backbone = total - engram - dspark`.
- Active per token: weights that multiply the token's activations in one forward, embeddings and
  lm_head excluded (a row lookup; logits are produced for few rows), routed experts counted
  `num_experts_per_tok` times, Engram tables counted by the rows looked up.
  `active_prefill`: encoder layers + consumer-side compressors (YOCO prefill);
  `active_decode`: every backbone layer.
"""

from __future__ import annotations

from dataclasses import dataclass

from deepinfer_kernels.ops.kv_fp4 import fp4_record_bytes
from deepinfer_kernels.ops.kv_fp8 import fp8_record_bytes


def kv_record_bytes(cfg) -> int:
    """The main/SWA KV record per token per layer: D e4m3 + D/32 ue8m0 (528 B for D = 512)."""
    return fp8_record_bytes(cfg.head_dim)


def index_record_bytes(cfg) -> int:
    """FP4 indexer key per compressed entry: Di/2 + Di/32 (68 B for Di = 128)."""
    return fp4_record_bytes(cfg.index_head_dim)


def kv_bytes_per_token(cfg) -> dict[str, float]:
    """Cache bytes one token adds, per format and summed over layers."""
    topo, rec, idx = cfg.topology, kv_record_bytes(cfg), index_record_bytes(cfg)
    compressed = sum((rec + idx) / cfg.compress_ratios[s] for s in topo.compressed_sources)
    return {
        "main_record": rec,                                   # one layer's window KV record
        "index_record": idx,
        "window_all_layers": rec * cfg.num_hidden_layers,     # paged window planes (full length)
        "global_compressed": compressed,                      # compressed entries + index keys, all sources
    }


def swa_state_bytes_per_sequence(cfg, backtracking_tokens: int | None = None) -> int:
    """Host SWA slot of one sequence (SPEC §5): encoder layers x (W + backtracking) x record.
    Backtracking defaults to nextn + 1 (flash: 20 x (128 + 6) x 528 = 1,415,040 B)."""
    back = cfg.nextn + 1 if backtracking_tokens is None else backtracking_tokens
    return cfg.topology.num_encoder_layers * (cfg.sliding_window + back) * kv_record_bytes(cfg)


@dataclass(frozen=True)
class ParamCounts:
    total: int
    backbone: int
    engram: int            # Engram tables
    dspark: int
    embedding: int         # embed_tokens + lm_head (untied)
    active_prefill: int
    active_decode: int


def _swiglu(h: int, i: int) -> int:
    return 3 * h * i


def _attention(cfg, layer: int) -> tuple[int, int]:
    """-> (all attention params of the layer, the compressor part)."""
    h, d, qr, dc = cfg.hidden_size, cfg.head_dim, cfg.q_lora_rank, cfg.kv_lora_rank
    n = h * qr + qr + qr * cfg.num_attention_heads * d + h * d + dc + cfg.num_attention_heads * d * h
    r = cfg.compress_ratios[layer] if layer < cfg.num_hidden_layers else 0
    comp = 0
    if r > 0:
        n += qr * cfg.index_n_heads * cfg.index_head_dim + h * cfg.index_n_heads
        if cfg.topology.is_source(layer):
            comp = h * d + h * cfg.index_head_dim + h + r + dc
    return n + comp, comp


def _ffn(cfg, layer: int) -> tuple[int, int]:
    """-> (all FFN params, active FFN params per token)."""
    h = cfg.hidden_size
    if layer < cfg.first_k_dense_replace:
        n = _swiglu(h, cfg.intermediate_size)
        return n, n
    e, i = cfg.n_routed_experts, cfg.moe_intermediate_size
    shared = _swiglu(h, cfg.n_shared_experts * i)
    router = e * h + e
    return router + shared + e * _swiglu(h, i), router + shared + cfg.num_experts_per_tok * _swiglu(h, i)


def _engram(cfg, layer: int) -> tuple[int, int, int]:
    """-> (table params, other params, active params)."""
    if layer not in cfg.engram_layer_ids:
        return 0, 0, 0
    k = cfg.engram_max_ngram_size - 1
    tables = k * cfg.engram_table_size * cfg.engram_dim
    other = k * cfg.engram_dim * cfg.hidden_size + cfg.hidden_size + cfg.hidden_size
    return tables, other, other + k * cfg.engram_dim


def param_counts(cfg) -> ParamCounts:
    topo, h = cfg.topology, cfg.hidden_size
    total = engram = act_pre = act_dec = 0
    for l in range(cfg.num_hidden_layers):
        attn, comp = _attention(cfg, l)
        ffn, ffn_act = _ffn(cfg, l)
        tables, eng_other, eng_act = _engram(cfg, l)
        layer_total = 2 * h + attn + ffn + tables + eng_other
        layer_act = 2 * h + attn + ffn_act + eng_act
        total += layer_total
        engram += tables
        act_dec += layer_act
        act_pre += layer_act if not topo.is_consumer(l) else comp
    embedding = cfg.vocab_size * h * (1 if cfg.tie_word_embeddings else 2)
    total += embedding + h
    dspark = 0
    if cfg.nextn > 0:
        per_layer = 2 * h + _attention(cfg, cfg.num_hidden_layers)[0] + _swiglu(h, cfg.dspark_intermediate_size)
        dspark = (len(cfg.dspark_target_layer_ids) * h * h + h + cfg.nextn * per_layer + h
                  + 2 * cfg.vocab_size * cfg.dspark_markov_rank + h + cfg.dspark_markov_rank)
    total += dspark
    return ParamCounts(total=total, backbone=total - engram - dspark, engram=engram, dspark=dspark,
                       embedding=embedding, active_prefill=act_pre, active_decode=act_dec)


# ---------------------------------------------------------------------------------------------
# KV footprint of a cache layout: bytes per token of context + fixed bytes per running sequence
#
#   bytes(context T, S sequences) = T * per_token + S * per_sequence
#
# SPEC's layout (§1 KV record, §5 SWA slot): a token adds only its compressed entries (FP8 record
# and FP4 index key of every compressed source, at 1/r of the tokens); the window is a ring of
# W + backtracking positions per sequence and layer, the compressor stage a ring of the last
# incomplete entry's token terms. `paged_kv_footprint` is the engine path's layout as allocated
# (paged_cache.py): every plane keeps every position.

H200_HBM_BYTES = 143_771 * 2**20   # one H200 as nvidia-smi reports it (141 GB)


@dataclass(frozen=True)
class KVFootprint:
    per_token: dict[str, float]    # kind -> bytes each token of context adds
    per_sequence: dict[str, int]   # kind -> fixed bytes each running sequence holds

    @property
    def bytes_per_token(self) -> float:
        return sum(self.per_token.values())

    @property
    def bytes_per_sequence(self) -> int:
        return sum(self.per_sequence.values())

    def bytes_for(self, num_tokens: int, num_seqs: int = 1) -> float:
        return num_tokens * self.bytes_per_token + num_seqs * self.bytes_per_sequence


def _stage_width(cfg) -> int:
    """Compressor token terms per position: latent c (D) + index key ik (Di) + gate g (1)."""
    return cfg.head_dim + cfg.index_head_dim + 1


def spec_kv_footprint(cfg, backtracking_tokens: int | None = None, stage_bytes: int = 4) -> KVFootprint:
    """SPEC's layout at `cfg`'s widths. Per token: compressed FP8 entries and FP4 index keys of each
    source at 1/r (flash: 596 + 2 x 596 / 4 = 894 B, SPEC "~890"). Per sequence: a window ring of
    W + backtracking (nextn + 1) records for every backbone and DFlash layer, and a stage ring of
    r - 1 + backtracking token terms (float, `stage_bytes` each) for every source with r > 1."""
    back = cfg.nextn + 1 if backtracking_tokens is None else backtracking_tokens
    topo, rec, idx = cfg.topology, kv_record_bytes(cfg), index_record_bytes(cfg)
    sources = topo.compressed_sources
    ring = cfg.sliding_window + back
    staged = [s for s in sources if cfg.compress_ratios[s] > 1]
    return KVFootprint(
        per_token={"compressed": sum(rec / cfg.compress_ratios[s] for s in sources),
                   "index_k": sum(idx / cfg.compress_ratios[s] for s in sources)},
        per_sequence={"window": (cfg.num_hidden_layers + cfg.nextn) * ring * rec,
                      "comp_stage": sum((cfg.compress_ratios[s] - 1 + back) * _stage_width(cfg) * stage_bytes
                                        for s in staged)})


def paged_kv_footprint(cfg, stage_bytes: int = 4) -> KVFootprint:
    """The engine path's paged layout (paged_cache.py) as allocated: per token a window record of
    every backbone and DFlash layer, the compressed and index planes at 1/r, the float compressor
    stage, the Engram id; nothing per sequence. (Before the compressed planes took 1/r, they and the
    index planes kept every position: flash 30,680 B/token with a float32 stage, 28,116 with bf16.)"""
    topo, rec, idx = cfg.topology, kv_record_bytes(cfg), index_record_bytes(cfg)
    sources = topo.compressed_sources
    staged = [s for s in sources if cfg.compress_ratios[s] > 1]
    return KVFootprint(
        per_token={"window": (cfg.num_hidden_layers + cfg.nextn) * rec,
                   "compressed": sum(rec / cfg.compress_ratios[s] for s in sources),
                   "index_k": sum(idx / cfg.compress_ratios[s] for s in sources),
                   "comp_stage": len(staged) * _stage_width(cfg) * stage_bytes, "engram_ids": 4},
        per_sequence={})


def weight_bytes(cfg, bytes_per_param: int = 2) -> int:
    """Parameter bytes (bf16 by default), every parameter resident."""
    return param_counts(cfg).total * bytes_per_param


def max_context_tokens(cfg, footprint: KVFootprint, hbm_bytes: int = H200_HBM_BYTES,
                       memory_utilization: float = 0.90, reserved_bytes: int = 0) -> int:
    """Longest context of one sequence whose KV fits: (utilization x HBM - weights - reserved
    (activations) - one sequence's fixed bytes) / bytes per token; 0 when the weights do not fit."""
    left = int(hbm_bytes * memory_utilization) - weight_bytes(cfg) - reserved_bytes - footprint.bytes_per_sequence
    return max(0, int(left // footprint.bytes_per_token))
