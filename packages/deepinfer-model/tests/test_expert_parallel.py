"""Expert-parallel MoE over 2 gloo processes against the single-process MoE (fp32, CPU).

One spawned pair per module. Each rank brings its own tokens (DP attention: different counts,
some layers skipped on one rank, one rank with no work at all); the EP output must equal the
single-process MoE over the same tokens, before and after an EPLB weight move.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from deepinfer_model.parallel.testing import RankGroup


@pytest.fixture(scope="module")
def pair():
    with RankGroup(2) as group:
        yield group


def _model():
    import copy

    from deepinfer_model.testing import tiny_model
    return copy.deepcopy(tiny_model(seed=3))   # the helper caches: the transform must not touch its copy


def _moe_layers(model):
    from deepinfer_model.modules.moe import MoE
    return [layer.mlp for layer in model.model.layers if isinstance(layer.mlp, MoE)]


def _tokens(rank: int, n: int, hidden: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(100 + rank)
    return torch.randn(n, hidden, generator=g)


def _rank_layers(rank: int, world: int, arg) -> dict:
    """Rank body: EP over every MoE layer with this rank's (count, layers run) from `arg`."""
    from deepinfer_model.parallel.eplb import rebalance_experts_global
    from deepinfer_model.parallel.expert_parallel import apply_expert_parallel
    counts, skip, extra, static = arg["counts"], arg["skip"], arg["extra"], arg.get("static", False)
    model = _model()
    hidden = model.config.hidden_size
    ref_layers = [m for m in _moe_layers(_model())]
    ep = apply_expert_parallel(model, plan=None, num_extra=extra)
    ep.comm.static_capacity = 8 if static else None
    ep.comm.dispatch = arg.get("dispatch", ep.comm.dispatch)
    out = {}
    with torch.no_grad():
        for step in range(2):   # step 1 after a rebalance (weights moved between the ranks)
            x = _tokens(rank, counts[rank], hidden)
            ep.begin_step(static)
            ys, refs = [], []
            for pos, layer in enumerate(ep.layers):
                if pos in skip[rank]:
                    continue
                ys.append(layer(x, residual=x))
                refs.append(ref_layers[pos](x, residual=x))
            ep.finish_step(ran_forward=len(skip[rank]) < len(ep.layers))
            out[f"max_err_{step}"] = max((float((a - b).abs().max()) for a, b in zip(ys, refs)), default=0.0)
            out[f"equal_{step}"] = all(torch.equal(a, b) for a, b in zip(ys, refs))
            stats = ep.take_counts()
            if step == 0:
                logical = np.zeros((len(ep.layers), model.config.n_routed_experts), np.int64)
                for pos in range(len(ep.layers)):
                    np.add.at(logical[pos], ep.plan.physical_to_logical[pos], stats[pos])
                before = ep.plan.physical_to_logical.copy()
                ep.rebalance(rebalance_experts_global(logical[None], ep.plan.num_physical, ep.num_local))
                out["moved"] = bool((before != ep.plan.physical_to_logical).any())
        out["rounds"], out["phantoms"] = ep.comm.num_rounds, ep.comm.num_phantom_rounds
    return out


@pytest.mark.parametrize("case", [
    {"counts": [5, 3], "skip": [[], []], "extra": 0},          # different counts, every layer
    {"counts": [6, 4], "skip": [[], [3, 4, 5]], "extra": 2},   # rank 1 skips the consumer layers
    {"counts": [4, 0], "skip": [[], [0, 1, 2, 3, 4, 5]], "extra": 2},   # rank 1: a dummy step
    {"counts": [6, 4], "skip": [[], [3, 4, 5]], "extra": 2, "dispatch": "all_gather"},
    {"counts": [5, 3], "skip": [[], []], "extra": 2, "static": True},   # decode: fixed shapes, no header
    {"counts": [4, 0], "skip": [[], [0, 1, 2, 3, 4, 5]], "extra": 0, "static": True},
], ids=["counts", "skipped-layers", "dummy-rank", "all-gather", "static", "static-dummy-rank"])
def test_ep_moe_equals_single_process(pair, case):
    a, b = pair.run(_rank_layers, case)
    for r in (a, b):
        # top-2 over 2 ranks: each pair is computed on one rank, the other adds 0: equal up to the
        # row batching of the expert GEMMs (fp32)
        assert r["max_err_0"] < 1e-5 and r["max_err_1"] < 1e-5, r
    assert a["rounds"] == b["rounds"]             # every collective matched
    assert a["moved"] and b["moved"]              # the rebalance changed the placement
    if case["skip"][1]:
        assert b["phantoms"] > 0
    if case.get("static"):
        assert a["rounds"] == 12                  # 6 layers x 2 steps, no header rounds


def _rank_skewed(rank: int, world: int, arg) -> dict:
    """Zipf-skewed routing (router bias) on one MoE layer: moe_lb before and after EPLB."""
    from deepinfer_model.parallel.eplb import moe_lb, num_physical_experts, rebalance_experts_global
    from deepinfer_model.parallel.expert_parallel import apply_expert_parallel
    model = _model()
    n_exp = model.config.n_routed_experts
    ref = _moe_layers(_model())[0]
    # Zipf ranks over the experts, hottest first among those the static plan keeps on rank 0 alone
    # (slots 0-5 = experts 0-5 there; rank 1's slots 6-11 = experts 6, 7 and replicas of 0-3)
    order = torch.tensor([4, 5, 0, 6, 1, 7, 2, 3])
    zipf = torch.empty(n_exp)
    zipf[order] = torch.log(1.0 / torch.arange(1, n_exp + 1, dtype=torch.float32))
    for m in _moe_layers(model) + [ref]:
        m.gate.e_score_correction_bias.data = arg * (zipf - zipf.mean())   # chooses, never weighs
    ep = apply_expert_parallel(model, num_extra=num_physical_experts(n_exp, world, 4) - n_exp)
    x = _tokens(rank, 256, model.config.hidden_size)
    layer = ep.layers[0]
    res = {}
    with torch.no_grad():
        y0 = layer(x)
        for pos in range(1, len(ep.layers)):
            ep.layers[pos](x)
        ep.finish_step()
        c = ep.take_counts()
        res["lb_before"] = moe_lb(c[:1], ep.num_local)
        logical = np.zeros((len(ep.layers), n_exp), np.int64)
        for pos in range(len(ep.layers)):
            np.add.at(logical[pos], ep.plan.physical_to_logical[pos], c[pos])
        ep.rebalance(rebalance_experts_global(logical[None], ep.plan.num_physical, ep.num_local))
        y1 = layer(x)
        for pos in range(1, len(ep.layers)):
            ep.layers[pos](x)
        ep.finish_step()
        res["lb_after"] = moe_lb(ep.take_counts()[:1], ep.num_local)
        res["unchanged"] = float((y0 - y1).abs().max())
        res["ref_err"] = float((y1 - ref(x)).abs().max())
    return res


def test_eplb_rebalances_skewed_routing_outputs_unchanged(pair):
    for r in pair.run(_rank_skewed, 0.4):   # a Zipf-ranked selection bias: 1.67 before, 1.01 after
        assert r["lb_before"] > 1.5, r
        assert r["lb_after"] <= 1.05, r
        assert r["unchanged"] < 1e-5 and r["ref_err"] < 1e-5, r
