"""Optional torch profile of a DP rank's steps (DEEPINFER_DP_PROFILE_DIR=dir): the communication share.

At the rank's end it writes `rank{R}.trace.json` (chrome trace) and `rank{R}.json`: device time in
kernels overall and in NCCL kernels (names containing "nccl"), and their ratio.
"""

from __future__ import annotations

import contextlib
import json
import os

import torch

PROFILE_DIR_ENV = "DEEPINFER_DP_PROFILE_DIR"


@contextlib.contextmanager
def rank_profile(rank: int):
    path = os.environ.get(PROFILE_DIR_ENV)
    if not path:
        yield
        return
    os.makedirs(path, exist_ok=True)
    acts = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=acts) as prof:
        yield
    prof.export_chrome_trace(os.path.join(path, f"rank{rank}.trace.json"))
    total = nccl = 0.0
    for ev in prof.key_averages():
        t = getattr(ev, "self_device_time_total", 0.0) or 0.0
        total += t
        if "nccl" in ev.key.lower():
            nccl += t
    with open(os.path.join(path, f"rank{rank}.json"), "w") as f:
        json.dump({"rank": rank, "device_us": total, "nccl_us": nccl,
                   "comm_share": (nccl / total) if total else None}, f)
