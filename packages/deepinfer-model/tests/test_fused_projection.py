"""Fused projections (modules/fused_projection.py): one GEMM for the projections of one input
equals the projections one by one, the members stay views of the stacked weight, and a weight
change after a forward (in place, replaced storage, assigning load, dtype conversion) is never
served from a stale stacked copy."""

import copy

import pytest
import torch
from torch import nn

from deepinfer_model.model import V41ForCausalLM
from deepinfer_model.modules.fused_projection import FusedProjection
from deepinfer_model.presets import tiny
from deepinfer_model.testing import Driver, Seq

PROMPT = torch.randint(4, 8192, (40,), generator=torch.Generator().manual_seed(0)).tolist()   # > window 16


def _linears(widths=(5, 3, 7), fan_in=16, seed=0):
    torch.manual_seed(seed)
    return [nn.Linear(fan_in, w, bias=False) for w in widths]


def _one_by_one(members, x):
    return torch.cat([m(x) for m in members], dim=-1)


def test_members_are_views_of_one_stacked_weight():
    members = _linears()
    fused = FusedProjection(members)
    w = fused.weight()
    assert w.shape == (16, 16) and fused.is_current()       # 15 rows + one zero row (ROW_ALIGN)
    assert torch.equal(w[15], torch.zeros(16))
    for m, start in zip(members, (0, 5, 8), strict=True):
        assert m.weight.is_contiguous() and m.weight.data_ptr() == w[start].data_ptr()
    x = torch.randn(4, 16)
    with torch.no_grad():
        assert torch.allclose(fused(x)[:, :15], _one_by_one(members, x), rtol=0, atol=1e-6)
        assert [t.shape[1] for t in fused.split(fused(x))] == [5, 3, 7]
        assert fused(x).shape == (4, 16)                      # rows of 16 columns: 16-byte aligned in bf16


def test_padding_before_a_member_keeps_it_last():
    """pad_before=2: the zero columns sit between member 1 and member 2 (the attention input keeps
    its KV projection's columns last); split and gradients see the same layout."""
    members = _linears((5, 6, 7))
    fused = FusedProjection(members, pad_before=2)
    assert fused.offsets == (0, 5, 17) and fused.out_features == 24 and fused.is_current()
    x = torch.randn(4, 16)
    with torch.no_grad():
        y = fused(x)
    assert torch.equal(y[:, 11:17], torch.zeros(4, 6))
    for part, m in zip(fused.split(y), members, strict=True):
        assert torch.allclose(part, m(x), rtol=0, atol=1e-6)
    y_grad = fused(x)                                          # autograd path: members one by one
    assert y_grad.shape == y.shape and torch.allclose(y_grad, y, rtol=0, atol=1e-6)


@pytest.mark.parametrize("change", ["in_place", "replace_data", "new_parameter", "to_float64"])
def test_a_weight_change_is_never_served_stale(change):
    members = _linears()
    fused = FusedProjection(members)
    x = torch.randn(4, 16)
    with torch.no_grad():
        fused(x)                                                    # first use
        if change == "in_place":
            members[1].weight.mul_(2.0)                             # a write into the stacked storage
        elif change == "replace_data":
            members[1].weight.data = torch.randn(3, 16)             # fresh storage
        elif change == "new_parameter":
            members[2].weight = nn.Parameter(torch.randn(7, 16))    # e.g. load_state_dict(assign=True)
        else:
            for m in members:
                m.to(torch.float64)
            x = x.double()
        assert torch.allclose(torch.cat(fused.split(fused(x)), -1), _one_by_one(members, x), rtol=0, atol=1e-6)
    assert fused.is_current()


def test_gradients_reach_the_members():
    members = _linears()
    fused = FusedProjection(members)
    twins = copy.deepcopy(members)
    x = torch.randn(4, 16)
    fused(x).square().sum().backward()
    _one_by_one(twins, x).square().sum().backward()
    for m, t in zip(members, twins, strict=True):
        assert torch.allclose(m.weight.grad, t.weight.grad)


def _unfused(monkeypatch):
    """Every FusedProjection runs its members one by one (the unfused engine path)."""
    monkeypatch.setattr(FusedProjection, "__call__", lambda self, x: _one_by_one(self.members, x))


def _engine_logits(model) -> list[torch.Tensor]:
    """Prefill logits of a 40-token prompt, then one decode step with two drafts (every row's logits)."""
    drv = Driver(model, num_blocks=16, block_size=8)
    seq = Seq(list(PROMPT), len(PROMPT))
    _, out = drv.prefill([seq], [len(PROMPT)])
    seq.tokens.append(int(out.logits[-1].argmax()))
    _, dec = drv.decode([seq], [[7, 9]])
    return [out.logits, dec.logits]


