"""The bad-request matrix: every class gets a 4xx OpenAI error envelope naming the field, the
server keeps serving a long request running beside them, and a good request after each works."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from deepinfer_engine.serving.launch import ServerProcess, scrape

MODEL = "deepinfer-default"
MAX_MODEL_LEN = 256
ARGS = ["--device", "cpu", "--block-size", "16", "--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", "8",
        "--num-speculative-tokens", "0", "--log-interval", "0"]
CMPL, CHAT = "/v1/completions", "/v1/chat/completions"
GOOD_CMPL = {"model": MODEL, "prompt": "def f(x):", "max_tokens": 2, "temperature": 0}
GOOD_CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 0}


def cmpl(**kw):
    return (CMPL, {**GOOD_CMPL, **kw})


def chat(**kw):
    return (CHAT, {**GOOD_CHAT, **kw})


def without(body: dict, key: str) -> dict:
    return {k: v for k, v in body.items() if k != key}


# (name, (path, body or raw bytes), expected status, expected `param`)
MATRIX = [
    ("bad_json", (CMPL, b'{"model": "x", "prompt": '), 400, "body"),
    ("body_not_object", (CMPL, b"[1, 2]"), 400, "body"),
    ("unknown_model", cmpl(model="gpt-17"), 404, "model"),
    ("missing_model", (CMPL, without(GOOD_CMPL, "model")), 400, "model"),
    ("missing_prompt", (CMPL, without(GOOD_CMPL, "prompt")), 400, "prompt"),
    ("empty_prompt", cmpl(prompt=""), 400, "prompt"),
    ("prompt_token_out_of_vocab", cmpl(prompt=[1, 2, 999999]), 400, "prompt"),
    ("prompt_wrong_type", cmpl(prompt={"text": "x"}), 400, "prompt"),
    ("temperature_wrong_type", cmpl(temperature="hot"), 400, "temperature"),
    ("temperature_out_of_range", cmpl(temperature=2.5), 400, "temperature"),
    ("top_p_zero", cmpl(top_p=0), 400, "top_p"),
    ("top_p_above_one", cmpl(top_p=1.5), 400, "top_p"),
    ("top_k_zero", cmpl(top_k=0), 400, "top_k"),
    ("max_tokens_zero", cmpl(max_tokens=0), 400, "max_tokens"),
    ("max_tokens_wrong_type", cmpl(max_tokens="ten"), 400, "max_tokens"),
    ("max_tokens_bool", cmpl(max_tokens=True), 400, "max_tokens"),
    ("n_zero", cmpl(n=0), 400, "n"),
    ("n_too_large", cmpl(n=1000), 400, "n"),
    ("seed_negative", cmpl(seed=-1), 400, "seed"),
    ("stop_too_many", cmpl(stop=[f"s{i}" for i in range(40)]), 400, "stop"),
    ("stop_wrong_type", cmpl(stop=[1, 2]), 400, "stop"),
    ("logprobs_too_many", cmpl(logprobs=50), 400, "logprobs"),
    ("presence_penalty_out_of_range", cmpl(presence_penalty=5), 400, "presence_penalty"),
    ("frequency_penalty_out_of_range", cmpl(frequency_penalty=-3), 400, "frequency_penalty"),
    ("repetition_penalty_zero", cmpl(repetition_penalty=0), 400, "repetition_penalty"),
    ("stream_wrong_type", cmpl(stream="yes"), 400, "stream"),
    ("stream_options_without_stream", cmpl(stream_options={"include_usage": True}), 400, "stream_options"),
    ("response_format_unknown_type", cmpl(response_format={"type": "xml"}), 400, "response_format.type"),
    ("response_format_schema_missing", cmpl(response_format={"type": "json_schema"}), 400, "response_format"),
    ("response_format_invalid_schema", cmpl(response_format={"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "properties": {"a": {"type": "no-such-type"}}}}}),
     400, "response_format"),
    ("response_format_invalid_regex", cmpl(response_format={"type": "regex", "regex": "(unclosed"}),
     400, "response_format"),
    ("prompt_over_max_model_len", cmpl(prompt=list(range(7, 7 + MAX_MODEL_LEN))), 400, "prompt"),
    ("max_tokens_over_context", cmpl(max_tokens=MAX_MODEL_LEN), 400, "max_tokens"),
    ("chat_empty_messages", chat(messages=[]), 400, "messages"),
    ("chat_unknown_role", chat(messages=[{"role": "wizard", "content": "x"}]), 400, "messages.role"),
    ("chat_top_logprobs_without_logprobs", chat(top_logprobs=3), 400, "top_logprobs"),
    ("chat_top_logprobs_too_many", chat(logprobs=True, top_logprobs=30), 400, "top_logprobs"),
    ("chat_max_completion_tokens_zero", chat(max_completion_tokens=0), 400, "max_completion_tokens"),
]


@pytest.fixture(scope="module", params=[1, 2], ids=["in-process", "2-api-workers"])
def server(request):
    # with API workers the engine's own checks answer through the link (the request's first delta)
    with ServerProcess(ARGS + ["--api-workers", str(request.param)]) as s:
        yield s


def test_matrix_has_at_least_20_classes():
    assert len(MATRIX) >= 20 and len({name for name, *_ in MATRIX}) == len(MATRIX)


def test_bad_requests_get_4xx_envelopes_naming_the_field(server):
    url = server.base_url
    bystander: dict = {}

    def long_request():   # runs through the whole matrix: the engine keeps serving it
        r = httpx.post(url + CMPL, json={**GOOD_CMPL, "max_tokens": 48, "ignore_eos": True}, timeout=600)
        bystander["status"], bystander["body"] = r.status_code, r.json()

    t = threading.Thread(target=long_request)
    t.start()
    failures = []
    with httpx.Client(base_url=url, timeout=300) as http:
        for name, (path, body), status, param in MATRIX:
            r = http.post(path, content=body, headers={"content-type": "application/json"}) \
                if isinstance(body, bytes) else http.post(path, json=body)
            err = r.json().get("error", {}) if r.headers.get("content-type", "").startswith("application/json") else {}
            if r.status_code != status or err.get("param") != param or param.split(".")[0] not in err.get("message", ""):
                failures.append((name, r.status_code, r.text[:300]))
            good_path, good = (CHAT, GOOD_CHAT) if path == CHAT else (CMPL, GOOD_CMPL)
            ok = http.post(good_path, json=good)
            if ok.status_code != 200 or not ok.json()["choices"]:
                failures.append((name + " (good request after)", ok.status_code, ok.text[:300]))
    t.join(600)
    assert not failures, failures
    assert bystander["status"] == 200 and bystander["body"]["usage"]["completion_tokens"] == 48
    # The last response can reach us before the engine loop's next step frees the request's
    # blocks and refreshes the gauges: every resource must be back within a few steps.
    deadline = time.monotonic() + 30
    while True:
        m = scrape(url)
        if m["deepinfer_kv_blocks_used"] == 0 and m["deepinfer_request_slots_used"] == 0:
            break
        assert time.monotonic() < deadline, m
        time.sleep(0.05)
    assert not any(k.startswith('deepinfer_http_errors_total{status="5') for k in m)


def test_unknown_route_and_method_get_envelopes(server):
    r = httpx.get(server.base_url + "/v1/nothing")
    assert r.status_code == 404 and "error" in r.json()
    r = httpx.get(server.base_url + CMPL)
    assert r.status_code == 405 and "error" in r.json()
