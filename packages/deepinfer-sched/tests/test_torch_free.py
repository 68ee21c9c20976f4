"""deepinfer_sched must never import torch (it builds and tests without it)."""

import subprocess
import sys


def test_import_does_not_import_torch():
    code = (
        "import sys, deepinfer_sched, deepinfer_sched.testing, deepinfer_sched.step_vote;"
        "bad = [m for m in sys.modules if m == 'torch' or m.startswith('torch.')];"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
