"""Index arithmetic of the per-request rings: window KV and compressor stage at their real size.

With a `WindowRing` (paged_cache.py) every window plane (backbone and DFlash layers) and every
compressor stage plane is a ring of `L` rows per request state slot, then a scratch region of one
row per flat row of the step:

```
plane rows   | slot 0 ring (padding) | slot 1 ring | ... | slot S ring | scratch: step row 0 .. T-1 |
ring row     state_slot * L + v % L                       (the last L positions written)
scratch row  (S + 1) * L + ftp[i] + (v - step_start[i])   (this step's rows of request i)
```
A layer stores its rows' records in the scratch (rows are consecutive positions from
`step_start = context_len - seqlen_q`), reads positions `>= step_start` there and earlier ones in
the ring, and after its reads copies the rows among the last `L` positions of their request into
the ring. The ring length: a window row reads `W - 1` earlier positions; a decode step writes at
most `nextn + 1` rows, rejected ones included, which overwrite ring rows of positions at least
`L` earlier: `L = W + nextn + 1` keeps every position a later step reads (the stage: the last
incomplete entry's `r - 1` positions, `L = max_ratio + nextn`).
Prefix-cache hits need the window restored: the engine's SWA tier (deepinfer_engine/swa_tier.py, SPEC §5).
"""

from __future__ import annotations

import torch

from deepinfer_kernels.ops.capture import write_rows
from deepinfer_kernels.ops.swa_index import window_positions
from deepinfer_model.metadata import ForwardMetadata, MetadataError


class RingRows:
    """Per-step ring facts of a set of rows (positions [N], req [N]), shared by every layer."""

    def __init__(self, meta: ForwardMetadata, req: torch.Tensor, positions: torch.Tensor, num_ring_slots: int):
        if meta.state_slots is None:
            raise MetadataError("state_slots: a cache with rings needs each request's state slot")
        self.req, self.positions = req, positions
        self.num_ring_slots = num_ring_slots                                       # S + 1
        self.step_start = (meta.context_lens.long() - meta.seqlens_q.long())[req]  # [N]
        self.ftp = meta.first_token_pos.long()[req]                                # [N]
        self.state = meta.state_slots.long()[req]                                  # [N]
        self.ctx = meta.context_lens.long()[req]                                   # [N]
        self.real = meta.slot_mapping >= 0                                        # [N] rows that write

    def subset(self, idx: torch.Tensor) -> RingRows:
        out = RingRows.__new__(RingRows)
        out.num_ring_slots = self.num_ring_slots
        for name in ("req", "positions", "step_start", "ftp", "state", "ctx", "real"):
            setattr(out, name, getattr(self, name)[idx])
        return out

    def scratch_rows(self, ring_len: int) -> torch.Tensor:
        """[N] int64 each row's own scratch row in a plane of ring length `ring_len`."""
        return self.num_ring_slots * ring_len + self.ftp + (self.positions - self.step_start)

    def rows_of(self, vpos: torch.Tensor, ring_len: int) -> torch.Tensor:
        """vpos [N, K] positions of each row's request (-1 = empty) -> plane rows int64 [N, K]:
        this step's positions in the scratch, earlier ones in the ring."""
        start, ftp, state = self.step_start.unsqueeze(1), self.ftp.unsqueeze(1), self.state.unsqueeze(1)
        scratch = self.num_ring_slots * ring_len + ftp + (vpos - start)
        ring = state * ring_len + vpos.clamp(min=0) % ring_len
        return torch.where(vpos < 0, -1, torch.where(vpos >= start, scratch, ring))

    def window_rows(self, lo: torch.Tensor, width: int, ring_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """-> plane rows of each row's window `max(lo, p - width + 1) .. p`, int64 [N, width] and int32."""
        rows = self.rows_of(window_positions(self.positions, lo, width), ring_len)
        return rows, rows.to(torch.int32)

    def ring_targets(self, ring_len: int) -> torch.Tensor:
        """[N] int64 the ring row each row's record goes to after the layer's reads: rows among the
        last `ring_len` positions of their request (no two share a ring row), -1 elsewhere and for
        rows that write nothing (slot -1: graph padding)."""
        keep = (self.positions >= self.ctx - ring_len) & self.real
        return torch.where(keep, self.state * ring_len + self.positions % ring_len, -1)


def copy_to_ring(plane: torch.Tensor, rows: RingRows, ring_len: int) -> None:
    """plane [rows, ...]: the rows' scratch records -> their ring rows (after every read of the layer)."""
    write_rows(plane, rows.ring_targets(ring_len), plane[rows.scratch_rows(ring_len)])
