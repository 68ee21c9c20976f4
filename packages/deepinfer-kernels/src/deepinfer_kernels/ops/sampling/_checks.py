"""Argument checks shared by the sampling and verification op wrappers.

Every public wrapper validates shapes, dtypes and devices before dispatch and names the
argument and the expected shape in its error. Value checks that would need a device->host copy
(ftp consistency, index ranges) run only for CPU tensors, so the CUDA path never synchronises
(it stays capturable in a CUDA graph); the torch references are tested on the CPU where those
checks are always on.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

INDEX_DTYPES = (torch.int32, torch.int64)
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _dtype_names(dtypes: Sequence[torch.dtype]) -> str:
    return " or ".join(str(d).removeprefix("torch.") for d in dtypes)


def check_tensor(
    op: str,
    name: str,
    t: object,
    shape: Sequence[int | None],
    shape_doc: str,
    dtypes: Sequence[torch.dtype],
    device: torch.device | None = None,
) -> torch.Tensor:
    """Check one tensor argument; ``None`` in ``shape`` means any size along that dim."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor of shape {shape_doc}, got {type(t).__name__}")
    if t.dim() != len(shape) or any(s is not None and s != d for s, d in zip(shape, t.shape, strict=True)):
        raise ValueError(f"{op}: {name} must have shape {shape_doc}, got {list(t.shape)}")
    if t.dtype not in dtypes:
        raise TypeError(f"{op}: {name} must have dtype {_dtype_names(dtypes)}, got {t.dtype}")
    if device is not None and t.device != device:
        raise ValueError(f"{op}: {name} must be on {device} like the other inputs, got {t.device}")
    return t


def is_host(t: torch.Tensor) -> bool:
    """Value checks run only where they cost no device synchronisation (CPU tensors, not while
    dynamo traces: a traced graph cannot branch on values)."""
    return t.device.type == "cpu" and not torch.compiler.is_compiling()


def may_be_true(mask: torch.Tensor) -> bool:
    """False only if ``mask`` is provably all-false without a device sync (i.e. on the host).

    References use it to skip work nobody needs on the CPU while staying sync-free on CUDA.
    """
    return not is_host(mask) or bool(mask.any())


def check_row_distributions(
    op: str, name: str, dist: object, token_ids: object
) -> None:
    """``dist [rows, vocab]`` float and ``token_ids [rows]`` int in ``[0, vocab)``, one per row.

    The range check runs on CPU tensors only (see module docstring).
    """
    check_tensor(op, name, dist, [None, None], "[rows, vocab]", FLOAT_DTYPES)
    rows, vocab = dist.shape
    check_tensor(op, "token_ids", token_ids, [rows], "[rows]", INDEX_DTYPES, dist.device)
    if is_host(token_ids) and rows and bool(((token_ids < 0) | (token_ids >= vocab)).any()):
        raise ValueError(f"{op}: token_ids must lie in [0, {vocab})")


def check_flat_layout(op: str, ftp: torch.Tensor, seqlens_q: torch.Tensor, total_q: int) -> None:
    """The bridge between flat rows and requests (docs/design.md, "Two index languages").

    ``seqlens_q[i] >= 1``, ``ftp[0] == 0``, ``ftp[i+1] == ftp[i] + seqlens_q[i]`` and
    ``ftp[-1] + seqlens_q[-1] == total_q``. Runs on CPU tensors only (see module docstring).
    """
    if total_q < 0:
        raise ValueError(f"{op}: total_q must be >= 0, got {total_q}")
    if not is_host(ftp):
        return
    req_cnt = ftp.shape[0]
    if req_cnt == 0:
        if total_q != 0:
            raise ValueError(f"{op}: no requests (ftp is empty) but total_q = {total_q}")
        return
    s = seqlens_q.to(torch.int64)
    if bool((s < 1).any()):
        bad = int(torch.nonzero(s < 1)[0, 0])
        raise ValueError(f"{op}: seqlens_q[{bad}] = {int(s[bad])}; every request needs >= 1 row")
    expected = torch.cumsum(s, 0) - s
    if not torch.equal(ftp.to(torch.int64), expected):
        bad = int(torch.nonzero(ftp.to(torch.int64) != expected)[0, 0])
        raise ValueError(
            f"{op}: ftp must be the exclusive prefix sum of seqlens_q; ftp[{bad}] = {int(ftp[bad])}, "
            f"expected {int(expected[bad])}"
        )
    if int(s.sum()) != total_q:
        raise ValueError(f"{op}: sum(seqlens_q) = {int(s.sum())} but total_q = {total_q}")
