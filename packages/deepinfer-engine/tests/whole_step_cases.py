"""What the whole-step tests share: prompts, the engine they run, the sampling settings."""

import numpy as np

from deepinfer_engine import LLM, SamplingParams


def _prompts(n: int, seed: int = 2) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(7, 8000, size=int(rng.integers(2, 60))).tolist() for _ in range(n)]


def _generate(padded_step: bool, nextn: int, varlen: bool, params, count_calls, prompts):
    """count_calls: the count_graph_runner_calls fixture (conftest.py)."""
    llm = LLM(device="cpu", block_size=16, max_num_batched_tokens=128, max_num_seqs=12, max_model_len=256,
              num_speculative_tokens=nextn, enable_mtp_varlen=varlen, zero_overhead_scheduling=True)
    calls = {"run_step": 0, "run": 0}
    if padded_step:
        engine = llm.engine
        max_rows = 12 * (nextn + 1)
        engine.runner.enable_cuda_graphs(max_rows, engine.max_model_len, interval=8)
        calls = count_calls("run_step", "run")
    outs = llm.generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False)
    return outs, calls, llm.engine.stats


GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, logprobs=0)
SEEDED = SamplingParams(temperature=0.9, max_tokens=16, seed=11, ignore_eos=True, logprobs=0)
