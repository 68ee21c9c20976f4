"""The whole decode step (decode_step.py): target forward, sampler and draft head in one function
over the padded graph layout. On the CPU the graph runner "replays" it eagerly on the padded
buffers, so these tests run exactly what a CUDA graph captures; tokens and logprobs must equal
the piecewise path (no graph runner) in every mode."""

import sys
from pathlib import Path

import numpy as np
import pytest

from deepinfer_engine import LLM, SamplingParams
from deepinfer_engine.cuda_graphs import DecodeGraphRunner

sys.path.insert(0, str(Path(__file__).parent))  # --import-mode=importlib: the sibling helper module
from whole_step_cases import GREEDY, SEEDED, _generate, _prompts  # noqa: E402


# Seeded + variable-length verification is left out: the draft counts follow the confidences,
# which move with fp32 rounding, and a sampled token depends on the drafts it was verified against.
@pytest.mark.parametrize("nextn,varlen,params", [
    (0, False, GREEDY), (5, False, GREEDY), (5, True, GREEDY), (0, False, SEEDED), (5, False, SEEDED),
], ids=["greedy-nextn0", "greedy-nextn5", "greedy-nextn5-varlen", "seeded-nextn0", "seeded-nextn5"])
def test_padded_whole_step_matches_piecewise(nextn, varlen, params, count_graph_runner_calls):
    prompts = _prompts(10)
    want, _, _ = _generate(False, nextn, varlen, params, count_graph_runner_calls, prompts)
    got, calls, stats = _generate(True, nextn, varlen, params, count_graph_runner_calls, prompts)
    assert calls["run_step"] > 0 and calls["run"] == 0          # every decode step ran as one padded step
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    # padding rows change the matmul row count, hence the BLAS blocking: fp32 rounding only
    np.testing.assert_allclose(np.concatenate([o.token_logprobs for o in got]),
                               np.concatenate([o.token_logprobs for o in want]), rtol=0, atol=1e-4)
    if nextn:
        assert stats.num_accepted_tokens > 0                    # drafts from the padded step were verified


def test_narrow_block_table_uploads_keep_the_tokens(count_graph_runner_calls, monkeypatch):
    """Block tables uploaded as wide as the widest table so far (large pools, graph_inputs.py)
    instead of whole rows: the same tokens as the piecewise path, with speculation."""
    from deepinfer_engine import graph_inputs

    prompts = _prompts(6, seed=4)
    want, _, _ = _generate(False, 5, False, GREEDY, count_graph_runner_calls, prompts)
    monkeypatch.setattr(graph_inputs, "FULL_ROWS_MAX_BYTES", 0)
    got, calls, _ = _generate(True, 5, False, GREEDY, count_graph_runner_calls, prompts)
    assert calls["run_step"] > 0
    assert [o.token_ids for o in got] == [o.token_ids for o in want]


def test_bucket_request_slots_follow_max_num_seqs():
    """Bucket G holds min(G, max_num_seqs) + 1 request slots, not G + 1: with speculation a step's
    rows outnumber its requests (1 + nextn) to 1, and the per-request work of the padded step (the
    draft head, the sampler's per-request ops) runs over the slots. The step tests above cover
    the tokens (10 requests x 6 rows land in bucket 64, with 13 slots)."""
    llm = LLM(device="cpu", block_size=16, max_num_batched_tokens=128, max_num_seqs=12, max_model_len=256,
              num_speculative_tokens=5)
    llm.engine.runner.enable_cuda_graphs(72, llm.engine.max_model_len, interval=8)
    graphs = llm.engine.runner.graphs
    assert [graphs.slots(g) for g in graphs.sizes] == [min(g, 12) + 1 for g in graphs.sizes]
    inputs = graphs._inputs(64)
    assert inputs.meta.num_reqs == 13 and inputs.meta.total_q == 64
    assert inputs.batch.temperature.shape == inputs.mtp_slots.shape == (13,)


