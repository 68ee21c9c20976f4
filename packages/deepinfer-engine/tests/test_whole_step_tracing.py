"""The whole decode step traced by dynamo (what `compile_decode` / `compile_speculation` do on
CUDA), with dynamo's eager backend on the CPU: fullgraph=True, no graph break, the same tokens. In
their own file so the parallel test workers can run them beside test_whole_step.py."""

import sys
from pathlib import Path

import numpy as np
import pytest

from deepinfer_engine import LLM

sys.path.insert(0, str(Path(__file__).parent))  # --import-mode=importlib: the sibling helper module
from whole_step_cases import GREEDY, SEEDED, _generate, _prompts  # noqa: E402


def test_whole_step_traces_as_one_dynamic_graph(count_graph_runner_calls):
    """What `compile_decode` does on CUDA, with dynamo's eager backend on the CPU: the whole step
    traces with fullgraph=True (no graph break, no host sync) as one graph with dynamic row and
    request counts, and gives the same tokens."""
    import torch
    import torch._dynamo as dynamo

    from deepinfer_engine.decode_step import run_decode_step

    prompts = _prompts(10, seed=5)
    want, _, _ = _generate(False, 5, True, GREEDY, count_graph_runner_calls, prompts)
    llm = LLM(device="cpu", block_size=16, max_num_batched_tokens=128, max_num_seqs=12, max_model_len=256,
              num_speculative_tokens=5, enable_mtp_varlen=True, zero_overhead_scheduling=True)
    runner = llm.engine.runner
    runner.enable_cuda_graphs(12 * 6, llm.engine.max_model_len, interval=8)
    dynamo.reset()
    frames = []
    with dynamo.config.patch(capture_scalar_outputs=False, capture_dynamic_output_shape_ops=False):
        def backend(gm, example_inputs):
            frames.append(gm)
            return gm.forward
        runner.graphs.compile = True
        runner.graphs._step_fn = torch.compile(run_decode_step, fullgraph=True, backend=backend)
        got = llm.generate(prompt_token_ids=prompts, sampling_params=GREEDY, use_tqdm=False)
    dynamo.reset()
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    # one graph: every per-row / per-request input (the ZOS carry's maps too) is dynamic from the first
    # trace; before, the carry's views were static and the recompiles depended on the order of the bucket sizes
    assert len(frames) == 1



@pytest.mark.parametrize("params", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_compiled_speculation_traces_whole_and_keeps_tokens(params, count_graph_runner_calls):
    """`compile_speculation` (DEEPINFER_COMPILE_SPECULATION) with dynamo's eager backend on the CPU:
    the DFlash main keys and the tail (verification sampler + draft head) trace with fullgraph=True
    inside the padded step (no graph break, no host sync), and tokens and logprobs equal the
    uncompiled padded step."""
    import torch._dynamo as dynamo

    prompts = _prompts(10, seed=9)
    want, _, _ = _generate(True, 5, False, params, count_graph_runner_calls, prompts)
    llm = LLM(device="cpu", block_size=16, max_num_batched_tokens=128, max_num_seqs=12, max_model_len=256,
              num_speculative_tokens=5, enable_mtp_varlen=False, zero_overhead_scheduling=True)
    runner = llm.engine.runner
    frames = []

    def backend(gm, example_inputs):
        frames.append(gm)
        return gm.forward
    dynamo.reset()
    runner.spec.compile(backend=backend)
    runner.enable_cuda_graphs(12 * 6, llm.engine.max_model_len, interval=8)
    got, calls = [], {"tail": 0}
    tail = runner.spec.compiled_tail

    def counted_tail(*a, **kw):
        calls["tail"] += 1
        return tail(*a, **kw)
    runner.spec.compiled_tail = counted_tail
    got = llm.generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False)
    dynamo.reset()
    assert calls["tail"] > 0
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    np.testing.assert_allclose(np.concatenate([o.token_logprobs for o in got]),
                               np.concatenate([o.token_logprobs for o in want]), rtol=0, atol=1e-5)
    assert 2 <= len(frames) <= 8          # main keys (prefill shapes too) + tail: static, then dynamic
    assert llm.engine.stats.num_accepted_tokens > 0
