"""RoPE in place on the last ``r`` dims of each head (TileLang, SM90), bf16 / fp16.

Same function as ``deepinfer_kernels.ops.rope.rope_inplace_ref``, bit for bit: one thread per
rotated pair (i, i + r/2) reads both values, computes each output as two products and a sum with
``__fmul_rn`` / ``__fadd_rn`` (no fused multiply-add: the torch formula rounds each step), and
writes both, so no thread reads a value another one rewrites.
"""

import torch

from deepinfer_kernels.tilelang._common import PDL, compile_cached, pdl_sync, require, require_cuda

# No `from __future__ import annotations` (TileLang evaluates prim_func annotations).

NT = 128
_DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}


def _build(h: int, d: int, r: int, dtype: str):
    import tilelang.language as T

    half = r // 2
    N = T.dynamic("N")
    PAIRS = h * half            # pairs per row

    @T.prim_func
    def main(
        X: T.Tensor((N, h, d), dtype),
        Cos: T.Tensor((N, r), T.float32),
        Sin: T.Tensor((N, r), T.float32),
    ):
        with T.Kernel(T.ceildiv(N * PAIRS, NT), threads=NT) as bx:
            if PDL:   # wait for the previous kernel before touching memory (_common.PDL)
                T.evaluate(pdl_sync())
            p = bx * NT + T.get_thread_binding()
            if p < N * PAIRS:
                n = p // PAIRS
                hh = (p % PAIRS) // half
                i = p % half
                a = T.cast(X[n, hh, d - r + i], T.float32)
                b = T.cast(X[n, hh, d - r + half + i], T.float32)
                # out_i = a cos_i + b (-sin)_i ; out_{i+half} = b cos_{i+half} + a sin_{i+half}
                lo = rotate_rn(T, a, Cos[n, i], b, Sin[n, i])
                hi = rotate_rn(T, b, Cos[n, half + i], a, Sin[n, half + i])
                X[n, hh, d - r + i] = T.cast(lo, dtype)
                X[n, hh, d - r + half + i] = T.cast(hi, dtype)

    return main


def rotate_rn(T, x, cos, partner, sin):
    """One rotated value ``x cos + partner sin`` in float32, each product and the sum rounded on its
    own (``__fmul_rn`` / ``__fadd_rn``: no fused multiply-add, as the torch formula rounds). Shared
    with the normed FP8 store's RoPE (``kv_store.py``), which must equal this kernel bit for bit."""
    return T.call_extern("float32", "__fadd_rn", T.call_extern("float32", "__fmul_rn", x, cos),
                         T.call_extern("float32", "__fmul_rn", partner, sin))


def _kernel(h: int, d: int, r: int, dtype: torch.dtype):
    return compile_cached("rope_inplace", (h, d, r, _DTYPES[dtype]), lambda: _build(h, d, r, _DTYPES[dtype]))


def rope_inplace_tilelang(x: torch.Tensor, cos_full: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """x [N, H, D] bf16 / fp16 / fp32 contiguous, cos_full / sin_signed float32 [N, r] -> x rotated in place."""
    require(x.dtype in _DTYPES, f"x: bf16, fp16 or fp32, got {x.dtype}")
    require(x.dim() == 3 and x.is_contiguous(), "x: contiguous [N, H, D]")
    require_cuda(x=x, cos_full=cos_full, sin_signed=sin_signed)
    n, h, d = x.shape
    r = cos_full.shape[1]
    require(r % 2 == 0 and 0 < r <= d, f"rotary width {r}: even, in (0, {d}]")
    if n:
        _kernel(h, d, r, x.dtype)(x, cos_full.contiguous(), sin_signed.contiguous())
    return x
