"""Capture safety of the op wrappers: which implementation runs, and a sync-free masked row write.

A CUDA graph (and a decode step that should overlap with the host) cannot contain a host sync:
no `.item()`, `int(t)`, `bool(t)`, `.tolist()`, `.nonzero()`, boolean-mask indexing, or any op whose
output *shape* depends on tensor values. The op wrappers therefore have two torch implementations
where the reference needs a sync:

- the `<op>_ref` reference (the CPU path and the oracle; free to skip empty work), and
- a *capturable* variant: same values, static shapes, no sync (used on CUDA).

`use_capturable(t)` picks the variant: always for tensors on an accelerator, on the CPU while
dynamo traces (`torch.compile(fullgraph=True)` is the CPU check of capturability) or inside
`force_capturable()` (tests run the CUDA code path on the CPU with it). Value checks that read
tensors run only where `host_checks(t)` is true: exactly where the capturable variants do not
run (CPU tensors, not tracing, not forced); on CUDA they are `ForwardMetadata.validate()`'s job.
"""

from __future__ import annotations

import contextlib
import threading

import torch

from deepinfer_kernels.platform import tilelang_launcher

_state = threading.local()


def _forced() -> bool:
    return getattr(_state, "forced", False)


@contextlib.contextmanager
def force_capturable(enabled: bool = True):
    """Run the capturable variants on the CPU too (tests; nests and restores)."""
    prev = _forced()
    _state.forced = enabled
    try:
        yield
    finally:
        _state.forced = prev


def _tracing() -> bool:
    return torch.compiler.is_compiling()


def use_capturable(t: torch.Tensor) -> bool:
    """True where the sync-free variant must run: non-CPU tensors, dynamo tracing, forced."""
    return t.device.type != "cpu" or _tracing() or _forced()


def host_checks(t: torch.Tensor) -> bool:
    """Value checks (which read tensor values) run only where `use_capturable(t)` is false."""
    return not use_capturable(t)


def write_rows_ref(dst: torch.Tensor, idx: torch.Tensor, src: torch.Tensor) -> None:
    """dst[idx[i]] = src[i] for every i with idx[i] >= 0 (boolean mask: syncs on CUDA)."""
    keep = idx >= 0
    if not bool(keep.any()):
        return
    dst[idx[keep].long()] = src[keep].to(dst.dtype)


def write_rows_capturable(dst: torch.Tensor, idx: torch.Tensor, src: torch.Tensor) -> None:
    """Same result as `write_rows_ref` with static shapes and no sync.

    Rows with `idx < 0` are redirected to the first kept row: they write that row's value to its
    destination again, so every duplicate write carries identical bytes and the result does not
    depend on the order of the writes. With no kept row at all, every row rewrites `dst[0]` with
    its current value. Cost: one extra gather of `n` rows.
    """
    n = idx.shape[0]
    if n == 0:
        return
    keep = idx >= 0
    first = torch.argmax(keep.to(torch.int32))                     # first kept row, 0 if none
    row = torch.where(keep, torch.arange(n, device=idx.device), first)
    any_kept = keep.any()
    dst_idx = torch.where(any_kept, idx.long()[row], torch.zeros_like(row))
    vals = src[row].to(dst.dtype)
    vals = torch.where(any_kept, vals, dst[:1].expand_as(vals))     # materialised before the write
    dst.index_copy_(0, dst_idx, vals)


def write_rows(dst: torch.Tensor, idx: torch.Tensor, src: torch.Tensor) -> None:
    """dst [M, ...] <- src [n, ...] at rows idx [n] (int, `-1` = skip); in place, sync-free on CUDA."""
    if idx.dim() != 1 or src.shape[0] != idx.shape[0] or tuple(src.shape[1:]) != tuple(dst.shape[1:]):
        raise ValueError(f"write_rows: dst {tuple(dst.shape)}, idx {tuple(idx.shape)}, src {tuple(src.shape)} "
                         "must be [M, ...], [n], [n, ...]")
    kernel = tilelang_launcher("write_rows", dst.device, supported=_kernel_takes(dst, idx, src))
    if kernel is not None:   # SM90: one launch instead of the capturable variant's ~13
        kernel(dst, idx, src)
    elif use_capturable(idx):
        write_rows_capturable(dst, idx, src)
    else:
        write_rows_ref(dst, idx, src)


_KERNEL_DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.int32, torch.int64)


def _kernel_takes(dst: torch.Tensor, idx: torch.Tensor, src: torch.Tensor) -> bool:
    """The TileLang kernel's operands: its dtypes, a cast within floats or within ints, contiguous
    rows of dst, dst / idx / src on one device."""
    return (dst.dtype in _KERNEL_DTYPES and src.dtype in _KERNEL_DTYPES
            and dst.dtype.is_floating_point == src.dtype.is_floating_point
            and idx.dtype in (torch.int32, torch.int64) and dst.device == idx.device == src.device
            and dst.shape[0] > 0 and dst[0].is_contiguous() and dst.stride(0) == dst[0].numel())
