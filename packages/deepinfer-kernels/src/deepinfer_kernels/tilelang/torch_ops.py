"""The TileLang launchers as torch custom ops (`torch.ops.deepinfer.*`), for `torch.compile`.

Dynamo cannot trace into a TileLang launch (a TVM FFI call). Registered as custom ops with fake
(shape-only) implementations, the kernels enter a compiled graph as opaque nodes that inductor
schedules around, and stay capturable in CUDA graphs. `platform.tilelang_launcher` hands out these
wrappers while dynamo traces and the plain launchers otherwise (a custom-op call costs a few
microseconds of dispatch in eager mode).

The default implementation is the TileLang launcher (CUDA); the CPU implementation is the torch
reference, registered by the op's module in ``deepinfer_kernels.ops`` (``register_cpu_reference``:
ops import the kernels, never the reverse), so the registration and the compiled-graph plumbing
(mutated pool views included) are tested on the CPU.
"""

from __future__ import annotations

import torch

from deepinfer_kernels.tilelang import get_launcher


@torch.library.custom_op("deepinfer::sparse_mla_attention", mutates_args=())
def sparse_mla_attention(q: torch.Tensor, kv_pool: torch.Tensor, indices: torch.Tensor, sm_scale: float,
                         variant: str, shared_keys: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    out, lse = get_launcher("sparse_mla_attention")(q, kv_pool, indices, sm_scale, variant=variant,
                                                    shared_keys=shared_keys)
    return out.contiguous(), lse.contiguous()


@sparse_mla_attention.register_fake
def _(q, kv_pool, indices, sm_scale, variant, shared_keys=False):
    return torch.empty_like(q), q.new_empty(q.shape[:2], dtype=torch.float32)


def _paged_store_op(name: str):
    """The custom op of a paged quantized store: row i of x [n, D] quantized into
    pool[slot_mapping[i]] (uint8 [slots, record_bytes]), in place; returns nothing."""

    @torch.library.custom_op(f"deepinfer::{name}", mutates_args=("pool",))
    def store(x: torch.Tensor, pool: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        get_launcher(name)(x, pool, slot_mapping)

    @store.register_fake
    def _(x, pool, slot_mapping):
        return None

    return store


store_kv_fp8 = _paged_store_op("store_kv_fp8")
store_index_k_fp4 = _paged_store_op("store_index_k_fp4")


@torch.library.custom_op("deepinfer::indexer_scores", mutates_args=())
def indexer_scores(q: torch.Tensor, weights: torch.Tensor, k_pool: torch.Tensor,
                   indices: torch.Tensor) -> torch.Tensor:
    return get_launcher("indexer_scores")(q, weights, k_pool, indices).contiguous()


@indexer_scores.register_fake
def _(q, weights, k_pool, indices):
    return q.new_empty(indices.shape, dtype=torch.float32)


@torch.library.custom_op("deepinfer::indexer_topk_blocks", mutates_args=())
def indexer_topk_blocks(q: torch.Tensor, weights: torch.Tensor, k_pool: torch.Tensor, indices: torch.Tensor,
                        valid_lens: torch.Tensor, block_size: int, topk: int, weight_scale: float = 1.0) -> torch.Tensor:
    return get_launcher("indexer_topk_blocks")(q, weights, k_pool, indices, valid_lens, block_size, topk,
                                               weight_scale).contiguous()


@indexer_topk_blocks.register_fake
def _(q, weights, k_pool, indices, valid_lens, block_size, topk, weight_scale=1.0):
    return q.new_empty((q.shape[0], topk), dtype=torch.int32)


@torch.library.custom_op("deepinfer::routed_experts", mutates_args=())
def routed_experts(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, w13: torch.Tensor,
                   w2: torch.Tensor) -> torch.Tensor:
    return get_launcher("routed_experts")(x, weights, ids, w13, w2).contiguous()


@routed_experts.register_fake
def _(x, weights, ids, w13, w2):
    return torch.empty_like(x)


def _sparse_mla_launcher(q, kv_pool, indices, sm_scale, variant="auto", shared_keys=False):
    return sparse_mla_attention(q, kv_pool, indices, float(sm_scale), variant, bool(shared_keys))


CUSTOM_OPS = {"sparse_mla_attention": sparse_mla_attention, "store_kv_fp8": store_kv_fp8,
              "store_index_k_fp4": store_index_k_fp4, "indexer_scores": indexer_scores,
              "indexer_topk_blocks": indexer_topk_blocks, "routed_experts": routed_experts}


def register_cpu_reference(op_name: str):
    """Decorator: ``fn`` (the custom op's signature, calling the torch reference) is the op's CPU
    implementation."""
    return CUSTOM_OPS[op_name].register_kernel("cpu")


# reference op name -> a callable with the launcher's signature that goes through the custom op
COMPILED_LAUNCHERS = {
    "sparse_mla_attention": _sparse_mla_launcher,
    "store_kv_fp8": store_kv_fp8,
    "store_index_k_fp4": store_index_k_fp4,
    "indexer_scores": indexer_scores,
    "indexer_topk_blocks": indexer_topk_blocks,
    "routed_experts": routed_experts,
}
