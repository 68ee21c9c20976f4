"""Shape/dtype checks shared by the op wrappers (a wrapper fails loudly, naming the argument)."""

from __future__ import annotations

import torch


def check_tensor(name: str, t: torch.Tensor, ndim: int | None = None,
                 dtypes: tuple[torch.dtype, ...] | None = None) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name}: expected {ndim} dims, got shape {tuple(t.shape)}")
    if dtypes is not None and t.dtype not in dtypes:
        names = ", ".join(str(d) for d in dtypes)
        raise ValueError(f"{name}: expected dtype in ({names}), got {t.dtype}")


def check_dim(name: str, t: torch.Tensor, dim: int, expected: int) -> None:
    if t.shape[dim] != expected:
        raise ValueError(f"{name}: dim {dim} must be {expected}, got shape {tuple(t.shape)}")


def check_same_device(**tensors: torch.Tensor) -> torch.device:
    devices = {n: t.device for n, t in tensors.items()}
    first = next(iter(devices.values()))
    for n, d in devices.items():
        if d != first:
            raise ValueError(f"{n}: on {d}, expected {first} like the other arguments")
    return first


FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
INDEX_DTYPES = (torch.int32, torch.int64)
