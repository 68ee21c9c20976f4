"""The engine process / API worker link (serve --api-workers): an EngineClient in this process
over a WorkerHub's unix socket, against the AsyncLLM it forwards to. Outputs equal the engine's
own, bad input fails in the first delta naming the field, an abort or a worker that goes away
frees the engine's blocks, and a worker's /health fails without heartbeats."""

from __future__ import annotations

import asyncio
import time

import pytest

from deepinfer_engine import SamplingParams
from deepinfer_engine.config import EngineConfig
from deepinfer_engine.llm_engine import LLMEngine
from deepinfer_engine.serving import engine_link as link
from deepinfer_engine.serving.api_worker import EngineClient
from deepinfer_engine.serving.async_llm import AsyncLLM
from deepinfer_engine.serving.metrics import ServingMetrics
from deepinfer_engine.serving.worker_hub import WorkerHub

CONFIG = dict(device="cpu", block_size=16, max_num_batched_tokens=64, max_num_seqs=8, max_model_len=256,
              num_speculative_tokens=2)


@pytest.fixture(scope="module")
def hub():
    metrics = ServingMetrics(log_interval_s=0)
    llm = AsyncLLM(LLMEngine(EngineConfig(**CONFIG)), observer=metrics)
    e = llm.engine
    h = WorkerHub(llm, metrics, link.ServerInfo("m", "", e.tokenizer, e.vocab_size, e.max_model_len, 16))
    yield h
    h.close()
    llm.shutdown()


def _client(hub) -> EngineClient:
    return EngineClient(hub.address, hub.authkey)


def _idle(hub) -> bool:
    s = hub.llm.engine.scheduler
    return s.num_free_blocks() == s.config.num_blocks and s.num_running() == 0 and s.num_waiting() == 0 \
        and hub.llm.state.num_live == 0


def _wait(pred, timeout_s=60.0):
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def test_the_handshake_carries_what_the_app_needs(hub):
    client = _client(hub)
    info = client.info
    assert (info.model_name, info.vocab_size, info.max_model_len, info.default_max_tokens) == \
        ("m", hub.llm.engine.vocab_size, 256, 16)
    assert info.tokenizer.encode("def f():") == hub.llm.engine.encode("def f():")
    _wait(lambda: len(hub.links) >= 1)


def test_deltas_through_the_link_equal_the_engines_own(hub):
    client = _client(hub)
    ids = hub.llm.engine.encode("def add(a, b):")
    params = SamplingParams(temperature=0.7, seed=3, max_tokens=20, logprobs=2)

    async def both():
        remote = [d async for d in client.add_request(None, ids, params)]
        local = await hub.llm.generate(prompt_token_ids=ids, params=params)
        return remote, local
    remote, local = asyncio.run(both())
    assert remote[-1].finished and remote[-1].finish_reason == "length"
    assert [t for d in remote for t in d.token_ids] == [t for d in local for t in d.token_ids]
    assert "".join(d.text for d in remote) == "".join(d.text for d in local)
    assert [x for d in remote for x in d.logprobs] == [x for d in local for x in d.logprobs]
    assert remote[-1].num_output_tokens == 20 and remote[-1].num_prompt_tokens == len(ids)


def test_many_concurrent_requests_each_get_their_own_stream(hub):
    client = _client(hub)
    prompts = [hub.llm.engine.encode(p) for p in ("import os", "class A:", "x = [", "def g(y):")] * 4

    async def run():
        async def one(ids, n):
            stream = client.add_request(None, ids, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
            return [t async for d in stream for t in d.token_ids]
        return await asyncio.gather(*(one(ids, 4 + i) for i, ids in enumerate(prompts)))
    outs = asyncio.run(run())
    assert [len(o) for o in outs] == [4 + i for i in range(len(prompts))]
    assert outs[0][:4] == outs[4][:4] == outs[8][:4]   # same prompt, greedy: same start
    _wait(lambda: _idle(hub))


def test_an_invalid_request_fails_in_its_first_delta_naming_the_field(hub):
    client = _client(hub)

    vocab = hub.llm.engine.vocab_size

    async def run():
        return [d async for d in client.add_request(None, [1, vocab + 5], SamplingParams(max_tokens=4))]
    deltas = asyncio.run(run())
    assert len(deltas) == 1 and deltas[0].finish_reason == "error" and not deltas[0].token_ids
    assert deltas[0].error.startswith("prompt") and str(vocab) in deltas[0].error


def test_abort_from_the_worker_frees_the_engine(hub):
    client = _client(hub)
    ids = hub.llm.engine.encode("class Stack:")

    async def run():
        stream = client.add_request(None, ids, SamplingParams(temperature=0, max_tokens=200, ignore_eos=True))
        got = []
        async for d in stream:
            got.append(d)
            if sum(len(x.token_ids) for x in got) >= 3 and not stream.abort_requested:
                stream.abort()
        return got
    deltas = asyncio.run(run())
    assert deltas[-1].finish_reason == "abort" and sum(len(d.token_ids) for d in deltas) < 200
    _wait(lambda: _idle(hub))


def test_a_worker_that_goes_away_aborts_its_requests(hub):
    client = _client(hub)
    ids = hub.llm.engine.encode("def walk(path):")
    aborts = hub.llm.state.num_aborts

    async def start():
        stream = client.add_request(None, ids, SamplingParams(temperature=0, max_tokens=200, ignore_eos=True))
        await stream.__anext__()
    asyncio.run(start())
    client.close()   # as when the worker process dies
    _wait(lambda: _idle(hub))
    assert hub.llm.state.num_aborts == aborts + 1


def test_health_follows_the_heartbeat(hub):
    client = _client(hub)
    _wait(lambda: time.monotonic() - client._health_at < link.HEARTBEAT_S)
    assert client.is_healthy() == (True, "ok")
    client.stale_after_s = 0.0   # as if the engine process stopped answering
    ok, why = client.is_healthy()
    assert not ok and "no heartbeat" in why


def test_metrics_come_from_the_engine_process(hub):
    client = _client(hub)
    client.count_http_error(418)
    _wait(lambda: hub.metrics.http_errors.labels("418")._value.get() == 1)
    text = asyncio.run(client.scrape()).decode()
    assert 'deepinfer_http_errors_total{status="418"} 1.0' in text
    assert "deepinfer_api_workers_connected" in text


def test_the_handshake_comes_before_any_heartbeat(hub, monkeypatch):
    monkeypatch.setattr(link, "HEARTBEAT_S", 0.0005)   # heartbeats all but continuous
    for _ in range(30):
        client = _client(hub)
        assert isinstance(client.info, link.ServerInfo)
        client.close()
