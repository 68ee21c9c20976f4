"""tools/load_bench.py end to end on the CPU with the default model (a tiny workload): result rows
as JSON in the agreed layout, the latency plot, and (slow) the offline comparison row."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
TOOL = Path(__file__).resolve().parents[1] / "tools" / "load_bench.py"
KEYS = {"group", "what", "value", "unit", "baseline", "baseline_value", "ratio", "device", "date", "command"}
SMALL = ["--device", "cpu", "--num-requests", "6", "--prompt-lens", "16,40", "--output-lens", "3,6",
         "--json-share", "0.34", "--max-num-seqs", "8", "--max-model-len", "256", "--block-size", "16",
         "--num-speculative-tokens", "2"]


def _run(tmp_path, extra):
    out, png = tmp_path / "rows.json", tmp_path / "lat.png"
    subprocess.run([sys.executable, str(TOOL), *SMALL, *extra, "--json-out", str(out), "--plot", str(png),
                    "--server-log", str(tmp_path / "server.log")], check=True, timeout=900, cwd=tmp_path)
    rows = json.loads(out.read_text())
    assert rows and all(set(r) == KEYS for r in rows)
    assert png.stat().st_size > 1000
    return {r["what"]: r for r in rows}


@pytest.mark.parametrize("clients", [1, 3])   # in this process, or spread over processes on one clock
def test_load_bench_rates_rows_and_plot(tmp_path, clients):
    rows = _run(tmp_path, ["--rates", "8,inf", "--client-processes", str(clients)])
    for rate in ("8", "inf"):
        assert rows[f"rate={rate} errors"]["value"] == 0
        assert rows[f"rate={rate} tok_s"]["value"] > 0
        assert 0 < rows[f"rate={rate} ttft_p50_ms"]["value"] <= rows[f"rate={rate} ttft_p99_ms"]["value"]
    over = rows["saturation server overhead per token"]
    assert over["baseline"] == "engine step per token" and over["baseline_value"] > 0


@pytest.mark.slow
def test_load_bench_compare_offline(tmp_path):
    rows = _run(tmp_path, ["--rates", "inf", "--compare-offline"])
    row = rows["saturation throughput vs offline LLM.generate"]
    assert row["baseline_value"] > 0 and row["ratio"] == pytest.approx(row["value"] / row["baseline_value"])
