"""tools/chat_replay.py on the CPU with the default model (4 chats, 3 turns): the warm run serves
most input tokens from the prefix cache, produces the cold run's tokens, and writes the result rows;
once per window KV layout (the GPU runner replays both)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[1] / "tools" / "chat_replay.py"
SMALL = ["--conversations", "4", "--turns", "3", "--system-tokens", "256", "--user-tokens", "16",
         "--max-tokens", "8", "--block-size", "32"]


def _tool():
    spec = importlib.util.spec_from_file_location("chat_replay", TOOL)
    mod = sys.modules[spec.name] = importlib.util.module_from_spec(spec)   # (its dataclasses look it up)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("layout", ["ring", "paged"])
def test_chat_replay_warm_equals_cold_and_hits(tmp_path, layout, capsys):
    out = tmp_path / "rows.jsonl"
    rows = _tool().main(SMALL + ["--window-kv", layout, "--trace-steps", "--json-out", str(out)])
    by = {r["what"]: r for r in rows}
    assert by["warm_outputs_equal_cold"]["value"] == 1.0
    # each turn's prompt is cached but its tail: the new message, the YOCO tail and, with rings,
    # back to a 128-token SWA snapshot point (0.58 ring / 0.83 paged at these short prompts)
    assert by["input_token_hit_rate"]["value"] > {"ring": 0.5, "paged": 0.75}[layout]
    assert 0 < by["ttft_warm_ms"]["value"] and by["ttft_warm_ms"]["baseline_value"] > 0
    assert [json.loads(line)["what"] for line in out.read_text().splitlines()] == [r["what"] for r in rows]
    assert f"--window-kv {layout}" in rows[0]["command"]
    assert capsys.readouterr().out.count("last first token after") == 2 * 3   # per turn, cold and warm
