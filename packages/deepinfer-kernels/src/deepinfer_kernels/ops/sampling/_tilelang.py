"""Plumbing shared by the TileLang kernels of the sampling and verification ops.

TileLang is imported only when a kernel is built, so the references never need it. Kernels are
written as factories returning a ``T.prim_func`` with dynamic sizes (one compile per dtype, not
per batch); ``compiled`` builds each once per process. ``lower_to_cuda_source`` runs the TileLang
front end and lowering passes without a GPU or nvcc, so CPU tests can check that every kernel
lowers and inspect the CUDA it emits.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

THREADS = 128  # threads per block of the one-thread-per-item kernels here


def uint64_const(T: Any, value: int) -> Any:  # noqa: N803 (T is the TileLang language module)
    """A uint64 constant (>= 2^63 allowed) as a bit-cast of its int64 view."""
    signed = value - (1 << 64) if value >= (1 << 63) else value
    return T.reinterpret(T.int64(signed), "uint64")


@functools.cache
def compiled(factory: Callable[..., Any], *args: Any) -> Any:
    """JIT-compile ``factory(*args)`` for the current CUDA device, once per process."""
    import tilelang

    return tilelang.compile(factory(*args), target="cuda")


def lower_to_cuda_source(factory: Callable[..., Any], *args: Any, arch: str = "sm_90") -> str:
    """CUDA source TileLang generates for ``factory(*args)``; needs no GPU."""
    import tilelang
    from tilelang import tvm

    target = tvm.target.Target({"kind": "cuda", "arch": arch})
    with target:
        return tilelang.lower(factory(*args), target=target).kernel_source
