"""counter_uniform: a pure function of (seed, position, stream), bit-exact to a uint64 oracle."""

from __future__ import annotations

import random

import pytest
import torch
from scipy import stats

from deepinfer_kernels.ops.sampling import RngStream, counter_uniform

MASK64 = (1 << 64) - 1
GAMMA = 0x9E3779B97F4A7C15


def mix(z: int) -> int:
    z ^= z >> 30
    z = (z * 0xBF58476D1CE4E5B9) & MASK64
    z ^= z >> 27
    z = (z * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def oracle_uniform(seed: int, position: int, stream: int) -> float:
    """The documented hash in plain Python integers (uint64 arithmetic)."""
    h = mix((seed + GAMMA) & MASK64)
    h = mix(h ^ (position & MASK64))
    h = mix(h ^ (((stream + 1) * GAMMA) & MASK64))
    return (h >> 11) * 2.0**-53


def as_int64(u: int) -> int:
    return u - (1 << 64) if u >= 1 << 63 else u


def test_splitmix64_known_vector():
    """splitmix64 seeded with 0 outputs 0xE220A8397B1DCDAF first: mix(0 + GAMMA)."""
    assert mix(GAMMA) == 0xE220A8397B1DCDAF


@pytest.mark.parametrize("stream", list(RngStream))
def test_bit_exact_against_uint64_oracle(stream):
    rnd = random.Random(int(stream))
    seeds = [rnd.getrandbits(64) for _ in range(500)] + [0, 1, MASK64, 1 << 63]
    positions = [rnd.getrandbits(rnd.choice([8, 20, 40, 62])) for _ in range(500)] + [0, 0, 1, (1 << 62)]
    u = counter_uniform(torch.tensor([as_int64(s) for s in seeds]), torch.tensor(positions), stream)
    assert u.dtype == torch.float64
    expected = [oracle_uniform(s, p, int(stream)) for s, p in zip(seeds, positions, strict=True)]
    assert u.tolist() == expected


def test_depends_on_its_own_row_only():
    g = torch.Generator().manual_seed(0)
    seeds = torch.randint(-(1 << 62), 1 << 62, (257,), generator=g)
    pos = torch.randint(0, 1 << 30, (257,), generator=g)
    full = counter_uniform(seeds, pos, RngStream.SAMPLE)
    perm = torch.randperm(257, generator=g)
    assert torch.equal(counter_uniform(seeds[perm], pos[perm], RngStream.SAMPLE), full[perm])
    for b in (1, 7, 64):
        assert torch.equal(counter_uniform(seeds[:b], pos[:b], RngStream.SAMPLE), full[:b])


def test_int32_positions_and_per_row_streams():
    seeds = torch.tensor([5, 5, 5, 5])
    pos = torch.tensor([9, 9, 9, 9], dtype=torch.int32)
    streams = torch.tensor([0, 1, 2, 3])
    per_row = counter_uniform(seeds, pos, streams)
    for k, s in enumerate(RngStream):
        assert per_row[k] == counter_uniform(seeds[:1], pos[:1].long(), s)[0]
    assert len(set(per_row.tolist())) == 4  # streams are distinct


def test_uniform_and_streams_independent():
    n = 200_000
    seeds = torch.arange(n, dtype=torch.int64)  # consecutive seeds: the hardest case for a weak hash
    pos = torch.full((n,), 42, dtype=torch.int64)
    draws = {s: counter_uniform(seeds, pos, s) for s in RngStream}
    for s, u in draws.items():
        assert float(u.min()) >= 0.0 and float(u.max()) < 1.0
        assert stats.kstest(u.numpy(), "uniform").pvalue > 0.01, s
    streams = list(RngStream)
    for i in range(len(streams)):
        for j in range(i + 1, len(streams)):
            r = stats.pearsonr(draws[streams[i]].numpy(), draws[streams[j]].numpy()).statistic
            assert abs(r) < 0.01
    # Consecutive positions of one seed are uniform and uncorrelated too.
    u = counter_uniform(torch.full((n,), 7, dtype=torch.int64), torch.arange(n), RngStream.ACCEPT)
    assert stats.kstest(u.numpy(), "uniform").pvalue > 0.01
    assert abs(stats.pearsonr(u[:-1].numpy(), u[1:].numpy()).statistic) < 0.01


def test_argument_errors():
    with pytest.raises(TypeError, match="seeds must have dtype int64"):
        counter_uniform(torch.zeros(3, dtype=torch.int32), torch.zeros(3, dtype=torch.int64), 0)
    with pytest.raises(ValueError, match=r"positions must have shape \[rows\]"):
        counter_uniform(torch.zeros(3, dtype=torch.int64), torch.zeros(2, dtype=torch.int64), 0)
    with pytest.raises(ValueError, match=r"stream must have shape \[rows\]"):
        counter_uniform(torch.zeros(3, dtype=torch.int64), torch.zeros(3, dtype=torch.int64), torch.zeros(2))
