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

# No `from __future__ import annotations`: TileLang reads the kernel signatures' annotations
# as live expressions over the factory's local sizes.

import torch

from deepinfer_kernels.ops.sampling._checks import check_tensor
from deepinfer_kernels.ops.sampling._tilelang import THREADS, compiled
from deepinfer_kernels.platform import Backend, select_backend


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


def get_accept_result_kernel():
    """TileLang: one thread per request walks its rows until the first blocked one.

    Same result as the cumsum: per request, rows stay alive until the first blocked row.
    """
    import tilelang.language as T

    req_cnt = T.dynamic("req_cnt")
    total_q = T.dynamic("total_q")

    @T.prim_func
    def kernel(
        raw_accept: T.Tensor((total_q,), "bool"),
        is_verify: T.Tensor((total_q,), "bool"),
        ftp: T.Tensor((req_cnt,), "int32"),
        effective_accept: T.Tensor((total_q,), "bool"),
        is_final: T.Tensor((total_q,), "bool"),
    ):
        with T.Kernel(T.ceildiv(req_cnt, THREADS), threads=THREADS) as bx:
            i = bx * THREADS + T.get_thread_binding()
            if i < req_cnt:
                end = T.if_then_else(i + 1 < req_cnt, ftp[T.min(i + 1, req_cnt - 1)], total_q)
                alive = T.alloc_var("bool", init=True)
                for r in T.serial(ftp[i], end):
                    blocked = not (is_verify[r] and raw_accept[r])
                    effective_accept[r] = alive and not blocked
                    is_final[r] = alive and blocked
                    if blocked:
                        alive = False

    return kernel


def get_accept_result_tilelang(
    raw_accept: torch.Tensor, is_verify: torch.Tensor, ftp: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    effective = torch.empty_like(raw_accept)
    is_final = torch.empty_like(raw_accept)
    compiled(get_accept_result_kernel)(raw_accept, is_verify, ftp, effective, is_final)
    return effective, is_final


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
    backend = select_backend(op, dev, has_kernel=True)
    if backend is Backend.TILELANG and ftp.numel() > 0:
        return get_accept_result_tilelang(raw_accept.contiguous(), is_verify.contiguous(), ftp.contiguous())
    return get_accept_result_ref(raw_accept, is_verify, ftp, row_to_req)
