"""The start-up log line on the TileLang kernels an engine start built or loaded."""

import logging

from deepinfer_engine import LLM, kernel_builds, llm_engine


def test_describe_kernel_builds_counts_only_this_starts_buckets(monkeypatch):
    monkeypatch.setenv("TILELANG_CACHE_DIR", "/data/tl")
    line = kernel_builds.describe_kernel_builds({"norm(1024,)": 2.0},
                                                {"norm(1024,)": 2.0, "matvec(8, 64)": 2.5, "rope(4,)": 0.5})
    assert line.startswith("TileLang: 2 kernel buckets ready in 3.0 s (slowest matvec(8, 64): 2.5 s)")
    assert "/data/tl" in line
    assert kernel_builds.describe_kernel_builds({"a": 1.0}, {"a": 1.0}) is None   # nothing new (the CPU)


def test_engine_start_logs_the_kernels_it_built(monkeypatch, caplog):
    """An engine start logs the buckets built between its first and last step (on the CPU none are:
    the builds are simulated), and nothing about kernels when there were none."""
    calls = iter([{}, {"greedy_partials('float32',)": 1.25}])
    monkeypatch.setattr(llm_engine, "kernel_build_seconds", lambda: next(calls))
    with caplog.at_level(logging.INFO, logger="deepinfer"):
        LLM(device="cpu", max_model_len=256)
    assert any("TileLang: 1 kernel buckets ready in 1.2 s" in r.getMessage() for r in caplog.records)
    caplog.clear()
    monkeypatch.setattr(llm_engine, "kernel_build_seconds", dict)   # nothing built
    with caplog.at_level(logging.INFO, logger="deepinfer"):
        LLM(device="cpu", max_model_len=256)
    assert not any("TileLang" in r.getMessage() for r in caplog.records)