def _model(seed: int) -> V41ForCausalLM:
    return V41ForCausalLM(tiny()).init_random_weights(seed).eval()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_paged_forward_fused_equals_unfused(monkeypatch, dtype):
    model = V41ForCausalLM(tiny(), dtype=dtype).init_random_weights(3).eval()
    fused = _engine_logits(model)
    _unfused(monkeypatch)
    for got, want in zip(fused, _engine_logits(model), strict=True):
        assert torch.allclose(got, want, rtol=0, atol=1e-4 if dtype == torch.float32 else 5e-2)


def test_project_input_equals_the_separate_projections():
    model = _model(4)
    cfg = model.config
    for layer in model.model.layers:
        attn = layer.self_attn
        u = torch.randn(6, cfg.hidden_size)
        pos = torch.randint(0, 3000, (6,))
        with torch.no_grad():
            got = attn.project_input(u, pos)
            q, q_lat = attn.query(u, pos)
            assert torch.allclose(got.q, q, atol=1e-5) and torch.allclose(got.q_latent, q_lat, atol=1e-5)
            assert torch.allclose(got.latent, attn.latent(u, pos), atol=1e-5)
            if attn.indexer is not None:
                assert torch.allclose(got.index_weights, attn.indexer.weights_proj(u), atol=1e-6)
            if attn.compressor is not None and not layer.is_consumer:
                assert torch.allclose(got.compressor_terms, attn.compressor.token_terms(u), atol=1e-6)
            else:
                assert got.compressor_terms is None
            if attn.compressor is not None and layer.is_consumer:   # reads the shared hidden: its own stack
                assert torch.allclose(attn.compressor.project_terms(u), attn.compressor.token_terms(u), atol=1e-6)


def test_paged_forward_after_weight_changes_matches_a_fresh_model():
    """Weights changed after a first forward, in each way the tests load them, give the logits of a
    model built with those weights (no stale stacked weight)."""
    target = _model(1)
    want = _engine_logits(target)
    state = target.state_dict()
    ways = {
        "load_state_dict": lambda m: m.load_state_dict(state),                       # in place
        "assign": lambda m: m.load_state_dict({k: v.clone() for k, v in state.items()}, assign=True),
        "param.data": lambda m: [setattr(p, "data", state[n].clone()) for n, p in m.named_parameters()],
    }
    for name, load in ways.items():
        model = _model(0)
        _engine_logits(model)
        with torch.no_grad():
            load(model)
        for got, w in zip(_engine_logits(model), want, strict=True):
            assert torch.equal(got, w), name


def test_model_linear_is_a_bias_free_nn_linear():
    """The model's projections (modules/linear.py): nn.Linear's parameter and state-dict layout,
    its values (the kernels' `linear` is F.linear off SM90), no bias."""
    import pytest

    from deepinfer_model.modules.linear import Linear

    lin = Linear(16, 8)
    ref = torch.nn.Linear(16, 8, bias=False)
    ref.load_state_dict(lin.state_dict())
    x = torch.randn(3, 16)
    assert list(lin.state_dict()) == ["weight"] and torch.equal(lin(x), ref(x))
    with pytest.raises(ValueError, match="bias"):
        Linear(16, 8, bias=True)


def test_normed_rows_norm_once_and_project_like_the_two_ops_on_the_cpu():
    """`NormedRows` (a q latent's norm before q_b and the indexer's query): off the GPU the rows are
    normalised once, up front, and each projection equals the norm then the projection; the fused
    `FusedProjection.normed` / `RMSNorm.add_linear` equal their two-op compositions."""
    from deepinfer_model.modules.norm import NormedRows, RMSNorm

    g = torch.Generator().manual_seed(0)
    norm = RMSNorm(64, 1e-6)
    norm.weight.data = torch.rand(64, generator=g) + 0.5
    x, r = torch.randn(1, 64, generator=g).bfloat16(), torch.randn(1, 64, generator=g).bfloat16()
    w = torch.randn(32, 64, generator=g).bfloat16()
    with torch.no_grad():
        rows = NormedRows(x, norm)
        assert not rows.per_projection and torch.equal(rows.normed(), norm(x))
        assert torch.equal(rows.project(w), torch.nn.functional.linear(norm(x), w))
        s, u, y = norm.add_linear(x, r, w)
        assert torch.equal(s, x + r) and torch.equal(u, norm(x + r))
        assert torch.equal(y, torch.nn.functional.linear(norm(x + r), w))
