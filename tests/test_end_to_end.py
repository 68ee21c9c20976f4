"""Cross-package: the whole engine (C++ scheduler, paged engine-path forward, sampler) generates
exactly what greedy decoding over the dense reference forward of deepinfer_model generates."""

import pytest
import torch

from deepinfer_engine import LLM, SamplingParams


def reference_greedy(model, prompt: list[int], num_tokens: int) -> list[int]:
    """Greedy continuation via reference_forward (bounded replay + KV quantisation emulation: the
    function the engine path computes, see docs/model.md)."""
    tokens = list(prompt)
    for _ in range(num_tokens):
        ref = model.reference_forward(torch.tensor(tokens), mode="bounded_replay", prompt_len=len(prompt),
                                      kv_quant=True)
        tokens.append(int(ref.logits[-1].argmax()))
    return tokens[len(prompt):]


@pytest.mark.parametrize("nextn", [0, 5])
@pytest.mark.parametrize("prompt_len", [5, 37, 70])
def test_engine_greedy_matches_reference(prompt_len, nextn):
    llm = LLM(device="cpu", block_size=16, max_num_batched_tokens=32, max_model_len=256,
              num_speculative_tokens=nextn)
    prompt = [(17 * i + 5) % 8000 + 7 for i in range(prompt_len)]
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    out = llm.generate(prompt_token_ids=[prompt], sampling_params=params, use_tqdm=False)[0]
    assert out.token_ids == reference_greedy(llm.engine.model, prompt, 10)


def test_prefix_cache_hit_gives_same_tokens():
    # window rings: hits at SWA snapshot points (swa_tier.py); a 32-token grain fits these short prompts
    llm = LLM(device="cpu", block_size=16, max_num_batched_tokens=64, max_model_len=256,
              swa_snapshot_tokens=32)
    shared = [(31 * i + 11) % 8000 + 7 for i in range(80)]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    first = llm.generate(prompt_token_ids=[shared + [100, 101]], sampling_params=params, use_tqdm=False)[0]
    assert llm.engine.scheduler.num_cached_blocks() > 0, "finished prompt blocks should stay cached"
    computed_first = llm.engine.stats.num_prefill_tokens
    second = llm.generate(prompt_token_ids=[shared + [100, 101]], sampling_params=params, use_tqdm=False)[0]
    assert second.token_ids == first.token_ids
    # The hit skips whole blocks but keeps >= the bounded-replay window for the last chunk.
    assert llm.engine.stats.num_prefix_cached_tokens > 0
    assert llm.engine.stats.num_prefill_tokens - computed_first < computed_first
    fresh = LLM(device="cpu", block_size=16, max_num_batched_tokens=64, max_model_len=256,
                enable_prefix_caching=False)
    cold = fresh.generate(prompt_token_ids=[shared + [100, 101]], sampling_params=params, use_tqdm=False)[0]
    assert cold.token_ids == first.token_ids


def test_partial_prefix_hit_equals_cold_run():
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    shared = [(13 * i + 3) % 8000 + 7 for i in range(96)]
    a, b = shared + [100, 101], shared + [200, 201, 202, 203, 204]
    warm = LLM(device="cpu", block_size=16, max_num_batched_tokens=64, max_model_len=256,
               swa_snapshot_tokens=32)
    warm.generate(prompt_token_ids=[a], sampling_params=params, use_tqdm=False)
    hits_before = warm.engine.stats.num_prefix_cached_tokens
    b_warm = warm.generate(prompt_token_ids=[b], sampling_params=params, use_tqdm=False)[0]
    assert warm.engine.stats.num_prefix_cached_tokens > hits_before
    cold = LLM(device="cpu", block_size=16, max_num_batched_tokens=64, max_model_len=256, enable_prefix_caching=False)
    assert cold.generate(prompt_token_ids=[b], sampling_params=params, use_tqdm=False)[0].token_ids == b_warm.token_ids
