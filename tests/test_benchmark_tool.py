"""tools/benchmark.py on the CPU: the decode rows it reports (rounds pooled over fresh prompts,
the fixed and variable-length rows, drafts verified per step) and its argument checks."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def _bench(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "tools" / "benchmark.py"), "--device", "cpu",
                           "--model", "preset:tiny", "--prompt-len", "24", "--max-model-len", "256",
                           "--no-prefill", "--warmup-steps", "2", "--steps", "3", *extra],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)


def test_decode_rows_pool_rounds_and_count_drafts(tmp_path):
    out = tmp_path / "rows.jsonl"
    res = _bench(tmp_path, "--decode-batch-sizes", "2", "--nextn-list", "0,3", "--varlen-compare",
                 "--rounds", "2", "--result-jsonl", str(out), "--json-out", str(tmp_path / "results.json"))
    assert res.returncode == 0, res.stderr[-2000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    # --json-out: the same run as result rows, each speculative row beside nextn 0 of this run
    results = json.loads((tmp_path / "results.json").read_text())
    assert [r["what"] for r in results] == ["decode, preset:tiny, batch 2", "decode, preset:tiny, batch 2, nextn 3",
                                            "decode, preset:tiny, batch 2, nextn 3 variable-length"]
    assert [r["value"] for r in results] == [round(r["tokens_per_s_real"], 1) for r in rows]
    assert results[0]["ratio"] is None and results[0]["series"] == "decode_vs_batch" and results[0]["x"] == 2
    for r in results[1:]:
        assert r["group"] == "speculation" and r["baseline"] == "nextn 0"
        assert r["baseline_value"] == results[0]["value"] and r["ratio"] == round(r["value"] / r["baseline_value"], 3)
    assert all(r["command"].startswith("python tools/benchmark.py --device cpu") and r["date"] for r in results)
    assert [(r["nextn"], r["varlen"]) for r in rows] == [(0, False), (3, False), (3, True)]
    for r in rows:
        assert r["kind"] == "decode" and r["batch"] == 2 and r["rounds"] == 2
        assert r["avg_sps"] > 0 and r["tokens_per_s_real"] > 0 and r["prefill_steps_in_window"] == 0
        assert isinstance(r["gc_pauses_in_window"], dict)
    plain, fixed, varlen = rows
    assert plain["drafts_verified_per_step"] == 0
    assert fixed["drafts_verified_per_step"] == 2 * 3          # every request verifies nextn drafts
    assert 0 < varlen["drafts_verified_per_step"] <= 2 * 3
    assert "step_time_fit" not in fixed and varlen["step_time_fit"]["slope_ms_per_row"] >= 0


def test_batch_one_reports_the_weight_bytes_a_step_reads(tmp_path):
    """Batch 1 without speculation: weight bytes per step (active-decode params + lm_head) and
    weights / step time; not with drafts (the draft head reads more)."""
    sys.path.insert(0, str(ROOT / "tools"))
    from benchmark import weight_bytes_per_decode_step

    from deepinfer_model import param_counts
    from deepinfer_model.model import V41ForCausalLM
    from deepinfer_model.presets import tiny

    cfg = tiny()
    model = V41ForCausalLM(cfg, device="cpu", dtype=torch.bfloat16)
    assert weight_bytes_per_decode_step(model) == 2 * (param_counts(cfg).active_decode + cfg.vocab_size * cfg.hidden_size)
    out = tmp_path / "rows.jsonl"
    res = _bench(tmp_path, "--decode-batch-sizes", "1", "--nextn-list", "0,3", "--result-jsonl", str(out))
    assert res.returncode == 0, res.stderr[-2000:]
    plain, spec = [json.loads(line) for line in out.read_text().splitlines()]
    assert plain["weight_bytes_per_step"] > 0
    assert abs(plain["weight_read_tb_s"] - plain["weight_bytes_per_step"] * plain["avg_sps"] / 1e12) < 1e-12
    assert "weight_bytes_per_step" not in spec


@pytest.mark.gpu
def test_steady_state_period_on_gpu(tmp_path):
    """On CUDA a decode row also reports the period between step completions (CUDA events, idle
    included): at least the median device span, the rate its inverse, and the roofline fraction
    over it beside the wall-clock one."""
    out = tmp_path / "rows.jsonl"
    res = subprocess.run([sys.executable, str(ROOT / "tools" / "benchmark.py"), "--device", "cuda",
                          "--model", "preset:tiny", "--prompt-len", "24", "--max-model-len", "256",
                          "--no-prefill", "--warmup-steps", "4", "--steps", "12", "--rounds", "2",
                          "--decode-batch-sizes", "1", "--result-jsonl", str(out)],
                         capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    ceilings, row = rows
    assert ceilings["kind"] == "ceilings" and row["kind"] == "decode"
    assert row["period_ms"] >= 0.9 * row["device_step_ms"] > 0
    assert row["idle_gap_max_ms"] >= row["idle_gap_ms"] and row["num_slow_gaps"] >= len(row["slow_gaps"])
    assert abs(row["avg_sps_period"] * row["period_ms"] - 1e3) < 1e-6
    assert abs(row["weight_read_tb_s_period"] - row["weight_bytes_per_step"] * row["avg_sps_period"] / 1e12) < 1e-12
    assert abs(row["weight_read_fraction_of_copy_period"] * ceilings["copy_bw_tb_s"]
               - row["weight_read_tb_s_period"]) < 1e-9


def test_host_timers_need_one_round(tmp_path):
    res = _bench(tmp_path, "--decode-batch-sizes", "1", "--rounds", "2", "--host-timers")
    assert res.returncode == 2 and "--host-timers needs --rounds 1" in res.stderr


def test_prefill_chunk_sweep(tmp_path):
    """--prefill-chunk-sizes: one prefill row per budget, each with its chunk size; the prefill
    steps of a bigger budget carry more tokens (4 x 48 prompt tokens a round: 64 a step, or all 192)."""
    out = tmp_path / "prefill.jsonl"
    res = subprocess.run([sys.executable, str(ROOT / "tools" / "benchmark.py"), "--device", "cpu",
                          "--model", "preset:tiny", "--prompt-len", "48", "--max-model-len", "256",
                          "--decode-batch-sizes", "", "--prefill-batch", "4", "--prefill-chunk-sizes", "64,256",
                          "--result-jsonl", str(out)], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["kind"], r["chunk_tokens"]) for r in rows] == [("prefill", 64), ("prefill", 256)]
    assert all(r["tokens_per_s"] > 0 for r in rows)
    assert rows[0]["tokens_per_step"] <= 64 < rows[1]["tokens_per_step"] <= 256


def test_pipelined_prefill_row_counts_the_window_of_queued_rounds(tmp_path):
    """--prefill-pipelined: the synchronous row, then the ZOS row over queued rounds (window: the
    rounds after the first and before the last, whole rounds of prompt tokens give or take the
    step in flight at each end)."""
    out = tmp_path / "rows.jsonl"
    res = subprocess.run([sys.executable, str(ROOT / "tools" / "benchmark.py"), "--device", "cpu",
                          "--model", "preset:tiny", "--prompt-len", "24", "--max-model-len", "256",
                          "--decode-batch-sizes", "", "--prefill-batch", "4", "--max-num-batched-tokens", "48",
                          "--prefill-pipelined", "--prefill-rounds", "4", "--result-jsonl", str(out)],
                         capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    sync, piped = [json.loads(line) for line in out.read_text().splitlines()]
    assert sync["kind"] == piped["kind"] == "prefill"
    assert sync["pipelined"] is False and piped["pipelined"] is True and piped["zos"] is True
    assert piped["rounds"] == 4 and piped["tokens_per_s"] > 0
    per_round = 4 * 24
    assert 2 * per_round - 48 <= piped["window_tokens"] <= 2 * per_round + 48   # +- one 48-token step
