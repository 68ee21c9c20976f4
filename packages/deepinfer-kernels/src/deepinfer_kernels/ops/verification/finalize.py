"""finalize_verification: per-request results of the accept prefix, and the verified-token array.

For request ``i`` with ``a`` accepted drafts (rows ``ftp[i] .. ftp[i] + a - 1`` effective)::

    final_row[i]          = ftp[i] + a          the row whose distribution gives the main token
    last_valid_offset[i]  = a                   final row relative to the request's first row
                                                (the draft head's next anchor; equals num_accepted)
    num_accepted[i]       = a
    num_verified[i]       = seqlens_q[i] - 1    drafts checked this step (for acceptance stats)
    verified_token_ids[ftp[i] + k] = draft_token_ids[ftp[i] + k]   for k < a
                                   = VERIFIED_END                  for a <= k < seqlens_q[i]

Worked example (seed 000): A accepts 2 of 3 drafts, B rejects its one, C has none::

    row                 0   1   2   3   4   5   6
    verified_token_ids  t1  t2  -1  -1  -1  -1  -1      final_row = [2, 4, 6], last_valid_offset = [2, 0, 0]

The reference is sync-free (scatter-adds instead of boolean indexing), so it can run inside a
captured CUDA graph as the fallback path.
"""

# No `from __future__ import annotations`: TileLang reads the kernel signatures' annotations
# as live expressions over the factory's local sizes.

from dataclasses import dataclass

import torch

from deepinfer_kernels.ops.sampling._checks import INDEX_DTYPES, check_tensor
from deepinfer_kernels.ops.sampling._tilelang import THREADS, compiled
from deepinfer_kernels.ops.verification.constants import VERIFIED_END
from deepinfer_kernels.platform import Backend, select_backend


@dataclass(frozen=True)
class FinalizeResult:
    final_row: torch.Tensor           # [req_cnt] int32 flat row of each request's main token
    last_valid_offset: torch.Tensor   # [req_cnt] int32 final_row - ftp (== num_accepted)
    num_accepted: torch.Tensor        # [req_cnt] int32 accepted drafts
    num_verified: torch.Tensor        # [req_cnt] int32 drafts checked (seqlens_q - 1)
    verified_token_ids: torch.Tensor  # [total_q] int32 accepted drafts, then VERIFIED_END


def finalize_verification_ref(
    effective_accept: torch.Tensor,  # [total_q] bool
    is_final: torch.Tensor,          # [total_q] bool
    is_verify: torch.Tensor,         # [total_q] bool
    draft_token_ids: torch.Tensor,   # [total_q] int
    ftp: torch.Tensor,               # [req_cnt] int32
    row_to_req: torch.Tensor,        # [total_q] int32
) -> FinalizeResult:
    req_cnt, total_q, dev = ftp.shape[0], is_final.shape[0], ftp.device
    req = row_to_req.to(torch.int64)
    rows = torch.arange(total_q, dtype=torch.int32, device=dev)
    zeros = torch.zeros(req_cnt, dtype=torch.int32, device=dev)
    final_row = zeros.scatter_add(0, req, torch.where(is_final, rows, 0))
    num_accepted = zeros.scatter_add(0, req, effective_accept.to(torch.int32))
    num_verified = zeros.scatter_add(0, req, is_verify.to(torch.int32))
    verified = torch.where(effective_accept, draft_token_ids.to(torch.int32), VERIFIED_END).to(torch.int32)
    return FinalizeResult(final_row, final_row - ftp, num_accepted, num_verified, verified)


