"""Expert parallelism as a model transform: `apply_expert_parallel(model, group)`.

Every MoE layer's routed experts are partitioned over the EP group by an `EplbPlan` (physical
slot p on rank `p // L`, L = slots per rank; the static plan is a contiguous range of experts per
rank). The router, the shared expert and everything dense stay replicated. One MoE call:

    x [N, H] -> router (replicated) -> logical ids, weights [N, k] -> replica choice -> physical ids
             -> shared expert (local)
             -> ExpertParallelComm.exchange: all-gather tokens + routing of every rank, this rank's
                experts over the pairs routed to them, reduce-scatter (sum) back   (ep_comm.py)
             -> residual + (routed + shared)          (the single-process MoE's rounding order)

In fp32 on the CPU the routed sum equals the single-process one term for term at top-2 (each
(token, slot) pair is computed on exactly one rank, the others add 0); in general only the
order of the k-term sum differs. Routing statistics (pairs per physical slot per layer) are
recorded by the slot's owner; `take_counts(sum_ranks=True)` all-reduces them (every rank the same).

`ExpertParallel.rebalance(plan)` moves expert weights rank to rank (point-to-point sends of the
slots that change owner; NCCL on GPUs: GPU to GPU) and switches the replica maps between steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from deepinfer_kernels.ops.moe import routed_experts
from deepinfer_model.modules.moe import MoE, StackedExperts
from deepinfer_model.parallel.eplb import EplbPlan, static_plan
from deepinfer_model.parallel.ep_comm import ExpertParallelComm


class ExpertParallelMoE(MoE):
    """An MoE layer whose routed experts are this rank's physical slots (`experts.w13 [L, 2I, H]`)."""

    def __init__(self, moe: MoE, ep: ExpertParallel, layer_pos: int):
        nn.Module.__init__(self)
        self.top_k, self.norm_topk_prob, self.scaling = moe.top_k, moe.norm_topk_prob, moe.scaling
        self.gate, self.shared_experts, self.input_projection = moe.gate, moe.shared_experts, moe.input_projection
        self.num_logical = moe.experts.w13.shape[0]
        self.layer_pos = layer_pos
        self._ep = [ep]   # a list: not a submodule
        local = ep.local_slots(layer_pos)
        self.experts = StackedExperts(0, moe.experts.w2.shape[1], moe.experts.w2.shape[2])
        self.experts.w13 = nn.Parameter(moe.experts.w13.data[local].clone(), requires_grad=False)   # [L, 2I, H]
        self.experts.w2 = nn.Parameter(moe.experts.w2.data[local].clone(), requires_grad=False)     # [L, H, I]
        self.set_maps(ep.plan)

    def set_maps(self, plan: EplbPlan) -> None:
        dev = self.gate.weight.device
        self.logical_to_physical = torch.as_tensor(plan.logical_to_physical[self.layer_pos], device=dev)  # [E, R]
        self.logical_count = torch.as_tensor(plan.logical_count[self.layer_pos], device=dev)              # [E]

    def physical_ids(self, ids: torch.Tensor) -> torch.Tensor:
        """Logical ids [N, k] -> physical slots [N, k] int64: replica `(row + j) % count[e]` (eplb.py)."""
        ids = ids.long()
        n, k = ids.shape
        turn = (torch.arange(n, device=ids.device)[:, None] + torch.arange(k, device=ids.device)[None, :])
        turn = turn % self.logical_count[ids]
        return self.logical_to_physical[ids, turn]

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None, streams=None,
                projected: torch.Tensor | None = None) -> torch.Tensor:
        """x [N, H] -> [N, H] (+ residual [N, H]), as `MoE.forward`; `streams` is not used under EP."""
        shared = None
        if self.input_projection is None:
            weights, ids = self.route(x)
        else:
            fused = self.input_projection(x) if projected is None else projected
            logits, gate, up = self.input_projection.split(fused)
            shared = self.shared_experts.from_gate_up(gate, up)
            weights, ids = self.route_logits(logits)
        ep = self._ep[0]
        out = ep.comm.exchange(self.layer_pos, x, self.physical_ids(ids), weights).to(x.dtype)
        out = out if shared is None else out + shared
        return out if residual is None else residual + out

    def local_compute(self, x_all: torch.Tensor, ids_all: torch.Tensor, w_all: torch.Tensor,
                      valid: torch.Tensor) -> torch.Tensor:
        """Every rank's rows: x_all [M, H], ids_all [M, k] physical, w_all [M, k], valid [M] ->
        this rank's experts' weighted outputs summed per row [M, H] float32 (0 elsewhere)."""
        ep = self._ep[0]
        lo = ep.rank * ep.num_local
        if valid is None:   # a static round (ep_comm.py): fixed shapes, no host read
            return self._masked_compute(x_all, ids_all, w_all, lo)
        mine = valid[:, None] & (ids_all >= lo) & (ids_all < lo + ep.num_local)              # [M, k]
        ep.record(self.layer_pos, ids_all[mine])
        out = torch.zeros(x_all.shape[0], x_all.shape[1], dtype=torch.float32, device=x_all.device)
        rows, slots = mine.nonzero(as_tuple=True)            # row-major: a row's slots in order
        if rows.numel():
            y = routed_experts(x_all[rows], w_all[rows, slots].unsqueeze(1),
                               (ids_all[rows, slots] - lo).to(torch.int32).unsqueeze(1),
                               self.experts.w13, self.experts.w2)                            # [P, H]
            out.index_add_(0, rows, y.float())
        return out

    def pair_compute(self, x: torch.Tensor, local: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """Pairs routed to this rank (all-to-all dispatch): x [R, H], local slot [R], weight [R] ->
        weighted expert outputs [R, H] float32."""
        ep = self._ep[0]
        ep.record(self.layer_pos, local + ep.rank * ep.num_local)
        if local.numel() == 0:
            return torch.zeros(0, x.shape[1], dtype=torch.float32, device=x.device)
        return routed_experts(x, w.unsqueeze(1), local.to(torch.int32).unsqueeze(1),
                              self.experts.w13, self.experts.w2).float()

    def _masked_compute(self, x_all: torch.Tensor, ids_all: torch.Tensor, w_all: torch.Tensor,
                        lo: int) -> torch.Tensor:
        """Every pair through this rank's experts, weight 0 unless the pair is routed here (padding
        rows weigh 0 everywhere). Capturable: static shapes, no nonzero."""
        ep = self._ep[0]
        real = w_all > 0                                                                      # [M, k]
        mine = real & (ids_all >= lo) & (ids_all < lo + ep.num_local)
        ep.record_masked(self.layer_pos, ids_all, mine)
        local = torch.where(mine, ids_all - lo, torch.zeros_like(ids_all)).to(torch.int32)
        w = torch.where(mine, w_all, torch.zeros_like(w_all))
        return routed_experts(x_all, w, local, self.experts.w13, self.experts.w2).float()


@dataclass
class ExpertParallel:
    """The EP state of one rank: group, plan, MoE layers (by position), routing statistics."""

    comm: ExpertParallelComm
    plan: EplbPlan
    layers: list[ExpertParallelMoE]
    rank: int
    size: int
    counts: torch.Tensor            # [layers, P] int64 pairs per physical slot since the last take

    @property
    def num_local(self) -> int:
        return self.plan.num_local_physical

    def local_slots(self, layer_pos: int) -> list[int]:
        """Logical expert of each of this rank's slots in one layer."""
        p2l = self.plan.physical_to_logical[layer_pos]
        return [int(e) for e in p2l[self.rank * self.num_local:(self.rank + 1) * self.num_local]]

    def record(self, layer_pos: int, ids: torch.Tensor) -> None:
        self.counts[layer_pos] += torch.bincount(ids.reshape(-1), minlength=self.plan.num_physical)

    def record_masked(self, layer_pos: int, ids: torch.Tensor, real: torch.Tensor) -> None:
        """`record` without a host read (static rounds): pairs where `real` [M, k]."""
        self.counts[layer_pos].index_add_(0, ids.reshape(-1), real.reshape(-1).to(torch.int64))

    def step_counts(self) -> torch.Tensor:
        """This rank's pairs per physical slot [layers, P] since the last call (device, no sync)."""
        c = self.counts.clone()
        self.counts.zero_()
        return c

    def sum_over_ranks(self, counts: torch.Tensor) -> np.ndarray:
        """Collective: [..., P] counts of every rank summed (each slot's owner counted its pairs)."""
        c = counts.clone()
        dist.all_reduce(c, op=dist.ReduceOp.SUM, group=self.comm.group)
        return c.cpu().numpy()

    def take_counts(self) -> np.ndarray:
        """Pairs per physical slot [layers, P] since the last call, summed over the ranks (a
        collective: every rank calls it at the same point; each slot's owner counted its pairs)."""
        c = self.counts.clone()
        dist.all_reduce(c, op=dist.ReduceOp.SUM, group=self.comm.group)
        self.counts.zero_()
        return c.cpu().numpy()

    def begin_step(self, static: bool) -> None:
        self.comm.begin_step(static)

    def finish_step(self, ran_forward: bool = True) -> None:
        """End of a step on every rank (the dummy step of a rank without work): ep_comm.py."""
        self.comm.finish_step(ran_forward)

    def rebalance(self, plan: EplbPlan) -> int:
        """Switch to `plan`: slots whose expert changes get its weights from a rank holding it (a
        local copy where this rank has one). Collective over the group; call it between steps on
        every rank with the same plan. Returns the slots this rank received from other ranks."""
        if plan.num_local_physical != self.num_local or plan.num_layers != len(self.layers):
            raise ValueError("rebalance: the new plan must keep the slot count per rank and the layer count")
        received = 0
        for pos, layer in enumerate(self.layers):
            w13, w2, got = _move_layer(self, pos, plan.physical_to_logical[pos], layer.experts.w13.data,
                                       layer.experts.w2.data)
            layer.experts.w13.data, layer.experts.w2.data = w13, w2
            received += got
        self.plan = plan
        for layer in self.layers:
            layer.set_maps(plan)
        return received


def _move_layer(ep: ExpertParallel, pos: int, new_p2l: np.ndarray, w13: torch.Tensor,
                w2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """One layer's weight moves: every rank derives the same transfer list from (old, new) maps."""
    old = ep.plan.physical_to_logical[pos]
    n_loc = ep.num_local
    holders = {}   # logical expert -> (rank, local slot) of its first old replica
    for p in range(len(old)):
        holders.setdefault(int(old[p]), (p // n_loc, p % n_loc))
    transfers: dict[tuple[int, int], list[tuple[int, int]]] = {}   # (src, dst) -> [(src slot, dst slot)]
    local_copies: list[tuple[int, int]] = []
    for p in range(len(new_p2l)):
        dst, slot, e = p // n_loc, p % n_loc, int(new_p2l[p])
        own = [q % n_loc for q in range(dst * n_loc, (dst + 1) * n_loc) if int(old[q]) == e]
        if dst == ep.rank and own:
            local_copies.append((own[0], slot))
        elif not own:
            src, src_slot = holders[e]
            transfers.setdefault((src, dst), []).append((src_slot, slot))
    new13, new2 = torch.empty_like(w13), torch.empty_like(w2)
    for src_slot, slot in local_copies:
        new13[slot], new2[slot] = w13[src_slot], w2[src_slot]
    ops, recvs = [], []
    g = ep.comm.group
    for (src, dst), pairs in sorted(transfers.items()):
        if src == ep.rank:
            buf = torch.cat([torch.cat([w13[s].reshape(-1), w2[s].reshape(-1)]) for s, _ in pairs])
            ops.append(dist.isend(buf, dist.get_global_rank(g, dst) if g is not None else dst, group=g))
        elif dst == ep.rank:
            buf = torch.empty(len(pairs) * (w13[0].numel() + w2[0].numel()), dtype=w13.dtype, device=w13.device)
            ops.append(dist.irecv(buf, dist.get_global_rank(g, src) if g is not None else src, group=g))
            recvs.append((buf, pairs))
    for op in ops:
        op.wait()
    received = 0
    for buf, pairs in recvs:
        size13, size2 = w13[0].numel(), w2[0].numel()
        for i, (_, slot) in enumerate(pairs):
            chunk = buf[i * (size13 + size2):(i + 1) * (size13 + size2)]
            new13[slot] = chunk[:size13].view_as(w13[0])
            new2[slot] = chunk[size13:].view_as(w2[0])
            received += 1
    return new13, new2, received


def apply_expert_parallel(model: nn.Module, group: dist.ProcessGroup | None = None,
                          plan: EplbPlan | None = None, num_extra: int = 0) -> ExpertParallel:
    """Replace every MoE layer of `model` by its expert-parallel form over `group` (None = the
    default group). `plan`: the initial placement (None = `static_plan` with `num_extra` extra
    slots). Returns the rank's ExpertParallel handle (`finish_step` once per engine step)."""
    layers = model.model.layers
    moe_ids = [i for i, layer in enumerate(layers) if isinstance(layer.mlp, MoE)]
    if not moe_ids:
        raise ValueError("apply_expert_parallel: the model has no MoE layer")
    first = layers[moe_ids[0]].mlp
    num_experts = first.experts.w13.shape[0]
    size = dist.get_world_size(group)
    plan = plan or static_plan(len(moe_ids), num_experts, size, num_extra)
    if plan.ep_size != size or plan.num_layers != len(moe_ids):
        raise ValueError(f"plan: {plan.ep_size} ranks x {plan.num_layers} layers, expected {size} x {len(moe_ids)}")
    w = first.experts.w13
    comm = ExpertParallelComm(group, first.gate.weight.shape[1], first.top_k, w.device, w.dtype)
    ep = ExpertParallel(comm, plan, [], dist.get_rank(group), size,
                        torch.zeros(len(moe_ids), plan.num_physical, dtype=torch.int64, device=w.device))
    for pos, i in enumerate(moe_ids):
        ep.layers.append(ExpertParallelMoE(layers[i].mlp, ep, pos))
        layers[i].mlp = ep.layers[-1]
    comm.num_layers = len(moe_ids)
    comm.num_local = plan.num_local_physical
    comm.compute_pairs = lambda pos, x, local, w: ep.layers[pos].pair_compute(x, local, w)
    comm.compute = lambda pos, x_all, ids_all, w_all, valid: ep.layers[pos].local_compute(x_all, ids_all, w_all, valid)
    return ep
