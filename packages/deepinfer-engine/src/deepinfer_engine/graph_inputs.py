"""The decode graphs' static input buffers, packed one device buffer per dtype.

A whole-step graph reads fixed-address buffers (cuda_graphs.py has the padded layout). Filling
them from the step's device metadata took ~25 launches per step (7 device copies, the padding
fills, two scalar writes that synchronize the stream) on top of the metadata's own copies, each
a few microseconds of host time; at batch 1 the host, not the device, set the step time.

Here every field is a view of one of three device buffers (int64, int32, float32), and the
block tables have their own. `stage` writes a step's padded values into numpy mirrors of those
buffers on the host, and `upload` copies each mirror with one asynchronous copy from page-locked
memory (torch's caching host allocator keeps the block until its copy has run, so ZOS may stage
the next step at once); of the block tables only the step's request slots, as wide as the widest
table so far (a 1M-token `max_model_len` would otherwise copy MBs per step).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from deepinfer_engine.decode_step import carry_row_maps

ALIGN_ELEMENTS = 16   # every field starts 64-byte aligned in the int32 / float32 buffers (128 in int64)
FULL_ROWS_MAX_BYTES = 1 << 20   # block-table rows uploaded whole up to this size per step


@dataclass(frozen=True)
class _Field:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]


@dataclass
class StagedStep:
    """A step's host arrays, in SchedulerOutput order (what `stage` pads into the buffers)."""

    input_ids: np.ndarray      # [total_q] int64 (-1: last step's token, filled in on the device)
    positions: np.ndarray      # [total_q] int64
    slot_mapping: np.ndarray   # [total_q] int64
    seqlens_q: np.ndarray      # [req_cnt] int32
    first_token_pos: np.ndarray  # [req_cnt] int32
    context_lens: np.ndarray   # [req_cnt] int32
    block_tables: np.ndarray   # [req_cnt, width] int32
    remap: np.ndarray          # [req_cnt] int64 index of the request in the previous step, -1 none
    temperature: np.ndarray    # [req_cnt] float32
    seeds: np.ndarray          # [req_cnt] int64
    mtp_slots: np.ndarray | None  # [req_cnt] int32 (None without speculation)
    state_slots: np.ndarray | None = None  # [req_cnt] int32 ring state slots (0 = padding ring; None: none)


_NP = {torch.int64: np.int64, torch.int32: np.int32, torch.float32: np.float32}


