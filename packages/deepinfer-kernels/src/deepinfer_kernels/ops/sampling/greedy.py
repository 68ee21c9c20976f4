"""Greedy pick without drafts: each request's token is the argmax of its one logits row, with the
model's logprob of it.

    final_row[i]   = ftp[i] + seqlens_q[i] - 1 if seqlens_q[i] > 0 else 0   (a padded, empty request reads row 0)
    token_ids[i]   = argmax(logits[final_row[i]])          (the lowest column among equal maxima, as torch)
    token_logprobs = log_softmax(logits[final_row[i]])[token_ids[i]] = -log(sum(exp(row - max(row))))

``greedy_pick`` runs two TileLang launches on SM90 (``deepinfer_kernels.tilelang.greedy``): the
rows' vocabulary split over CTAs (max, its column, the sum of exponentials per 4,096 logits), then
one warp per request combining them. torch's ``log_softmax`` and ``argmax`` give one CTA to a row:
~30 us each at a 129K vocabulary, batch 1 (H200, 2026-11-30). The kernel's sum runs in another
order: its logprobs agree with the reference to float32 rounding, its tokens exactly. Rows must
hold no NaN (torch's argmax would pick the NaN; the kernel skips it).
"""

from __future__ import annotations

import torch

from deepinfer_kernels.ops.sampling._checks import FLOAT_DTYPES, INDEX_DTYPES, check_tensor, is_host
from deepinfer_kernels.platform import tilelang_launcher


def final_rows(ftp: torch.Tensor, seqlens_q: torch.Tensor) -> torch.Tensor:
    """[req_cnt] int32: each request's last logits row (row 0 for a request without rows)."""
    return torch.where(seqlens_q > 0, ftp + seqlens_q - 1, 0).to(torch.int32)


def greedy_pick_ref(
    logits: torch.Tensor,      # [rows, vocab] float
    ftp: torch.Tensor,         # [req_cnt] int first logits row of each request
    seqlens_q: torch.Tensor,   # [req_cnt] int logits rows of each request (0 or 1)
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> (token_ids int32 [req_cnt], token_logprobs float32 [req_cnt], final_row int32 [req_cnt])."""
    final_row = final_rows(ftp, seqlens_q)
    f = final_row.long()
    token_ids = logits.argmax(dim=1)[f]
    token_logprobs = torch.log_softmax(logits.to(torch.float32), dim=1)[f, token_ids]
    return token_ids.to(torch.int32), token_logprobs, final_row


def greedy_pick(
    logits: torch.Tensor,      # [rows, vocab] float
    ftp: torch.Tensor,         # [req_cnt] int
    seqlens_q: torch.Tensor,   # [req_cnt] int, each 0 or 1
    checked: bool = True,      # False: the padded graph layout (its padding request holds several rows)
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> (token_ids int32 [req_cnt], token_logprobs float32 [req_cnt], final_row int32 [req_cnt]).
    A request with several rows (unchecked only) reads its last one."""
    op = "greedy_pick"
    check_tensor(op, "logits", logits, [None, None], "[rows, vocab]", FLOAT_DTYPES)
    rows, vocab = logits.shape
    check_tensor(op, "ftp", ftp, [None], "[req_cnt]", INDEX_DTYPES, logits.device)
    check_tensor(op, "seqlens_q", seqlens_q, [ftp.shape[0]], "[req_cnt]", INDEX_DTYPES, logits.device)
    if vocab == 0 or rows == 0:
        raise ValueError(f"{op}: logits must have at least one row and one column, got {list(logits.shape)}")
    if is_host(ftp) and ftp.shape[0]:
        last = final_rows(ftp, seqlens_q)
        if bool((seqlens_q < 0).any()) or (checked and bool((seqlens_q > 1).any())):
            raise ValueError(f"{op}: seqlens_q must be 0 or 1 (one logits row per request), got {seqlens_q.tolist()}")
        if bool(((last < 0) | (last >= rows)).any()):
            raise ValueError(f"{op}: ftp + seqlens_q - 1 must lie in [0, {rows}), got {last.tolist()}")
    kernel = tilelang_launcher(op, logits.device, supported=logits.dtype in (torch.float32, torch.bfloat16, torch.float16)
                               and logits.stride(1) == 1)
    if kernel is not None:
        return kernel(logits, ftp, seqlens_q)
    return greedy_pick_ref(logits, ftp, seqlens_q)
