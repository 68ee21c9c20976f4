"""MTP info pool: where the draft head leaves next step's drafts, one slot of ``nextn`` rows per sequence.

The pool has ``(max_num_seqs + 1) * nextn`` rows; sequence slot ``s >= 1`` owns rows
``s * nextn .. s * nextn + nextn - 1`` (draft ``j`` in row ``s * nextn + j``). Slot
``MTP_PADDING_SLOT = 0`` belongs to nobody: ``store_mtp_info`` skips requests whose write slot is
0 and never modifies its rows, so reads that land there (final rows, padded graph rows) see
stable padding content::

    pool row   0 .. n-1 | n .. 2n-1 | 2n .. 3n-1 | ...
    slot       0 (pad)  | 1          | 2          | ...

Read side, next step: request ``i`` (slot ``s``) has rows ``ftp[i] ..``; the verify row at local
step ``k`` checks draft ``k`` of the block, pool row ``s * nextn + k`` (the same draft is the
input token of local step ``k + 1``). Final rows read the padding row 0.

The store reference uses boolean indexing so that slot 0 is literally never written; on CUDA
that synchronises, which is acceptable for the fallback path.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from deepinfer_kernels.ops.capture import use_capturable
from deepinfer_kernels.ops.sampling._checks import FLOAT_DTYPES, INDEX_DTYPES, check_tensor, is_host
from deepinfer_kernels.ops.verification.metadata import check_layout_args, prepare_verification_metadata_ref
from deepinfer_kernels.platform import select_backend

MTP_PADDING_SLOT = 0  # slot of no sequence: never written, read by rows that have no draft
MTP_PADDING_ROW = MTP_PADDING_SLOT  # pool row that read_rows use for final rows (slot 0, draft 0)


@dataclass
class MtpInfoPool:
    nextn: int
    token_ids: torch.Tensor                # [pool_rows] int32 draft token of each row
    confidence: torch.Tensor               # [pool_rows] float32 confidence of each draft
    draft_probs: torch.Tensor | None       # [pool_rows, K] float32: q over the vocab (K = vocab) or top-K values
    draft_prob_ids: torch.Tensor | None    # [pool_rows, K] int32: column ids when draft_probs is top-K

    @staticmethod
    def allocate(max_num_seqs: int, nextn: int, device: torch.device | str = "cpu",
                 prob_width: int | None = None, sparse: bool = False) -> MtpInfoPool:
        """Zeroed pool of ``(max_num_seqs + 1) * nextn`` rows (slot 0 = padding)."""
        rows = (max_num_seqs + 1) * nextn
        probs = None if prob_width is None else torch.zeros(rows, prob_width, dtype=torch.float32, device=device)
        ids = None if prob_width is None or not sparse else torch.zeros(rows, prob_width, dtype=torch.int32,
                                                                        device=device)
        return MtpInfoPool(nextn, torch.zeros(rows, dtype=torch.int32, device=device),
                           torch.zeros(rows, dtype=torch.float32, device=device), probs, ids)


def _pool_rows(write_slots: torch.Tensor, nextn: int) -> torch.Tensor:  # [req_cnt * nextn] int64
    j = torch.arange(nextn, dtype=torch.int64, device=write_slots.device)
    return (write_slots.to(torch.int64).unsqueeze(1) * nextn + j).reshape(-1)


def store_mtp_info_ref(
    write_slots: torch.Tensor,                            # [req_cnt] int32
    fields: list[tuple[torch.Tensor, torch.Tensor]],      # (src [req_cnt, nextn, *rest], dst [pool_rows, *rest])
    nextn: int,
) -> None:
    live = write_slots != MTP_PADDING_SLOT
    rows = _pool_rows(write_slots[live], nextn)
    for src, dst in fields:
        dst[rows] = src[live].reshape(rows.shape[0], *src.shape[2:]).to(dst.dtype)


def store_mtp_info_capturable(
    write_slots: torch.Tensor,                            # [req_cnt] int32
    fields: list[tuple[torch.Tensor, torch.Tensor]],      # (src [req_cnt, nextn, *rest], dst [pool_rows, *rest])
    nextn: int,
) -> None:
    """`store_mtp_info_ref` without the boolean mask (a sync): padding requests write slot 0 too.
    Slot 0 is the padding slot, read only by final rows, whose draft and q are never used; its
    content (the last of several racing writes) differs from the reference's, nothing else does."""
    rows = _pool_rows(write_slots, nextn)
    for src, dst in fields:
        dst[rows] = src.reshape(rows.shape[0], *src.shape[2:]).to(dst.dtype)


