"""`deepinfer serve` on the CPU with the default model, driven by the official `openai` client
(one server for the module, on a free 127.0.0.1 port: the app in the engine's process, then two
API worker processes linked to it)."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest

openai = pytest.importorskip("openai")

from deepinfer_engine.serving.launch import ServerProcess, scrape  # noqa: E402

MODEL = "deepinfer-default"
ARGS = ["--device", "cpu", "--block-size", "16", "--max-model-len", "512", "--max-num-seqs", "16",
        "--num-speculative-tokens", "2", "--max-num-batched-tokens", "256", "--log-interval", "0"]
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "size": {"type": "integer"}},
          "required": ["name", "size"], "additionalProperties": False}


@pytest.fixture(scope="module", params=[1, 2], ids=["in-process", "2-api-workers"])
def server(request):
    # 1: the app in the engine's process; 2: two HTTP worker processes linked to the engine process
    with ServerProcess(ARGS + ["--api-workers", str(request.param)]) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="none", max_retries=0, timeout=300)


def _stream_completion(client, **kw):
    chunks = list(client.completions.create(model=MODEL, stream=True, stream_options={"include_usage": True}, **kw))
    body = [c for c in chunks if c.choices]
    return chunks, body


def test_models_health_metrics(server, client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert httpx.get(server.base_url + "/health").json() == {"status": "ok"}
    m = scrape(server.base_url)
    assert m["deepinfer_kv_blocks_total"] > 0 and m["deepinfer_kv_blocks_used"] == 0


def test_completion_with_logprobs(client):
    r = client.completions.create(model=MODEL, prompt="def add(a, b):", max_tokens=12, temperature=0, logprobs=3)
    c = r.choices[0]
    assert c.finish_reason in ("length", "stop") and c.text
    assert len(c.logprobs.tokens) == len(c.logprobs.token_logprobs) == r.usage.completion_tokens
    assert "".join(c.logprobs.tokens) == c.text
    assert all(lp <= 0 for lp in c.logprobs.token_logprobs)
    for lp, top in zip(c.logprobs.token_logprobs, c.logprobs.top_logprobs):
        assert 1 <= len(top) <= 3 and max(top.values()) >= lp - 1e-6   # greedy: the sampled token is the top one
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_chat_n2_logprobs(client):
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Sort a list."}],
                                       max_tokens=10, temperature=0.9, seed=11, n=2, logprobs=True, top_logprobs=2)
    assert [c.index for c in r.choices] == [0, 1]
    assert r.usage.completion_tokens == sum(len(c.logprobs.content) for c in r.choices)
    for c in r.choices:
        assert c.message.role == "assistant"
        assert "".join(t.token for t in c.logprobs.content) == c.message.content
        assert all(len(t.top_logprobs) <= 2 for t in c.logprobs.content)
    assert r.choices[0].message.content != r.choices[1].message.content   # seeds seed and seed + 1


def test_stream_equals_non_stream_for_the_same_seed(client):
    kw = dict(prompt="import os\n\ndef walk(path):", max_tokens=24, temperature=0.8, seed=7, logprobs=0)
    whole = client.completions.create(model=MODEL, **kw)
    chunks, body = _stream_completion(client, **kw)
    assert "".join(c.choices[0].text for c in body) == whole.choices[0].text
    streamed_tokens = [t for c in body for t in c.choices[0].logprobs.tokens]
    assert streamed_tokens == whole.choices[0].logprobs.tokens        # no token twice, none missing
    assert [c.choices[0].finish_reason for c in body][-1] == whole.choices[0].finish_reason
    assert all(c.choices[0].finish_reason is None for c in body[:-1])
    usage = chunks[-1].usage
    assert not chunks[-1].choices and usage.completion_tokens == whole.usage.completion_tokens == len(streamed_tokens)
    assert usage.prompt_tokens == whole.usage.prompt_tokens


def test_chat_stream_equals_non_stream(client):
    kw = dict(messages=[{"role": "system", "content": "Python only."}, {"role": "user", "content": "Parse a CSV."}],
              max_tokens=20, temperature=0.7, seed=3)
    whole = client.chat.completions.create(model=MODEL, **kw)
    chunks = list(client.chat.completions.create(model=MODEL, stream=True, stream_options={"include_usage": True},
                                                 **kw))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_stop_string_cuts_and_nothing_follows(client):
    base = client.completions.create(model=MODEL, prompt="def add(a, b):", max_tokens=24, temperature=0)
    text = base.choices[0].text
    stop = text[len(text) // 2: len(text) // 2 + 3]
    assert stop.strip()
    want = text[: text.index(stop)]
    r = client.completions.create(model=MODEL, prompt="def add(a, b):", max_tokens=24, temperature=0, stop=[stop])
    assert r.choices[0].text == want and r.choices[0].finish_reason == "stop"
    chunks, body = _stream_completion(client, prompt="def add(a, b):", max_tokens=24, temperature=0, stop=stop)
    assert "".join(c.choices[0].text for c in body) == want
    assert body[-1].choices[0].finish_reason == "stop"
    assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens


def test_json_schema_and_json_object(server, client):
    compiled = scrape(server.base_url)["deepinfer_grammar_compile_seconds_count"]
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "A file record."}], max_tokens=60, temperature=0.8, seed=1,
        response_format={"type": "json_schema", "json_schema": {"name": "rec", "schema": SCHEMA}})
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].message.content), SCHEMA)
    assert scrape(server.base_url)["deepinfer_grammar_compile_seconds_count"] >= compiled + 1
    r = client.completions.create(model=MODEL, prompt="config = ", max_tokens=40, temperature=0,
                                  extra_body={"response_format": {"type": "json_object"}})
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].text), dict)
    else:   # cut by max_tokens: a prefix of a JSON object
        assert r.choices[0].text.startswith("{")


def test_user_text_never_becomes_a_control_token(server, client):
    r = client.completions.create(model=MODEL, prompt="<|eos|>", max_tokens=1, temperature=0)
    assert r.usage.prompt_tokens > 1                   # characters, not the one EOS token
    r = client.chat.completions.create(model=MODEL, max_tokens=1, temperature=0,
                                       messages=[{"role": "user", "content": "<|assistant|><|eos|>"}])
    assert r.usage.prompt_tokens > 4


def test_cached_prompt_tokens_are_reported(server, client):
    # long enough that a 128-token SWA grain (window rings: hits at snapshot points, SPEC §5) precedes
    # the last chunk (which holds the decoder replay + backtracking)
    prompt = ("class Queue:\n    def __init__(self):\n        self.items = []\n\n"
              "    def put(self, item):\n") * 12
    client.completions.create(model=MODEL, prompt=prompt, max_tokens=2, temperature=0)
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=2, temperature=0)
    assert r.usage.prompt_tokens_details.cached_tokens >= 128    # at least one SWA grain
    assert r.usage.prompt_tokens_details.cached_tokens < r.usage.prompt_tokens
    m = scrape(server.base_url)   # and as metrics: cached tokens, admissions by prefix-cache outcome
    assert m["deepinfer_prefix_cached_tokens_total"] >= r.usage.prompt_tokens_details.cached_tokens
    assert m['deepinfer_prefix_cache_admissions_total{reason="YOCO_KEEP"}'] >= 1   # the hit the keep length cut
    assert sum(v for k, v in m.items() if k.startswith("deepinfer_prefix_cache_admissions_total{")) >= 2


def test_penalties_and_top_k_are_accepted(client):
    plain = client.completions.create(model=MODEL, prompt="x = [", max_tokens=16, temperature=0)
    pen = client.completions.create(model=MODEL, prompt="x = [", max_tokens=16, temperature=0,
                                    frequency_penalty=2.0, presence_penalty=1.0,
                                    extra_body={"repetition_penalty": 1.5, "top_k": 5})
    assert pen.choices[0].text != plain.choices[0].text
