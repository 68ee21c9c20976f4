"""Masked row scatter in one launch (TileLang, SM90): ``dst[idx[i]] = src[i]`` where ``idx[i] >= 0``.

Same function as ``deepinfer_kernels.ops.capture.write_rows_ref`` for in-range indices: rows with a
negative index are skipped, each kept row is cast to ``dst``'s dtype (float <-> float, int <-> int,
as torch's cast). One CTA per source row, threads over its W values. The torch capturable variant
is ~13 kernels per call (a first-kept-row redirect, gathers, an index_copy_); the engine calls it
up to three times per step. Indices past ``dst``'s rows are skipped too (the torch variant
device-asserts): the engine's slots are in range by construction.
"""

import torch

from deepinfer_kernels.tilelang._common import PDL, compile_cached, pdl_sync, require, require_cuda

# No `from __future__ import annotations` (TileLang evaluates prim_func annotations).

NT = 128
_DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32",
           torch.int32: "int32", torch.int64: "int64"}
_INDEX = {torch.int32: "int32", torch.int64: "int64"}


def _build(w: int, src_dtype: str, dst_dtype: str, idx_dtype: str):
    import tilelang.language as T

    N = T.dynamic("N")
    M = T.dynamic("M")
    CHUNKS = (w + NT - 1) // NT

    @T.prim_func
    def main(
        Dst: T.Tensor((M, w), dst_dtype),
        Idx: T.Tensor((N,), idx_dtype),
        Src: T.Tensor((N, w), src_dtype),
    ):
        with T.Kernel(N, threads=NT) as i:
            if PDL:   # wait for the previous kernel before touching memory (_common.PDL)
                T.evaluate(pdl_sync())
            tx = T.get_thread_binding()
            r = Idx[i]
            if (r >= 0) and (r < M):
                for c in T.serial(CHUNKS):
                    j = c * NT + tx
                    if j < w:
                        Dst[r, j] = T.cast(Src[i, j], dst_dtype)

    return main


def _kernel(w: int, src_dtype: torch.dtype, dst_dtype: torch.dtype, idx_dtype: torch.dtype):
    key = (w, _DTYPES[src_dtype], _DTYPES[dst_dtype], _INDEX[idx_dtype])
    return compile_cached("write_rows", key, lambda: _build(*key))


def write_rows_tilelang(dst: torch.Tensor, idx: torch.Tensor, src: torch.Tensor) -> None:
    """dst [M, ...] <- src [n, ...] at rows idx [n] (int32 / int64, negative = skip), in place; the
    trailing dims of ``dst`` contiguous, dtypes among bf16 / fp16 / fp32 / int32 / int64."""
    require(dst.dtype in _DTYPES and src.dtype in _DTYPES, f"dst/src dtypes: {dst.dtype}/{src.dtype} not supported")
    require(idx.dtype in _INDEX and idx.dim() == 1, f"idx: int32/int64 [n], got {idx.dtype} {tuple(idx.shape)}")
    require_cuda(dst=dst, idx=idx, src=src)
    n = idx.shape[0]
    if n == 0 or dst.shape[0] == 0:
        return
    w = 1
    for s in dst.shape[1:]:
        w *= s
    rows = dst.view(dst.shape[0], w)   # a view: raises unless the trailing dims are contiguous
    require(w >= 1, "dst: rows of at least one value")
    _kernel(w, src.dtype, dst.dtype, idx.dtype)(rows, idx.contiguous(), src.reshape(n, w).contiguous())
