"""Batch-invariant kernel choices: while active, a row's result does not depend on how many rows
share the call.

Two TileLang launch decisions depend on the row count and change a row's floating-point result:
- sparse MLA splits the index list across CTAs (split-KV) when few rows leave SMs idle, and the
  split partials are combined in a different order than one CTA accumulates them: invariant mode
  fixes the split count at 1;
- routed experts switch between TileLang (small calls) and `torch._grouped_mm` (large calls), and
  TileLang's tiles between decode and prefill shapes: invariant mode always takes TileLang with
  the decode tiles (the K loop then runs in the same blocks for every token).

The engine's `DEEPINFER_BATCH_INVARIANT=1` enters `batch_invariant_kernels()` around every model
entry point (deepinfer_engine/batch_invariant.py); kernels read `batch_invariant_enabled()` when
they plan a launch (and so at CUDA-graph capture).
"""

from __future__ import annotations

import contextlib

_depth = 0   # a plain global (dynamo reads it as a constant)


def batch_invariant_enabled() -> bool:
    return _depth > 0


@contextlib.contextmanager
def batch_invariant_kernels():
    global _depth
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
