"""Warm the L2 cache with the first bytes of a weight a later kernel will read (a hint, no result).

A batch-1 decode step alternates weight reads that stream at HBM speed with latency-bound stretches
(routing, the indexer chain, sparse attention over a few hundred keys) during which HBM idles.
Fetching the head of the next weight into L2 during such a stretch, from a side stream, moves those
bytes off the step's critical path: the weight's kernel then finds them in L2.

The region warmed is chosen for the way a one-row or few-row projection reads W [N, K] (every CTA
streams its rows along K, all CTAs in step): the first `row_bytes` of every row when rows are wide
(``PrefetchRegion.whole_rows`` False), else whole rows from the start (a contiguous prefix), within
`budget_bytes`. L2 holds ~50 MB on the H100 / H200, and what is warmed must survive until it is read.

The CPU has nothing to warm: `l2_prefetch_ref` does nothing, and no op's result depends on whether
a prefetch ran (CUDA only changes the timing).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from deepinfer_kernels.ops._checks import check_tensor
from deepinfer_kernels.platform import tilelang_launcher

CHUNK_BYTES = 16384        # bytes per prefetch request of a contiguous prefix
MIN_ROW_BYTES = 2048       # a per-row prefix shorter than this is too many small requests: whole rows
MAX_ROW_PREFIX = 65536     # the kernel issues at most 4 requests of CHUNK_BYTES per row
MAX_SPAN_BYTES = 2 ** 31 - 1   # the kernel's byte offsets are int32


@dataclass(frozen=True)
class PrefetchRegion:
    """What `l2_prefetch` fetches of a weight: rows [0, rows) x the first `row_bytes` bytes of each,
    rows `stride_bytes` apart (`whole_rows`: row_bytes == stride_bytes, one contiguous prefix, which
    the kernel issues in CHUNK_BYTES requests)."""

    rows: int
    row_bytes: int
    stride_bytes: int

    @property
    def whole_rows(self) -> bool:
        return self.row_bytes == self.stride_bytes

    @property
    def nbytes(self) -> int:
        return self.rows * self.row_bytes


def prefetch_region(weight: torch.Tensor, budget_bytes: int) -> PrefetchRegion | None:
    """The region of `weight` (contiguous, 1-D or 2-D) that `l2_prefetch` warms within `budget_bytes`
    (None: nothing, budget or weight empty). Sizes are multiples of 16 bytes (the request granule)."""
    if budget_bytes < 0:
        raise ValueError(f"budget_bytes={budget_bytes}: must be >= 0")
    nbytes = weight.numel() * weight.element_size()
    if budget_bytes < 16 or nbytes < 16:
        return None
    if weight.dim() == 2:
        rows, stride = weight.shape[0], weight.shape[1] * weight.element_size()
        per_row = min(budget_bytes // rows, stride, MAX_ROW_PREFIX) // 16 * 16
        if per_row >= MIN_ROW_BYTES and per_row < stride and stride % 16 == 0 and nbytes <= MAX_SPAN_BYTES:
            return PrefetchRegion(rows, per_row, stride)
    prefix = min(budget_bytes, nbytes, MAX_SPAN_BYTES) // CHUNK_BYTES * CHUNK_BYTES
    if prefix == 0:
        prefix = min(budget_bytes, nbytes) // 16 * 16
    return PrefetchRegion(1, prefix, prefix)


def l2_prefetch_ref(weight: torch.Tensor, budget_bytes: int) -> None:
    """The CPU path: no cache to warm (and no result: the op only changes timing on CUDA)."""
    prefetch_region(weight, budget_bytes)   # the same argument checks


def l2_prefetch(weight: torch.Tensor, budget_bytes: int) -> None:
    """Fetch `prefetch_region(weight, budget_bytes)` into L2, asynchronously (one launch on SM90; a
    no-op elsewhere). weight: contiguous 1-D or 2-D tensor; budget_bytes >= 0."""
    check_tensor("weight", weight)
    if weight.dim() not in (1, 2):
        raise ValueError(f"weight: expected 1 or 2 dims, got shape {tuple(weight.shape)}")
    if not weight.is_contiguous():
        raise ValueError("weight: must be contiguous")
    kernel = tilelang_launcher("l2_prefetch", weight.device, supported=weight.data_ptr() % 16 == 0)
    if kernel is None:
        return l2_prefetch_ref(weight, budget_bytes)
    return kernel(weight, budget_bytes)
