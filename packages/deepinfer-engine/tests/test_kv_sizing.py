"""KV pool sizing (kv_sizing.py): blocks from the memory budget, capped by need; on CUDA the budget
is what gpu_memory_utilization leaves after the weights and a profiling prefill's activations."""

import copy

import pytest
import torch

from deepinfer_engine.config import EngineConfig
from deepinfer_engine.errors import ModelDoesNotFitError
from deepinfer_engine.kv_sizing import (
    blocks_needed,
    num_kv_blocks,
    profile_activation_bytes,
    profile_prefill_metadata,
)
from deepinfer_model.testing import tiny_model


class _FakeCudaModel:
    device = torch.device("cuda")

    def kv_cache_bytes_per_block(self, block_size: int) -> int:
        return 1 << 20                                              # 1 MiB per block


def test_cpu_pool_is_capped_by_need_and_by_the_byte_budget():
    model = tiny_model()
    per_block = model.kv_cache_bytes_per_block(16)
    cfg = EngineConfig(block_size=16, max_num_seqs=4)
    assert num_kv_blocks(model, cfg, 256) == blocks_needed(cfg, 256) == 4 * (256 // 16 + 1)
    small = EngineConfig(block_size=16, max_num_seqs=4, kv_cache_memory_bytes=20 * per_block)
    assert num_kv_blocks(model, small, 256) == 20
    with pytest.raises(ModelDoesNotFitError, match="max_model_len=1024"):
        num_kv_blocks(model, small, 1024)                         # one sequence needs 65 blocks


def test_cuda_budget_reserves_the_profiled_activations(monkeypatch):
    gib = 1 << 30
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (70 * gib, 100 * gib))  # 30 GiB in use
    cfg = EngineConfig(block_size=128, max_num_seqs=10_000, gpu_memory_utilization=0.9)   # need: 330K blocks
    # 90 - 30 = 60 GiB, less 8 GiB of activations: 52 GiB of 1 MiB blocks
    assert num_kv_blocks(_FakeCudaModel(), cfg, 4096, activation_peak_bytes=8 * gib) == 52 * 1024
    assert num_kv_blocks(_FakeCudaModel(), cfg, 4096) == 60 * 1024
    with pytest.raises(ModelDoesNotFitError, match="reserved for a prefill step's activations"):
        num_kv_blocks(_FakeCudaModel(), cfg, 4096, activation_peak_bytes=60 * gib)


def test_profiling_prefill_is_whole_prompts_and_runs_the_forward():
    model = copy.deepcopy(tiny_model())                            # tiny_model() is shared (cached)
    meta = profile_prefill_metadata(100, 100, 16, model.device)
    meta.validate()
    assert meta.total_q == 100 and meta.block_tables.shape == (1, 7) and bool(meta.is_last_chunk.all())
    many = profile_prefill_metadata(250, 100, 16, model.device)     # budget > max_model_len: 100 + 100 + 50
    many.validate()
    assert many.seqlens_q.tolist() == [100, 100, 50] and many.logit_rows.tolist() == [99, 199, 249]
    assert len(set(many.slot_mapping.tolist())) == 250                # every row its own slot
    calls = []
    forward = model.forward

    def counting(m, cache):
        calls.append((m.total_q, m.num_reqs, cache.num_slots))
        return forward(m, cache)
    model.forward = counting
    assert profile_activation_bytes(model, 16, 250, 100) == 0    # no allocator statistics off CUDA
    assert calls == [(250, 3, 3 * 7 * 16)]                         # over its own throwaway pool


def test_ring_pool_pays_the_rings_then_ring_layout_blocks():
    """With window rings the budget first pays the rings' fixed bytes; the allocation equals the
    formula (fixed + blocks x bytes per block), and at flash widths a block costs SPEC's bytes per
    token (894) + the Engram id: within 1.2x (SPEC §1; the ring allocation itself at flash widths
    is checked in deepinfer-model's test_ring_window.py)."""
    from deepinfer_model.capacity import spec_kv_footprint
    from deepinfer_model.paged_cache import CacheLayout, WindowRing
    from deepinfer_model.presets import flash

    model = tiny_model()
    ring = WindowRing.for_config(model.config, num_seqs=4, max_step_rows=64)
    per_block, fixed = model.kv_cache_bytes_per_block(16, ring), model.kv_cache_fixed_bytes(ring)
    assert per_block < model.kv_cache_bytes_per_block(16) / 5         # the window left the blocks
    small = EngineConfig(block_size=16, max_num_seqs=4, kv_cache_memory_bytes=fixed + 40 * per_block)
    blocks = num_kv_blocks(model, small, 256, ring=ring)
    assert blocks == 40
    assert model.allocate_kv_cache(blocks, 16, ring=ring).nbytes() == fixed + blocks * per_block
    cfg = flash()
    flash_ring = WindowRing.for_config(cfg, num_seqs=64, max_step_rows=16384)
    per_token = CacheLayout.from_config(cfg, flash_ring).bytes_per_block(128, torch.bfloat16) / 128
    spec = spec_kv_footprint(cfg).bytes_per_token
    assert spec == 894 and per_token == spec + 4 and per_token / spec < 1.2
