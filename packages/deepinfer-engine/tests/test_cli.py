"""`deepinfer generate`: one-line errors with exit status 2, the flags, and the demo's output parses."""

from __future__ import annotations

import ast
import json

import pytest
import torch

import deepinfer_engine
from deepinfer_engine import cli


@pytest.fixture
def shared_llm(tiny_llm, monkeypatch):
    """The CLI's LLM(...) returns the shared tiny engine; the kwargs it was built with are recorded."""
    made: dict = {}

    def factory(*args, **kwargs):
        made.update(kwargs, model=args[0] if args else None)
        return tiny_llm
    monkeypatch.setattr(deepinfer_engine, "LLM", factory)
    return made


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        rc = cli.main(list(argv))
    except SystemExit as e:   # argparse
        rc = e.code
    out = capsys.readouterr()
    return rc, out.out, out.err


def _one_line_error(rc: int, err: str, *needles: str) -> None:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
    for n in needles:
        assert n in lines[0], lines[0]


def test_version(capsys):
    rc, out, _ = _run(capsys, "--version")
    assert rc == 0 and out.startswith(f"deepinfer-engine {deepinfer_engine.__version__}")


def test_bad_request_value(capsys):
    rc, _, err = _run(capsys, "generate", "--prompt", "x", "--max-tokens", "0")
    _one_line_error(rc, err, "max_tokens", ">= 1")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_gpu(capsys):
    rc, _, err = _run(capsys, "generate", "--prompt", "x", "--device", "cuda")
    _one_line_error(rc, err, "device", "no CUDA device")


def test_missing_model_path(capsys, tmp_path):
    rc, _, err = _run(capsys, "generate", "--prompt", "x", "--model", str(tmp_path / "nope"))
    _one_line_error(rc, err, "model:", "nope")


def test_model_that_does_not_fit(capsys, monkeypatch):
    def too_big(*a, **k):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: "
                           "you tried to allocate 36238786560 bytes. Error code 12 (Cannot allocate memory)")
    monkeypatch.setattr(deepinfer_engine, "LLM", too_big)
    rc, _, err = _run(capsys, "generate", "--prompt", "x", "--model", "preset:flash")
    _one_line_error(rc, err, "does not fit in memory", "33.8 GiB")


def test_bad_json_schema_flag(capsys):
    rc, _, err = _run(capsys, "generate", "--prompt", "x", "--json-schema", "{not json")
    assert rc == 2 and "--json-schema" in err and "Traceback" not in err


def test_refused_schema(capsys):
    rc, _, err = _run(capsys, "generate", "--prompt", "x", "--json-schema", '{"not": {"type": "string"}}')
    _one_line_error(rc, err, "structured_output", "'not'")


def test_prompt_token_ids_shows_the_prompt(capsys, shared_llm, tiny_llm):
    rc, out, err = _run(capsys, "generate", "--prompt-token-ids", "1,400,52", "--max-tokens", "4", "--max-model-len", "128")
    assert rc == 0 and shared_llm["max_model_len"] == 128
    assert out.splitlines()[0] == "prompt token ids: [1, 400, 52]"
    assert tiny_llm.tokenizer.decode([1, 400, 52], skip_special_tokens=False) in out
    assert "finish_reason=length" in err


def test_json_schema_stop_and_logprobs(capsys, shared_llm):
    schema = {"type": "integer", "minimum": 10, "maximum": 99}
    rc, out, _ = _run(capsys, "generate", "--prompt", "n = ", "--json-schema", json.dumps(schema), "--temperature", "0.7",
                      "--seed", "1", "--max-tokens", "8")
    assert rc == 0 and 10 <= int(out.splitlines()[0][len("n = "):]) <= 99
    rc, out, _ = _run(capsys, "generate", "--prompt", "import os", "--max-tokens", "3", "--logprobs", "2")
    rows = [ln for ln in out.splitlines() if ln.strip()[:1].isdigit()]
    assert rc == 0 and len(rows) == 3 and all("|" in r for r in rows)
    rc, out, err = _run(capsys, "generate", "--prompt", "import os", "--max-tokens", "40", "--stop", "\n")
    assert rc == 0 and out == "import os" + out[len("import os"):] and out.count("\n") <= 1 + out.startswith("\n")


def test_demo_prints_a_function_that_parses(capsys):
    """`make demo` exactly (the embedded model, the device's default)."""
    rc, out, err = _run(capsys, "generate", "--prompt", "def fibonacci(n):", "--max-tokens", "64", "--temperature", "0")
    assert rc == 0 and out.startswith("def fibonacci(n):\n")
    tree = ast.parse(out)
    assert [type(n).__name__ for n in tree.body] == ["FunctionDef"]   # the function alone, nothing after it
    assert "finish_reason=stop, at the end of the function" in err


def test_function_end_is_only_for_block_headers(capsys, shared_llm, tiny_llm):
    rc, out, err = _run(capsys, "generate", "--prompt", "import os", "--max-tokens", "24")
    assert rc == 0 and "at the end of the function" not in err
    plain = tiny_llm.generate(["import os"], deepinfer_engine.SamplingParams(temperature=0, max_tokens=24),
                              use_tqdm=False)[0]
    assert out.rstrip("\n") == ("import os" + plain.text).rstrip("\n")

