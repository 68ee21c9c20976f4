"""The SWA tier (SPEC §5): host snapshots of the window rings at multiples of A, keyed by prefix hash.

With window rings (paged/ring.py) a prefix hit at L finds the block KV (compressed entries, index
keys, Engram ids) in its cached blocks but not the window: the encoder layers' last W records
before L live in the ring of the request that computed them, gone once it moved on. So the
engine keeps a copy of the encoder window rows [L - W, L) at every multiple L of A a request's
committed KV crosses (the scheduler's `swa_points`), in a bounded LRU host store, and the
scheduler admits hits only at points the store holds (its hit policy: L1, else L1 - A).

What a snapshot at P holds and why it is enough (A is a multiple of every compress ratio and
A >= W):
  encoder window planes   [E, W, rec]  positions P - W .. P - 1 (the window of position P)
  compressor stage        nothing      at a multiple of every ratio no entry is open
  decoder / DFlash planes nothing      the last prefill chunk (>= W + backtracking tokens: the
                                       YOCO keep) recomputes the decoder window (bounded replay)
                                       and the DFlash main keys of the prompt's last W positions

Where the rows are when the device takes the copy, right after the step's forward (stream order;
no host read of device values):
  prefill chunk [s, c)   P = the last multiple of A in (s, c]; rows q >= s from the step's
                         scratch, rows q < s from the ring, gathered *before* the forward (the
                         chunk may overwrite them)
  decode step           P = the multiple of A within nextn + 1 rows below the host's (upper
                         bound, ZOS) positions; every row from the ring: if the step commits past
                         P, the ring still holds [P - W, P) (at most nextn rows were written past P)
The copy goes to page-locked host memory; `confirm` keeps it when the ledger reports that the step
committed past P (the key is the prefix chain hash at P), drops it otherwise. A hit restores the
rows into the new request's ring before its first chunk runs.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from deepinfer_sched import SchedulerOutput, StepKind


class SwaHostStore:
    """Bounded LRU of snapshots (uint8 host tensors) keyed by prefix hash. `on_add` / `on_evict`
    tell the scheduler which keys it may hit on; pinned keys (a scheduled restore not yet run)
    are never evicted."""

    def __init__(self, capacity_bytes: int, on_add: Callable[[int], None], on_evict: Callable[[int], None]):
        self.capacity_bytes = capacity_bytes
        self.on_add, self.on_evict = on_add, on_evict
        self.entries: OrderedDict[int, torch.Tensor] = OrderedDict()
        self.points: dict[int, int] = {}   # key -> the prefix length its snapshot is taken at
        self.num_bytes = 0
        self.pinned: set[int] = set()
        self.num_evictions = 0

    def __len__(self) -> int:
        return len(self.entries)

    def get(self, key: int) -> torch.Tensor | None:
        snap = self.entries.get(key)
        if snap is not None:
            self.entries.move_to_end(key)
        return snap

    def drop(self, key: int) -> None:
        """Evict one snapshot now (the scheduler stops hitting on it)."""
        if key in self.entries and key not in self.pinned:
            self.num_bytes -= self.entries.pop(key).numel()
            self.points.pop(key, None)
            self.num_evictions += 1
            self.on_evict(key)

    def put(self, key: int, snap: torch.Tensor, point: int) -> None:
        if key in self.entries:   # the same prefix again: the newer copy is identical
            self.entries.move_to_end(key)
            return
        size = snap.numel() * snap.element_size()
        if size > self.capacity_bytes:
            return
        for old in [k for k in self.entries if k not in self.pinned]:   # least recently used first
            if self.num_bytes + size <= self.capacity_bytes:
                break
            self.drop(old)
        if self.num_bytes + size > self.capacity_bytes:
            return
        self.entries[key] = snap
        self.points[key] = point
        self.num_bytes += size
        self.on_add(key)


@dataclass
class _Planned:
    """One step's snapshot candidates: request index i, point P, and the flat kv rows to copy."""

    req_index: np.ndarray        # [k] int64
    points: np.ndarray           # [k] int64
    rows_after: torch.Tensor     # [k, E, W] int64 kv rows read after the forward
    from_before: torch.Tensor | None  # [k, 1, W, 1] bool rows taken before the forward (prefill)
    rows_before: torch.Tensor | None = None  # [k, E, W] int64 their kv rows (the ring's)
    before: torch.Tensor | None = None  # [k, E, W, rec] uint8 those rows, gathered before it
    host: torch.Tensor | None = None    # [k, E, W, rec] the copy (page-locked on CUDA)


