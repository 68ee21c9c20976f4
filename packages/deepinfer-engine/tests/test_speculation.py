"""Issue 7: DSpark speculation in the engine is exact (greedy outputs identical to no speculation),
stops inside accepted drafts cut exactly, seeded sampling is batch-invariant, stats are reported."""

import numpy as np
import pytest

from deepinfer_engine import LLM, SamplingParams

MAX_TOKENS = 12


def _llm(nextn: int, varlen: bool = False, **kw) -> LLM:
    return LLM(device="cpu", block_size=16, max_num_batched_tokens=128, max_num_seqs=64, max_model_len=256,
               num_speculative_tokens=nextn, enable_mtp_varlen=varlen, **kw)


def _prompts(n: int) -> list[list[int]]:
    rng = np.random.default_rng(0)
    return [rng.integers(7, 8000, size=int(rng.integers(3, 40))).tolist() for _ in range(n)]


@pytest.fixture(scope="module")
def baseline():
    prompts = _prompts(64)
    greedy = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    outs = _llm(0).generate(prompt_token_ids=prompts, sampling_params=greedy, use_tqdm=False)
    return prompts, [o.token_ids for o in outs]


@pytest.mark.parametrize("nextn, varlen", [(1, False), (3, False), (5, False), (3, True), (5, True)])
def test_greedy_identical_to_no_speculation(baseline, make_oracle, nextn, varlen):
    prompts, expected = baseline
    oracle = make_oracle([p + e for p, e in zip(prompts, expected)], nextn, corrupt_every=4)
    llm = _llm(nextn, varlen)
    greedy = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    outs = llm.generate(prompt_token_ids=prompts, sampling_params=greedy, use_tqdm=False)
    assert [o.token_ids for o in outs] == expected
    st = llm.engine.stats
    assert oracle.num_hits > 0 and st.num_accepted_tokens > 0, "the oracle should make drafts accepted"
    assert 0 < st.acceptance_rate < 1  # corrupted drafts get rejected, true ones accepted
    assert 1.0 < st.mean_acceptance_length <= nextn + 1
    assert all(0 <= o.num_accepted_tokens <= o.num_draft_tokens for o in outs)
    if varlen:  # the budget policy may verify fewer drafts than nextn, never more
        assert st.num_draft_tokens <= st.num_decode_request_steps * nextn


def test_model_draft_head_without_oracle_is_exact(baseline):
    prompts, expected = baseline
    outs = _llm(5).generate(prompt_token_ids=prompts[:16], sampling_params=SamplingParams(
        temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True), use_tqdm=False)
    assert [o.token_ids for o in outs] == expected[:16]


def test_stop_inside_accepted_drafts_cuts_exactly(baseline, make_oracle):
    prompts, expected = baseline
    # Prefill emits token 0; the first decode step verifies drafts for tokens 1..5 (all accepted)
    # and samples token 6. A stop id first seen at index 3, or max_tokens = 3, ends the request on
    # the third accepted draft: tokens 4.. of that block are accepted yet must not be emitted.
    picks = [(i, e[3]) for i, e in enumerate(expected) if e.index(e[3]) == 3][:8]
    assert picks
    for i, stop in picks:
        oracle = make_oracle([prompts[i] + expected[i]], 5)  # every draft right (one sequence: no key clash)
        for params, cut, reason in [
            (SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True, stop_token_ids=[stop]), 4, "stop"),
            (SamplingParams(temperature=0, max_tokens=3, ignore_eos=True), 3, "length"),
        ]:
            llm = _llm(5)
            out = llm.generate(prompt_token_ids=[prompts[i]], sampling_params=params, use_tqdm=False)[0]
            assert out.token_ids == expected[i][:cut], "no token after the stop, none missing"
            assert out.finish_reason == reason
            assert out.num_accepted_tokens >= cut - 1, "the stop must fall inside accepted drafts"
            assert llm.engine.stats.num_generated_tokens == cut  # usage == emitted tokens
        assert oracle.num_hits > 0


def test_eos_inside_accepted_drafts(baseline, make_oracle, monkeypatch):
    prompts, expected = baseline
    i = next(k for k, e in enumerate(expected) if e.index(e[2]) == 2)
    eos = expected[i][2]
    make_oracle([prompts[i] + expected[i]], 5)
    from deepinfer_model.config import V41Config
    monkeypatch.setattr(V41Config, "eos_token_ids", property(lambda self: (eos,)))
    out = _llm(5).generate(prompt_token_ids=[prompts[i]], sampling_params=SamplingParams(
        temperature=0, max_tokens=MAX_TOKENS), use_tqdm=False)[0]
    assert out.token_ids == expected[i][:3] and out.finish_reason == "stop" and out.stop_token_id == eos


def test_seeded_sampling_batch_invariant_with_speculation():
    prompts = _prompts(64)
    params = SamplingParams(temperature=0.9, top_p=0.95, max_tokens=8, seed=99, ignore_eos=True)
    llm = _llm(3)
    alone = [llm.generate(prompt_token_ids=[p], sampling_params=params, use_tqdm=False)[0].token_ids for p in prompts[:7]]
    batch7 = [o.token_ids for o in llm.generate(prompt_token_ids=prompts[:7], sampling_params=params, use_tqdm=False)]
    batch64 = [o.token_ids for o in llm.generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False)]
    order = list(reversed(range(7)))
    permuted = llm.generate(prompt_token_ids=[prompts[k] for k in order], sampling_params=params, use_tqdm=False)
    assert alone == batch7 == batch64[:7]
    assert [permuted[order.index(k)].token_ids for k in range(7)] == alone
