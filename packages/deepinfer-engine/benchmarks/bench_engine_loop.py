"""Engine loop benchmarks on the CPU with the default model: one offline batch, each optional
path on and off in the same run (zero-overhead scheduling, speculation). Ratios, not absolute
times, are what to read: the CPU has no asynchronous device, so ZOS can only cost here (it pays
on a GPU, where tools/benchmark.py measures it), and speculation with random drafts shows the
verification overhead.

    pytest packages/deepinfer-engine/benchmarks/bench_engine_loop.py --benchmark-only -q
"""

import numpy as np
import pytest
import torch

from deepinfer_engine import LLM, SamplingParams

PROMPTS = np.random.default_rng(0).integers(10, 8000, size=(8, 48)).tolist()
PARAMS = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("zos, nextn", [(False, 0), (True, 0), (False, 3), (True, 3)])
def test_generate_batch_of_8(benchmark, zos, nextn):
    llm = LLM(device="cpu", block_size=16, max_num_batched_tokens=256, max_model_len=256,
              zero_overhead_scheduling=zos, num_speculative_tokens=nextn, enable_mtp_varlen=False)
    outs = benchmark.pedantic(lambda: llm.generate(prompt_token_ids=PROMPTS, sampling_params=PARAMS, use_tqdm=False),
                              rounds=3, iterations=1, warmup_rounds=1)
    assert all(len(o.token_ids) == 16 for o in outs)
    benchmark.extra_info["generated_tokens_per_round"] = 8 * 16
