"""Structured output says what it cannot enforce: a JSON-schema keyword the grammar backend would
drop is refused naming the keyword, never silently ignored; every enforced schema's output
validates with `jsonschema` and, where the schema bounds its values, finishes before max_tokens;
the caps for unbounded strings / numbers."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jsonschema
import pytest

from deepinfer_engine import LLM, InvalidRequestError, SamplingParams
from deepinfer_engine.structured_output import StructuredOutput
from deepinfer_engine.structured_output.schema_check import check_schema

sys.path.insert(0, str(Path(__file__).parent))  # --import-mode=importlib: make the sibling data module importable
from schema_suite import ENFORCED, REFUSED, UNBOUNDED  # noqa: E402

MAX_TOKENS = 160
PROMPT = "# the answer, as JSON:\n"


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM(device="cpu", block_size=16, max_num_batched_tokens=256, max_num_seqs=64, max_model_len=512,
               num_speculative_tokens=0)


def _params(spec: StructuredOutput, seed: int = 3) -> SamplingParams:
    return SamplingParams(temperature=0.8, seed=seed, max_tokens=MAX_TOKENS, structured_output=spec)


def test_suite_covers_the_features():
    assert len(ENFORCED) >= 30
    text = json.dumps(ENFORCED)
    for feature in ('"properties"', '"items"', '"enum"', '"pattern"', '"$ref"', '"anyOf"', '"oneOf"', '"allOf"',
                    '"minimum"', '"exclusiveMaximum"', '"prefixItems"', '"const"', '"maxItems"'):
        assert feature in text, feature


def test_enforced_schemas_validate_and_finish(llm):
    specs = [StructuredOutput.json_schema(s) for s in ENFORCED]
    outs = llm.generate([PROMPT] * len(specs), [_params(s, seed=i) for i, s in enumerate(specs)], use_tqdm=False)
    for schema, out in zip(ENFORCED, outs):
        assert out.error is None, (schema, out.error)
        assert out.finish_reason == "stop", (schema, out.finish_reason, out.text)   # bounded: never "length"
        jsonschema.validate(json.loads(out.text), schema)


@pytest.mark.parametrize("schema, keyword", REFUSED, ids=[kw for _, kw in REFUSED])
def test_unenforceable_keyword_is_refused_by_name(schema, keyword):
    with pytest.raises(InvalidRequestError) as err:
        StructuredOutput.json_schema(schema).validate()
    assert err.value.field == "structured_output" and keyword in str(err.value)


def test_refusal_is_per_request_and_nothing_is_printed(llm, capfd):
    """A refused schema fails its own request only (in a batch with good ones), and xgrammar's
    native warnings never reach stderr (a warning that slips past the checks is a refusal too)."""
    good = StructuredOutput.json_schema(ENFORCED[0])
    bad = _params(good)
    bad.structured_output = StructuredOutput.json_schema({"type": "string", "pattern": "^a+$", "minLength": 2})
    outs = llm.generate([PROMPT, PROMPT], [bad, _params(good)], use_tqdm=False)
    assert outs[0].finish_reason == "error" and "pattern" in outs[0].error
    assert outs[1].finish_reason == "stop"
    jsonschema.validate(json.loads(outs[1].text), ENFORCED[0])
    assert "Warning" not in capfd.readouterr().err


def test_native_warning_becomes_the_requests_error(llm, capfd, monkeypatch):
    """Past the Python checks (forced off here), the backend's own warning is captured and refuses."""
    from deepinfer_engine.structured_output import spec as spec_module
    monkeypatch.setattr(spec_module.StructuredOutput, "checked_schema", lambda self: json.loads(self.value))
    schema = {"allOf": [{"type": "object", "properties": {"a": {"type": "integer", "maximum": 3}}, "required": ["a"]},
                        {"type": "object", "properties": {"b": {"type": "boolean"}}, "required": ["b"]}]}
    out = llm.generate([PROMPT], _params(StructuredOutput.json_schema(schema)), use_tqdm=False)[0]
    assert out.finish_reason == "error" and "cannot enforce" in out.error and "allOf" in out.error
    assert "Warning" not in capfd.readouterr().err


def test_all_of_is_merged():
    merged = check_schema(ENFORCED[26])
    assert "allOf" not in merged and merged["required"] == ["a", "b"] and set(merged["properties"]) == {"a", "b"}


def test_caps_bound_unbounded_values(llm):
    capped = [StructuredOutput.json_schema(s, max_string_length=12, max_integer_digits=4) for s in UNBOUNDED]
    outs = llm.generate([PROMPT] * len(capped), [_params(s, seed=i) for i, s in enumerate(capped)], use_tqdm=False)
    for schema, out in zip(UNBOUNDED, outs):
        assert out.finish_reason == "stop", (schema, out.finish_reason, out.text)
        value = json.loads(out.text)
        jsonschema.validate(value, schema)
        for v in (value.values() if isinstance(value, dict) else value if isinstance(value, list) else [value]):
            if isinstance(v, str):
                assert len(v) <= 12
            elif isinstance(v, (int, float)):
                assert abs(v) <= 9999
    with pytest.raises(InvalidRequestError, match="max_string_length"):
        StructuredOutput.json_schema({"type": "string"}, max_string_length=0).validate()


def _no_repeated_keys(pairs):
    keys = [k for k, _ in pairs]
    assert len(keys) == len(set(keys)), f"repeated keys {keys}"
    return dict(pairs)


def test_key_scanner():
    from deepinfer_engine.structured_output.unique_keys import START, advance
    assert advance(START, b'{"a": 1, "b": {"a": [{"a": 2}]}, "c": "a"}')[1] is False
    assert advance(START, b'{"a": 1, "b": 2, "a"')[1] is True
    assert advance(START, b'{"\\u0061": 1, "a"')[1] is True      # the same key, escaped
    state, _ = advance(START, b'{"ab": 1, "a')
    assert advance(state, b'b"')[1] is True and advance(state, b'bc"')[1] is False


def test_json_object_has_no_repeated_keys(llm):
    from deepinfer_engine.structured_output.unique_keys import START, advance
    prompts = ['config = {"name": "x", "name"', "# the answer, as JSON:\n", 'd = {"utf-8": "ascii", "ascii"']
    outs = llm.generate(prompts * 3, [SamplingParams(temperature=1.0, seed=s, max_tokens=MAX_TOKENS,
                                                     structured_output=StructuredOutput.json_object())
                                      for s in range(9)], use_tqdm=False)
    assert sum(o.text.count('":') for o in outs) >= 10      # the outputs do write keys
    for out in outs:
        assert out.error is None and out.text.startswith("{")
        if out.finish_reason == "stop":
            assert isinstance(json.loads(out.text, object_pairs_hook=_no_repeated_keys), dict)
        else:   # cut by max_tokens: the scanner (checked against json above) finds no repeat either
            assert advance(START, out.text.encode())[1] is False, out.text
