"""packages/deepinfer-engine/diag/count_step_ops.py: the per-phase launch count of one padded decode step (the CPU proxy of
a launch-bound GPU step) runs and sees every phase."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "diag"))

from count_step_ops import _cuda_rms_norm_launches, count  # noqa: E402


def test_counts_every_phase_of_a_speculative_step():
    res = count("preset:tiny", nextn=3, batch=1)
    spec, by_function = res.by_phase, res.by_function
    plain = count("preset:tiny", nextn=0, batch=1).by_phase
    totals = {label: sum(ops.values()) for label, ops in spec.items()}
    assert set(totals) >= {"target forward", "draft head", "DFlash main keys", "sampler"}
    assert all(n > 0 for n in totals.values())
    assert spec["target forward"]["tilelang:sparse_mla_attention"] > 0      # TileLang ops count once each
    assert spec["target forward"]["rms_norm (CUDA)"] > 0 and spec["target forward"]["rsqrt"] == 0  # as on CUDA
    assert "draft head" not in plain and sum(totals.values()) > sum(sum(o.values()) for o in plain.values())
    # every launch is attributed to the function of ours that issued it
    assert sum(by_function.values()) == sum(totals.values()) and by_function["forward.py:run_layer"] > 0
    # and to the stream it goes to with decode side streams on: the capture stream and the side chains
    assert sum(res.by_stream.values()) == sum(totals.values())
    assert res.by_stream["main"] > 0 and res.by_stream["query"] > 0 and res.by_stream["compress"] > 0
    # the wrappers leave nothing behind: a second count in the same process counts the same
    assert count("preset:tiny", nextn=3, batch=1).by_phase == spec


def test_rms_norm_counts_its_cuda_launches():
    bf16 = torch.bfloat16
    x, w = torch.zeros(2, 64, dtype=bf16), torch.ones(64, dtype=bf16)
    assert _cuda_rms_norm_launches(x, w) == 1                      # torch's fused kernel
    assert _cuda_rms_norm_launches(x, w.float()) == 1              # the TileLang mixed-dtype kernel
    assert _cuda_rms_norm_launches(torch.zeros(2, 40, dtype=bf16), torch.ones(40)) == 3   # D % 32: casts + norm
    assert _cuda_rms_norm_launches(x.float(), w) == 2              # the weight to float32
    assert _cuda_rms_norm_launches(x, torch.ones(3, 1, 64, dtype=bf16)) == -1   # stacked: op by op


def test_greedy_and_general_sampling_variants_are_counted_apart():
    greedy = count("preset:tiny", nextn=0, batch=1, greedy=True).by_phase
    general = count("preset:tiny", nextn=0, batch=1, greedy=False).by_phase
    sampler = {name: sum(phases["sampler"].values()) for name, phases in (("greedy", greedy), ("general", general))}
    assert 0 < sampler["greedy"] < sampler["general"]    # the greedy fast path: argmax, no distributions
    assert greedy["target forward"] == general["target forward"]
