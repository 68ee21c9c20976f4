"""diag/profile_step.py: one profiled step of the engine under torch.profiler, its op table."""

import subprocess
import sys
from pathlib import Path

DIAG = Path(__file__).resolve().parents[1] / "diag"


def test_profile_step_tool_runs_a_step(tmp_path):
    """On the CPU: one profiled prefill step, its header and the op table."""
    res = subprocess.run([sys.executable, str(DIAG / "profile_step.py"), "--model", "preset:tiny",
                          "--device", "cpu", "--mode", "prefill", "--batch", "2", "--prompt-len", "40",
                          "--max-num-batched-tokens", "256", "--top", "25"],
                         capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "== preset:tiny prefill batch 2 prompt 40: 0 kernels" in res.stdout   # no CUDA kernels on the CPU
    assert "aten::mm" in res.stdout   # top 25 by CPU time: in the top 5, copies and indexing can push it out
