"""The RoPE table: bit for bit the half-row formula (cos / sin of `positions * theta^(-2i/dim)`,
duplicated and sign-flipped), with its constant frequencies made once per (dim, theta, device)."""

import pytest
import torch

from deepinfer_model.modules import rope
from deepinfer_model.modules.rope import apply_rope, rope_table


def _half_row_table(positions, dim, theta):
    inv = theta ** (torch.arange(0, dim - 1, 2, dtype=torch.float32) / -dim)
    ang = positions.to(torch.float32).unsqueeze(-1) * inv
    cos, sin = ang.cos(), ang.sin()
    return cos, sin, torch.cat([cos, cos], dim=-1), torch.cat([-sin, sin], dim=-1)


@pytest.mark.parametrize("dim,theta", [(64, 10000.0), (64, 1e6), (32, 50000.0), (128, 10000.0)])
def test_table_equals_the_half_row_formula_bit_for_bit(dim, theta):
    positions = torch.cat([torch.arange(0, 300), torch.randint(0, 1 << 20, (200,), generator=torch.Generator().manual_seed(dim))])
    cos, sin, cos_full, sin_signed = _half_row_table(positions, dim, theta)
    table = rope_table(positions, dim, theta)
    assert torch.equal(table.cos_full, cos_full) and torch.equal(table.sin_signed, sin_signed)
    assert torch.equal(table.cos, cos) and torch.equal(table.sin, sin)
    assert (table.dim, table.theta) == (dim, theta)


def test_frequencies_are_made_once_per_dim_theta_device():
    rope._FREQUENCIES.clear()
    a = rope_table(torch.arange(5), 64, 10000.0)
    first = rope._FREQUENCIES[(64, 10000.0, torch.device("cpu"))]
    b = rope_table(torch.arange(7, 12), 64, 10000.0)
    assert rope._FREQUENCIES[(64, 10000.0, torch.device("cpu"))] is first and len(rope._FREQUENCIES) == 1
    rope_table(torch.arange(3), 32, 10000.0)
    assert len(rope._FREQUENCIES) == 2
    x = torch.randn(5, 4, 64)
    assert torch.equal(apply_rope(x, a, 10000.0), apply_rope(x, torch.arange(5), 10000.0))
    assert b.cos_full.shape == (5, 64)
