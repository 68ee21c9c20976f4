"""Decode-PPL regression of the shipped default model: greedy decoding of fixed prompts through the
engine must stay within the documented tolerance of ppl_baseline_<cpu|cuda>.json
(tools/default_model/baseline.py: |PPL / baseline - 1| <= 5% and >= 6 of 8 prompts with identical
greedy tokens). The CPU test runs in CI, the CUDA one on the GPU machine. Refresh with
tools/default_model/refresh_ppl_baseline.py [--device cuda] after a deliberate change."""

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

from default_model import baseline  # noqa: E402

DEFAULT_DIR = ROOT / "packages/deepinfer-model/src/deepinfer_model/default"


def _check_against_baseline(kind: str):
    if not (DEFAULT_DIR / "config.json").is_file():
        pytest.skip("no shipped default checkpoint (deepinfer_model/default/config.json) yet: "
                    "train it with tools/default_model/train.py")
    path = DEFAULT_DIR / f"ppl_baseline_{kind}.json"
    if not path.is_file():
        pytest.fail(f"{path} missing: run tools/default_model/refresh_ppl_baseline.py --device {kind}")
    stored = json.loads(path.read_text())
    current = baseline.decode_ppl(DEFAULT_DIR, kind)
    assert [p["prompt"] for p in current["prompts"]] == [p["prompt"] for p in stored["prompts"]], \
        "the baseline was made with other prompts: refresh it"
    ok, msg = baseline.compare(current, stored)
    assert ok, msg


def test_shipped_model_decode_ppl_matches_cpu_baseline():
    _check_against_baseline("cpu")


@pytest.mark.gpu
def test_shipped_model_decode_ppl_matches_cuda_baseline():
    _check_against_baseline("cuda")


def test_compare_flags_a_regression():
    base = {"decode_ppl": 2.0, "prompts": [{"token_ids": [1, 2]}] * 8}
    same = {"decode_ppl": 2.05, "prompts": [{"token_ids": [1, 2]}] * 8}
    assert baseline.compare(same, base)[0]
    assert not baseline.compare({**same, "decode_ppl": 2.3}, base)[0]
    flipped = {"decode_ppl": 2.0, "prompts": [{"token_ids": [1, 3]}] * 3 + [{"token_ids": [1, 2]}] * 5}
    assert not baseline.compare(flipped, base)[0]
