"""AsyncLLM: deltas from any thread, aborts in every phase free blocks and slots at once, no spin
when idle, /health's stuck detection; and LLMEngine's abort of a request waiting for its grammar."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from deepinfer_engine import SamplingParams
from deepinfer_engine.config import EngineConfig
from deepinfer_engine.llm_engine import LLMEngine
from deepinfer_engine.serving.async_llm import IDLE_WAKE_S, AsyncLLM
from deepinfer_engine.structured_output.compiler import GrammarCompilerService
from deepinfer_engine.structured_output.spec import StructuredOutput

CONFIG = dict(device="cpu", block_size=16, max_num_batched_tokens=64, max_num_seqs=8, max_model_len=512,
              num_speculative_tokens=2, enable_mtp_varlen=False)
SCHEMA = StructuredOutput.json_schema({"type": "object", "properties": {"a": {"type": "integer"}}})


@pytest.fixture(scope="module")
def llm():
    a = AsyncLLM(LLMEngine(EngineConfig(**CONFIG)))
    yield a
    a.shutdown()


def _idle(engine) -> bool:
    s = engine.scheduler
    return s.num_free_blocks() == s.config.num_blocks and s.num_running() == 0 and s.num_waiting() == 0 \
        and s.num_used_mtp_slots() == 0


def _wait(pred, timeout_s=60.0):
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def test_engine_abort_while_waiting_for_grammar_never_runs_it():
    engine = LLMEngine(EngineConfig(**CONFIG))
    ids = engine.encode("x = ")
    rid = engine.add_request(None, ids, SamplingParams(temperature=0, max_tokens=8, structured_output=SCHEMA))
    other = engine.add_request(None, ids, SamplingParams(temperature=0, max_tokens=4))
    assert engine.output_processor.is_held(rid) and engine.abort_request(rid)
    finished = {}
    while engine.has_unfinished():
        for out in engine.step():
            finished[out.request_id] = out
    assert finished[rid].finish_reason == "abort" and finished[rid].token_ids == []
    assert finished[other].finish_reason == "length" and len(finished[other].token_ids) == 4
    assert _idle(engine) and not engine.output_processor.has_held and not engine.structured_output.tickets


def test_deltas_concatenate_and_match_offline(llm):
    ids = llm.engine.encode("def add(a, b):")
    params = SamplingParams(temperature=0.8, seed=5, max_tokens=16, logprobs=1)
    deltas = asyncio.run(llm.generate(prompt_token_ids=ids, params=params))
    assert deltas[-1].finished and all(not d.finished for d in deltas[:-1])
    tokens = [t for d in deltas for t in d.token_ids]
    assert len(tokens) == deltas[-1].num_output_tokens == 16
    assert sum(len(d.logprobs) for d in deltas) == 16
    # the same seed through the same engine, synchronously
    again = asyncio.run(llm.generate(prompt_token_ids=ids, params=params))
    assert [t for d in again for t in d.token_ids] == tokens
    assert "".join(d.text for d in again) == "".join(d.text for d in deltas)


def test_add_request_from_a_plain_thread(llm):
    ids = llm.engine.encode("import sys")
    box = {}

    def worker():
        stream = llm.add_request(prompt_token_ids=ids, params=SamplingParams(temperature=0, max_tokens=5))

        async def consume():
            return [d async for d in stream]
        box["deltas"] = asyncio.run(consume())

    t = threading.Thread(target=worker)
    t.start()
    t.join(120)
    assert sum(len(d.token_ids) for d in box["deltas"]) == 5


def _abort_after(llm, stream_params, ids, wait_for) -> list:
    async def run():
        stream = llm.add_request(prompt_token_ids=ids, params=stream_params)
        deltas = []
        await asyncio.to_thread(_wait, lambda: wait_for(stream))
        stream.abort()
        async for d in stream:
            deltas.append(d)
        return deltas
    return asyncio.run(run())


def test_abort_while_waiting_for_grammar(llm, monkeypatch):
    original = GrammarCompilerService._compile_now

    def slow(self, spec):
        time.sleep(1.0)
        return original(self, spec)
    monkeypatch.setattr(GrammarCompilerService, "_compile_now", slow)
    ids = llm.engine.encode("config = ")
    params = SamplingParams(temperature=0, max_tokens=8, structured_output=StructuredOutput.json_schema(
        {"type": "object", "properties": {"slow": {"type": "string"}}}))
    deltas = _abort_after(llm, params, ids, lambda s: s.request_id is not None and llm.engine.output_processor.is_held(s.request_id))
    assert deltas[-1].finish_reason == "abort" and not any(d.token_ids for d in deltas)
    time.sleep(1.5)   # the compilation finishes later: the request must not start then
    assert _idle(llm.engine) and not llm.engine.has_unfinished()


def test_abort_while_prefilling(llm):
    ids = (llm.engine.encode("def walk(path):\n    for name in os.listdir(path):\n") * 30)[:400]
    steps0 = llm.state.num_steps

    def mid_prefill(stream):
        seq = stream.request_id is not None and llm.engine.scheduler.get_sequence(stream.request_id)
        return bool(seq) and 0 < seq.num_committed_tokens and seq.num_tokens < seq.prefill_len
    deltas = _abort_after(llm, SamplingParams(temperature=0, max_tokens=8), ids, mid_prefill)
    assert deltas[-1].finish_reason == "abort" and not any(d.token_ids for d in deltas)
    _wait(lambda: _idle(llm.engine))
    assert llm.state.num_steps - steps0 < 400 // 64 + 3


def test_abort_while_decoding_frees_within_a_step(llm):
    ids = llm.engine.encode("class Stack:")

    def decoding(stream):
        return stream.num_tokens_sent >= 3
    deltas = _abort_after(llm, SamplingParams(temperature=0, max_tokens=400, ignore_eos=True), ids, decoding)
    assert deltas[-1].finish_reason == "abort"
    assert 3 <= sum(len(d.token_ids) for d in deltas) < 400
    assert _idle(llm.engine)                                        # freed when the abort was applied
    assert llm.state.num_steps - llm.state.last_abort_step <= 2   # final output within ZOS's step lag


def test_no_spin_when_idle(llm):
    _wait(lambda: not llm.engine.has_unfinished())
    steps, wakes = llm.state.num_steps, llm.state.num_idle_wakeups
    time.sleep(2.5 * IDLE_WAKE_S)
    assert llm.state.num_steps == steps
    assert llm.state.num_idle_wakeups - wakes <= 4
    assert llm.is_healthy() == (True, "ok")


class _StuckEngine:
    """An engine whose step blocks until released (a hung device) or raises."""

    def __init__(self, fail: bool = False):
        self.release = threading.Event()
        self.live = False
        self.fail = fail

    def start_streaming(self):
        pass

    def validate_request(self, prompt, ids, params):
        from deepinfer_engine.request_validation import CheckedPrompt
        return CheckedPrompt.of(list(ids))

    def add_request(self, prompt, ids, params):
        self.live = True
        return 0

    def abort_request(self, rid):
        return False

    def has_unfinished(self):
        return self.live

    def step(self):
        if self.fail:
            raise RuntimeError("device lost")
        self.release.wait(30)
        self.live = False
        return []

    def pop_stream_deltas(self):
        return []


def test_health_fails_when_the_loop_is_stuck():
    engine = _StuckEngine()
    a = AsyncLLM(engine, stuck_after_s=0.3)
    assert a.is_healthy()[0]
    a.add_request(prompt_token_ids=[1], params=SamplingParams(max_tokens=1))
    time.sleep(0.8)
    ok, why = a.is_healthy()
    assert not ok and "step running" in why
    engine.release.set()
    _wait(lambda: a.is_healthy()[0], 5)
    a.shutdown()


def test_a_failing_step_fails_its_requests_and_health():
    a = AsyncLLM(_StuckEngine(fail=True))
    stream = a.add_request(prompt_token_ids=[1], params=SamplingParams(max_tokens=1))

    async def consume():
        return [d async for d in stream]
    deltas = asyncio.run(consume())
    assert deltas[-1].finish_reason == "error" and "device lost" in deltas[-1].error
    assert not a.is_healthy()[0]
    with pytest.raises(RuntimeError):
        a.add_request(prompt_token_ids=[1])
