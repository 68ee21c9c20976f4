"""confidence_head_fused vs the literal sigmoid(cat(...) @ w / T)."""

from __future__ import annotations

import pytest
import torch

from deepinfer_kernels.ops.verification import confidence_head_fused


def literal(hidden, weight, temperature, markov):
    x = hidden.float() if markov is None else torch.cat([hidden.float(), markov.float()], -1)
    return torch.sigmoid((x.double() @ weight.double()) / temperature).float()


def test_matches_literal_formula_with_markov():
    g = torch.Generator().manual_seed(0)
    n, h, r = 12, 32, 8
    hidden, markov = torch.randn(n, h, generator=g), torch.randn(n, r, generator=g)
    w = torch.randn(h + r, generator=g) * 0.2
    out = confidence_head_fused(hidden, w, 1.7, markov)
    assert out.dtype == torch.float32 and out.shape == (n,)
    torch.testing.assert_close(out, literal(hidden, w, 1.7, markov))


def test_without_markov_and_default_temperature():
    g = torch.Generator().manual_seed(1)
    hidden, w = torch.randn(5, 16, generator=g), torch.randn(16, generator=g)
    torch.testing.assert_close(confidence_head_fused(hidden, w), literal(hidden, w, 1.0, None))


def test_per_position_temperature_is_block_major():
    g = torch.Generator().manual_seed(2)
    nextn, blocks, h = 3, 4, 8
    hidden, w = torch.randn(blocks * nextn, h, generator=g), torch.randn(h, generator=g)
    temps = torch.tensor([0.5, 1.0, 2.0])
    out = confidence_head_fused(hidden, w, temps)
    expected = literal(hidden, w, temps.repeat(blocks).double(), None)
    torch.testing.assert_close(out, expected)


def test_bf16_inputs_compute_in_float32():
    g = torch.Generator().manual_seed(3)
    hidden, markov = torch.randn(6, 64, generator=g).bfloat16(), torch.randn(6, 4, generator=g).bfloat16()
    w = torch.randn(68, generator=g).bfloat16()
    torch.testing.assert_close(confidence_head_fused(hidden, w, 1.0, markov), literal(hidden, w.float(), 1.0, markov))


def test_argument_errors():
    hidden, w = torch.zeros(6, 4), torch.zeros(4)
    with pytest.raises(ValueError, match=r"weight must have shape \[H \+ R\] = \[6\]"):
        confidence_head_fused(hidden, w, 1.0, torch.zeros(6, 2))
    with pytest.raises(ValueError, match=r"markov_emb must have shape \[n, R\]"):
        confidence_head_fused(hidden, torch.zeros(6), 1.0, torch.zeros(5, 2))
    with pytest.raises(ValueError, match="multiple of nextn"):
        confidence_head_fused(hidden, w, torch.ones(4))
    with pytest.raises(ValueError, match="temperature must be > 0"):
        confidence_head_fused(hidden, w, 0.0)
