"""Counter-based uniforms: ``u = U(seed, position, stream)``, the only randomness of the sampler.

A uniform is a pure function of three integers, so a sample never depends on the batch it was
drawn in (size, row order, neighbours) nor on how many numbers were drawn before it; that is
what makes seeded sampling batch invariant (SPEC §4).

Hash (splitmix64 finaliser, Steele et al. 2014), all arithmetic modulo 2^64::

    mix(z) = z ^= z >>> 30; z *= 0xBF58476D1CE4E5B9; z ^= z >>> 27; z *= 0x94D049BB133111EB; z ^= z >>> 31
    h      = mix(mix(mix(seed + GAMMA) ^ position) ^ (stream + 1) * GAMMA)     GAMMA = 0x9E3779B97F4A7C15
    u      = (h >>> 11) * 2^-53                                                in [0, 1), float64

The uint64 values live in int64 tensors as their two's-complement view: multiplication and
xor wrap identically on every backend, and the logical shift ``>>>`` is an arithmetic shift
followed by a mask. The 53-bit integer converts to float64 exactly and the scale is a power of
two, so CPU and CUDA produce bit-identical uniforms.

Streams separate the independent random decisions taken at the same (seed, position):
"""

# No `from __future__ import annotations`: TileLang reads the kernel signatures' annotations
# as live expressions over the factory's local sizes.

import enum

import torch

from deepinfer_kernels.ops.sampling._checks import check_tensor
from deepinfer_kernels.ops.sampling._tilelang import THREADS, compiled, uint64_const
from deepinfer_kernels.platform import Backend, select_backend


class RngStream(enum.IntEnum):
    """Which decision a uniform drives. Position = the sequence position of the token decided."""

    SAMPLE = 0    # fresh sample of the target model's token (final row, nothing was rejected)
    DRAFT = 1     # draft-head (nextn) proposal; `random_sampling(..., is_nextn_predict=True)`
    ACCEPT = 2    # speculative accept test of a draft: accept iff u * q(x) < p(x)
    RESIDUAL = 3  # resample from norm(max(0, p - q)) after a rejection


def as_int64_bits(value: int) -> int:
    """uint64 -> the int64 with the same bits (the sampling kernels take seeds and constants so)."""
    return value - (1 << 64) if value >= (1 << 63) else value


_GAMMA = as_int64_bits(0x9E3779B97F4A7C15)
_MUL1 = as_int64_bits(0xBF58476D1CE4E5B9)
_MUL2 = as_int64_bits(0x94D049BB133111EB)
_MANTISSA_BITS = 53


def _shr(z: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift of the uint64 held in an int64 tensor."""
    return (z >> k) & ((1 << (64 - k)) - 1)


def _mix(z: torch.Tensor) -> torch.Tensor:
    z = z ^ _shr(z, 30)
    z = z * _MUL1
    z = z ^ _shr(z, 27)
    z = z * _MUL2
    return z ^ _shr(z, 31)


def counter_hash_ref(
    seeds: torch.Tensor,      # [rows] int64
    positions: torch.Tensor,  # [rows] int64
    streams: torch.Tensor,    # [rows] int64
) -> torch.Tensor:            # [rows] int64 (uint64 bits)
    h = _mix(seeds + _GAMMA)
    h = _mix(h ^ positions)
    return _mix(h ^ ((streams + 1) * _GAMMA))


def counter_uniform_ref(
    seeds: torch.Tensor,      # [rows] int64
    positions: torch.Tensor,  # [rows] int64
    streams: torch.Tensor,    # [rows] int64
) -> torch.Tensor:            # [rows] float64 in [0, 1)
    h = counter_hash_ref(seeds, positions, streams)
    return _shr(h, 64 - _MANTISSA_BITS).to(torch.float64) * (2.0**-_MANTISSA_BITS)


def counter_uniform_kernel():
    """TileLang: one thread per row, the same hash in native uint64 arithmetic."""
    import tilelang.language as T

    rows = T.dynamic("rows")

    @T.prim_func
    def kernel(
        seeds: T.Tensor((rows,), "int64"),
        positions: T.Tensor((rows,), "int64"),
        streams: T.Tensor((rows,), "int64"),
        out: T.Tensor((rows,), "float64"),
    ):
        with T.Kernel(T.ceildiv(rows, THREADS), threads=THREADS) as bx:
            r = bx * THREADS + T.get_thread_binding()
            if r < rows:
                gamma = uint64_const(T, 0x9E3779B97F4A7C15)
                mul1 = uint64_const(T, 0xBF58476D1CE4E5B9)
                mul2 = uint64_const(T, 0x94D049BB133111EB)
                z = T.alloc_var("uint64")
                z = T.cast(seeds[r], "uint64") + gamma
                for key in T.unroll(3):  # mix(z) three times; after mix 1 xor position, after mix 2 stream
                    z = z ^ (z >> T.uint64(30))
                    z = z * mul1
                    z = z ^ (z >> T.uint64(27))
                    z = z * mul2
                    z = z ^ (z >> T.uint64(31))
                    if key == 0:
                        z = z ^ T.cast(positions[r], "uint64")
                    elif key == 1:
                        z = z ^ ((T.cast(streams[r], "uint64") + T.uint64(1)) * gamma)
                out[r] = T.cast(z >> T.uint64(64 - _MANTISSA_BITS), "float64") * T.float64(2.0**-_MANTISSA_BITS)

    return kernel


def counter_uniform_tilelang(seeds: torch.Tensor, positions: torch.Tensor, streams: torch.Tensor) -> torch.Tensor:
    out = torch.empty(seeds.shape[0], dtype=torch.float64, device=seeds.device)
    compiled(counter_uniform_kernel)(seeds.contiguous(), positions.contiguous(), streams.contiguous(), out)
    return out


def counter_uniform(
    seeds: torch.Tensor,                        # [rows] int64 (uint64 seeds as their int64 bits)
    positions: torch.Tensor,                    # [rows] int32 or int64
    stream: RngStream | int | torch.Tensor,     # one stream for all rows, or [rows] int
) -> torch.Tensor:                              # [rows] float64 in [0, 1)
    """Uniform in [0, 1) that depends on ``(seed, position, stream)`` of its row and nothing else."""
    op = "counter_uniform"
    check_tensor(op, "seeds", seeds, [None], "[rows]", [torch.int64])
    rows = seeds.shape[0]
    check_tensor(op, "positions", positions, [rows], "[rows]", [torch.int32, torch.int64], seeds.device)
    if isinstance(stream, torch.Tensor):
        check_tensor(op, "stream", stream, [rows], "[rows]", [torch.int32, torch.int64], seeds.device)
        streams = stream.to(torch.int64)
    else:
        streams = torch.full((rows,), int(stream), dtype=torch.int64, device=seeds.device)
    backend = select_backend(op, seeds.device, has_kernel=True)
    if backend is Backend.TILELANG and rows > 0:
        return counter_uniform_tilelang(seeds, positions.to(torch.int64), streams)
    return counter_uniform_ref(seeds, positions.to(torch.int64), streams)
