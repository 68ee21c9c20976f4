"""How many KV blocks the paged pool gets.

CPU: enough blocks for `max_num_seqs` full-length sequences, capped by `kv_cache_memory_bytes`
(default 1 GiB). CUDA: what `gpu_memory_utilization` leaves after the weights and a profiling
forward's activation peak (`profile_activation_bytes`: the largest prefill step the scheduler can
emit, `max_num_batched_tokens` rows of whole `max_model_len` prompts, run once over a throwaway
pool before the real one is allocated), capped the same way by need. With window rings
(`window_kv="ring"`) the budget first pays the rings' fixed bytes (`max_num_seqs` state slots of
W + nextn + 1 window rows per layer, the stage rings, a step's scratch rows); the blocks then hold
only what grows with the tokens (compressed entries, index keys, Engram ids: SPEC's ~894 B/token).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from deepinfer_engine.config import EngineConfig, ResolvedEngineConfig
from deepinfer_engine.errors import ModelDoesNotFitError
from deepinfer_model.metadata import ForwardMetadata

DEFAULT_CPU_KV_BYTES = 1 << 30


def blocks_needed(config: EngineConfig | ResolvedEngineConfig, max_model_len: int) -> int:
    """Blocks for every sequence at full length (+1 block of headroom per sequence for speculation)."""
    per_seq = math.ceil(max_model_len / config.block_size) + 1
    return config.max_num_seqs * per_seq


def profile_prefill_metadata(tokens: int, max_len: int, block_size: int, device) -> ForwardMetadata:
    """The largest prefill step: `tokens` rows as whole prompts of `max_len` rows (the last one
    shorter), each prompt one last chunk starting at position 0, blocks numbered in order. The
    longest prompts give the widest far-entry candidates."""
    lens = [max_len] * (tokens // max_len) + ([tokens % max_len] if tokens % max_len else [])
    per_req = -(-max(lens) // block_size)
    starts = np.cumsum([0] + lens[:-1])
    positions = np.concatenate([np.arange(n) for n in lens])
    req = np.repeat(np.arange(len(lens)), lens)
    tables = np.arange(len(lens) * per_req).reshape(len(lens), per_req)
    slots = tables[req, positions // block_size] * block_size + positions % block_size

    def t(a, dtype):
        return torch.as_tensor(np.asarray(a), dtype=dtype, device=device)
    return ForwardMetadata(
        input_ids=torch.zeros(tokens, dtype=torch.int64, device=device), positions=t(positions, torch.int64),
        seqlens_q=t(lens, torch.int32), first_token_pos=t(starts, torch.int32), context_lens=t(lens, torch.int32),
        block_tables=t(tables, torch.int32), slot_mapping=t(slots, torch.int64), block_size=block_size,
        is_prefill=True, is_last_chunk=torch.ones(len(lens), dtype=torch.bool, device=device),
        logit_rows=t(starts + np.asarray(lens) - 1, torch.int64))


def profile_activation_bytes(model, block_size: int, tokens: int, max_len: int) -> int:
    """Bytes a prefill step of `tokens` rows (prompts of at most `max_len`) allocates beyond the
    weights and its KV pool: the forward (and the DFlash main keys) over a throwaway pool of just
    enough blocks. CUDA: the allocator's peak; other devices: 0 (the forward still runs: same path)."""
    meta = profile_prefill_metadata(tokens, max_len, block_size, model.device)
    cache = model.allocate_kv_cache(int(meta.block_tables.numel()), block_size)
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


def num_kv_blocks(model, config: EngineConfig | ResolvedEngineConfig, max_model_len: int,
                  activation_peak_bytes: int = 0, ring=None) -> int:
    """`ring` (a WindowRing): the rings' fixed bytes come off the budget, blocks are ring-layout blocks."""
    if config.num_kv_blocks is not None:
        return config.num_kv_blocks
    if ring is None:
        bytes_per_block, fixed = model.kv_cache_bytes_per_block(config.block_size), 0
    else:
        bytes_per_block = model.kv_cache_bytes_per_block(config.block_size, ring)
        fixed = model.kv_cache_fixed_bytes(ring)
    if model.device.type == "cuda":
        free, total = torch.cuda.mem_get_info(model.device)
        used_by_others = total - free
        budget = int(total * config.gpu_memory_utilization) - used_by_others - activation_peak_bytes - fixed
    else:
        budget = (config.kv_cache_memory_bytes or DEFAULT_CPU_KV_BYTES) - fixed
    blocks = min(blocks_needed(config, max_model_len), budget // max(1, bytes_per_block))
    one_sequence = math.ceil(max_model_len / config.block_size) + 1
    if blocks < one_sequence:
        raise ModelDoesNotFitError(
            f"KV cache: {max(budget, 0) / 2**20:.0f} MiB left for KV blocks of {bytes_per_block} B; one sequence of "
            f"max_model_len={max_model_len} needs {one_sequence} blocks ({one_sequence * bytes_per_block / 2**20:.0f} "
            f"MiB) after {activation_peak_bytes / 2**20:.0f} MiB reserved for a prefill step's activations "
            f"(and {fixed / 2**20:.0f} MiB of window rings). Lower "
            "max_model_len or max_num_batched_tokens, or raise gpu_memory_utilization / kv_cache_memory_bytes.")
    return blocks
