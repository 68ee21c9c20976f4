"""One bad request never breaks the engine (issue 50): every request field is checked before
anything is queued; whatever still raises while a request is added or run becomes that request's
error output, its state is removed, and the next request runs as on a fresh engine."""

from __future__ import annotations

import contextlib
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deepinfer_engine import LLM, InvalidRequestError, SamplingParams
from deepinfer_engine.request_state import RequestState

GOOD_PROMPT = "def add(a, b):"
GOOD = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


@pytest.fixture(scope="module")
def fresh() -> tuple[LLM, list[int]]:
    """A small engine (max_model_len 64 bounds every request) and its good request's tokens, taken
    before any bad request has run."""
    llm = LLM(device="cpu", block_size=16, max_num_batched_tokens=64, max_num_seqs=8, max_model_len=64,
              enable_mtp_varlen=False)
    return llm, llm.generate([GOOD_PROMPT], GOOD, use_tqdm=False)[0].token_ids


def _assert_serves(llm: LLM, reference: list[int]) -> None:
    out = llm.generate([GOOD_PROMPT], GOOD, use_tqdm=False)[0]
    assert out.finish_reason == "length" and out.token_ids == reference
    assert not llm.engine.has_unfinished() and not llm.engine.output_processor.requests


@contextlib.contextmanager
def _fault(llm: LLM, reference: list[int], monkeypatch, target, name: str, fake):
    """``target.name`` is ``fake`` inside the block; after it, the engine serves the good request
    as on a fresh engine."""
    monkeypatch.setattr(target, name, fake)
    yield
    monkeypatch.undo()
    _assert_serves(llm, reference)


def _assert_error_names_field(out, field: str, *limit: str) -> None:
    assert out.finish_reason == "error" and out.error.startswith(f"{field}:"), out.error
    for text in limit:
        assert text in out.error


# ------------------------------------------------------------------ the reproductions of the issue
def test_top_k_past_int32_is_refused_and_the_engine_keeps_serving(fresh):
    llm, reference = fresh
    with pytest.raises(InvalidRequestError, match=r"top_k: .*2147483647 \(int32\)"):
        SamplingParams(temperature=1, top_k=2**31, max_tokens=4)
    params = SamplingParams(temperature=1, max_tokens=4)
    params.top_k = 2**31   # past the constructor: the engine checks again before queueing
    out = llm.generate([GOOD_PROMPT], params, use_tqdm=False)[0]
    _assert_error_names_field(out, "top_k", "2147483647")
    assert not llm.engine.has_unfinished()
    _assert_serves(llm, reference)


def test_surrogate_prompt_fails_alone(fresh):
    llm, reference = fresh
    good, bad = llm.generate([GOOD_PROMPT, "s = '\ud800'"], GOOD, use_tqdm=False)
    _assert_error_names_field(bad, "prompt", "surrogate", "index 5")
    assert good.token_ids == reference
    _assert_serves(llm, reference)


@pytest.mark.parametrize("field, value", [("max_tokens", True), ("top_k", True), ("temperature", True),
                                          ("logprobs", False), ("seed", True), ("min_tokens", True)])
def test_bools_are_not_numbers(field, value):
    with pytest.raises(InvalidRequestError) as err:
        SamplingParams(**{field: value})
    assert err.value.field == field


def test_bool_prompt_token_id_is_refused(fresh):
    llm, _ = fresh
    out = llm.generate(prompt_token_ids=[[5, True, 7]], sampling_params=GOOD, use_tqdm=False)[0]
    _assert_error_names_field(out, "prompt_token_ids", "index 1")


def test_a_step_that_raises_fails_its_requests_and_the_engine_keeps_serving(fresh, monkeypatch):
    """The second step's launch raises (every step launches, with ZOS or without: `execute` too)."""
    llm, reference = fresh
    runner = llm.engine.runner
    original, launches = runner.launch, []

    def broken(*a, **kw):
        launches.append(1)
        if len(launches) == 2:
            raise RuntimeError("injected device failure\nsecond line")
        return original(*a, **kw)
    with _fault(llm, reference, monkeypatch, runner, "launch", broken):
        outs = llm.generate([GOOD_PROMPT, "import os"], GOOD, use_tqdm=False)
    assert len(launches) == 2
    assert all(o.finish_reason == "error" and o.error == "request: engine step failed: RuntimeError: injected "
               "device failure" for o in outs), [o.error for o in outs]


def test_an_output_that_raises_fails_that_request_only(fresh, monkeypatch):
    llm, reference = fresh
    original = RequestState.push_text

    def push_text(self, first_new):
        if self.output.prompt == "import os":
            raise ValueError("injected detokenizer failure")
        return original(self, first_new)
    with _fault(llm, reference, monkeypatch, RequestState, "push_text", push_text):
        bad, good = llm.generate(["import os", GOOD_PROMPT], GOOD, use_tqdm=False)
    assert bad.finish_reason == "error" and "injected detokenizer failure" in bad.error
    assert good.token_ids == reference


