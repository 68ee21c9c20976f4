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
| ``kv_store`` | ``store_kv_fp8_tilelang``, ``quantize_kv_fp8_tilelang``, ``store_index_k_fp4_tilelang``, ``quantize_index_k_fp4_tilelang`` |
| ``indexer`` | ``indexer_scores_tilelang``, ``candidate_block_max_tilelang``, ``select_topk_blocks_tilelang``, ``indexer_topk_blocks_tilelang`` (fused) |
| ``moe`` | ``grouped_expert_gemm_tilelang``, ``routed_experts_tilelang`` |
"""

from __future__ import annotations

from deepinfer_kernels.tilelang._common import compile_times, is_available

__all__ = ["compile_times", "is_available"]
