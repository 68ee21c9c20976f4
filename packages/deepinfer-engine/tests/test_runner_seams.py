"""The engine's typed seams: `ModelRunner.launch` -> LaunchedStep / DeferredStep (one LaunchPath
each) -> `collect` -> StepResult, the grammar masks from a `MaskProvider` the runner is given,
and the engine parts other layers build on (`output_processor`, `resolved`, streaming indices)."""

import numpy as np
import pytest
import torch

from deepinfer_engine import LLM, SamplingParams
from deepinfer_engine.runner_step import DeferredStep, LaunchedStep, LaunchPath, StepResult
from deepinfer_engine.structured_output import StructuredOutput as SO
from deepinfer_engine.structured_output.manager import mask_width
from deepinfer_engine.structured_output.mask_provider import VocabMasks
from deepinfer_sched import StepKind

GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


def _llm(nextn: int, **kw) -> LLM:
    return LLM(device="cpu", block_size=16, max_num_batched_tokens=64, max_num_seqs=8, max_model_len=256,
               num_speculative_tokens=nextn, enable_mtp_varlen=False, **kw)


def _prompts(n: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(7, 8000, size=int(rng.integers(3, 40))).tolist() for _ in range(n)]


def _record_steps(runner) -> list:
    """Every step launch / complete returns, in order (the runner's methods wrapped in place)."""
    steps = []
    launch, complete = runner.launch, runner.complete

    def recording_launch(out, batch, prev=None):
        steps.append(launch(out, batch, prev))
        return steps[-1]

    def recording_complete(step):
        steps.append(complete(step))
        return steps[-1]
    runner.launch, runner.complete = recording_launch, recording_complete
    return steps


@pytest.mark.parametrize("zos", [True, False])
def test_each_launch_path_hands_over_a_typed_step(zos):
    """Prefill runs eagerly, a plain decode step replays the whole-step graph, a grammar step stops
    after its forward (DeferredStep) and `complete` finishes it on the split path; the tokens are
    those of the engine without graphs."""
    prompts = _prompts(3, seed=4)
    params = [GREEDY, GREEDY, SamplingParams(temperature=0, max_tokens=24, structured_output=SO.regex("(yes|no)"))]
    want = _llm(3, zero_overhead_scheduling=zos).generate(prompt_token_ids=prompts, sampling_params=params,
                                                          use_tqdm=False)
    llm = _llm(3, zero_overhead_scheduling=zos)
    llm.engine.runner.enable_cuda_graphs(8 * 4, llm.engine.max_model_len, interval=8)
    steps = _record_steps(llm.engine.runner)
    got = llm.generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert got[2].text in ("yes", "no")
    paths = {s.path for s in steps if isinstance(s, LaunchedStep)}
    assert paths == {LaunchPath.EAGER, LaunchPath.WHOLE_STEP, LaunchPath.SPLIT}
    for i, s in enumerate(steps):
        assert isinstance(s, (LaunchedStep, DeferredStep))
        if isinstance(s, DeferredStep):    # completed right after, on the split path
            assert steps[i + 1].path is LaunchPath.SPLIT and steps[i + 1].out is s.out
        elif s.out.step_kind == StepKind.PREFILL:
            assert s.path is LaunchPath.EAGER
            assert s.results.verified_token_ids is None   # a prefill step verifies nothing
        else:
            assert s.results.verified_token_ids is not None and s.results.confidence is not None


def test_collect_returns_host_arrays_in_request_order():
    """`execute` = launch + collect: a decode step's StepResult carries every request's main token,
    the accepted drafts (VERIFIED_END terminated) and next step's draft confidences."""
    engine = _llm(2, zero_overhead_scheduling=False).engine
    for p in _prompts(2, seed=5):
        engine.add_request(prompt_token_ids=p, params=GREEDY)
    while True:   # the engine's step, by hand: schedule -> launch + collect -> outputs
        out = engine.scheduler.schedule()
        res = engine.runner.execute(out, engine._step_sampling_batch(out))
        assert isinstance(res, StepResult) and res.token_ids.dtype == np.int32
        assert res.token_ids.shape == res.token_logprobs.shape == (out.req_cnt,)
        if out.step_kind == StepKind.DECODE:
            break
        assert res.verified_token_ids is None
        engine._process_outputs(out, res)
    assert res.verified_token_ids.shape == (out.total_q,) and res.confidence.shape == (out.req_cnt, 2)
    assert res.num_accepted.shape == (out.req_cnt,) and (res.num_accepted <= out.seqlens_q - 1).all()


class OnlyToken:
    """A MaskProvider that allows one token on every logits row of every step."""

    def __init__(self, token: int, vocab_size: int):
        self.token, self.vocab_size, self.calls = token, vocab_size, 0

    def step_masks(self, out, input_ids, device=None) -> VocabMasks:
        self.calls += 1
        rows = int(np.asarray(out.is_last_chunk, bool).sum()) if out.step_kind == StepKind.PREFILL else out.total_q
        bits = torch.zeros(1, mask_width(self.vocab_size), dtype=torch.int32)
        bits[0, self.token // 32] = 1 << (self.token % 32)
        ids = torch.zeros(rows, dtype=torch.int32)   # every row takes mask 0 (none is NO_VOCAB_MASK)
        return VocabMasks(bits.to(device), ids.to(device))


@pytest.mark.parametrize("nextn", [0, 3])
def test_the_runner_samples_through_the_mask_provider_it_is_given(nextn):
    llm = _llm(nextn, zero_overhead_scheduling=False)
    provider = OnlyToken(4321, llm.engine.vocab_size)
    llm.engine.runner.set_mask_provider(provider)
    outs = llm.generate(prompt_token_ids=_prompts(3, seed=6), sampling_params=GREEDY, use_tqdm=False)
    assert all(o.token_ids == [4321] * GREEDY.max_tokens for o in outs)
    assert provider.calls >= GREEDY.max_tokens // (nextn + 1)


def test_engine_parts_for_serving_layers():
    """What an async server or a data-parallel worker reads: the live requests, the resolved
    configuration, and stream indices set after the requests were added."""
    llm = _llm(0, zero_overhead_scheduling=True)
    engine = llm.engine
    assert engine.zos is engine.resolved.zero_overhead_scheduling is True and engine.nextn == 0
    engine.start_streaming()
    rids = [engine.add_request(prompt_token_ids=p, params=GREEDY) for p in _prompts(2, seed=7)]
    engine.set_stream_indices({rids[0]: 10, rids[1]: 11})
    assert sorted(engine.output_processor.requests) == rids
    deltas, finished = [], {}
    while engine.has_unfinished():
        finished.update({o.request_id: o for o in engine.step()})
        deltas += engine.pop_stream_deltas()
    engine.stop_streaming()
    assert not engine.output_processor.requests
    for rid, index in zip(rids, (10, 11)):
        mine = [d for d in deltas if d.request_id == rid]
        assert all(d.index == index for d in mine) and mine[-1].finished
        assert sum((d.token_ids for d in mine), []) == finished[rid].token_ids
