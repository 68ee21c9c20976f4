"""64 concurrent streaming clients, a third of which disconnect mid-stream: the KV blocks and
request slots return to idle within a step of the last disconnect (read from /metrics), and every
other client's output equals its solo output (greedy, batch-invariant forward)."""

from __future__ import annotations

import asyncio
import time

import pytest

openai = pytest.importorskip("openai")

from deepinfer_engine.serving.launch import ServerProcess, scrape  # noqa: E402

MODEL = "deepinfer-default"
ARGS = ["--device", "cpu", "--block-size", "16", "--max-model-len", "256", "--max-num-seqs", "64",
        "--num-speculative-tokens", "2", "--log-interval", "0"]
PROMPTS = ["def add(a, b):", "class Stack:", "import os\n", "def parse(line):", "for i in range(", "try:\n    ",
           "def __init__(self, name):", "with open(path) as f:"]
NUM_CLIENTS, SOLO_TOKENS, LONG_TOKENS = 64, 10, 200


@pytest.fixture(scope="module", params=[1, 2], ids=["in-process", "2-api-workers"])
def server(request):
    # batch-invariant forward: a request's greedy tokens do not depend on what it is batched with;
    # with 2 API workers the clients' connections spread over two HTTP processes
    with ServerProcess(ARGS + ["--api-workers", str(request.param)], env={"DEEPINFER_BATCH_INVARIANT": "1"}) as s:
        yield s


async def _stream(client, prompt: str, max_tokens: int, disconnect_after: int | None, gate: asyncio.Event | None):
    """Stream one completion; with disconnect_after, close the connection after that many chunks
    (after `gate` is set, when given). Returns the text received."""
    text = ""
    stream = await client.completions.create(model=MODEL, prompt=prompt, max_tokens=max_tokens, temperature=0,
                                             stream=True, extra_body={"ignore_eos": disconnect_after is not None})
    n = 0
    async for chunk in stream:
        text += chunk.choices[0].text
        n += 1
        if disconnect_after is not None and n >= disconnect_after and (gate is None or gate.is_set()):
            await stream.close()
            return None
    return text


def test_disconnects_free_everything_and_others_are_unaffected(server):
    url = server.base_url
    before = scrape(url)
    assert before["deepinfer_kv_blocks_used"] == 0 and before["deepinfer_request_slots_used"] == 0

    async def run():
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=600)
        solo = {p: await _stream(client, p, SOLO_TOKENS, None, None) for p in PROMPTS}
        survivors_done = asyncio.Event()
        tasks, kinds = [], []
        for i in range(NUM_CLIENTS):
            p = PROMPTS[i % len(PROMPTS)]
            if i % 3 == 2:          # a third disconnect; the last one only after every survivor finished
                last = i == NUM_CLIENTS - 2
                tasks.append(_stream(client, p, LONG_TOKENS, 2 + i % 5, survivors_done if last else None))
                kinds.append(("disconnect", p))
            else:
                tasks.append(_stream(client, p, SOLO_TOKENS, None, None))
                kinds.append(("survivor", p))
        running = [asyncio.ensure_future(t) for t in tasks]
        survivors = [t for t, k in zip(running, kinds) if k[0] == "survivor"]
        await asyncio.gather(*survivors)
        survivors_done.set()
        results = await asyncio.gather(*running)
        t_last = time.monotonic()
        await client.close()
        return solo, kinds, results, t_last

    solo, kinds, results, _ = asyncio.run(run())
    num_disconnects = sum(k == "disconnect" for k, _ in kinds)
    assert num_disconnects == NUM_CLIENTS // 3
    for (kind, p), text in zip(kinds, results):
        if kind == "survivor":
            assert text == solo[p], p
        else:
            assert text is None
    deadline = time.monotonic() + 60
    while True:
        m = scrape(url)
        idle = (m["deepinfer_kv_blocks_used"] == 0 and m["deepinfer_request_slots_used"] == 0
                and m["deepinfer_num_requests_live"] == 0 and m["deepinfer_mtp_slots_used"] == 0)
        if idle and m["deepinfer_aborts_total"] == num_disconnects:
            break
        assert time.monotonic() < deadline, m
        time.sleep(0.05)
    # the loop applied the last abort after step last_abort_step; blocks and slots were idle by the next
    assert 0 <= m["deepinfer_resources_idle_step"] - m["deepinfer_last_abort_step"] <= 1
    assert m['deepinfer_requests_finished_total{finish_reason="abort"}'] == num_disconnects
