"""Issue 2 acceptance: batch generation, continuous batching isolation, bad input, long prompts."""

import pytest

from deepinfer_engine import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


def _prompts(llm: LLM, n: int) -> list[list[int]]:
    """n prompts of different lengths (several over the 64-token prefill budget -> chunked)."""
    text = open(__file__).read()
    ids = llm.tokenizer.encode(text)
    lengths = [3, 17, 40, 64, 65, 90, 130, 7][:n]
    return [ids[i * 5: i * 5 + L] for i, L in enumerate(lengths)]


def test_batch_equals_each_prompt_alone(tiny_llm):
    prompts = _prompts(tiny_llm, 8)
    batch = tiny_llm.generate(prompt_token_ids=prompts, sampling_params=GREEDY, use_tqdm=False)
    assert len(batch) == 8
    for prompt, out in zip(prompts, batch):
        alone = tiny_llm.generate(prompt_token_ids=[prompt], sampling_params=GREEDY, use_tqdm=False)[0]
        assert out.prompt_token_ids == prompt
        assert out.token_ids == alone.token_ids, f"prompt of {len(prompt)} tokens differs in a batch"
        assert len(out.token_ids) == 12 and out.finish_reason == "length"


def test_text_prompts_return_text_logprobs_and_prompt_len(tiny_llm):
    params = SamplingParams(temperature=0.8, top_p=0.9, top_k=50, max_tokens=6, seed=7, logprobs=3, ignore_eos=True)
    outs = tiny_llm.generate(["def add(a, b):", "import os\n"], params, use_tqdm=False)
    for out in outs:
        assert out.text is not None and out.prompt_len == len(tiny_llm.tokenizer.encode(out.prompt))
        assert len(out.token_logprobs) == len(out.token_ids) == 6
        assert all(-9999.0 <= lp <= 0.0 for lp in out.token_logprobs)
        assert all(len(top) == 3 for top in out.top_logprobs)
        for tok, lp, top in zip(out.token_ids, out.token_logprobs, out.top_logprobs):
            assert max(top.values()) >= lp - 1e-5  # the best alternative is at least as likely
            if tok in top:
                assert top[tok] == pytest.approx(lp, abs=1e-5)


def test_seeded_sampling_reproducible_and_independent_of_batch(tiny_llm):
    p = SamplingParams(temperature=1.0, max_tokens=8, seed=1234, ignore_eos=True)
    alone = tiny_llm.generate(["class Foo:"], p, use_tqdm=False)[0]
    mixed = tiny_llm.generate(["x = 1", "class Foo:", "for i in range(3):"], p, use_tqdm=False)[1]
    assert alone.token_ids == mixed.token_ids


def test_stop_token_id_and_max_tokens(tiny_llm):
    free = tiny_llm.generate(prompt_token_ids=[[100, 200, 300]], sampling_params=GREEDY, use_tqdm=False)[0]
    stop_at = free.token_ids[4]
    first = free.token_ids.index(stop_at)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, stop_token_ids=[stop_at])
    out = tiny_llm.generate(prompt_token_ids=[[100, 200, 300]], sampling_params=params, use_tqdm=False)[0]
    assert out.token_ids == free.token_ids[: first + 1]
    assert out.finish_reason == "stop" and out.stop_token_id == stop_at


@pytest.mark.parametrize(
    "bad, field",
    [
        ({"prompt_token_ids": []}, "prompt_token_ids"),
        ({"prompt_token_ids": [1, 99999]}, "prompt_token_ids"),
        ({"prompt_token_ids": [1, -1]}, "prompt_token_ids"),
        ({"prompt": ""}, "prompt"),
        ({"stop_token_ids": [8192]}, "stop_token_ids"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": 2.0}, "top_p"),
        ({"top_k": 0}, "top_k"),
    ],
)
def test_bad_request_fails_alone(tiny_llm, bad, field):
    good = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    engine = tiny_llm.engine
    rid_before = engine.add_request(prompt_token_ids=[5, 6, 7], params=good)
    params = SamplingParams(temperature=0, max_tokens=4)
    for key in ("stop_token_ids", "max_tokens", "temperature", "top_p", "top_k"):
        if key in bad:
            setattr(params, key, bad[key])  # bypass construction-time checks: the engine re-validates
    with pytest.raises(Exception) as err:
        engine.add_request(prompt=bad.get("prompt"), prompt_token_ids=bad.get("prompt_token_ids",
                           None if "prompt" in bad else [5, 6]), params=params)
    assert getattr(err.value, "field", None) == field and str(err.value).startswith(field)
    finished = {}
    while engine.has_unfinished():
        finished.update({o.request_id: o for o in engine.step()})
    assert finished[rid_before].finish_reason == "length" and len(finished[rid_before].token_ids) == 4


def test_generate_batch_with_one_bad_request(tiny_llm):
    outs = tiny_llm.generate(prompt_token_ids=[[5, 6, 7], [1, 10**6], [8, 9]], sampling_params=GREEDY,
                             use_tqdm=False)
    assert outs[1].finish_reason == "error" and "prompt_token_ids" in outs[1].error and "[0, 8192)" in outs[1].error
    assert outs[0].finish_reason == outs[2].finish_reason == "length"
    assert len(outs[0].token_ids) == len(outs[2].token_ids) == 12


def test_prompt_longer_than_max_model_len_never_reaches_model(tiny_llm, monkeypatch):
    engine = tiny_llm.engine
    seen: list[int] = []
    original = engine.runner.launch

    def spy(out, batch, prev=None):
        seen.extend(int(r) for r in out.request_ids)
        return original(out, batch, prev)

    monkeypatch.setattr(engine.runner, "launch", spy)
    long_prompt = [7] * (engine.max_model_len + 1)
    outs = tiny_llm.generate(prompt_token_ids=[long_prompt, [3, 4, 5]], sampling_params=GREEDY, use_tqdm=False)
    assert outs[0].finish_reason == "prompt_length_exceeded" and outs[0].token_ids == []
    assert outs[1].finish_reason == "length"
    assert outs[0].request_id not in seen and outs[1].request_id in seen


def test_prefill_budget_default_follows_the_device():
    """max_num_batched_tokens None = 8192 rows per step on CUDA (a prefill step's host cost barely
    grows with its tokens), 2048 on the CPU; an explicit value wins; a bad one names the field."""
    from deepinfer_engine.config import EngineConfig

    assert EngineConfig().batched_tokens_for("cuda") == 16384
    assert EngineConfig().batched_tokens_for("cpu") == 2048
    assert EngineConfig(max_num_batched_tokens=512).batched_tokens_for("cuda") == 512
    assert LLM(device="cpu", max_num_seqs=2, max_model_len=256).engine.max_num_batched_tokens == 2048
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        LLM(device="cpu", max_num_batched_tokens=0)
