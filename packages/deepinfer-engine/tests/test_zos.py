"""Zero-overhead scheduling: the CPU schedules step N+1 before step N's results are processed and
the device fixes up N+1's inputs (golden tokens, rejected-draft position deltas) from N. Outputs
must be identical to the synchronous loop in every mode."""

import numpy as np
import pytest

from deepinfer_engine import LLM, SamplingParams


def _llm(zos: bool, nextn: int, **kw) -> LLM:
    return LLM(device="cpu", block_size=16, max_num_batched_tokens=64, max_num_seqs=32, max_model_len=256,
               zero_overhead_scheduling=zos, num_speculative_tokens=nextn, enable_mtp_varlen=False, **kw)


def _prompts(n: int, seed: int = 1) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(7, 8000, size=int(rng.integers(2, 70))).tolist() for _ in range(n)]


@pytest.mark.parametrize("nextn", [0, 3])
@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0, max_tokens=10, ignore_eos=True),
    SamplingParams(temperature=0.8, top_k=40, max_tokens=10, seed=5, ignore_eos=True, logprobs=2),
])
def test_zos_matches_synchronous_loop(nextn, params):
    prompts = _prompts(24)
    sync = _llm(False, nextn).generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False)
    zos_llm = _llm(True, nextn)
    zos = zos_llm.generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False)
    assert [o.token_ids for o in zos] == [o.token_ids for o in sync]
    assert [o.finish_reason for o in zos] == [o.finish_reason for o in sync]
    if params.logprobs is not None:
        np.testing.assert_allclose(np.concatenate([o.token_logprobs for o in zos]),
                                   np.concatenate([o.token_logprobs for o in sync]), rtol=0, atol=1e-5)
    assert not zos_llm.engine.has_unfinished() and zos_llm.engine.scheduler.num_running() == 0


def test_zos_with_accepted_drafts_and_stops(make_oracle):
    prompts = _prompts(16, seed=3)
    greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    expected = [o.token_ids for o in _llm(False, 0).generate(prompt_token_ids=prompts, sampling_params=greedy,
                                                              use_tqdm=False)]
    oracle = make_oracle([p + e for p, e in zip(prompts, expected)], 5, corrupt_every=3)
    zos = _llm(True, 5)
    outs = zos.generate(prompt_token_ids=prompts, sampling_params=greedy, use_tqdm=False)
    assert [o.token_ids for o in outs] == expected
    assert oracle.num_hits > 0 and zos.engine.stats.num_accepted_tokens > 0
    # A stop id inside an accepted block, under ZOS: the request is scheduled once more before the
    # ledger sees the stop; that in-flight step must push nothing.
    i = next(k for k, e in enumerate(expected) if e.index(e[3]) == 3)
    stop = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, stop_token_ids=[expected[i][3]])
    out = _llm(True, 5).generate(prompt_token_ids=[prompts[i]], sampling_params=stop, use_tqdm=False)[0]
    assert out.token_ids == expected[i][:4] and out.finish_reason == "stop"


def test_zos_abort_while_in_flight():
    llm = _llm(True, 3)
    engine = llm.engine
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    rids = [engine.add_request(prompt_token_ids=p, params=params) for p in _prompts(4, seed=9)]
    finished = {}
    for _ in range(4):
        finished.update({o.request_id: o for o in engine.step()})
    assert engine._inflight is not None
    assert engine.abort_request(rids[1])
    while engine.has_unfinished():
        finished.update({o.request_id: o for o in engine.step()})
    assert finished[rids[1]].finish_reason == "abort"
    assert all(finished[r].finish_reason == "length" and len(finished[r].token_ids) == 30 for r in rids if r != rids[1])
    assert engine.scheduler.num_free_blocks() == engine.runner.num_blocks  # cached blocks stay evictable
    assert engine.scheduler.num_used_mtp_slots() == 0