class RingSnapshots:
    """Takes, keeps and restores the encoder window snapshots of one ring cache (see above)."""

    def __init__(self, cache, config, grain: int, nextn: int, store: SwaHostStore):
        ring = cache.layout.ring
        if ring is None:
            raise ValueError("RingSnapshots: the cache has no window rings")
        self.cache, self.ring, self.store = cache, ring, store
        self.grain, self.nextn, self.window = grain, nextn, config.sliding_window
        planes = [cache.layout.window_planes[l] for l in config.topology.encoder_layers]
        self.bases = torch.tensor([cache.plane_base[p] for p in planes], dtype=torch.int64)   # [E]
        self.scratch_base = (ring.num_seqs + 1) * ring.ring_len
        self.pending: dict[int, _Planned] = {}   # step id -> its candidates, until `confirm`
        self.num_restored = 0

    @property
    def snapshot_bytes(self) -> int:
        """Bytes of one snapshot: encoder layers x W x record."""
        return int(self.bases.numel()) * self.window * self.cache.kv.shape[1]

    def _ring_rows(self, state: np.ndarray, q: np.ndarray) -> np.ndarray:
        return state[:, None] * self.ring.ring_len + q % self.ring.ring_len

    def _flat(self, rows: np.ndarray) -> torch.Tensor:
        """[k, W] plane rows -> [k, E, W] flat kv rows of every encoder window plane."""
        return (self.bases[None, :, None] + torch.from_numpy(rows)[:, None, :]).to(self.cache.kv.device)

    # ------------------------------------------------------------------ before the forward
    def before_forward(self, out: SchedulerOutput) -> None:
        """Restore the rings of this step's hits, then plan (and for prefill start) its snapshots."""
        if out.step_kind == StepKind.PREFILL:
            self._restore(out)
        planned = self._plan(out)
        if planned is not None:
            if planned.from_before is not None:
                planned.before = self.cache.kv[planned.rows_before]
            self.pending[out.step_id] = planned

    def _restore(self, out: SchedulerOutput) -> None:
        hits = np.flatnonzero(np.asarray(out.restore_tokens) > 0)
        for i in hits.tolist():
            key, point = int(out.restore_keys[i]), int(out.restore_tokens[i])
            snap = self.store.get(key)
            if snap is None:
                raise RuntimeError(f"SWA tier: request {int(out.request_ids[i])} hit at {point} but the "
                                   f"snapshot {key:#x} is not in the host store")
            q = np.arange(point - self.window, point)
            rows = self._flat(self._ring_rows(np.array([int(out.state_slots[i])]), q))[0]
            self.cache.kv[rows] = snap.to(self.cache.kv.device, non_blocking=True)
            self.num_restored += 1
        self.store.pinned.clear()

    def _plan(self, out: SchedulerOutput) -> _Planned | None:
        start = np.asarray(out.num_computed_tokens, np.int64)
        ctx = np.asarray(out.context_lens, np.int64)
        point = ctx // self.grain * self.grain
        prefill = out.step_kind == StepKind.PREFILL
        low = start if prefill else start - (self.nextn + 1)   # decode: host positions are upper bounds
        take = np.flatnonzero((point > low) & (point > 0))
        if take.size == 0:
            return None
        p, s = point[take], start[take]
        state = np.asarray(out.state_slots, np.int64)[take]
        q = p[:, None] - self.window + np.arange(self.window)          # [k, W] positions P - W .. P - 1
        ring_rows = self._ring_rows(state, q)
        if not prefill:
            return _Planned(take, p, self._flat(ring_rows), None)
        ftp = np.asarray(out.first_token_pos, np.int64)[take]
        in_step = q >= s[:, None]
        scratch = self.scratch_base + ftp[:, None] + (q - s[:, None])
        planned = _Planned(take, p, self._flat(np.where(in_step, scratch, ring_rows)), None)
        if not in_step.all():
            planned.from_before = torch.from_numpy(~in_step)[:, None, :, None].to(self.cache.kv.device)
            planned.rows_before = self._flat(ring_rows)
        return planned

    # ------------------------------------------------------------------ after the forward
    def after_forward(self, step_id: int) -> None:
        """Gather the step's snapshot rows (its forward is done) and start their copy to the host."""
        planned = self.pending.get(step_id)
        if planned is None:
            return
        snap = self.cache.kv[planned.rows_after]                          # [k, E, W, rec]
        if planned.before is not None:
            snap = torch.where(planned.from_before, planned.before, snap)
            planned.before = None
        if snap.device.type == "cuda":
            planned.host = torch.empty(snap.shape, dtype=snap.dtype, pin_memory=True)
            planned.host.copy_(snap, non_blocking=True)
        else:
            planned.host = snap

    # ------------------------------------------------------------------ after the ledger
    def confirm(self, out: SchedulerOutput) -> None:
        """Keep the snapshots whose point the ledger reports crossed (`swa_points`), under its key."""
        planned = self.pending.pop(out.step_id, None)
        if planned is None or planned.host is None:
            return
        points = np.asarray(out.swa_points)
        keys = np.asarray(out.swa_keys)
        for j, (i, p) in enumerate(zip(planned.req_index.tolist(), planned.points.tolist(), strict=True)):
            if int(points[i]) == p:
                self.store.put(int(keys[i]), planned.host[j], p)

    def discard(self, step_id: int) -> None:
        """A step that never reaches the ledger (it failed): forget its candidates."""
        self.pending.pop(step_id, None)


def swa_snapshot_grain(cfg, model_config) -> int:
    """The SWA tier's grain: `swa_snapshot_tokens` (SPEC: 128) rounded up to a multiple of the block
    size and of every compress ratio (no compressed entry is open at a snapshot point); >= W."""
    ratios = [model_config.compress_ratios[s] for s in model_config.topology.compressed_sources]
    grain = math.lcm(cfg.swa_snapshot_tokens, cfg.block_size, *[r for r in ratios if r > 0])
    if grain < model_config.sliding_window:
        raise ValueError(f"swa_snapshot_tokens: the grain {grain} must be >= the sliding window "
                         f"({model_config.sliding_window})")
    return grain
