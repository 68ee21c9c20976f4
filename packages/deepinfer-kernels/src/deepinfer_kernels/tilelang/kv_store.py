"""Fused quantize + scatter of KV records into the paged pools (TileLang, SM90).

Bit-exact with the references in ``deepinfer_kernels.ops.kv_fp8`` / ``kv_fp4``:

* FP8 record (528 bytes for D = 512): D e4m3 values + D/32 ue8m0 scale bytes, scale exponent
  ``e = ceil(log2(amax / 448))`` clamped to [-127, 127] (``amax == 0`` -> -127), values
  ``clamp(x * 2^-e, +-448)`` rounded to nearest-even e4m3.
* FP4 indexer key (68 bytes for D = 128): D/2 bytes of packed e2m1 (element 2i in the low
  nibble) + D/32 scale bytes, ``e = ceil(log2(amax / 6))``, magnitudes rounded to
  {0, .5, 1, 1.5, 2, 3, 4, 6} with ties to the even code.

The exponent is computed with the same fp32 operations as the reference (``amax / qmax`` then
``ceil(log2(.))``, ``x * exp2(-e)``), so GPU kernel and GPU reference agree bit for bit.

Thread layout: every thread owns 16 consecutive values of one row (``D/16`` threads per row);
the two threads of a 32-value scale group exchange their partial absmax with one shuffle. One
row's record is written with 16-byte (FP8, D = 512) or 8-byte (FP4) vector stores.
"""

import torch

from deepinfer_kernels.tilelang._common import PDL, compile_cached, pdl_sync, require, require_cuda
from deepinfer_kernels.tilelang.rope import rotate_rn

# No `from __future__ import annotations` (TileLang evaluates prim_func annotations).

E4M3_MAX = 448.0
E2M1_MAX = 6.0
NT = 128

_T_DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}
_I_DTYPES = {torch.int32: "int32", torch.int64: "int64"}


def _vec_bytes(n: int) -> int:
    v = 16
    while n % v:
        v //= 2
    return v