def finalize_verification_kernel(draft_dtype: str):
    """TileLang: one thread per request walks its rows (``draft_dtype``: "int32" or "int64")."""
    import tilelang.language as T

    req_cnt = T.dynamic("req_cnt")
    total_q = T.dynamic("total_q")

    @T.prim_func
    def kernel(
        effective_accept: T.Tensor((total_q,), "bool"),
        is_final: T.Tensor((total_q,), "bool"),
        is_verify: T.Tensor((total_q,), "bool"),
        draft_token_ids: T.Tensor((total_q,), draft_dtype),
        ftp: T.Tensor((req_cnt,), "int32"),
        final_row: T.Tensor((req_cnt,), "int32"),
        last_valid_offset: T.Tensor((req_cnt,), "int32"),
        num_accepted: T.Tensor((req_cnt,), "int32"),
        num_verified: T.Tensor((req_cnt,), "int32"),
        verified_token_ids: T.Tensor((total_q,), "int32"),
    ):
        with T.Kernel(T.ceildiv(req_cnt, THREADS), threads=THREADS) as bx:
            i = bx * THREADS + T.get_thread_binding()
            if i < req_cnt:
                first = ftp[i]
                end = T.if_then_else(i + 1 < req_cnt, ftp[T.min(i + 1, req_cnt - 1)], total_q)
                final = T.alloc_var("int32", init=0)
                accepted = T.alloc_var("int32", init=0)
                verified = T.alloc_var("int32", init=0)
                for r in T.serial(first, end):
                    verified_token_ids[r] = T.if_then_else(
                        effective_accept[r], T.cast(draft_token_ids[r], "int32"), VERIFIED_END)
                    accepted += T.cast(effective_accept[r], "int32")
                    verified += T.cast(is_verify[r], "int32")
                    if is_final[r]:
                        final = r
                final_row[i] = final
                last_valid_offset[i] = final - first
                num_accepted[i] = accepted
                num_verified[i] = verified

    return kernel


def finalize_verification_tilelang(
    effective_accept: torch.Tensor, is_final: torch.Tensor, is_verify: torch.Tensor,
    draft_token_ids: torch.Tensor, ftp: torch.Tensor,
) -> FinalizeResult:
    req_cnt, total_q, dev = ftp.shape[0], is_final.shape[0], ftp.device
    per_req = [torch.empty(req_cnt, dtype=torch.int32, device=dev) for _ in range(4)]
    verified = torch.empty(total_q, dtype=torch.int32, device=dev)
    dtype = "int64" if draft_token_ids.dtype == torch.int64 else "int32"
    compiled(finalize_verification_kernel, dtype)(
        effective_accept, is_final, is_verify, draft_token_ids, ftp, *per_req, verified)
    return FinalizeResult(*per_req, verified)


def finalize_verification(
    effective_accept: torch.Tensor,  # [total_q] bool, from get_accept_result
    is_final: torch.Tensor,          # [total_q] bool, from get_accept_result
    is_verify: torch.Tensor,         # [total_q] bool, from prepare_verification_metadata
    draft_token_ids: torch.Tensor,   # [total_q] int32/int64: draft checked at each row (= next row's token)
    ftp: torch.Tensor,               # [req_cnt] int32
    row_to_req: torch.Tensor,        # [total_q] int32
) -> FinalizeResult:
    """Final row, ``last_valid_offset``, accepted/verified counts and ``verified_token_ids``."""
    op = "finalize_verification"
    check_tensor(op, "effective_accept", effective_accept, [None], "[total_q]", [torch.bool])
    total_q, dev = effective_accept.shape[0], effective_accept.device
    check_tensor(op, "is_final", is_final, [total_q], "[total_q]", [torch.bool], dev)
    check_tensor(op, "is_verify", is_verify, [total_q], "[total_q]", [torch.bool], dev)
    check_tensor(op, "draft_token_ids", draft_token_ids, [total_q], "[total_q]", INDEX_DTYPES, dev)
    check_tensor(op, "ftp", ftp, [None], "[req_cnt]", [torch.int32], dev)
    check_tensor(op, "row_to_req", row_to_req, [total_q], "[total_q]", [torch.int32], dev)
    backend = select_backend(op, dev, has_kernel=True)
    if backend is Backend.TILELANG and ftp.numel() > 0:
        return finalize_verification_tilelang(effective_accept.contiguous(), is_final.contiguous(),
                                              is_verify.contiguous(), draft_token_ids.contiguous(), ftp.contiguous())
    return finalize_verification_ref(effective_accept, is_final, is_verify, draft_token_ids, ftp, row_to_req)
