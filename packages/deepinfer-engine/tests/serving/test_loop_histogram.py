"""LoopHistogram (the serving metrics' lock-free per-token histograms) exports what
prometheus_client's own Histogram does for the same observations."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from deepinfer_engine.serving.metrics import LATENCY_BUCKETS, LoopHistogram


def _samples(registry) -> dict[str, float]:
    out = {}
    for line in generate_latest(registry).decode().splitlines():
        if line and not line.startswith("#") and "_created" not in line:
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def test_matches_prometheus_histogram_bucket_for_bucket():
    ours_reg, ref_reg = CollectorRegistry(), CollectorRegistry()
    ours = LoopHistogram("x_seconds", "doc", LATENCY_BUCKETS, ours_reg)
    ref = Histogram("x_seconds", "doc", registry=ref_reg, buckets=LATENCY_BUCKETS)
    values = [0.0, 1e-4, 1.5e-4, 2e-3, 0.05, 0.7, 3.0, 1e3]   # on bounds, between, above all
    for i, v in enumerate(values):
        ours.observe(v, count=i + 1)     # k tokens of one delta: one call
        for _ in range(i + 1):
            ref.observe(v)
    got, want = _samples(ours_reg), _samples(ref_reg)
    assert got.keys() == want.keys()
    for k in want:
        assert abs(got[k] - want[k]) <= 1e-9 * max(1.0, abs(want[k])), k
    assert ours.count == sum(range(1, len(values) + 1))
