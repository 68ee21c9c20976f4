"""tools/count_step_ops.py: the per-phase launch count of one padded decode step (the CPU proxy of
a launch-bound GPU step) runs and sees every phase."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

from count_step_ops import count  # noqa: E402


def test_counts_every_phase_of_a_speculative_step():
    spec = count("preset:tiny", nextn=3, batch=1)
    plain = count("preset:tiny", nextn=0, batch=1)
    totals = {label: sum(ops.values()) for label, ops in spec.items()}
    assert set(totals) >= {"target forward", "draft head", "DFlash main keys", "sampler"}
    assert all(n > 0 for n in totals.values())
    assert spec["target forward"]["tilelang:sparse_mla_attention"] > 0      # TileLang ops count once each
    assert "draft head" not in plain and sum(totals.values()) > sum(sum(o.values()) for o in plain.values())
