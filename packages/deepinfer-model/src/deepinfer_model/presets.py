"""Named configs: `tiny` (CPU tests), `default` (the embedded default model), `mini` (GPU benchmarks), `flash` (the reference dims; capacity
math only, never built whole), `flash-slice` (full width, a few layers, one H200).

The unpublished `flash` widths are chosen so that the parameter counts land on SPEC's totals;
the derivation is in the package README (and `capacity.param_counts` recomputes it).
"""

from __future__ import annotations

from deepinfer_model.config import V41Config


def tiny() -> V41Config:
    """7 layers: window-only, ratio-4 source + sharer, ratio-1 n_prefill_layer, then YOCO consumers
    (window-only, ratio-2 source + sharer). Engram on one encoder and one consumer layer; DSpark
    nextn 5. Window 16 so short prompts exercise windowing and the compressed background."""
    return V41Config(
        vocab_size=8192, hidden_size=64, num_hidden_layers=7, num_attention_heads=4,
        head_dim=64, qk_rope_head_dim=16, q_lora_rank=32, max_position_embeddings=4096,
        sliding_window=16, compress_ratios=(0, 4, 4, 1, 0, 2, 2), kv_source_layer_ids=(1, 3, 5),
        index_n_heads=2, index_head_dim=32, index_block_size=2, index_topk=2,
        n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, moe_intermediate_size=32,
        routed_scaling_factor=1.5, norm_topk_prob=True, first_k_dense_replace=1, intermediate_size=96,
        engram_layer_ids=(1, 5), engram_max_ngram_size=3, engram_table_size=512, engram_dim=16,
        nextn=5, dspark_noise_token_id=3, dspark_target_layer_ids=(1, 3, 6), dspark_markov_rank=8,
        dspark_confidence_temperature=1.0, dspark_intermediate_size=64,
        bos_token_id=1, eos_token_id=2,
    )


def default() -> V41Config:
    """The embedded default model (trained by tools/train_default_model.py): the `tiny` layout
    (same ratios, sources, YOCO split, Engram layers, DSpark nextn 5 with Markov + confidence
    heads) at hidden 192, 8 + 1 experts (top-2, width 48), window 32 (<= the engine tests' smallest
    prefill budget), tied embeddings (5.77M parameters, 11.0 MiB in bf16). Token ids follow the
    shipped tokenizer: <|bos|> 1, <|eos|> 2, <|noise|> 6 (the DSpark noise token)."""
    return tiny().replace(  # the layout and token ids stay tiny's; widths and the noise id change
        hidden_size=192, q_lora_rank=64, sliding_window=32,
        index_n_heads=4, index_block_size=4, index_topk=8, moe_intermediate_size=48,
        routed_scaling_factor=1.0, intermediate_size=512, engram_table_size=2048, engram_dim=32,
        dspark_noise_token_id=6, dspark_markov_rank=16, dspark_intermediate_size=192,
        tie_word_embeddings=True,
    )


def mini() -> V41Config:
    """GPU benchmark size: flash's layer layout (head_dim 512 = KV latent 448 + RoPE 64, window 128,
    indexer heads of 128, top-6 + 1 shared experts, DSpark nextn 5) at hidden 1024, 16 layers
    (8 encoder + 8 consumer), 16 heads, 64 routed experts of width 512, vocab 32000."""
    ratios = (0, 4, 0, 4, 4, 0, 4, 1) + (0, 4, 4, 0, 4, 4, 0, 4)
    return flash().replace(  # flash's heads, routing, window and Engram n-grams; widths and depth change
        vocab_size=32000, hidden_size=1024, num_hidden_layers=16, num_attention_heads=16, q_lora_rank=384,
        max_position_embeddings=65536, compress_ratios=ratios, kv_source_layer_ids=(1, 7, 9),
        index_n_heads=8, index_block_size=16, index_topk=16, n_routed_experts=64, moe_intermediate_size=512,
        first_k_dense_replace=1, intermediate_size=2816, engram_layer_ids=(1, 9), engram_table_size=65536,
        engram_dim=128, dspark_target_layer_ids=(3, 7, 15), dspark_markov_rank=64,
        dspark_intermediate_size=2816, bos_token_id=1, eos_token_id=2,
    )


FLASH_RATIOS = (0, 0) + (4,) * 17 + (1,) + (4,) * 20   # 20 encoder layers (19 has ratio 1) + 20 consumers


def flash() -> V41Config:
    """The reference dims (40 layers 20 + 20, 384 + 1 experts top-6, window 128, head_dim 512).
    Widths derived in README.md: hidden 3072, 64 heads, q_lora_rank 1024, expert width 3840,
    Engram 2 layers x 2 tables x 48M rows x 1024 (= 196.6B)."""
    return V41Config(
        vocab_size=129280, hidden_size=3072, num_hidden_layers=40, num_attention_heads=64,
        head_dim=512, qk_rope_head_dim=64, q_lora_rank=1024, max_position_embeddings=1048576,
        sliding_window=128, compress_ratios=FLASH_RATIOS, kv_source_layer_ids=(2, 19, 20),
        index_n_heads=64, index_head_dim=128, index_block_size=64, index_topk=32,
        n_routed_experts=384, n_shared_experts=1, num_experts_per_tok=6, moe_intermediate_size=3840,
        routed_scaling_factor=2.5, norm_topk_prob=True, first_k_dense_replace=0, intermediate_size=0,
        engram_layer_ids=(1, 20), engram_max_ngram_size=3, engram_table_size=48_000_000, engram_dim=1024,
        nextn=5, dspark_noise_token_id=3, dspark_target_layer_ids=(9, 19, 39), dspark_markov_rank=256,
        dspark_intermediate_size=8192, bos_token_id=0, eos_token_id=1,
    )


def flash_slice(num_layers: int = 4) -> V41Config:
    """Full flash width with a few layers for per-layer measurements on one H200: window-only,
    ratio-4 source, ratio-1 n_prefill_layer, one ratio-4 consumer source. To fit 141 GB the
    window-only layer gets a dense SwiGLU of the MoE's active width (7 x 3840) and the Engram
    tables shrink to 1M rows (4 layers: ~46B params, ~91 GB in bf16)."""
    ratios = (0, 4, 1, 4, 4, 4, 4, 4)[:num_layers]
    if num_layers < 4:
        raise ValueError("flash_slice: num_layers must be >= 4 (window, compressed, n_prefill, consumer)")
    base = flash()
    return base.replace(
        num_hidden_layers=num_layers, compress_ratios=ratios, kv_source_layer_ids=(1, 2, 3),
        engram_layer_ids=(1,), engram_table_size=1_000_000, dspark_target_layer_ids=(1, num_layers - 1),
        first_k_dense_replace=1, intermediate_size=7 * base.moe_intermediate_size)


PRESETS = {"tiny": tiny, "default": default, "mini": mini, "flash": flash, "flash-slice": flash_slice}


def get_preset(name: str) -> V41Config:
    try:
        return PRESETS[name]()
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; choose from {sorted(PRESETS)}") from None