class GraphInputBuffers:
    """Device buffers of `max_rows` rows and `max_slots` request slots, and their host mirrors."""

    def __init__(self, max_rows: int, max_slots: int, max_blocks: int, device: torch.device):
        g, s = max_rows, max_slots
        fields = [
            _Field("input_ids", torch.int64, (g,)), _Field("positions", torch.int64, (g,)),
            _Field("slot_mapping", torch.int64, (g,)), _Field("seeds", torch.int64, (s,)),
            _Field("remap", torch.int64, (s,)), _Field("prev_row", torch.int64, (g,)),
            _Field("row_remap", torch.int64, (g,)), _Field("row_req", torch.int64, (g,)),
            _Field("seqlens", torch.int32, (s,)), _Field("ftp", torch.int32, (s,)),
            _Field("context_lens", torch.int32, (s,)), _Field("mtp_slots", torch.int32, (s,)),
            _Field("state_slots", torch.int32, (s,)),
            _Field("temperature", torch.float32, (s,)),
        ]
        self.device = device
        self.max_rows, self.max_slots, self.max_blocks = g, s, max_blocks
        self._mirror: dict[torch.dtype, np.ndarray] = {}
        self._buffer: dict[torch.dtype, torch.Tensor] = {}
        self.host: dict[str, np.ndarray] = {}    # field -> view of its dtype's mirror
        views: dict[str, torch.Tensor] = {}
        for dtype in (torch.int64, torch.int32, torch.float32):
            members = [f for f in fields if f.dtype == dtype]
            offsets, total = [], 0
            for f in members:
                offsets.append(total)
                total += -(-int(np.prod(f.shape)) // ALIGN_ELEMENTS) * ALIGN_ELEMENTS
            self._mirror[dtype] = np.zeros(total, dtype=_NP[dtype])
            self._buffer[dtype] = torch.zeros(total, dtype=dtype, device=device)
            for f, start in zip(members, offsets, strict=True):
                n = int(np.prod(f.shape))
                self.host[f.name] = self._mirror[dtype][start: start + n].reshape(f.shape)
                views[f.name] = self._buffer[dtype][start: start + n].view(f.shape)
        self.input_ids, self.positions, self.slot_mapping = views["input_ids"], views["positions"], views["slot_mapping"]
        self.seeds, self.remap = views["seeds"], views["remap"]
        self.prev_row, self.row_remap, self.row_req = views["prev_row"], views["row_remap"], views["row_req"]
        self.seqlens, self.ftp, self.context_lens = views["seqlens"], views["ftp"], views["context_lens"]
        self.mtp_slots, self.temperature = views["mtp_slots"], views["temperature"]
        self.state_slots = views["state_slots"]   # ring state slots (padding and empty requests: 0)
        # block tables: their own buffer, uploaded [slots, table high-water width] (the rest stays -1)
        self.block_tables = torch.full((s, max_blocks), -1, dtype=torch.int32, device=device)
        self.host["block_tables"] = np.full((s, max_blocks), -1, dtype=np.int32)
        self._table_width = 0   # widest table written to the device buffer so far (any path)
        self._slots = s         # request slots of the staged step
        self.clear_host()

    def note_table_width(self, width: int) -> None:
        """A block table `width` columns wide was written to `block_tables` (also by device copies:
        cuda_graphs' piecewise `_fill`): later uploads cover at least that many columns."""
        self._table_width = min(max(self._table_width, width), self.max_blocks)

    def _upload_width(self) -> int:
        """Block-table columns an upload covers: whole rows (one contiguous copy) while the staged
        slots' rows are at most FULL_ROWS_MAX_BYTES or the widest table so far reaches half the
        row; else that widest table (a copy into a strided view: staged, then one device copy)."""
        if self._slots * self.max_blocks * 4 <= FULL_ROWS_MAX_BYTES or 2 * self._table_width >= self.max_blocks:
            return self.max_blocks
        return self._table_width

    def clear_host(self) -> None:
        """Mirrors to the empty step: no rows, every request slot empty, block tables -1."""
        for m in self._mirror.values():
            m[...] = 0
        self.host["slot_mapping"][...] = -1
        for name in ("remap", "prev_row", "row_remap"):
            self.host[name][...] = -1
        self.host["block_tables"][...] = -1

    def stage(self, g: int, slots: int, step: StagedStep | None) -> None:
        """Pad `step` (None: padding only) into bucket g's layout in the host mirrors: rows [0, t),
        padding rows [t, g) owned by the padding request (slot `slots - 1`), empty slots between."""
        h = self.host
        t = 0 if step is None else step.input_ids.shape[0]
        r = 0 if step is None else step.seqlens_q.shape[0]
        if step is not None:
            self.note_table_width(step.block_tables.shape[1])
        width = self.stage_padding(g, slots, t, r)   # the rows and slots around the step's (disjoint)
        if step is not None:
            w = step.block_tables.shape[1]
            h["input_ids"][:t] = step.input_ids
            h["positions"][:t] = step.positions
            h["slot_mapping"][:t] = step.slot_mapping
            h["seqlens"][:r] = step.seqlens_q
            h["ftp"][:r] = step.first_token_pos
            h["context_lens"][:r] = step.context_lens
            h["block_tables"][:r, :w] = step.block_tables
            h["block_tables"][:r, w:width] = -1
            h["remap"][:r] = step.remap
            h["temperature"][:r] = step.temperature
            h["seeds"][:r] = step.seeds
            h["mtp_slots"][:r] = 0 if step.mtp_slots is None else step.mtp_slots
            h["state_slots"][:r] = 0 if step.state_slots is None else step.state_slots
            h["row_req"][:t], h["row_remap"][:t], h["prev_row"][:t] = carry_row_maps(
                step.input_ids, step.seqlens_q, step.first_token_pos, step.remap)

    def stage_padding(self, g: int, slots: int, t: int, r: int) -> int:
        """The padding of bucket g around a step of t rows and r requests, in the host mirrors (the
        one definition of the padded layout; rows [0, t) and slots [0, r) are left as they are):
        rows [t, g) belong to the padding request, slot `slots - 1`, which starts at row t and
        whose positions count from 0; slots [r, slots - 1) are empty requests (no rows, no blocks).
        Returns the block-table columns the next upload covers."""
        h = self.host
        pad, last = g - t, slots - 1
        self._slots = slots
        width = self._upload_width()
        h["input_ids"][t:g] = 0
        h["positions"][t:g] = np.arange(pad)
        h["slot_mapping"][t:g] = -1
        h["seqlens"][r:last] = 0
        h["seqlens"][last] = pad
        h["ftp"][r:last + 1] = t
        h["context_lens"][r:last] = 0
        h["context_lens"][last] = pad
        h["block_tables"][r:last + 1, :width] = -1
        h["remap"][r:last + 1] = -1
        h["row_req"][t:g] = last
        h["row_remap"][t:g] = -1
        h["prev_row"][t:g] = -1
        h["temperature"][r:last + 1] = 0
        h["seeds"][r:last + 1] = 0
        h["mtp_slots"][r:last + 1] = 0
        h["state_slots"][r:last + 1] = 0
        return width

    def upload(self) -> None:
        """The mirrors -> the device buffers: one asynchronous copy per dtype, and the staged
        slots' block tables up to the widest table written so far (columns past it were never
        written: still -1). Past half the buffer's width the whole rows go (one contiguous copy)."""
        copies = [(self._buffer[dtype], mirror) for dtype, mirror in self._mirror.items()]
        width = self._upload_width()
        if width:
            copies.append((self.block_tables[: self._slots, :width],
                           np.ascontiguousarray(self.host["block_tables"][: self._slots, :width])))
        for dst, mirror in copies:
            host = torch.from_numpy(mirror)
            if self.device.type == "cuda":
                dst.copy_(host.pin_memory(), non_blocking=True)
            else:
                dst.copy_(host)