def test_steps_with_more_requests_than_slots_run_eagerly(count_graph_runner_calls):
    """A step whose requests do not fit its bucket's request slots runs eagerly (same tokens), and
    `runs_graphed` (the host-side decision) agrees with the graph runner's own bucket fit."""
    prompts = _prompts(6, seed=8)
    want, _, _ = _generate(False, 5, False, GREEDY, count_graph_runner_calls, prompts)
    llm = LLM(device="cpu", block_size=16, max_num_batched_tokens=128, max_num_seqs=12, max_model_len=256,
              num_speculative_tokens=5, enable_mtp_varlen=False, zero_overhead_scheduling=True)
    runner = llm.engine.runner
    runner.max_num_seqs = 2                                        # graphs with 3 request slots
    runner.enable_cuda_graphs(72, llm.engine.max_model_len, interval=8)
    graphed, eager = [], []
    launch = runner.launch

    def recording(out, batch, prev=None):
        (graphed if runner.runs_graphed(out, batch) else eager).append(out.req_cnt)
        return launch(out, batch, prev)
    runner.launch = recording
    got = llm.generate(prompt_token_ids=prompts, sampling_params=GREEDY, use_tqdm=False)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert 6 in eager and all(r <= 2 for r in graphed)            # a graph only once <= 2 requests are left


@pytest.mark.parametrize("mix", ["all-greedy", "mixed"])
def test_greedy_variant_serves_all_greedy_steps_only(mix, monkeypatch, count_graph_runner_calls):
    """A step whose requests are all greedy runs the greedy variant of the step (no uniforms, no
    residual, no draft distribution); one seeded request puts the step on the general variant.
    Both give the piecewise path's tokens."""
    prompts = _prompts(8, seed=6)
    params = [GREEDY if mix == "all-greedy" or i % 3 else SEEDED for i in range(len(prompts))]
    seen = []
    original = DecodeGraphRunner._inputs

    def recording(self, g, all_greedy=False, carry=False):
        seen.append(all_greedy)
        return original(self, g, all_greedy, carry)
    want, _, _ = _generate(False, 5, False, params, count_graph_runner_calls, prompts)
    monkeypatch.setattr(DecodeGraphRunner, "_inputs", recording)
    got, calls, _ = _generate(True, 5, False, params, count_graph_runner_calls, prompts)
    assert calls["run_step"] > 0
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert seen and all(seen) if mix == "all-greedy" else not any(seen)   # every mixed step: the general one


def test_steps_needing_eager_sampling_use_the_forward_graph(count_graph_runner_calls):
    """top-k / top-p and top-n logprobs run the sampler eagerly after the bucket's forward graph."""
    prompts = _prompts(6, seed=4)
    params = SamplingParams(temperature=0.8, top_p=0.9, top_k=50, max_tokens=8, seed=3, ignore_eos=True, logprobs=2)
    want, _, _ = _generate(False, 5, False, params, count_graph_runner_calls, prompts)
    got, calls, _ = _generate(True, 5, False, params, count_graph_runner_calls, prompts)
    assert calls["run"] > 0 and calls["run_step"] == 0
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    for g, w in zip(got, want, strict=True):
        assert [list(d) for d in g.top_logprobs] == [list(d) for d in w.top_logprobs]
        np.testing.assert_allclose([v for d in g.top_logprobs for v in d.values()],
                                   [v for d in w.top_logprobs for v in d.values()], rtol=0, atol=1e-4)


def test_whole_step_without_speculation_returns_tokens_only():
    """Without speculation a padded whole step verifies nothing: its outputs hold the tokens and
    logprobs (int32 / float32, per request slot) and None for the verification outputs, so neither
    the step nor the host copies spend launches on constants."""
    import torch

    llm = LLM(device="cpu", block_size=16, max_num_batched_tokens=128, max_num_seqs=4, max_model_len=256,
              num_speculative_tokens=0)
    llm.engine.runner.enable_cuda_graphs(4, llm.engine.max_model_len, interval=8)
    graphs = llm.engine.runner.graphs
    graphs.inputs.stage_padding(4, graphs.slots(4), 0, 0)   # a step of padding only, as a capture runs
    graphs.inputs.upload()
    out = graphs._run_step(graphs._inputs(4, all_greedy=True, carry=True))
    assert out.token_ids.dtype == torch.int32 and out.token_ids.shape == (graphs.slots(4),)
    assert out.token_logprobs.dtype == torch.float32
    assert out.verified_token_ids is None and out.verified_logprobs is None
    assert out.num_accepted is None and out.rejected_rows is None and out.confidence is None
