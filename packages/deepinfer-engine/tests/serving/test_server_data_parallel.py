"""`deepinfer serve --data-parallel-size 2` on the CPU (gloo): the official `openai` client gets the
single-process engine's greedy text, streaming concatenates to it, and /metrics sums the ranks."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import pytest

openai = pytest.importorskip("openai")

from deepinfer_engine import LLM, SamplingParams  # noqa: E402
from deepinfer_engine.serving.launch import ServerProcess, scrape  # noqa: E402

MODEL = "deepinfer-default"
ENGINE = {"block_size": 16, "max_model_len": 512, "max_num_seqs": 8, "num_speculative_tokens": 2}
ARGS = ["--device", "cpu", "--block-size", "16", "--max-model-len", "512", "--max-num-seqs", "8",
        "--num-speculative-tokens", "2", "--log-interval", "0", "--data-parallel-size", "2"]
PROMPTS = ["def add(a, b):", "class Stack:", "import os\n", "def parse(line):"]
SCHEMA = {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"],
          "additionalProperties": False}


def test_dp2_serve_matches_single_process_and_streams():
    single = LLM(device="cpu", **ENGINE)
    want = [o.text for o in single.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=12), use_tqdm=False)]
    with ServerProcess(ARGS) as server:
        client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="none", max_retries=0, timeout=300)

        def complete(prompt):
            return client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0)

        with ThreadPoolExecutor(len(PROMPTS)) as pool:   # concurrent: both ranks serve
            got = list(pool.map(complete, PROMPTS))
        assert [r.choices[0].text for r in got] == want
        chunks = list(client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=12, temperature=0,
                                                stream=True, stream_options={"include_usage": True}))
        assert "".join(c.choices[0].text for c in chunks if c.choices) == want[0]
        assert chunks[-1].usage.completion_tokens == got[0].usage.completion_tokens
        r = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "A record."}], max_tokens=30, temperature=0,
            response_format={"type": "json_schema", "json_schema": {"name": "rec", "schema": SCHEMA}})
        if r.choices[0].finish_reason == "stop":
            jsonschema.validate(json.loads(r.choices[0].message.content), SCHEMA)
        m = scrape(server.base_url)
        assert m["deepinfer_kv_blocks_total"] > 0 and m["deepinfer_kv_blocks_used"] == 0
        assert m["deepinfer_num_requests_running"] == 0
        assert m["deepinfer_grammar_compile_seconds_count"] >= 1      # compiled on a rank, reported here
        assert m["deepinfer_generation_tokens_total"] >= sum(r.usage.completion_tokens for r in got)
