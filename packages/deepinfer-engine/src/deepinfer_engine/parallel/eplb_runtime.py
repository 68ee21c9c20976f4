"""EPLB while serving: the routing window, the `moe_lb` figure, and rebalancing between steps.

Knobs (SPEC §4/§6), read once per rank:
  DEEPINFER_EXPERT_COUNT_WINDOW_SIZE (100)          steps of routing statistics the plan is made from
  DEEPINFER_MOE_LB_STAT_INTERVAL (128)              steps between updates of the `moe_lb` figure
  DEEPINFER_EXPERT_REARRANGEMENT_STEP_INTERVAL (0)  steps between rebalances (0 = never)
  DEEPINFER_OVERRIDE_NUM_EXTRA_EXPERTS (32)         extra physical slots, a lower bound rounded up so
                                                    that routed + extra divides ep_size

Each physical slot's owner counts its pairs per step on the device (no sync); at a stat or
rebalance step the window is summed over the ranks by one all-reduce, so every rank computes the
same plan from the same counts: no broadcast, only the weight moves (point-to-point,
`ExpertParallel.rebalance`).
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field

import numpy as np
import torch

from deepinfer_engine.envs import _int
from deepinfer_model.parallel.eplb import moe_lb, num_physical_experts, rebalance_experts_global

logger = logging.getLogger("deepinfer")


@dataclass
class EplbRuntime:
    window_size: int
    stat_interval: int
    rearrangement_interval: int
    num_extra: int
    ep = None
    window: deque = field(default_factory=deque)     # per step: this rank's pairs per slot [layers, P] (device)
    num_steps: int = 0
    last_moe_lb: float | None = None
    num_rebalances: int = 0

    @classmethod
    def from_environ(cls, model, ep_size: int) -> EplbRuntime:
        n = model.config.n_routed_experts
        extra = _int("DEEPINFER_OVERRIDE_NUM_EXTRA_EXPERTS", 32, minimum=0)
        return cls(window_size=_int("DEEPINFER_EXPERT_COUNT_WINDOW_SIZE", 100, minimum=1),
                   stat_interval=_int("DEEPINFER_MOE_LB_STAT_INTERVAL", 128, minimum=1),
                   rearrangement_interval=_int("DEEPINFER_EXPERT_REARRANGEMENT_STEP_INTERVAL", 0, minimum=0),
                   num_extra=num_physical_experts(n, ep_size, extra) - n)

    def attach(self, ep) -> None:
        self.ep = ep

    def after_step(self, ran_forward: bool = True) -> None:
        """Once per engine step on every rank: end the step's EP rounds, then the EPLB cadence."""
        ep = self.ep
        ep.finish_step(ran_forward)
        self.window.append(ep.step_counts())
        while len(self.window) > self.window_size:
            self.window.popleft()
        self.num_steps += 1
        lb_due = self.num_steps % self.stat_interval == 0
        rebalance_due = bool(self.rearrangement_interval) and self.num_steps % self.rearrangement_interval == 0
        if not (lb_due or rebalance_due):
            return
        counts = self.ep.sum_over_ranks(torch.stack(list(self.window)))   # [steps, layers, P], every rank
        if lb_due:
            self.last_moe_lb = moe_lb(counts.sum(0), self.ep.num_local)
            logger.info("eplb: moe_lb %.3f over the last %d steps", self.last_moe_lb, len(self.window))
        if rebalance_due:
            self.rebalance(counts)

    def logical_window(self, counts: np.ndarray) -> np.ndarray:
        """[steps, layers, P] pairs per physical slot -> [steps, layers, E] per logical expert."""
        plan = self.ep.plan
        out = np.zeros((counts.shape[0], plan.num_layers, plan.logical_count.shape[1]), np.int64)
        for layer in range(plan.num_layers):
            np.add.at(out[:, layer], (slice(None), plan.physical_to_logical[layer]), counts[:, layer])
        return out

    def rebalance(self, counts: np.ndarray) -> None:
        plan = rebalance_experts_global(self.logical_window(counts), self.ep.plan.num_physical, self.ep.num_local)
        moved = self.ep.rebalance(plan)
        self.window.clear()          # counts of the old placement
        self.num_rebalances += 1
        logger.info("eplb: rebalanced (%d expert slots received by this rank)", moved)
