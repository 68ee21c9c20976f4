"""packages/deepinfer-engine/diag/trace_decode.py: replays found through the runtime call that launched their kernels, and the
device work between replays that no graph issued."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "diag"))

from trace_decode import slim_events, summarize  # noqa: E402


def _replays(n: int, period: float, span: float) -> list[dict]:
    """n replays of two kernels each (correlation 100 + i), an eager copy 10 us after each."""
    events = []
    for i in range(n):
        t = i * period
        events.append(dict(c="cuda_runtime", n="cudaGraphLaunch", ts=t - 50, d=20.0, s=-1, k=100 + i))
        events.append(dict(c="kernel", n="main_kernel", ts=t, d=span / 2, s=7, k=100 + i))
        events.append(dict(c="kernel", n="gemm", ts=t + span / 2, d=span / 2, s=7, k=100 + i))
        events.append(dict(c="gpu_memcpy", n="Memcpy HtoD (Pinned -> Device)", ts=t + span + 10, d=1.0, s=7, k=900 + i))
    return events


def test_summary_per_replay():
    s = summarize(_replays(20, period=1000.0, span=600.0), skip=2)
    assert s["replays"] == 16
    assert s["span_us"] == pytest.approx(600.0)
    assert s["interval_us"] == pytest.approx(1000.0)
    assert s["gap_us"] == pytest.approx(400.0)
    assert s["graph_launch_host_us"] == pytest.approx(20.0)
    assert s["outside_graph_ops"] == 1 and s["outside_graph_top"][0][0].startswith("Memcpy HtoD")
    # one replay's kernels grouped by (name, grid, block): TileLang kernels are all `main_kernel`
    assert s["kernels"] == 2 and s["kernel_us"] == pytest.approx(600.0)
    assert [(name, n, us) for (name, _, _), n, us in s["by_shape"]] == [("main_kernel", 1, 300.0), ("gemm", 1, 300.0)]


def test_too_few_replays_is_an_error():
    with pytest.raises(ValueError, match="at least 2 graph replays"):
        summarize(_replays(1, period=1000.0, span=600.0))


def test_slim_keeps_device_work_and_runtime_calls():
    raw = [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1.0, "dur": 2.0,
            "args": {"stream": 7, "correlation": 3, "grid": [4, 1, 1], "block": [128, 1, 1]}},
           {"ph": "X", "cat": "cpu_op", "name": "aten::add", "ts": 0.0, "dur": 1.0},
           {"ph": "i", "cat": "kernel", "name": "marker", "ts": 0.0}]
    assert slim_events(raw) == [dict(c="kernel", n="k", ts=1.0, d=2.0, s=7, k=3, g=[4, 1, 1], b=[128, 1, 1])]
