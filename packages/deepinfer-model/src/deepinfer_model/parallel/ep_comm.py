"""The expert-parallel rendezvous: which MoE layer the EP group computes next, and its collectives.

With DP attention each rank runs its own batch, so ranks reach the MoE layers of a step with
different token counts and, in a prefill step, not even the same layers (a rank whose chunks are
all non-final skips the YOCO consumer layers; a rank with no work runs no forward at all). Every
collective must still be matched one for one, so each MoE call is a *round* of the group:

    1. header all-gather: every rank's position (pass, layer position) and token count; a rank
       waiting in `finish_step` reports DONE.
    2. the round computes the smallest position any rank reports; ranks at a later position (or
       DONE) take part with 0 tokens, as *phantoms*, and compute their local experts of that layer
       for the others' tokens, then retry their own call.
    3. data, `dispatch` = ALL_TO_ALL (default): each (token, slot) pair goes to the rank owning
       its physical slot (all_to_all_single, split sizes exchanged first), the owner runs it and
       sends the weighted output back, the sender sums its pairs per token. ALL_GATHER: gather the
       tokens and routing of every rank (padded to the round's largest count), every rank runs its
       local experts over all rows, reduce-scatter (sum) returns each rank its own rows.

    rank 0: L1 L2 L3 L4 L5 L6 DONE..              (a last-chunk prefill)
    rank 1: L1 L2 L3 ph ph ph DONE                (non-final chunks only: phantom in L4..L6)

`finish_step` ends a step: phantom rounds until every rank is DONE. The engine calls it once per
step on every rank (also on ranks that ran no forward: that is the dummy step). Positions are
monotone within a step, so the smallest position always belongs to a rank that can proceed: no
round waits on a rank that waits on it.

The header read is a host sync. Decode steps therefore use *static* rounds (`begin_step(static=
True)`): in a decode step every rank that runs a forward runs every MoE layer once, so no header
is needed; every round pads to the fixed `static_capacity` rows per rank, pairs not routed to
this rank get weight 0 (masked: no nonzero, no host read), and `finish_step(ran_forward=False)`
runs the whole layer sequence as phantoms on a rank without a decode forward. Static rounds are
capturable in a CUDA graph (NCCL all-gather / reduce-scatter, fixed shapes).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

DONE = 1 << 40   # the position of a rank waiting in finish_step (larger than any real position)
ALL_TO_ALL, ALL_GATHER = "all_to_all", "all_gather"   # dispatch of the header rounds (static: all-gather)


@dataclass(frozen=True)
class Round:
    """One round as every rank sees it."""

    target: tuple[int, int]        # (pass, layer position) computed: the smallest any rank reports
    counts: list[int]              # [ep] tokens each rank brings (0 for phantoms)

    @property
    def layer_pos(self) -> int:    # index into the group's MoE layers
        return self.target[1]

    @property
    def max_count(self) -> int:
        return max(self.counts)


# compute_pairs(layer_pos, x [R, H], local slot [R], weight [R]) -> weighted outputs [R, H] f32
PairCompute = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]

# compute(layer_pos, x_all [ep*n, H], ids_all [ep*n, k] physical, w_all [ep*n, k], valid [ep*n] or None)
#   -> [ep*n, H] f32; valid None = a static round: masked compute, padding pairs weigh 0
LocalCompute = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class ExpertParallelComm:
    """Rounds over one EP process group (rank order = the group's ranks)."""

    def __init__(self, group: dist.ProcessGroup | None, hidden: int, top_k: int, device: torch.device,
                 dtype: torch.dtype):
        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        self.hidden, self.top_k, self.device, self.dtype = hidden, top_k, device, dtype
        self.compute: LocalCompute | None = None   # set by the transform (expert_parallel.py)
        self.compute_pairs: PairCompute | None = None
        self.dispatch = ALL_TO_ALL
        self.num_local = 1             # physical slots per rank (set by the transform)
        self._pass = 0
        self._last_pos = -1
        self.num_layers = 0            # MoE layers in the model (set by the transform)
        self.static_capacity: int | None = None   # rows per rank of a static round
        self._static = False
        self.num_rounds = 0            # rounds this process took part in (real + phantom)
        self.num_phantom_rounds = 0

    # ------------------------------------------------------------------ the protocol
    def _header(self, pass_idx: int, pos: int, count: int) -> list[tuple[int, int, int]]:
        mine = torch.tensor([pass_idx, pos, count], dtype=torch.int64, device=self.device)
        every = torch.empty(self.size * 3, dtype=torch.int64, device=self.device)
        dist.all_gather_into_tensor(every, mine, group=self.group)
        flat = every.tolist()
        return [(flat[3 * r], flat[3 * r + 1], flat[3 * r + 2]) for r in range(self.size)]

    def _next_round(self, me: tuple[int, int], count: int) -> Round | None:
        """Steps 1-2: the round every rank agrees on; None once every rank is DONE."""
        headers = self._header(me[0], me[1], count)
        target = min((p, q) for p, q, _ in headers)
        if target[0] == DONE:
            return None
        counts = [n if (p, q) == target else 0 for p, q, n in headers]
        return Round(target, counts)

    def begin_step(self, static: bool) -> None:
        """Before a step on every rank: static rounds (a decode step with `static_capacity` set) or not."""
        if static and self.static_capacity is None:
            raise ValueError("begin_step(static=True): static_capacity is not set")
        self._static = static

    def exchange(self, layer_pos: int, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """One real MoE call of this rank: x [N, H], ids [N, k] physical slots, weights [N, k] float32
        -> routed-expert output [N, H] float32 (sum over k of weight * expert(x))."""
        if self._static:
            return self._static_round(layer_pos, x, ids, weights)
        if layer_pos <= self._last_pos:
            self._pass += 1
        self._last_pos = layer_pos
        me = (self._pass, layer_pos)
        while True:
            rnd = self._next_round(me, x.shape[0])
            assert rnd is not None   # this rank is not DONE
            if rnd.target == me:
                return self._data(rnd, x, ids, weights)
            self._data(rnd, None, None, None)

    def finish_step(self, ran_forward: bool = True) -> None:
        """Phantom rounds until every rank is DONE; then the next step starts at pass 0. Static step:
        a rank that ran no forward (`ran_forward=False`) runs every layer's round as a phantom."""
        if self._static:
            if not ran_forward:
                for pos in range(self.num_layers):
                    self._static_round(pos, None, None, None)
            self._static = False
            return
        while (rnd := self._next_round((DONE, DONE), 0)) is not None:
            self._data(rnd, None, None, None)
        self._pass, self._last_pos = 0, -1

    def _static_round(self, layer_pos: int, x: torch.Tensor | None, ids: torch.Tensor | None,
                      weights: torch.Tensor | None) -> torch.Tensor:
        """A round at the fixed capacity: no header, no host read (padding rows weigh 0)."""
        self.num_rounds += 1
        self.num_phantom_rounds += x is None
        n = self.static_capacity
        mine = 0 if x is None else x.shape[0]
        if mine > n:
            raise ValueError(f"static EP round: {mine} rows exceed static_capacity {n}")
        return self._gathered_round(layer_pos, n, mine, x, ids, weights, None)

    # ------------------------------------------------------------------ data of one round
    def _data(self, rnd: Round, x: torch.Tensor | None, ids: torch.Tensor | None,
              weights: torch.Tensor | None) -> torch.Tensor:
        self.num_rounds += 1
        self.num_phantom_rounds += x is None
        n, h = rnd.max_count, self.hidden
        if n == 0:
            return torch.zeros(0, h, dtype=torch.float32, device=self.device)
        if self.dispatch == ALL_TO_ALL:
            return self._all_to_all(rnd, x, ids, weights)
        return self._gathered_round(rnd.layer_pos, n, rnd.counts[self.rank], x, ids, weights, rnd.counts)

    def _gathered_round(self, layer_pos: int, n: int, mine: int, x: torch.Tensor | None,
                        ids: torch.Tensor | None, weights: torch.Tensor | None,
                        counts: Sequence[int] | None) -> torch.Tensor:
        """One all-gather round at ``n`` rows a rank: this rank's ``mine`` rows padded to ``n``, every
        rank's rows and routes gathered, the local experts' partial sums reduce-scattered back.
        ``counts``: the real rows of each rank (the rest are masked out); None: the padding rows
        route with weight 0 and need no mask."""
        ep, k, h = self.size, self.top_k, self.hidden
        xp = torch.zeros(n, h, dtype=self.dtype, device=self.device)
        route = torch.zeros(n, 2 * k, dtype=torch.float32, device=self.device)   # ids (exact < 2^24) | weights
        if mine:
            xp[:mine] = x
            route[:mine, :k] = ids.float()
            route[:mine, k:] = weights.float()
        x_all = torch.empty(ep * n, h, dtype=self.dtype, device=self.device)
        r_all = torch.empty(ep * n, 2 * k, dtype=torch.float32, device=self.device)
        dist.all_gather_into_tensor(x_all, xp, group=self.group)
        dist.all_gather_into_tensor(r_all, route, group=self.group)
        valid = None
        if counts is not None:
            row = torch.arange(n, device=self.device)
            valid = torch.cat([row < c for c in counts])                                # [ep*n]
        partial = self.compute(layer_pos, x_all, r_all[:, :k].long(), r_all[:, k:], valid)
        out = torch.empty(n, h, dtype=torch.float32, device=self.device)
        dist.reduce_scatter_tensor(out, partial.contiguous(), op=dist.ReduceOp.SUM, group=self.group)
        return out[:mine]

    def _all_to_all(self, rnd: Round, x: torch.Tensor | None, ids: torch.Tensor | None,
                    weights: torch.Tensor | None) -> torch.Tensor:
        """Step 3, ALL_TO_ALL: pairs to their owners and their weighted outputs back."""
        ep, h, dev = self.size, self.hidden, self.device
        mine = rnd.counts[self.rank]
        if mine:
            flat = ids.reshape(-1)                                                   # [n*k] physical
            dest = flat // self.num_local
            order = torch.sort(dest, stable=True).indices                            # pairs by owner
            token = order // self.top_k
            send_x = x[token]
            send_meta = torch.stack([(flat[order] % self.num_local).float(), weights.reshape(-1)[order].float()], 1)
            send_counts = torch.bincount(dest, minlength=ep)
        else:
            send_x = torch.zeros(0, h, dtype=self.dtype, device=dev)
            send_meta = torch.zeros(0, 2, dtype=torch.float32, device=dev)
            send_counts = torch.zeros(ep, dtype=torch.int64, device=dev)
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts, group=self.group)
        s_split, r_split = send_counts.tolist(), recv_counts.tolist()
        recv_x = torch.empty(sum(r_split), h, dtype=self.dtype, device=dev)
        recv_meta = torch.empty(sum(r_split), 2, dtype=torch.float32, device=dev)
        dist.all_to_all_single(recv_x, send_x.contiguous(), r_split, s_split, group=self.group)
        dist.all_to_all_single(recv_meta, send_meta.contiguous(), r_split, s_split, group=self.group)
        y = self.compute_pairs(rnd.layer_pos, recv_x, recv_meta[:, 0].long(), recv_meta[:, 1])   # [R, H] f32
        back = torch.empty(sum(s_split), h, dtype=torch.float32, device=dev)
        dist.all_to_all_single(back, y.contiguous(), s_split, r_split, group=self.group)
        out = torch.zeros(mine, h, dtype=torch.float32, device=dev)
        if mine:
            out.index_add_(0, token, back)
        return out
