"""The TileLang kernels an engine start built or loaded: how many and how long, for its start-up log.

On the GPU the first start compiles every kernel bucket its model's shapes need (minutes for `mini` on
a cold cache: a few seconds each). TileLang keeps compiled kernels on disk (``TILELANG_CACHE_DIR``,
default ``~/.tilelang/cache``), so a later start loads each in ~0.1 s. The log line tells a user which
of the two a start was, and where the cache lives.
"""

from __future__ import annotations

import os

from deepinfer_kernels.tilelang import compile_times

DEFAULT_TILELANG_CACHE = "~/.tilelang/cache"


def kernel_build_seconds() -> dict[str, float]:
    """``"name(key...)" -> seconds`` of every kernel bucket this process has built or loaded so far."""
    return dict(compile_times())


def describe_kernel_builds(before: dict[str, float], after: dict[str, float]) -> str | None:
    """The log line for the buckets in ``after`` and not in ``before`` (None: there are none, e.g.
    on the CPU, where no TileLang kernel runs)."""
    new = {k: v for k, v in after.items() if k not in before}
    if not new:
        return None
    slowest = max(new, key=new.__getitem__)
    cache = os.environ.get("TILELANG_CACHE_DIR", DEFAULT_TILELANG_CACHE)
    return (f"TileLang: {len(new)} kernel buckets ready in {sum(new.values()):.1f} s (slowest {slowest}: "
            f"{new[slowest]:.1f} s); compiled kernels are cached under {cache}, so a later start loads them")
