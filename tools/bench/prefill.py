"""Prefill rows of tools/benchmark.py: synchronous steps (ZOS off, each step timed to its end) and
pipelined over queued prompt rounds (ZOS on, the engine's default loop)."""

from __future__ import annotations

import time

import torch
from bench.engine import build_engine, free_device_memory, make_prompts

from deepinfer_kernels.ops.sparse_mla import shared_key_group_rows, shared_keys_enabled


def _allocator_counts() -> dict:
    """CUDA caching-allocator counters (a retry frees cached blocks and syncs the device; a device
    malloc / free inside a timed window means the activations did not fit the cache)."""
    if not torch.cuda.is_available():
        return {}
    stats = torch.cuda.memory_stats()
    return {k: int(stats.get(k, 0)) for k in ("num_alloc_retries", "num_device_alloc", "num_device_free")}


def _allocator_delta(before: dict) -> dict:
    after = _allocator_counts()
    return {f"window_{k}": after[k] - before[k] for k in before}


def bench_prefill(args, chunk_tokens: int | None = None) -> dict:
    """Prefill tokens/s with chunks of `chunk_tokens` rows (default --max-num-batched-tokens)."""
    from deepinfer_engine import SamplingParams

    chunk = chunk_tokens or args.max_num_batched_tokens
    engine = build_engine(args, max_num_seqs=args.prefill_batch, zero_overhead_scheduling=False, cuda_graphs=False,
                     max_num_batched_tokens=chunk)
    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    times, tokens, round_id = [], [], 0
    alloc0 = None
    while len(times) < 15:
        if len(times) == 5 and alloc0 is None:   # the timed steps (after the first five)
            alloc0 = _allocator_counts()
        if not engine.has_unfinished():
            for p in make_prompts(args.prefill_batch, args.prompt_len, engine.vocab_size, seed=1000 + round_id):
                engine.add_request(prompt_token_ids=p, params=params)
            round_id += 1
        before = engine.stats.num_prefill_tokens
        start = time.perf_counter()
        engine.step()
        if engine.device.type == "cuda":
            torch.cuda.synchronize()
        computed = engine.stats.num_prefill_tokens - before
        if computed:
            times.append(time.perf_counter() - start)
            tokens.append(computed)
    t, n = sum(times[5:]), sum(tokens[5:])
    row = dict(kind="prefill", engine="deepinfer", model=args.model, batch=args.prefill_batch,
               prompt_len=args.prompt_len, chunk_tokens=chunk, pipelined=False, tokens_per_s=n / t,
               tokens_per_step=n / len(times[5:]), sparse_mla_shared_keys=shared_keys_enabled(),
               sparse_mla_group_rows=shared_key_group_rows(),
               **_allocator_delta(alloc0 or {}))
    del engine
    free_device_memory()
    return row


def bench_prefill_pipelined(args, chunk_tokens: int | None = None) -> dict:
    """Prefill tokens/s as the engine runs a queue of prompts by default (ZOS on: step N+1 is
    launched before step N is collected, so the host's scheduling, metadata and output work hides
    under the device). `--prefill-rounds` rounds of `--prefill-batch` prompts are queued at once;
    the window skips the first round and stops before the last (in steady state one step is in
    flight at both ends). Twice the sequence slots, so the next round is admitted while the
    previous one's last step is in flight."""
    from deepinfer_engine import SamplingParams

    chunk = chunk_tokens or args.max_num_batched_tokens
    engine = build_engine(args, max_num_seqs=2 * args.prefill_batch, max_num_batched_tokens=chunk)
    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    rounds = max(args.prefill_rounds, 3)
    for r in range(rounds):
        for p in make_prompts(args.prefill_batch, args.prompt_len, engine.vocab_size, seed=2000 + r):
            engine.add_request(prompt_token_ids=p, params=params)
    per_round = args.prefill_batch * args.prompt_len
    while engine.stats.num_prefill_tokens < per_round:   # warm-up: the first round
        engine.step()
    if engine.device.type == "cuda":
        torch.cuda.synchronize()
    alloc0 = _allocator_counts()
    tok0, start = engine.stats.num_prefill_tokens, time.perf_counter()
    while engine.stats.num_prefill_tokens < (rounds - 1) * per_round:
        engine.step()
    if engine.device.type == "cuda":
        torch.cuda.synchronize()
    elapsed, tokens = time.perf_counter() - start, engine.stats.num_prefill_tokens - tok0
    alloc = _allocator_delta(alloc0)
    while engine.has_unfinished():
        engine.step()
    row = dict(kind="prefill", engine="deepinfer", model=args.model, batch=args.prefill_batch,
               prompt_len=args.prompt_len, chunk_tokens=chunk, pipelined=True, zos=engine.zos,
               rounds=rounds, tokens_per_s=tokens / elapsed, window_tokens=tokens,
               sparse_mla_shared_keys=shared_keys_enabled(), sparse_mla_group_rows=shared_key_group_rows(),
               **alloc)
    del engine
    free_device_memory()
    return row
