"""Row sets of a prefill step, computed on the host from the scheduler's arrays.

The engine-path forward needs three data-dependent row sets in a prefill step: the rows that run
every layer (YOCO's replay rows of last chunks), where the logit rows sit among them, and, per
compression ratio, the rows that close a compressed entry. Read from device tensors, each is a
`nonzero` or an `.any()`: a sync that drains the GPU's queue, after which the GPU idles while the
host launches the next kernels (seven per `mini` prefill step, ninth session profile). The runner
holds the same facts in host arrays before it uploads them; `plan_prefill_rows` derives the sets
there, with the checks the forward would have run, and the forward uses them when
`ForwardMetadata.row_plan` is set (else it computes them on the device as before).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from deepinfer_model.metadata import ForwardMetadata, MetadataError, PrefillRowPlan


def short_last_chunk_error(i: int, replay_len: int, chunk_start: int) -> MetadataError:
    """Request i's last chunk starts after its replay segment (the forward's and the plan's check)."""
    return MetadataError(f"request {i}: the last prefill chunk must hold the last min(W, prompt) = {replay_len} "
                         f"tokens for the decoder bounded replay, it starts at {chunk_start}")


LOGIT_ROW_OUTSIDE_REPLAY = "logit_rows: a row outside the replay segment of a last chunk has no logits"


@dataclass
class PrefillRowArrays:
    """`PrefillRowPlan`'s contents as host arrays (int64), before the upload."""
    full_rows: np.ndarray
    logit_rows_in_full: np.ndarray
    closing_rows: dict[int, np.ndarray]

    def arrays(self) -> list[np.ndarray]:
        """Every array, in `from_tensors` order (full rows, logit rows, then closing rows by ratio)."""
        return [self.full_rows, self.logit_rows_in_full] + [self.closing_rows[r] for r in sorted(self.closing_rows)]

    def from_tensors(self, tensors: list[torch.Tensor]) -> PrefillRowPlan:
        """The plan of `tensors`, the uploaded `arrays()` in their order."""
        ratios = sorted(self.closing_rows)
        if len(tensors) != 2 + len(ratios):
            raise ValueError(f"tensors: expected {2 + len(ratios)} (full rows, logit rows, {len(ratios)} ratios), "
                             f"got {len(tensors)}")
        return PrefillRowPlan(tensors[0], tensors[1], dict(zip(ratios, tensors[2:], strict=True)))


def plan_prefill_rows(config, positions: np.ndarray, seqlens_q: np.ndarray, context_lens: np.ndarray,
                      is_last_chunk: np.ndarray, slot_mapping: np.ndarray, block_tables: np.ndarray,
                      block_size: int, logit_rows: np.ndarray) -> PrefillRowArrays:
    """The row sets of a prefill step from its host arrays (shapes of `ForwardMetadata`: positions,
    slot_mapping [total_q]; seqlens_q, context_lens, is_last_chunk [req_cnt]; block_tables
    [req_cnt, max_blocks], -1 padded; logit_rows [n]). Raises `MetadataError` where the forward
    would: a last chunk that does not hold its replay segment, a logit row outside the full rows,
    a compressed entry whose tokens have no slot (RuntimeError, as the forward)."""
    positions = np.asarray(positions, dtype=np.int64)
    seqlens = np.asarray(seqlens_q, dtype=np.int64)
    ctx = np.asarray(context_lens, dtype=np.int64)
    last = np.asarray(is_last_chunk, dtype=bool)
    slots = np.asarray(slot_mapping, dtype=np.int64)
    req = np.repeat(np.arange(seqlens.size), seqlens)                                      # [total_q]
    total_q = positions.size
    topo, w = config.topology, config.sliding_window
    if topo.yoco_enabled:
        replay_start = ctx - np.minimum(ctx, w)
        num_computed = ctx - seqlens
        short = np.flatnonzero(last & (num_computed > replay_start))
        if short.size:
            i = int(short[0])
            raise short_last_chunk_error(i, int(ctx[i] - replay_start[i]), int(num_computed[i]))
        full_rows = np.flatnonzero(last[req] & (positions >= replay_start[req]))
    else:
        full_rows = np.arange(total_q)
    inv = np.full(total_q, -1, dtype=np.int64)
    inv[full_rows] = np.arange(full_rows.size)
    lrows = inv[np.asarray(logit_rows, dtype=np.int64)]
    if (lrows < 0).any():
        raise MetadataError(LOGIT_ROW_OUTSIDE_REPLAY)
    closing: dict[int, np.ndarray] = {}
    tables = np.asarray(block_tables, dtype=np.int64)
    for r in sorted({int(config.compress_ratios[s]) for s in topo.compressed_sources} - {0, 1}):
        rows = np.flatnonzero((slots >= 0) & (positions % r == r - 1))
        vpos = positions[rows, None] - (r - 1) + np.arange(r)[None, :]                      # [E, r]
        blk = vpos // block_size
        inside = blk < tables.shape[1]
        held = np.where(inside, tables[req[rows, None], np.minimum(blk, tables.shape[1] - 1)], -1)
        if (held < 0).any():
            raise RuntimeError(f"ratio {r}: a compressed entry's tokens have no slot in the block table")
        closing[r] = rows
    return PrefillRowArrays(full_rows.astype(np.int64), lrows, closing)


def with_row_plan(config, meta: ForwardMetadata) -> ForwardMetadata:
    """`meta` (a prefill step) with the row plan of its own tensors, read back to the host (tests and
    tools; the runner builds the plan from its host arrays before the upload)."""
    if not meta.is_prefill:
        raise ValueError("with_row_plan: prefill metadata only (decode rows are every row)")

    def host(t: torch.Tensor) -> np.ndarray:
        return t.detach().cpu().numpy()

    arrays = plan_prefill_rows(config, host(meta.positions), host(meta.seqlens_q), host(meta.context_lens),
                               host(meta.is_last_chunk), host(meta.slot_mapping), host(meta.block_tables),
                               meta.block_size, host(meta.logit_rows))
    dev = meta.positions.device
    plan = arrays.from_tensors([torch.from_numpy(a).to(dev) for a in arrays.arrays()])
    return dataclasses.replace(meta, row_plan=plan)
