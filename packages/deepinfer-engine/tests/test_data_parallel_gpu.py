"""DP2+EP2 on 2 GPUs (NCCL) against one GPU: skips below 2 GPUs (run by benchmarks/bench_two_gpus.sh).

fp32 for the token-for-token check (bf16 rounds the EP sum in another order than the fused
combine), bf16 for the serving dtype: same lengths and mostly the same greedy tokens.
"""

from __future__ import annotations

import pytest
import torch

from deepinfer_engine import LLM, SamplingParams

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")]

GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, logprobs=0)
LENGTHS = [3, 200, 17, 64, 130, 7, 40, 90]


def _prompts(tokenizer) -> list[list[int]]:
    ids = tokenizer.encode(open(__file__).read() * 4)
    return [ids[i * 11: i * 11 + n] for i, n in enumerate(LENGTHS)]


@pytest.mark.parametrize("nextn", [0, 5])
def test_dp2_ep2_fp32_equals_one_gpu(nextn):
    args = {"dtype": "float32", "num_speculative_tokens": nextn, "max_num_batched_tokens": 128, "cuda_graphs": False}
    single = LLM(**args)
    prompts = _prompts(single.tokenizer)
    want = single.generate(prompt_token_ids=prompts, sampling_params=GREEDY, use_tqdm=False)
    del single
    dp = LLM(data_parallel_size=2, expert_parallel=True, **args)
    got = dp.generate(prompt_token_ids=prompts, sampling_params=GREEDY, use_tqdm=False)
    dp.engine.shutdown()
    for g, w in zip(got, want):
        assert g.token_ids == w.token_ids
        assert max(abs(a - b) for a, b in zip(g.token_logprobs, w.token_logprobs)) < 1e-3


def test_dp2_ep2_bf16_serves_the_batch():
    single = LLM(num_speculative_tokens=5)
    prompts = _prompts(single.tokenizer)
    want = single.generate(prompt_token_ids=prompts, sampling_params=GREEDY, use_tqdm=False)
    del single
    dp = LLM(data_parallel_size=2, expert_parallel=True, num_speculative_tokens=5)
    got = dp.generate(prompt_token_ids=prompts, sampling_params=GREEDY, use_tqdm=False)
    dp.engine.shutdown()
    assert all(len(g.token_ids) == 16 and g.finish_reason == "length" for g in got)
    same = sum(a == b for g, w in zip(got, want) for a, b in zip(g.token_ids, w.token_ids))
    assert same >= 0.9 * 16 * len(prompts)
