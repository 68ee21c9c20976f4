"""get_accept_result: which drafts survive, for every request at once, by one global cumsum.

A request's accepted drafts are the longest prefix of its verify rows whose draft was accepted;
the first row that is not "an accepted verify row" ends it. Call such a row *blocked*::

    blocked[r] = not (is_verify[r] and raw_accept[r])

    row          0  1  2  3 | 4  5 | 6          (requests A | B | C, ftp = [0, 4, 6])
    raw_accept   T  T  F  T | F  - | -
    is_verify    T  T  T  F | T  F | F
    blocked      F  F  T  T | T  T | T
    prefix       0  0  0  1   2  3   4   5      prefix[r] = #blocked rows before r (cumsum, shifted)
    alive        T  T  T  F | T  F | T          alive[r] = prefix[r] == prefix[ftp[req(r)]]
    effective    T  T  F  F | F  F | F          = alive & is_verify & raw_accept
    is_final     F  F  T  F | T  F | T          = alive & blocked: exactly one row per request

A row is alive iff no row of its own request before it is blocked. Because the final row of every
request is blocked, no request's prefix leaks into the next one, and every request has exactly
one ``is_final`` row: its first rejected verify row, or its last row if every draft was accepted.
"""

from __future__ import annotations

import torch

from deepinfer_kernels.ops.sampling._checks import check_tensor
from deepinfer_kernels.platform import select_backend


def get_accept_result_ref(
    raw_accept: torch.Tensor,  # [total_q] bool
    is_verify: torch.Tensor,   # [total_q] bool
    ftp: torch.Tensor,         # [req_cnt] int32
    row_to_req: torch.Tensor,  # [total_q] int32
) -> tuple[torch.Tensor, torch.Tensor]:  # effective_accept [total_q] bool, is_final [total_q] bool
    blocked = ~(is_verify & raw_accept)
    prefix = torch.cat([blocked.new_zeros(1, dtype=torch.int32), torch.cumsum(blocked, 0, dtype=torch.int32)])
    start = ftp.to(torch.int64)[row_to_req.to(torch.int64)]
    alive = prefix[:-1] == prefix[start]
    return alive & is_verify & raw_accept, alive & blocked


def get_accept_result(
    raw_accept: torch.Tensor,  # [total_q] bool: the draft checked at this row passed (ignored off verify rows)
    is_verify: torch.Tensor,   # [total_q] bool, from prepare_verification_metadata
    ftp: torch.Tensor,         # [req_cnt] int32
    row_to_req: torch.Tensor,  # [total_q] int32, from prepare_verification_metadata
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns ``effective_accept [total_q] bool`` (accepted and inside the surviving prefix) and
    ``is_final [total_q] bool`` (the one row per request whose distribution gives the main token)."""
    op = "get_accept_result"
    check_tensor(op, "raw_accept", raw_accept, [None], "[total_q]", [torch.bool])
    total_q, dev = raw_accept.shape[0], raw_accept.device
    check_tensor(op, "is_verify", is_verify, [total_q], "[total_q]", [torch.bool], dev)
    check_tensor(op, "ftp", ftp, [None], "[req_cnt]", [torch.int32], dev)
    check_tensor(op, "row_to_req", row_to_req, [total_q], "[total_q]", [torch.int32], dev)
    select_backend(op, dev, has_kernel=False)
    return get_accept_result_ref(raw_accept, is_verify, ftp, row_to_req)