def test_a_failed_add_leaves_no_state(fresh, monkeypatch):
    llm, reference = fresh
    engine = llm.engine

    def broken_admit(request_id, token_ids):
        raise OverflowError("injected: out of bounds for int32")
    with _fault(llm, reference, monkeypatch, engine.output_processor, "_admit", broken_admit):
        out = llm.generate([GOOD_PROMPT], GOOD, use_tqdm=False)[0]
        _assert_error_names_field(out, "request", "could not be queued", "OverflowError")
        assert not engine.output_processor.requests and not engine.has_unfinished()


def test_interrupted_generate_leaves_nothing_queued(fresh, monkeypatch):
    llm, reference = fresh
    engine = llm.engine
    original = engine.step
    monkeypatch.setattr(engine, "step", lambda: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        llm.generate([GOOD_PROMPT], GOOD, use_tqdm=False)
    monkeypatch.setattr(engine, "step", original)
    while engine.has_unfinished():   # the abort's echo
        assert engine.step() == []
    _assert_serves(llm, reference)


# ------------------------------------------------------------------ the fuzz test
ODD_NUMBERS = st.one_of(
    st.integers(-(2**70), 2**70), st.sampled_from([2**31, 2**31 - 1, 2**63, 2**64, -1, 0, 1]),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([math.nan, math.inf, -math.inf, 1e-300, 1e300]),
    st.booleans(), st.none(), st.text(max_size=3))
FIELDS = ("temperature", "top_p", "top_k", "max_tokens", "min_tokens", "seed", "logprobs", "prompt_logprobs",
          "ignore_eos", "include_stop_str_in_output", "stop_at_function_end")
TEXT = st.text(st.characters(codec=None, categories=None), max_size=12) | st.sampled_from(
    ["\ud800", "a\udfffb", "", "\x00", "\U0010ffff" * 3])
PROMPT = TEXT | st.lists(ODD_NUMBERS, max_size=6)
FIELD_VALUES = st.dictionaries(
    st.sampled_from(FIELDS + ("stop", "stop_token_ids")), ODD_NUMBERS | st.lists(ODD_NUMBERS | TEXT, max_size=3),
    max_size=4)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(prompt=PROMPT, fields=FIELD_VALUES, with_good=st.booleans())
def test_fuzz_no_exception_escapes_and_the_next_request_is_unaffected(fresh, prompt, fields, with_good):
    llm, reference = fresh
    params = SamplingParams(temperature=0, max_tokens=4)
    for name, value in fields.items():   # past the constructor's checks: the engine's must hold
        setattr(params, name, value)
    prompts = [prompt] + ([GOOD_PROMPT] if with_good else [])
    sampling = [params] + ([GOOD] if with_good else [])
    if isinstance(prompt, str):
        outs = llm.generate(prompts, sampling, use_tqdm=False)
    else:
        ids = [prompt] + ([llm.tokenizer.encode(GOOD_PROMPT)] if with_good else [])
        outs = llm.generate(prompt_token_ids=ids, sampling_params=sampling, use_tqdm=False)
    assert len(outs) == len(prompts)
    bad = outs[0]
    assert bad.finish_reason is not None
    if bad.finish_reason == "error":
        field = bad.error.split(":", 1)[0]
        assert field in FIELDS + ("stop", "stop_token_ids", "prompt", "prompt_token_ids"), bad.error
    if with_good:
        assert outs[1].token_ids == reference
    _assert_serves(llm, reference)


@pytest.mark.parametrize("ids, bad_index", [([1, 2, 3], None), ([np.int64(5), 7], None), ([1, True, 2], 1),
                                            ([3, -1], 1), ([0, 10 ** 9], 1), ([0, 10 ** 12], 1), ([2, 1.0], 1), ([2, "3"], 1)])
def test_prompt_ids_fast_and_slow_paths_agree(ids, bad_index):
    """Plain in-range ints pass the C-speed check; anything else takes the per-token path, which
    names the first bad id's index."""
    from deepinfer_engine.request_validation import validate_request
    params = SamplingParams(max_tokens=1)
    if bad_index is None:
        out = validate_request(None, ids, params, tokenizer=None, vocab_size=100)
        assert out.token_ids == [int(t) for t in ids] and all(type(t) is int for t in out.token_ids)
        assert out.token_array.dtype == np.int32 and out.token_array.tolist() == out.token_ids
        # a CheckedPrompt passes again without its ids being re-read (the server checks once, off the loop)
        assert validate_request(None, out, params, tokenizer=None, vocab_size=100) is out
    else:
        with pytest.raises(InvalidRequestError, match=f"at index {bad_index} is outside the vocabulary"):
            validate_request(None, ids, params, tokenizer=None, vocab_size=100)
