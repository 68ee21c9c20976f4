"""EPLB (parallel/eplb.py): replication + placement on skewed synthetic routing (a Zipf over experts)."""

from __future__ import annotations

import numpy as np
import pytest

from deepinfer_model.parallel.eplb import (
    moe_lb,
    num_physical_experts,
    physical_counts,
    plan_from_physical,
    rebalance_experts_global,
    replicate,
    static_plan,
)


def _zipf_routing(rng, num_experts: int, top_k: int, tokens: int, s: float = 1.0) -> np.ndarray:
    """ids [tokens, top_k]: distinct experts per token, drawn by a Zipf(s) over the expert ids (expert 0
    hottest: the static plan's contiguous ranges put the hot experts on rank 0)."""
    p = 1.0 / np.arange(1, num_experts + 1) ** s
    p = np.log(p / p.sum())
    return np.argsort(-(rng.gumbel(size=(tokens, num_experts)) + p), axis=1)[:, :top_k]


@pytest.mark.parametrize("num_experts,ep,extra,top_k", [(64, 8, 32, 6), (16, 2, 4, 2)])
def test_zipf_routing_balanced_after_rebalance(num_experts, ep, extra, top_k):
    rng = np.random.default_rng(0)
    window = [_zipf_routing(rng, num_experts, top_k, 512) for _ in range(20)]
    tpe = np.stack([np.bincount(ids.reshape(-1), minlength=num_experts)[None] for ids in window])  # [20, 1, E]
    before = moe_lb(sum(physical_counts(ids, static_plan(1, num_experts, ep), 0) for ids in window)[None],
                    num_experts // ep)
    p = num_physical_experts(num_experts, ep, extra)
    plan = rebalance_experts_global(tpe, p, p // ep)
    held_out = [_zipf_routing(rng, num_experts, top_k, 512) for _ in range(20)]
    after = moe_lb(sum(physical_counts(ids, plan, 0) for ids in held_out)[None], p // ep)
    if num_experts == 64:
        assert before > 1.5          # 3.96: the hot experts pile onto rank 0
    assert after <= 1.05, (before, after)   # 1.019 (64 / EP8), on routing the plan never saw
    assert np.array_equal(np.sort(np.unique(plan.physical_to_logical)), np.arange(num_experts))


def test_replication_minimises_max_load_per_replica():
    load = np.array([100, 10, 10, 10])
    count = replicate(load, 8)
    assert count.tolist() == [5, 1, 1, 1]          # 20 per replica beats any other split of 4 extras
    assert count.sum() == 8 and (count >= 1).all()


def test_ties_break_deterministically_by_expert_id():
    a = rebalance_experts_global(np.ones((1, 1, 8), np.int64), 12, 6)
    b = rebalance_experts_global(np.ones((1, 1, 8), np.int64), 12, 6)
    assert np.array_equal(a.physical_to_logical, b.physical_to_logical)
    assert a.logical_count[0].tolist() == [2, 2, 2, 2, 1, 1, 1, 1]   # the extras go to the lowest ids


def test_placement_spreads_replicas_and_fills_every_rank():
    plan = rebalance_experts_global(np.array([[[900, 50, 30, 20, 10, 5, 3, 2]]]), 16, 4)
    slots = plan.physical_to_logical[0].reshape(4, 4)          # [rank, local slot]
    hot = int(plan.logical_count[0, 0])
    assert hot >= 4 and (slots == 0).any(1).all()               # the hot expert's replicas reach every rank
    assert sorted(plan.logical_count[0].tolist(), reverse=True) == plan.logical_count[0].tolist()
    for p, e in enumerate(plan.physical_to_logical[0]):
        assert p in plan.logical_to_physical[0, e]


def test_extra_slots_round_up_to_a_multiple_of_ep():
    assert num_physical_experts(384, 64, 32) == 448       # SPEC: lower bound 32, routed + extra divides ep
    assert num_physical_experts(8, 2, 3) == 12
    with pytest.raises(ValueError, match="no physical slot"):
        plan_from_physical(np.array([[0, 1, 1, 1]]), 3, 2)