def _check_dim(d: int) -> None:
    require(d % 32 == 0 and d >= 32 and (NT * 16) % d == 0 and (d // 16) <= NT,
            f"dim={d}: TileLang KV store needs D a multiple of 32 dividing {NT * 16}")


def _record(fmt: str, d: int) -> tuple[int, int, float]:
    """(record bytes, store vector width in bytes, largest magnitude) of the ``fmt`` record of D values."""
    rec = d + d // 32 if fmt == "fp8" else d // 2 + d // 32
    vw = _vec_bytes(rec) if fmt == "fp8" else min(_vec_bytes(rec), 8)
    return rec, vw, E4M3_MAX if fmt == "fp8" else E2M1_MAX


def _record_macro(T, fmt: str, d: int):
    """Quantize one thread's 16 values ``xv`` (float32) of a row to the ``fmt`` record and write
    them and, from the even thread of a scale group, the group's scale byte into ``Pool[slot]``
    (skipped for slot < 0). The two threads of a 32-value group share their absmax by a shuffle."""
    _, VW, QMAX = _record(fmt, d)
    NB = 16 if fmt == "fp8" else 8    # value bytes per thread

    @T.macro
    def quantize_store(Pool, xv, slot, part):
        qb = T.alloc_local((NB,), T.uint8)
        amax = T.alloc_var(T.float32)
        ex = T.alloc_var(T.int32)
        amax = 0.0
        for v in T.serial(16):
            amax = T.max(amax, T.abs(xv[v]))
        amax = T.max(amax, T.shfl_xor(amax, 1))
        if amax > 0:
            ex = T.cast(T.ceil(T.log2(amax / QMAX)), T.int32)
        else:
            ex = -127
        ex = T.clamp(ex, -127, 127)
        if fmt == "fp8":
            for v in T.serial(16):
                qb[v] = T.reinterpret(
                    T.cast(T.clamp(xv[v] * T.exp2(T.cast(-ex, T.float32)), -QMAX, QMAX), T.float8_e4m3fn), T.uint8)
        else:
            cd = T.alloc_local((16,), T.uint8)
            for v in T.serial(16):
                sv = T.clamp(xv[v] * T.exp2(T.cast(-ex, T.float32)), -QMAX, QMAX)
                mag = T.abs(sv)
                # ties: down at .25, 1.25, 2.5, 5 (strict >); up at .75, 1.75, 3.5 (>=)
                code = (T.cast(mag > 0.25, T.int32) + T.cast(mag >= 0.75, T.int32) + T.cast(mag > 1.25, T.int32)
                        + T.cast(mag >= 1.75, T.int32) + T.cast(mag > 2.5, T.int32) + T.cast(mag >= 3.5, T.int32)
                        + T.cast(mag > 5.0, T.int32))
                cd[v] = T.cast(T.if_then_else((sv < 0) & (code > 0), code + 8, code), T.uint8)
            for v in T.serial(8):
                qb[v] = cd[2 * v] | (cd[2 * v + 1] << T.uint8(4))
        if slot >= 0:
            for u in T.unroll(NB // VW):
                for v in T.vectorized(VW):
                    Pool[slot, part * NB + u * VW + v] = qb[u * VW + v]
            if part % 2 == 0:
                Pool[slot, NB * (d // 16) + part // 2] = T.cast(ex + 127, T.uint8)

    return quantize_store


def _build_store(fmt: str, d: int, in_dtype: str, idx_dtype: str, identity: bool):
    """Quantize rows of X to ``fmt`` records and write row i to ``Pool[Slots[i]]`` (``identity``:
    to ``Pool[i]``, the quantize-only launcher)."""
    import tilelang.language as T

    REC = _record(fmt, d)[0]
    LPR = d // 16                    # threads per row
    RPC = NT // LPR                  # rows per CTA
    N = T.dynamic("N")
    S = T.dynamic("S")
    M = T.dynamic("M")               # slot_mapping length (N, or 1 when identity)
    quantize_store = _record_macro(T, fmt, d)

    @T.prim_func
    def main(
        X: T.Tensor((N, d), in_dtype),
        Slots: T.Tensor((M,), idx_dtype),
        Pool: T.Tensor((S, REC), T.uint8),
    ):
        with T.Kernel(T.ceildiv(N, RPC), threads=NT) as bx:
            if PDL:   # wait for the previous kernel before touching memory (_common.PDL)
                T.evaluate(pdl_sync())
            tx = T.get_thread_binding()
            xv = T.alloc_local((16,), T.float32)
            row = bx * RPC + tx // LPR
            part = tx % LPR
            slot = T.alloc_var(T.int64)
            slot = T.int64(-1)
            if row < N:
                if identity:
                    slot = T.cast(row, T.int64)
                else:
                    slot = T.cast(Slots[row], T.int64)
            for v in T.vectorized(16):
                xv[v] = T.if_then_else(row < N, T.cast(X[T.min(row, N - 1), part * 16 + v], T.float32), 0.0)
            quantize_store(Pool, xv, slot, part)

    return main


def _build_fp8_normed(d: int, dn: int, in_dtype: str, w_dtype: str, idx_dtype: str, eps: float, r: int = 0):
    """``_build_store``'s FP8 store of ``[rms_norm(x[:dn], W, eps), x[dn:]]`` (the MLA latent: normed
    content, rotated tail) read from a strided row (the tail of a fused projection's output). The
    norm is ``norm.py``'s one-warp row norm step for step (lane l sums the squares of values
    l, l + 32, ... in order, then a shuffle butterfly; ``(x * rstd) * w`` rounded to the dtype), so
    the record equals that kernel's output stored, bit for bit. One warp per row.

    ``r > 0``: the last r columns are rotated first (RoPE from the rows' ``Cos`` / ``Sin`` tables,
    with ``rope.py``'s own ``rotate_rn``, rounded to the dtype), so the record equals
    ``rope_inplace`` then this store; the row itself is not written."""
    import tilelang.language as T

    REC = _record("fp8", d)[0]
    LPR = d // 16
    RPC = NT // LPR
    PER_LANE = dn // 32
    HALF = r // 2
    assert LPR == 32 and dn % 32 == 0 and dn < d and r % 2 == 0 and r <= d - dn
    N = T.dynamic("N")
    SX = T.dynamic("SX")
    S = T.dynamic("S")
    quantize_store = _record_macro(T, "fp8", d)

    @T.macro
    def store_row(X, W, Slots, Pool, Cos, Sin, bx):
        if PDL:   # wait for the previous kernel before touching memory (_common.PDL)
            T.evaluate(pdl_sync())
        tx = T.get_thread_binding()
        xn = T.alloc_local((PER_LANE,), T.float32)
        xv = T.alloc_local((16,), T.float32)
        total = T.alloc_var(T.float32)
        rstd = T.alloc_var(T.float32)
        row = bx * RPC + tx // LPR
        part = tx % LPR
        safe_row = T.min(row, N - 1)
        slot = T.alloc_var(T.int64)
        slot = T.int64(-1)
        if row < N:
            slot = T.cast(Slots[row], T.int64)
        total = 0.0
        for k in T.serial(PER_LANE):
            xn[k] = T.cast(X[safe_row, part + 32 * k], T.float32)
            total = total + xn[k] * xn[k]
        total = total + T.shfl_xor(total, 16)
        total = total + T.shfl_xor(total, 8)
        total = total + T.shfl_xor(total, 4)
        total = total + T.shfl_xor(total, 2)
        total = total + T.shfl_xor(total, 1)
        rstd = T.rsqrt(total / T.float32(dn) + T.float32(eps))
        for v in T.serial(16):
            c = part * 16 + v
            xv[v] = T.cast(X[safe_row, c], T.float32)
            if c < dn:
                xv[v] = T.cast(T.cast(xv[v] * rstd * T.cast(W[c], T.float32), in_dtype), T.float32)
            if r > 0:
                if c >= d - r:   # out_i = x_i cos_i + x_partner (+-sin)_i, the pair (i, i +- r/2)
                    i = c - (d - r)
                    partner = T.if_then_else(i < HALF, c + HALF, c - HALF)
                    rot = rotate_rn(T, xv[v], Cos[safe_row, i], T.cast(X[safe_row, partner], T.float32),
                                    Sin[safe_row, i])
                    xv[v] = T.cast(T.cast(rot, in_dtype), T.float32)
        quantize_store(Pool, xv, slot, part)

    if r == 0:
        @T.prim_func
        def main(
            X: T.StridedTensor((N, d), (SX, 1), in_dtype),
            W: T.Tensor((dn,), w_dtype),
            Slots: T.Tensor((N,), idx_dtype),
            Pool: T.Tensor((S, REC), T.uint8),
        ):
            with T.Kernel(T.ceildiv(N, RPC), threads=NT) as bx:
                store_row(X, W, Slots, Pool, None, None, bx)
    else:
        @T.prim_func
        def main(
            X: T.StridedTensor((N, d), (SX, 1), in_dtype),
            W: T.Tensor((dn,), w_dtype),
            Slots: T.Tensor((N,), idx_dtype),
            Cos: T.Tensor((N, r), T.float32),
            Sin: T.Tensor((N, r), T.float32),
            Pool: T.Tensor((S, REC), T.uint8),
        ):
            with T.Kernel(T.ceildiv(N, RPC), threads=NT) as bx:
                store_row(X, W, Slots, Pool, Cos, Sin, bx)

    return main


def _kernel(fmt: str, d: int, x_dtype: torch.dtype, idx_dtype: torch.dtype | None, identity: bool):
    require(x_dtype in _T_DTYPES, f"dtype {x_dtype} not supported (bf16, fp16, fp32)")
    idx_name = _I_DTYPES[idx_dtype] if idx_dtype is not None else "int64"
    key = (d, _T_DTYPES[x_dtype], idx_name, identity)
    return compile_cached(f"kv_store_{fmt}", key, lambda: _build_store(fmt, d, _T_DTYPES[x_dtype], idx_name, identity))


def _store(fmt: str, x: torch.Tensor, pool: torch.Tensor, slot_mapping: torch.Tensor, rec: int) -> None:
    require(x.dim() == 2, f"x: expected [n, D], got {tuple(x.shape)}")
    n, d = x.shape
    _check_dim(d)
    require(pool.dim() == 2 and pool.dtype == torch.uint8 and pool.shape[1] == rec,
            f"pool: expected uint8 [slots, {rec}], got {pool.dtype} {tuple(pool.shape)}")
    require(pool.stride() == (rec, 1), "pool: rows must be contiguous records")
    require(slot_mapping.dim() == 1 and slot_mapping.shape[0] == n and slot_mapping.dtype in _I_DTYPES,
            f"slot_mapping: expected int32/int64 [{n}], got {slot_mapping.dtype} {tuple(slot_mapping.shape)}")
    require_cuda(x=x, pool=pool, slot_mapping=slot_mapping)
    require(pool.data_ptr() % 16 == 0, "pool: base must be 16-byte aligned")
    if n == 0:
        return
    kernel = _kernel(fmt, d, x.dtype, slot_mapping.dtype, identity=False)
    kernel(x.contiguous(), slot_mapping.contiguous(), pool)


def store_normed_kv_fp8_tilelang(kv: torch.Tensor, norm_weight: torch.Tensor, eps: float, norm_dim: int,
                                 pool: torch.Tensor, slot_mapping: torch.Tensor,
                                 rope: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
    """``store_kv_fp8_tilelang(cat([rms_norm_tilelang(kv[:, :norm_dim], norm_weight, eps), kv[:, norm_dim:]]))``
    in one launch, bit for bit. kv [n, D] bf16 / fp16 with contiguous rows (a column slice of a
    wider row is read in place), norm_weight [norm_dim] float32 or kv's dtype, D = 512 (one warp per
    row), norm_dim a multiple of 32 below D. ``rope`` (cos_full, sin_signed float32 [n, r], r even,
    <= D - norm_dim): the last r columns rotated first, as ``rope_inplace_tilelang`` (kv unchanged)."""
    require(kv.dim() == 2 and kv.dtype in (torch.bfloat16, torch.float16), f"kv: bf16 / fp16 [n, D], got {kv.dtype}")
    n, d = kv.shape
    rec = d + d // 32
    require(d // 16 == 32, f"kv: D = 512 expected (one warp per row), got {d}")
    require(0 < norm_dim < d and norm_dim % 32 == 0, f"norm_dim={norm_dim}: a multiple of 32 below D={d}")
    require(norm_weight.dim() == 1 and norm_weight.shape[0] == norm_dim
            and norm_weight.dtype in (torch.float32, kv.dtype), f"norm_weight: [{norm_dim}], float32 or kv's dtype")
    require(pool.dim() == 2 and pool.dtype == torch.uint8 and pool.shape[1] == rec and pool.stride() == (rec, 1),
            f"pool: expected contiguous uint8 [slots, {rec}], got {pool.dtype} {tuple(pool.shape)}")
    require(slot_mapping.dim() == 1 and slot_mapping.shape[0] == n and slot_mapping.dtype in _I_DTYPES,
            f"slot_mapping: expected int32/int64 [{n}], got {slot_mapping.dtype} {tuple(slot_mapping.shape)}")
    r = 0
    tables: tuple[torch.Tensor, ...] = ()
    if rope is not None:
        cos, sin = rope
        r = cos.shape[-1]
        for name, t in (("cos_full", cos), ("sin_signed", sin)):
            require(t.dim() == 2 and t.shape == (n, r) and t.dtype == torch.float32,
                    f"{name}: expected float32 [{n}, {r}], got {t.dtype} {tuple(t.shape)}")
        require(r % 2 == 0 and 0 < r <= d - norm_dim, f"rope width {r}: even, in (0, {d - norm_dim}] (the unnormed tail)")
        tables = (cos.contiguous(), sin.contiguous())
    require_cuda(kv=kv, norm_weight=norm_weight, pool=pool, slot_mapping=slot_mapping,
                 **dict(zip(("cos_full", "sin_signed"), tables)))
    if n == 0:
        return
    rows = kv if kv.stride(1) == 1 else kv.contiguous()
    _normed_kernel(d, norm_dim, kv.dtype, norm_weight.dtype, slot_mapping.dtype, eps, r)(
        rows, norm_weight.contiguous(), slot_mapping.contiguous(), *tables, pool)


def _normed_kernel(d: int, norm_dim: int, x_dtype: torch.dtype, w_dtype: torch.dtype, idx_dtype: torch.dtype,
                   eps: float, r: int = 0):
    key = (d, norm_dim, _T_DTYPES[x_dtype], _T_DTYPES[w_dtype], _I_DTYPES[idx_dtype], float(eps), r)
    return compile_cached("kv_store_fp8_normed", key, lambda: _build_fp8_normed(d, norm_dim, *key[2:]))


def _quantize(fmt: str, x: torch.Tensor, rec: int) -> torch.Tensor:
    require(x.dim() == 2, f"x: expected [n, D], got {tuple(x.shape)}")
    n, d = x.shape
    _check_dim(d)
    device = require_cuda(x=x)
    out = torch.empty(n, rec, dtype=torch.uint8, device=device)
    if n == 0:
        return out
    dummy = torch.empty(1, dtype=torch.int64, device=device)
    _kernel(fmt, d, x.dtype, None, identity=True)(x.contiguous(), dummy, out)
    return out


def store_kv_fp8_tilelang(kv: torch.Tensor, pool: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """pool[slot_mapping[i]] = quantize_kv_fp8(kv[i]) for slot_mapping[i] >= 0 (in place); like
    ``store_kv_fp8_ref``. kv [n, D] bf16/fp16/fp32, pool uint8 [slots, D + D/32]."""
    _store("fp8", kv, pool, slot_mapping, kv.shape[1] + kv.shape[1] // 32)


def quantize_kv_fp8_tilelang(kv: torch.Tensor) -> torch.Tensor:
    """kv [n, D] -> records uint8 [n, D + D/32]; like ``quantize_kv_fp8_ref``."""
    return _quantize("fp8", kv, kv.shape[1] + kv.shape[1] // 32)


def store_index_k_fp4_tilelang(k: torch.Tensor, pool: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """pool[slot_mapping[i]] = quantize_index_k_fp4(k[i]) for slot_mapping[i] >= 0 (in place); like
    ``store_index_k_fp4_ref``. k [n, D], pool uint8 [slots, D/2 + D/32]."""
    _store("fp4", k, pool, slot_mapping, k.shape[1] // 2 + k.shape[1] // 32)


def quantize_index_k_fp4_tilelang(k: torch.Tensor) -> torch.Tensor:
    """k [n, D] -> records uint8 [n, D/2 + D/32]; like ``quantize_index_k_fp4_ref``."""
    return _quantize("fp4", k, k.shape[1] // 2 + k.shape[1] // 32)
