"""How many KV blocks the paged pool gets.

CPU: enough blocks for `max_num_seqs` full-length sequences, capped by `kv_cache_memory_bytes`
(default 1 GiB). CUDA: what `gpu_memory_utilization` leaves after the weights and a profiling
forward's activation peak (`profile_activation_bytes`: the largest prefill step the scheduler can
emit, one request of `max_num_batched_tokens` rows, run once over a throwaway pool before the real
one is allocated), capped the same way by need.
"""

from __future__ import annotations

import math

import torch

from deepinfer_engine.config import EngineConfig
from deepinfer_engine.errors import ModelDoesNotFitError
from deepinfer_model.metadata import ForwardMetadata

DEFAULT_CPU_KV_BYTES = 1 << 30


def blocks_needed(config: EngineConfig, max_model_len: int) -> int:
    """Blocks for every sequence at full length (+1 block of headroom per sequence for speculation)."""
    per_seq = math.ceil(max_model_len / config.block_size) + 1
    return config.max_num_seqs * per_seq


def profile_prefill_metadata(tokens: int, block_size: int, device) -> ForwardMetadata:
    """One request whose whole prompt of `tokens` rows is one (last) prefill chunk, in blocks
    0, 1, ...: the step with the most rows and the widest far-entry candidates."""
    nblocks = -(-tokens // block_size)
    i32, i64 = dict(dtype=torch.int32, device=device), dict(dtype=torch.int64, device=device)
    return ForwardMetadata(
        input_ids=torch.zeros(tokens, **i64), positions=torch.arange(tokens, **i64),
        seqlens_q=torch.tensor([tokens], **i32), first_token_pos=torch.zeros(1, **i32),
        context_lens=torch.tensor([tokens], **i32), block_tables=torch.arange(nblocks, **i32).unsqueeze(0),
        slot_mapping=torch.arange(tokens, **i64), block_size=block_size, is_prefill=True,
        is_last_chunk=torch.ones(1, dtype=torch.bool, device=device), logit_rows=torch.tensor([tokens - 1], **i64))


def profile_activation_bytes(model, block_size: int, tokens: int) -> int:
    """Bytes a prefill step of `tokens` rows allocates beyond the weights and its KV pool: the
    forward (and the DFlash main keys) over a throwaway pool of just enough blocks. CUDA: the
    allocator's peak; other devices: 0 (the forward still runs: same code path)."""
    meta = profile_prefill_metadata(tokens, block_size, model.device)
    cache = model.allocate_kv_cache(-(-tokens // block_size), block_size)
    cuda = model.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(model.device)
        torch.cuda.reset_peak_memory_stats(model.device)
        base = torch.cuda.memory_allocated(model.device)
    meta.return_dspark_features = model.model.dspark is not None
    out = model.forward(meta, cache)
    if meta.return_dspark_features:
        model.dspark_write_main_keys(meta, out, cache)
    peak = 0
    if cuda:
        torch.cuda.synchronize(model.device)
        peak = torch.cuda.max_memory_allocated(model.device) - base
    del out, cache
    if cuda:
        torch.cuda.empty_cache()
    return peak


def num_kv_blocks(model, config: EngineConfig, max_model_len: int, activation_peak_bytes: int = 0) -> int:
    if config.num_kv_blocks is not None:
        return config.num_kv_blocks
    bytes_per_block = model.kv_cache_bytes_per_block(config.block_size)
    if model.device.type == "cuda":
        free, total = torch.cuda.mem_get_info(model.device)
        used_by_others = total - free
        budget = int(total * config.gpu_memory_utilization) - used_by_others - activation_peak_bytes
    else:
        budget = config.kv_cache_memory_bytes or DEFAULT_CPU_KV_BYTES
    blocks = min(blocks_needed(config, max_model_len), budget // max(1, bytes_per_block))
    one_sequence = math.ceil(max_model_len / config.block_size) + 1
    if blocks < one_sequence:
        raise ModelDoesNotFitError(
            f"KV cache: {max(budget, 0) / 2**20:.0f} MiB left for KV blocks of {bytes_per_block} B; one sequence of "
            f"max_model_len={max_model_len} needs {one_sequence} blocks ({one_sequence * bytes_per_block / 2**20:.0f} "
            f"MiB) after {activation_peak_bytes / 2**20:.0f} MiB reserved for a prefill step's activations. Lower "
            "max_model_len or max_num_batched_tokens, or raise gpu_memory_utilization / kv_cache_memory_bytes.")
    return blocks
