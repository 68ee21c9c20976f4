"""EPLB: expert-parallel load balancing (SPEC §6). Pure functions over routing counts; no torch.distributed.

    tokens_per_expert [steps, layers, E]  (a window of routing statistics)
        |  sum over steps -> load [layers, E]
        v
    1. replication: every logical expert gets one replica; each of the `num_physical - E` extra
       slots goes to the expert with the largest load per replica (greedy, minimising the maximum
       per-replica load). Ties: a tiny index-dependent noise (lower expert id first), deterministic.
    2. placement: replicas sorted by load per replica, heaviest first, each onto the rank with the
       least load so far that still has a free slot and, where possible, no replica of that expert
       (longest-processing-time greedy; every rank holds exactly `num_local_physical` slots).
        v
    EplbPlan: physical_to_logical [layers, P], logical_to_physical [layers, E, R] (-1 padded),
              logical_count [layers, E]        P = ep_size * num_local_physical, R = max replicas

Physical slot p lives on rank `p // num_local_physical` at local index `p % num_local_physical`.
A token's slot-j choice of logical expert e runs on replica `(row + j) % logical_count[e]`
(`replica_choice`): tokens spread evenly over replicas, deterministically.

`moe_lb` = the slowest rank's (token, expert) pairs / the mean rank's, per layer, averaged over
layers (SPEC: 1.045-1.09 in the reference system); 1.0 is perfect balance.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

TIE_NOISE = 1e-9   # per expert id: the tie-breaking noise of the greedy steps (relative to the load)


@dataclass(frozen=True)
class EplbPlan:
    physical_to_logical: np.ndarray   # [layers, P] int64 logical expert held by physical slot p
    logical_to_physical: np.ndarray   # [layers, E, R] int64 physical slots of expert e, -1 padded
    logical_count: np.ndarray         # [layers, E] int64 replicas of expert e (>= 1)
    num_local_physical: int           # slots per rank

    @property
    def num_layers(self) -> int:
        return self.physical_to_logical.shape[0]

    @property
    def num_physical(self) -> int:
        return self.physical_to_logical.shape[1]

    @property
    def ep_size(self) -> int:
        return self.num_physical // self.num_local_physical


def num_physical_experts(num_experts: int, ep_size: int, num_extra: int) -> int:
    """Routed + extra slots, `num_extra` a lower bound rounded up so that ep_size divides the total
    (SPEC's DEEPINFER_OVERRIDE_NUM_EXTRA_EXPERTS rule)."""
    if num_extra < 0:
        raise ValueError(f"num_extra: must be >= 0, got {num_extra}")
    total = num_experts + num_extra
    return -(-total // ep_size) * ep_size


def static_plan(num_layers: int, num_experts: int, ep_size: int, num_extra: int = 0) -> EplbPlan:
    """The plan before any statistics: expert e on slot e (a contiguous range per rank), the extra
    slots (if any) replicate experts 0, 1, ... in order."""
    p = num_physical_experts(num_experts, ep_size, num_extra)
    p2l = np.tile(np.arange(p, dtype=np.int64) % num_experts, (num_layers, 1))
    return plan_from_physical(p2l, num_experts, p // ep_size)


def plan_from_physical(physical_to_logical: np.ndarray, num_experts: int, num_local_physical: int) -> EplbPlan:
    """physical_to_logical [layers, P] -> the full plan (inverse map and counts)."""
    p2l = np.asarray(physical_to_logical, dtype=np.int64)
    layers, p = p2l.shape
    if p % num_local_physical:
        raise ValueError(f"num_physical {p} is not a multiple of num_local_physical {num_local_physical}")
    count = np.stack([np.bincount(p2l[l], minlength=num_experts) for l in range(layers)])
    if (count == 0).any():
        layer, e = np.argwhere(count == 0)[0]
        raise ValueError(f"layer {layer}: logical expert {e} has no physical slot")
    r = int(count.max())
    l2p = np.full((layers, num_experts, r), -1, dtype=np.int64)
    for l in range(layers):
        fill = np.zeros(num_experts, dtype=np.int64)
        for slot, e in enumerate(p2l[l]):
            l2p[l, e, fill[e]] = slot
            fill[e] += 1
    return EplbPlan(p2l, l2p, count, num_local_physical)


def replicate(load: np.ndarray, num_physical: int) -> np.ndarray:
    """load [E] -> replica counts [E] (sum = num_physical, each >= 1): greedy on load per replica."""
    e = load.shape[0]
    if num_physical < e:
        raise ValueError(f"num_physical {num_physical} < num_experts {e}")
    noisy = load.astype(np.float64) + (1.0 + load.max()) * TIE_NOISE * (e - np.arange(e))
    count = np.ones(e, dtype=np.int64)
    for _ in range(num_physical - e):
        count[int(np.argmax(noisy / count))] += 1
    return count


def place(load: np.ndarray, count: np.ndarray, ep_size: int, num_local_physical: int) -> np.ndarray:
    """load [E], replica counts [E] -> physical_to_logical [ep_size * num_local_physical] (balanced)."""
    e = load.shape[0]
    per_replica = load.astype(np.float64) / count
    replicas = [(per_replica[x], x) for x in range(e) for _ in range(int(count[x]))]
    replicas.sort(key=lambda r: (-r[0], r[1]))
    rank_load = np.zeros(ep_size)
    slots: list[list[int]] = [[] for _ in range(ep_size)]
    for w, x in replicas:
        free = [r for r in range(ep_size) if len(slots[r]) < num_local_physical]
        fresh = [r for r in free if x not in slots[r]] or free   # spread an expert's replicas over ranks
        r = min(fresh, key=lambda q: (rank_load[q], q))
        slots[r].append(x)
        rank_load[r] += w
    return np.array([x for s in slots for x in s], dtype=np.int64)


def rebalance_experts_global(tokens_per_expert: np.ndarray, num_physical: int, num_local_physical: int) -> EplbPlan:
    """tokens_per_expert [steps, layers, E] -> a balanced EplbPlan (steps 1 and 2 of the docstring)."""
    tpe = np.asarray(tokens_per_expert)
    if tpe.ndim != 3:
        raise ValueError(f"tokens_per_expert: expected [steps, layers, experts], got shape {tpe.shape}")
    if num_physical % num_local_physical:
        raise ValueError(f"num_physical {num_physical} is not a multiple of num_local_physical {num_local_physical}")
    load = tpe.sum(0)                                                        # [layers, E]
    ep_size = num_physical // num_local_physical
    p2l = np.stack([place(load[l], replicate(load[l], num_physical), ep_size, num_local_physical)
                    for l in range(load.shape[0])])
    return plan_from_physical(p2l, load.shape[1], num_local_physical)


def replica_choice(ids: np.ndarray, plan: EplbPlan, layer: int) -> np.ndarray:
    """Logical ids [T, k] -> physical slots [T, k] by the `(row + j) % count` rule (numpy twin of
    the torch one in expert_parallel.py)."""
    t, k = ids.shape
    turn = (np.arange(t)[:, None] + np.arange(k)[None, :]) % plan.logical_count[layer][ids]
    return plan.logical_to_physical[layer][ids, turn]


def rank_loads(physical_counts: np.ndarray, num_local_physical: int) -> np.ndarray:
    """(token, expert) pairs per physical slot [..., P] -> per rank [..., ep_size]."""
    c = np.asarray(physical_counts)
    return c.reshape(*c.shape[:-1], -1, num_local_physical).sum(-1)


def moe_lb(physical_counts: np.ndarray, num_local_physical: int) -> float:
    """Pairs per physical slot [layers, P] (summed over a window) -> max / mean rank load, averaged
    over layers with any load (1.0 = balanced)."""
    loads = rank_loads(physical_counts, num_local_physical).astype(np.float64)   # [layers, ep]
    mean = loads.mean(-1)
    busy = mean > 0
    if not busy.any():
        return 1.0
    return float((loads[busy].max(-1) / mean[busy]).mean())


def physical_counts(ids: np.ndarray, plan: EplbPlan, layer: int) -> np.ndarray:
    """Logical ids [T, k] of one layer -> pairs per physical slot [P] under the plan's replica choice."""
    return np.bincount(replica_choice(ids, plan, layer).reshape(-1), minlength=plan.num_physical)
