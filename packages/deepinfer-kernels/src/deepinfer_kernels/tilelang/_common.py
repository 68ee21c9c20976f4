"""Shared plumbing for the TileLang kernels: target, per-bucket compile cache, launch checks.

Nothing here imports TileLang at module import time.
"""

from __future__ import annotations

import importlib.util
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from deepinfer_kernels.envs import TILELANG_PDL_ENV, env_flag

# A plain "sm_90" target fails on warpgroup register reconfiguration; wgmma needs sm_90a.
TARGET = {"kind": "cuda", "arch": "sm_90a"}

# Programmatic dependent launch (DEEPINFER_TILELANG_PDL=1, read once per process): every kernel
# built here starts with `griddepcontrol.wait` (cudaGridDependencySynchronize) before it touches
# global memory, and TileLang then launches it with the programmatic-stream-serialization
# attribute, so its launch and CTA scheduling overlap the end of the kernel before it (a
# programmatic edge in a captured CUDA graph). Batch-1 decode is ~500 kernels of a few us each.
PDL = env_flag(TILELANG_PDL_ENV, False)


def pdl_sync() -> Any:
    """The wait of a PDL kernel (TileLang's `pdl_sync` intrinsic; imported when a kernel is built)."""
    from tilelang.cuda.language import pdl_sync as sync

    return sync()


_cache: dict[tuple, Any] = {}
_compile_seconds: dict[tuple, float] = {}
_lock = threading.Lock()


def is_available() -> bool:
    """TileLang importable (the kernels still need an SM90 device to run)."""
    return importlib.util.find_spec("tilelang") is not None


def compile_cached(name: str, key: tuple, build: Callable[[], Any], pass_configs: dict | None = None) -> Any:
    """Compile ``build()`` (a TileLang prim_func) once per ``(name, key)`` and cache the kernel."""
    full = (name, *key)
    kernel = _cache.get(full)
    if kernel is not None:
        return kernel
    with _lock:
        kernel = _cache.get(full)
        if kernel is None:
            import tilelang

            start = time.perf_counter()
            kernel = tilelang.compile(build(), target=TARGET, pass_configs=pass_configs or {})
            _compile_seconds[full] = time.perf_counter() - start
            _cache[full] = kernel
    return kernel


def compile_times() -> dict[str, float]:
    """``"name(key...)" -> seconds`` for every kernel compiled in this process."""
    return {f"{k[0]}{k[1:]}": v for k, v in _compile_seconds.items()}


def num_sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def require(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


def require_cuda(**tensors: torch.Tensor) -> torch.device:
    devices = {n: t.device for n, t in tensors.items()}
    first = next(iter(devices.values()))
    for n, d in devices.items():
        if d.type != "cuda":
            raise ValueError(f"{n}: TileLang kernels need CUDA tensors, got {d}")
        if d != first:
            raise ValueError(f"{n}: on {d}, expected {first} like the other arguments")
    return first


def aligned(t: torch.Tensor, nbytes: int) -> bool:
    return t.data_ptr() % nbytes == 0
