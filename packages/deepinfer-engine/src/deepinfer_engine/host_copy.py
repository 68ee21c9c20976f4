"""Host -> device copies of the per-step inputs that never make the host wait for the device.

Zero-overhead scheduling launches step N+1 while step N runs. A copy from pageable memory does not
fit that: `non_blocking=False` (what `torch.tensor(..., device="cuda")` does) synchronizes the
stream, so the host would wait for step N to finish before it could enqueue step N+1, and CUDA may
stage a pageable `non_blocking` copy with a stream sync too. Page-locked memory from torch's
caching host allocator is copied asynchronously, and the allocator keeps the block until the copy
has run.
"""

from __future__ import annotations

import numpy as np
import torch


def to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A CPU tensor -> a new tensor on `device` with the same contents (never aliases `host`)."""
    if device.type != "cuda":
        return host.to(device, copy=True)
    return host.pin_memory().to(device, non_blocking=True)


def array_to_device(array: np.ndarray, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A numpy array (any layout, read-only too) -> a new `dtype` tensor on `device`."""
    return to_device(torch.tensor(np.asarray(array), dtype=dtype), device)


def values_to_device(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A list of Python numbers -> a new 1-D `dtype` tensor on `device`."""
    return to_device(torch.tensor(values, dtype=dtype), device)
