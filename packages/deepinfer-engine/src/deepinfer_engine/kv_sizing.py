"""How many KV blocks the paged pool gets.

CPU: enough blocks for `max_num_seqs` full-length sequences, capped by `kv_cache_memory_bytes`
(default 1 GiB). CUDA: what `gpu_memory_utilization` leaves after the weights and a profiling
forward's activation peak (measured by the runner), capped the same way by need.
"""

from __future__ import annotations

import math

import torch

from deepinfer_engine.config import EngineConfig
from deepinfer_engine.errors import ModelDoesNotFitError

DEFAULT_CPU_KV_BYTES = 1 << 30


def blocks_needed(config: EngineConfig, max_model_len: int) -> int:
    """Blocks for every sequence at full length (+1 block of headroom per sequence for speculation)."""
    per_seq = math.ceil(max_model_len / config.block_size) + 1
    return config.max_num_seqs * per_seq


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
            f"MiB). Lower max_model_len or raise gpu_memory_utilization / kv_cache_memory_bytes.")
    return blocks
