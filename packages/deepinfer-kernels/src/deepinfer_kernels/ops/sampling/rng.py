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

from __future__ import annotations

import enum

import torch

from deepinfer_kernels.ops.sampling._checks import check_tensor
from deepinfer_kernels.platform import select_backend


class RngStream(enum.IntEnum):
    """Which decision a uniform drives. Position = the sequence position of the token decided."""

    SAMPLE = 0    # fresh sample of the target model's token (final row, nothing was rejected)
    DRAFT = 1     # draft-head (nextn) proposal; `random_sampling(..., is_nextn_predict=True)`
    ACCEPT = 2    # speculative accept test of a draft: accept iff u * q(x) < p(x)
    RESIDUAL = 3  # resample from norm(max(0, p - q)) after a rejection


def _u64(value: int) -> int:
    """uint64 constant -> the int64 with the same bits."""
    return value - (1 << 64) if value >= (1 << 63) else value


_GAMMA = _u64(0x9E3779B97F4A7C15)
_MUL1 = _u64(0xBF58476D1CE4E5B9)
_MUL2 = _u64(0x94D049BB133111EB)
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
    select_backend(op, seeds.device, has_kernel=False)
    return counter_uniform_ref(seeds, positions.to(torch.int64), streams)