def store_mtp_info(
    write_slots: torch.Tensor,                    # [req_cnt] int32: pool slot of each request, 0 = skip
    draft_token_ids: torch.Tensor,                # [req_cnt, nextn] int32/int64
    pool: MtpInfoPool,                            # destination (rows slot * nextn + j)
    confidence: torch.Tensor | None = None,       # [req_cnt, nextn] float32
    draft_probs: torch.Tensor | None = None,      # [req_cnt, nextn, K] float (pool.draft_probs must exist)
    draft_prob_ids: torch.Tensor | None = None,   # [req_cnt, nextn, K] int32 (pool.draft_prob_ids must exist)
) -> None:
    """Write request ``i``'s ``nextn`` draft rows to pool rows ``write_slots[i] * nextn + j``."""
    op = "store_mtp_info"
    check_tensor(op, "write_slots", write_slots, [None], "[req_cnt]", [torch.int32])
    req_cnt, dev, nextn = write_slots.shape[0], write_slots.device, pool.nextn
    pool_rows = pool.token_ids.shape[0]
    if nextn < 1 or pool_rows % nextn:
        raise ValueError(f"{op}: pool must have (max_num_seqs + 1) * nextn rows with nextn >= 1, "
                         f"got {pool_rows} rows, nextn = {nextn}")
    check_tensor(op, "draft_token_ids", draft_token_ids, [req_cnt, nextn], f"[req_cnt, nextn={nextn}]",
                 INDEX_DTYPES, dev)
    check_tensor(op, "pool.token_ids", pool.token_ids, [pool_rows], "[pool_rows]", [torch.int32], dev)
    fields = [(draft_token_ids, pool.token_ids)]
    if confidence is not None:
        check_tensor(op, "confidence", confidence, [req_cnt, nextn], f"[req_cnt, nextn={nextn}]",
                     [torch.float32], dev)
        check_tensor(op, "pool.confidence", pool.confidence, [pool_rows], "[pool_rows]", [torch.float32], dev)
        fields.append((confidence, pool.confidence))
    for name, src, dst, dtypes in (("draft_probs", draft_probs, pool.draft_probs, FLOAT_DTYPES),
                                   ("draft_prob_ids", draft_prob_ids, pool.draft_prob_ids, [torch.int32])):
        if src is None:
            continue
        if dst is None:
            raise ValueError(f"{op}: {name} given but pool.{name} was not allocated")
        k = dst.shape[1]
        check_tensor(op, name, src, [req_cnt, nextn, k], f"[req_cnt, nextn={nextn}, K={k}]", dtypes, dev)
        fields.append((src, dst))
    if is_host(write_slots) and req_cnt:
        max_slot = pool_rows // nextn - 1
        if bool(((write_slots < 0) | (write_slots > max_slot)).any()):
            raise ValueError(f"{op}: write_slots must lie in [0, max_num_seqs={max_slot}] (0 = padding, skipped)")
        live = write_slots[write_slots != MTP_PADDING_SLOT]
        if live.unique().numel() != live.numel():
            raise ValueError(f"{op}: two requests write the same slot: {sorted(live.tolist())}")
    select_backend(op, dev, has_kernel=False)
    if use_capturable(write_slots):
        store_mtp_info_capturable(write_slots, fields, nextn)
    else:
        store_mtp_info_ref(write_slots, fields, nextn)


def mtp_info_read_rows_ref(
    read_slots: torch.Tensor,  # [req_cnt] int32
    ftp: torch.Tensor,         # [req_cnt] int32
    seqlens_q: torch.Tensor,   # [req_cnt] int32
    total_q: int,
    nextn: int,
) -> torch.Tensor:             # [total_q] int64
    row_to_req, local_step, is_verify = prepare_verification_metadata_ref(ftp, seqlens_q, total_q)
    slot = read_slots.to(torch.int64)[row_to_req.to(torch.int64)]
    return torch.where(is_verify, slot * nextn + local_step, MTP_PADDING_ROW)


def mtp_info_read_rows(
    read_slots: torch.Tensor,  # [req_cnt] int32: pool slot of each request (0 only if seqlens_q == 1)
    ftp: torch.Tensor,         # [req_cnt] int32
    seqlens_q: torch.Tensor,   # [req_cnt] int32, <= nextn + 1
    total_q: int,
    nextn: int,
) -> torch.Tensor:             # [total_q] int64 pool row of the draft checked at each flat row
    """Pool row holding the draft that each flat row verifies; final rows get ``MTP_PADDING_ROW``."""
    op = "mtp_info_read_rows"
    check_layout_args(op, ftp, seqlens_q, total_q)
    check_tensor(op, "read_slots", read_slots, [ftp.shape[0]], "[req_cnt]", [torch.int32], ftp.device)
    if nextn < 1:
        raise ValueError(f"{op}: nextn must be >= 1, got {nextn}")
    if is_host(read_slots) and read_slots.numel():
        if bool((seqlens_q > nextn + 1).any()):
            raise ValueError(f"{op}: seqlens_q must be <= nextn + 1 = {nextn + 1}")
        if bool(((read_slots == MTP_PADDING_SLOT) & (seqlens_q > 1)).any()):
            raise ValueError(f"{op}: a request with drafts (seqlens_q > 1) must have a read slot >= 1")
    select_backend(op, ftp.device, has_kernel=False)
    return mtp_info_read_rows_ref(read_slots, ftp, seqlens_q, int(total_q), nextn)


def read_mtp_info(
    read_rows: torch.Tensor,  # [total_q] int64, from mtp_info_read_rows
    pool: MtpInfoPool,
) -> tuple[torch.Tensor, torch.Tensor | None]:  # draft_token_ids [total_q] int32, draft_probs [total_q, K] or None
    """Gather the drafts (and their q) that each flat row verifies, ready for verify_and_sample."""
    op = "read_mtp_info"
    check_tensor(op, "read_rows", read_rows, [None], "[total_q]", [torch.int64], pool.token_ids.device)
    pool_rows = pool.token_ids.shape[0]
    if is_host(read_rows) and read_rows.numel() and bool(((read_rows < 0) | (read_rows >= pool_rows)).any()):
        raise ValueError(f"{op}: read_rows must lie in [0, pool_rows={pool_rows})")
    select_backend(op, read_rows.device, has_kernel=False)
    probs = None if pool.draft_probs is None else pool.draft_probs[read_rows]
    return pool.token_ids[read_rows], probs
