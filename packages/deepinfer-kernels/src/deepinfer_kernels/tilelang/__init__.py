"""TileLang CUDA kernels for SM90 (H100/H200, compiled for ``sm_90a``).

Every module here imports TileLang lazily (inside the kernel builders), so
``import deepinfer_kernels.tilelang`` works on CPU-only machines without TileLang. Each op has a
launcher ``<op>_tilelang`` taking the same arguments as the torch reference ``<op>_ref`` in
``deepinfer_kernels.ops`` and returning the same thing; kernels are compiled once per shape
bucket (the static dims: heads, head dim, ...) and cached for the process
(:func:`compile_times` reports what was compiled and how long it took).

| module | launchers |
| --- | --- |
| ``sparse_mla`` | ``sparse_mla_attention_tilelang`` |
| ``kv_store`` | ``store_kv_fp8_tilelang``, ``store_normed_kv_fp8_tilelang``, ``quantize_kv_fp8_tilelang``, ``store_index_k_fp4_tilelang``, ``quantize_index_k_fp4_tilelang`` |
| ``indexer`` | ``indexer_scores_tilelang``, ``candidate_block_max_tilelang``, ``select_topk_blocks_tilelang``, ``indexer_topk_blocks_tilelang`` (the three fused) |
| ``moe`` | ``grouped_expert_gemm_tilelang``, ``routed_experts_tilelang``, ``routed_experts_prefill_tilelang`` |
| ``norm`` | ``rms_norm_tilelang``, ``add_rms_norm_tilelang`` |
| ``activation`` | ``silu_mul_tilelang`` |
| ``moe_route`` | ``moe_route_tilelang`` |
| ``matvec`` | ``matvec_tilelang`` (the one-row ``linear``), ``rms_norm_matvec_tilelang`` (``rms_norm_linear``: the norm in its prologue) |
| ``shared_keys`` | ``shared_key_lists_tilelang`` (row pairs' union key lists for the grouped sparse MLA) |
"""

from __future__ import annotations

import importlib

from deepinfer_kernels.tilelang._common import compile_times, is_available

# reference op name -> "module:launcher"; every launcher takes the reference's arguments.
LAUNCHERS = {
    "sparse_mla_attention": "sparse_mla:sparse_mla_attention_tilelang",
    "store_kv_fp8": "kv_store:store_kv_fp8_tilelang",
    "store_normed_kv_fp8": "kv_store:store_normed_kv_fp8_tilelang",
    "quantize_kv_fp8": "kv_store:quantize_kv_fp8_tilelang",
    "store_index_k_fp4": "kv_store:store_index_k_fp4_tilelang",
    "quantize_index_k_fp4": "kv_store:quantize_index_k_fp4_tilelang",
    "indexer_scores": "indexer:indexer_scores_tilelang",
    "candidate_block_max": "indexer:candidate_block_max_tilelang",
    "select_topk_blocks": "indexer:select_topk_blocks_tilelang",
    "indexer_topk_blocks": "indexer:indexer_topk_blocks_tilelang",
    "grouped_expert_gemm": "moe:grouped_expert_gemm_tilelang",
    "routed_experts": "moe:routed_experts_tilelang",
    "routed_experts_prefill": "moe:routed_experts_prefill_tilelang",
    "rms_norm": "norm:rms_norm_tilelang",
    "add_rms_norm": "norm:add_rms_norm_tilelang",
    "silu_mul": "activation:silu_mul_tilelang",
    "moe_route": "moe_route:moe_route_tilelang",
    "attention_indices": "attention_indices:attention_indices_tilelang",
    "rope_inplace": "rope:rope_inplace_tilelang",
    "paged_slots": "paged_slots:paged_slots_tilelang",
    "window_slots": "paged_slots:window_slots_tilelang",
    "far_entry_slots": "paged_slots:far_entry_slots_tilelang",
    "paged_ngram_buckets": "engram:paged_ngram_buckets_tilelang",
    "write_rows": "write_rows:write_rows_tilelang",
    "greedy_pick": "greedy:greedy_pick_tilelang",
    "linear": "matvec:matvec_tilelang",
    "rms_norm_linear": "matvec:rms_norm_matvec_tilelang",
    "shared_key_lists": "shared_keys:shared_key_lists_tilelang",
}


def get_launcher(op_name: str):
    """The ``<op>_tilelang`` launcher of a reference op (imports its module, not TileLang)."""
    module, fn = LAUNCHERS[op_name].split(":")
    return getattr(importlib.import_module(f"deepinfer_kernels.tilelang.{module}"), fn)


__all__ = ["LAUNCHERS", "compile_times", "get_launcher", "is_available"]
