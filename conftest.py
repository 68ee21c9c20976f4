"""Workspace-wide pytest hooks: `gpu` tests skip cleanly where no CUDA device is present.

Kept torch-optional so that deepinfer-sched's tests run on a machine without torch.
"""

import os

import pytest


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if _has_cuda():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


def pytest_configure(config):
    # The suites run many tiny ops; one intra-op thread avoids OpenMP spin-waits that make them
    # 20x slower on a loaded 2-core machine, and keeps CPU reductions in one fixed order. The
    # processes the tests start (tools/benchmark.py, `deepinfer serve`, the tools' runs) inherit
    # it through OMP_NUM_THREADS: with torch's default of one thread per core, a benchmark.py
    # prefill sweep took 117 s here instead of 8 s.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        import torch
    except ImportError:
        return
    torch.set_num_threads(1)
