"""packages/deepinfer-engine/diag/profile_ops.py: kernels between a call's two marker kernels count for that call's label."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "diag"))

from profile_ops import attribute  # noqa: E402

M = "spin_kernel"


def test_kernels_between_markers_belong_to_the_call():
    kernels = [("gemm", 4.0), (M, 1.0), ("main_kernel", 3.0), ("main_kernel", 5.0), (M, 1.0), ("add", 1.0),
               (M, 1.0), ("main_kernel", 2.0), (M, 1.0), (M, 1.0), (M, 1.0)]   # the last call launched nothing
    got = attribute(kernels, ["routed_experts", "rms_norm", "rms_norm"], M)
    assert dict(got.by_label) == {"routed_experts": [1, 8.0], "rms_norm": [2, 2.0]}
    assert dict(got.by_kernel) == {"gemm": [1, 4.0], "add": [1, 1.0]}
    assert got.total_us == 15.0   # markers count for nothing


@pytest.mark.parametrize("kernels,labels", [
    ([(M, 1.0), ("k", 1.0)], ["a"]),                     # a call never closed
    ([(M, 1.0), (M, 1.0)], ["a", "b"]),                  # a labelled call without markers
    ([(M, 1.0), (M, 1.0), (M, 1.0), (M, 1.0)], ["a"]),   # markers without a label
])
def test_mismatched_markers_fail_loudly(kernels, labels):
    with pytest.raises(ValueError):
        attribute(kernels, labels, M)
