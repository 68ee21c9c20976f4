"""Host -> device copies of the per-step inputs that never make the host wait for the device.

Zero-overhead scheduling launches step N+1 while step N runs. A copy from pageable memory does not
fit that: `non_blocking=False` (what `torch.tensor(..., device="cuda")` does) synchronizes the
stream, so the host would wait for step N to finish before it could enqueue step N+1, and CUDA may
stage a pageable `non_blocking` copy with a stream sync too. Page-locked memory from torch's
caching host allocator is copied asynchronously, and the allocator keeps the block until the copy
has run.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

_NUMPY_DTYPES = {torch.int64: np.int64, torch.int32: np.int32, torch.bool: np.bool_, torch.float32: np.float32}
ALIGN_BYTES = 64   # every packed tensor starts this aligned (kernels may load vectors from it)


def to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A CPU tensor -> a new tensor on `device` with the same contents (never aliases `host`)."""
    if device.type != "cuda":
        return host.to(device, copy=True)
    return host.pin_memory().to(device, non_blocking=True)


def array_to_device(array: np.ndarray, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A numpy array (any layout, read-only too) -> a new `dtype` tensor on `device`."""
    return to_device(torch.tensor(np.asarray(array), dtype=dtype), device)


def arrays_to_device(items: Sequence[tuple[np.ndarray, torch.dtype]], device: torch.device) -> list[torch.Tensor]:
    """Several host arrays -> new device tensors, shaped like the arrays, with one staging buffer
    and one copy per dtype instead of one per array (the per-step metadata: 11 arrays, 3 dtypes).
    Each result is a view of its dtype's buffer starting at a multiple of ALIGN_BYTES."""
    out: list[torch.Tensor | None] = [None] * len(items)
    by_dtype: dict[torch.dtype, list[int]] = {}
    for i, (_, dtype) in enumerate(items):
        by_dtype.setdefault(dtype, []).append(i)
    for dtype, members in by_dtype.items():
        np_dtype = _NUMPY_DTYPES[dtype]
        step = max(1, ALIGN_BYTES // np.dtype(np_dtype).itemsize)
        parts, offsets, total = [], [], 0
        for i in members:
            a = np.asarray(items[i][0], dtype=np_dtype).reshape(-1)
            offsets.append(total)
            padded = -(-a.size // step) * step
            parts.append(a)
            if padded > a.size:
                parts.append(np.zeros(padded - a.size, dtype=np_dtype))
            total += padded
        flat = np.concatenate(parts) if parts else np.zeros(0, dtype=np_dtype)
        buf = to_device(torch.from_numpy(flat), device)
        for i, start in zip(members, offsets, strict=True):
            shape = np.shape(items[i][0])
            out[i] = buf[start: start + int(np.prod(shape, dtype=np.int64))].view(shape)
    return out  # type: ignore[return-value]
