"""DEEPINFER_BATCH_INVARIANT=1: a request's results do not depend on what else is in the batch.

Where float results depended on the batch (measured on the CPU torch path): the dense GEMMs and
the elementwise transcendental ops (see below). A row's `x @ W.T` is computed by a different micro-kernel depending on where it falls in the
M dimension (full 8-row blocks vs the remainder, or a GEMV for M = 1), so the same row gives
results that differ in the last bits at batch 1, 7 or 64, and MoE expert GEMMs see M = the
number of tokens routed to the expert, which depends on the batch. Everything else on the
reference path is already per-row (norms, softmax, sampling, per-row attention via batched
einsum whose batch dimension is the row) or reduces in a fixed order (MoE combine over top-k
slots, the counter-based RNG).

Elementwise exp/sigmoid/silu/...: ATen's vectorized body and its scalar tail round differently (one
ulp), and whether an element lands in the tail depends on the tensor's total size (a [N, 8] router
sigmoid: N = the batch's rows). Measured: the MoE of a request at batch 64 vs 7 differed by 1.2e-7.

The fix, while the mode is active: every 2-D GEMM (F.linear, matmul/mm/@ with a 2-D right operand)
runs on row tiles of a fixed shape: M padded up to a multiple of `ROW_TILE` rows on the CPU (every
row then goes through the same full-block micro-kernel; the K reduction order does not depend on
M), and cut into chunks of exactly `CUDA_ROW_TILE` rows on CUDA (one GEMM shape, so one cuBLAS
algorithm and reduction order, whatever the batch). Elementwise transcendental ops run on
a flat copy padded to a multiple of VECTOR_PAD elements (CPU only; CUDA has no scalar tail).
Cost: the padding rows (< ROW_TILE per GEMM on the CPU), the elementwise copies, and, on CUDA,
one GEMM launch per tile.

CUDA reductions over the last dimension (the RMSNorm mean, sums, logsumexp): ATen picks how many
warps (and CTAs) share one row's reduction from the number of rows, so they run on the same
fixed 64-row tiles as the GEMMs. The TileLang kernels' row-count-dependent choices (sparse MLA
split-KV, MoE kernel and tile shape) are fixed by `deepinfer_kernels.batch_invariant`, entered
with this mode.

`install(model)` wraps the model's entry points (forward, draft head, reference forward) so every
forward of the engine runs in the mode.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from deepinfer_kernels.batch_invariant import batch_invariant_kernels

ROW_TILE = 8          # CPU: a multiple of the GEMM micro-kernel's row block
CUDA_ROW_TILE = 64    # CUDA: every GEMM call has exactly this many rows

_MATMULS = {torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.mm, torch.Tensor.mm,
            torch._C.TensorBase.matmul, torch._C.TensorBase.mm}  # `a @ b` reaches the mode as TensorBase.matmul


def _tiled(a2: torch.Tensor, fn) -> torch.Tensor:
    """fn over the rows of a2 [M, K] in batch-invariant tiles -> [M, N]."""
    m = a2.shape[0]
    if a2.is_cuda:
        tile = CUDA_ROW_TILE
        pad = (-m) % tile
        if pad:
            a2 = torch.cat([a2, a2.new_zeros(pad, a2.shape[1])])
        out = torch.cat([fn(a2[i: i + tile]) for i in range(0, a2.shape[0], tile)])
        return out[:m]
    pad = (-m) % ROW_TILE
    if pad:
        a2 = torch.cat([a2, a2.new_zeros(pad, a2.shape[1])])
    return fn(a2)[:m]


# Elementwise transcendental ops: ATen computes the vectorized body and the scalar tail of a tensor with
# different code (Sleef vs libm), one ulp apart, and which elements fall in the tail depends on the
# tensor's total size, i.e. on the batch. Padded to a multiple of VECTOR_PAD elements, every element
# goes through the vectorized body.
VECTOR_PAD = 64
_ELEMENTWISE = {"exp", "exp2", "expm1", "log", "log2", "log1p", "sigmoid", "silu", "tanh", "cos", "sin", "rsqrt",
                "pow", "erf", "gelu", "softplus", "__pow__", "__rpow__"}


def _padded_elementwise(func, x: torch.Tensor, args, kwargs):
    n = x.numel()
    pad = (-n) % VECTOR_PAD
    flat = x.reshape(-1)
    if pad:
        flat = torch.cat([flat, flat.new_zeros(pad)])
    out = func(flat, *args, **kwargs)
    return out[:n].reshape(x.shape)


_REDUCTIONS = {"mean", "sum", "logsumexp"}


def _last_dim_reduction(func, args, kwargs) -> torch.Tensor | None:
    """A CUDA reduction over the last dim of x [..., N] on fixed 64-row tiles; None if not one."""
    x = args[0]
    dim = args[1] if len(args) > 1 else kwargs.get("dim")
    if isinstance(dim, (list, tuple)) and len(dim) == 1:
        dim = dim[0]
    if not isinstance(dim, int) or x.dim() < 2 or dim not in (-1, x.dim() - 1) or not x.numel():
        return None
    keepdim = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
    extra = {k: v for k, v in kwargs.items() if k not in ("dim", "keepdim")}
    lead = x.shape[:-1]
    out = _tiled(x.reshape(-1, x.shape[-1]), lambda t: func(t, -1, True, **extra))   # [M, 1]
    return out.reshape(*lead, 1) if keepdim else out.reshape(lead)


class BatchInvariantMode(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in _REDUCTIONS and args and isinstance(args[0], torch.Tensor) and args[0].is_cuda \
                and args[0].is_floating_point() and "out" not in kwargs:
            out = _last_dim_reduction(func, args, kwargs)
            if out is not None:
                return out
        if name in _ELEMENTWISE and args and isinstance(args[0], torch.Tensor) and args[0].is_floating_point() \
                and not args[0].is_cuda and args[0].numel() and not any(isinstance(a, torch.Tensor) for a in args[1:]) \
                and "out" not in kwargs:
            return _padded_elementwise(func, args[0], args[1:], kwargs)
        if func is F.linear:
            x, w = args[0], args[1]
            bias = args[2] if len(args) > 2 else kwargs.get("bias")
            if x.dim() >= 1 and x.shape[-1] == w.shape[-1] and w.dim() == 2 and x.numel():
                lead = x.shape[:-1]
                out = _tiled(x.reshape(-1, x.shape[-1]), lambda t: F.linear(t, w, bias))
                return out.reshape(*lead, w.shape[0])
        elif func in _MATMULS and len(args) == 2 and not kwargs:
            a, b = args
            if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dim() >= 2 and b.dim() == 2 \
                    and a.numel():
                lead = a.shape[:-1]
                out = _tiled(a.reshape(-1, a.shape[-1]), lambda t: torch.mm(t, b))
                return out.reshape(*lead, b.shape[1])
        return func(*args, **kwargs)


def _wrap(fn):
    @functools.wraps(fn)
    def run(*args, **kwargs):
        with BatchInvariantMode(), batch_invariant_kernels():
            return fn(*args, **kwargs)
    run.__deepinfer_batch_invariant__ = True
    return run


ENTRY_POINTS = ("forward", "dspark_draft", "dspark_write_main_keys", "reference_forward")


def install(model) -> None:
    """Run the model's engine entry points in BatchInvariantMode (idempotent)."""
    for name in ENTRY_POINTS:
        fn = getattr(model, name, None)
        if fn is not None and not getattr(fn, "__deepinfer_batch_invariant__", False):
            setattr(model, name, _wrap(fn))
