"""SwiGLU's activation in one launch (TileLang, SM90): ``silu(gate) * up``.

Same function as ``deepinfer_kernels.ops.activation.silu_mul_ref``, with its roundings: silu in
float32 rounded to the activations' dtype, then the product in float32 rounded again (torch's
``F.silu(gate) * up`` for bf16 / fp16). gate and up are read with their own row strides (column
slices of the fused gate/up GEMM's output), 8 values per thread, up to 256 threads along a row per CTA.

The row strides are compile-time constants (a kernel per stride pair; the engine has one or two):
with a dynamic stride TileLang cannot prove a row's 8 values 16-byte aligned and loads them 2 bytes
at a time (16 ``LDG.E.U16`` a thread, found by ``tools/tilelang_precompile.py --sass``). Inputs
whose strides or start are not 16-byte aligned are copied first.
"""

import torch

from deepinfer_kernels.tilelang._common import PDL, compile_cached, pdl_sync, require, require_cuda

# No `from __future__ import annotations` (TileLang evaluates prim_func annotations).

PER = 8
_DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16"}


def _build(inter: int, dtype: str, round_silu: bool, gate_stride: int, up_stride: int):
    """``round_silu``: silu rounded to dtype before the product (torch's ``F.silu(g) * u`` in dtype);
    False: one rounding at the end (``(F.silu(g.float()) * u.float()).to(dtype)``, the MoE prefill's).
    ``gate_stride`` / ``up_stride``: the inputs' row strides in elements, multiples of 8."""
    import tilelang.language as T

    NTR = inter // PER                    # threads per row
    TCOL = min(NTR, 256)                  # threads along a row per CTA (wide rows: several CTAs)
    ROWS = max(1, 256 // NTR)             # rows per CTA
    N = T.dynamic("N")
    SG, SU = gate_stride, up_stride
    assert SG % PER == 0 and SU % PER == 0 and SG >= inter and SU >= inter

    @T.prim_func
    def main(
        G: T.StridedTensor((N, inter), (SG, 1), dtype),
        U: T.StridedTensor((N, inter), (SU, 1), dtype),
        Y: T.Tensor((N, inter), dtype),
    ):
        with T.Kernel(T.ceildiv(N, ROWS), T.ceildiv(NTR, TCOL), threads=TCOL * ROWS) as (b, cb):
            if PDL:   # wait for the previous kernel before touching memory (_common.PDL)
                T.evaluate(pdl_sync())
            tx = T.get_thread_binding()
            row = b * ROWS + tx // TCOL
            part = cb * TCOL + tx % TCOL
            col = T.min(part, NTR - 1) * PER
            g = T.alloc_local((PER,), dtype)
            u = T.alloc_local((PER,), dtype)
            s = T.alloc_local((PER,), dtype)
            if (row < N) and (part < NTR):
                for v in T.vectorized(PER):
                    g[v] = G[row, col + v]
                for v in T.vectorized(PER):
                    u[v] = U[row, col + v]
                if round_silu:
                    for v in T.vectorized(PER):
                        s[v] = T.cast(T.cast(g[v], T.float32) / (1.0 + T.exp(-T.cast(g[v], T.float32))), dtype)
                    for v in T.vectorized(PER):
                        Y[row, col + v] = T.cast(T.cast(s[v], T.float32) * T.cast(u[v], T.float32), dtype)
                else:
                    for v in T.vectorized(PER):
                        Y[row, col + v] = T.cast(T.cast(g[v], T.float32) / (1.0 + T.exp(-T.cast(g[v], T.float32)))
                                                 * T.cast(u[v], T.float32), dtype)

    return main


def _kernel(inter: int, dtype: torch.dtype, round_silu: bool, gate_stride: int, up_stride: int):
    return compile_cached("silu_mul", (inter, _DTYPES[dtype], round_silu, gate_stride, up_stride),
                          lambda: _build(inter, _DTYPES[dtype], round_silu, gate_stride, up_stride))


def _aligned(x: torch.Tensor) -> bool:
    """Rows start on 16 bytes: the kernel's vector loads (8 bf16 / fp16 values)."""
    return x.stride(0) % PER == 0 and x.data_ptr() % 16 == 0


def silu_mul_tilelang(gate: torch.Tensor, up: torch.Tensor, round_silu: bool = True) -> torch.Tensor:
    """gate, up [N, I] bf16 / fp16 (rows contiguous, any row stride; I a multiple of 8) -> [N, I]
    contiguous; like ``silu_mul_ref`` (``round_silu=False``: the float32 product rounded once)."""
    require(gate.dim() == 2 and gate.dtype in _DTYPES and up.shape == gate.shape and up.dtype == gate.dtype,
            "gate, up: [N, I] of one dtype, bf16 or fp16")
    require(gate.shape[1] % PER == 0 and gate.stride(1) == 1 and up.stride(1) == 1,
            f"I={gate.shape[1]}: a multiple of {PER}, rows contiguous")
    require_cuda(gate=gate, up=up)
    out = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
    rows, inter = gate.shape
    if rows:
        # a copy with fresh strides (`.contiguous()` keeps a one-row slice's stride and start)
        gate = gate if _aligned(gate) else gate.clone(memory_format=torch.contiguous_format)
        up = up if _aligned(up) else up.clone(memory_format=torch.contiguous_format)
        _kernel(inter, gate.dtype, round_silu, gate.stride(0), up.stride(0))(gate, up, out)
    return out
