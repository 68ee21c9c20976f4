"""prepare_verification_metadata: what each flat row is, from ``ftp`` and ``seqlens_q``.

Rows of a decode step are packed along ``total_q``; request ``i`` owns rows
``ftp[i] .. ftp[i] + seqlens_q[i] - 1``. Row 0 of a request holds its last committed token,
rows 1.. its drafts. Every row but the last is a *verify* row (its prediction is compared with
the next row's draft); the last is the request's *final* row (fresh-sampled)::

    seqlens_q   4           2     1          ftp = [0, 4, 6], total_q = 7
    row         0  1  2  3  4  5  6
    row_to_req  0  0  0  0  1  1  2
    local_step  0  1  2  3  0  1  0
    is_verify   T  T  T  F  T  F  F          (a request with seqlen_q = 1 has no verify row)
"""

# No `from __future__ import annotations`: TileLang reads the kernel signatures' annotations
# as live expressions over the factory's local sizes.

import torch

from deepinfer_kernels.ops.sampling._checks import check_flat_layout, check_tensor
from deepinfer_kernels.ops.sampling._tilelang import THREADS, compiled
from deepinfer_kernels.platform import Backend, select_backend


def prepare_verification_metadata_ref(
    ftp: torch.Tensor,        # [req_cnt] int32
    seqlens_q: torch.Tensor,  # [req_cnt] int32
    total_q: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # [total_q] int32, int32, bool
    req_cnt = ftp.shape[0]
    row_to_req = torch.repeat_interleave(
        torch.arange(req_cnt, dtype=torch.int32, device=ftp.device), seqlens_q, output_size=total_q
    )
    req = row_to_req.to(torch.int64)
    local_step = torch.arange(total_q, dtype=torch.int32, device=ftp.device) - ftp[req]
    is_verify = local_step != seqlens_q[req] - 1
    return row_to_req, local_step, is_verify


def prepare_verification_metadata_kernel():
    """TileLang: one thread per request fills its ``seqlens_q[i]`` rows."""
    import tilelang.language as T

    req_cnt = T.dynamic("req_cnt")
    total_q = T.dynamic("total_q")

    @T.prim_func
    def kernel(
        ftp: T.Tensor((req_cnt,), "int32"),
        seqlens_q: T.Tensor((req_cnt,), "int32"),
        row_to_req: T.Tensor((total_q,), "int32"),
        local_step: T.Tensor((total_q,), "int32"),
        is_verify: T.Tensor((total_q,), "bool"),
    ):
        with T.Kernel(T.ceildiv(req_cnt, THREADS), threads=THREADS) as bx:
            i = bx * THREADS + T.get_thread_binding()
            if i < req_cnt:
                first = ftp[i]
                s = seqlens_q[i]
                for k in T.serial(s):
                    row_to_req[first + k] = i
                    local_step[first + k] = k
                    is_verify[first + k] = k < s - 1

    return kernel


def prepare_verification_metadata_tilelang(
    ftp: torch.Tensor, seqlens_q: torch.Tensor, total_q: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    dev = ftp.device
    row_to_req = torch.empty(total_q, dtype=torch.int32, device=dev)
    local_step = torch.empty(total_q, dtype=torch.int32, device=dev)
    is_verify = torch.empty(total_q, dtype=torch.bool, device=dev)
    compiled(prepare_verification_metadata_kernel)(ftp, seqlens_q, row_to_req, local_step, is_verify)
    return row_to_req, local_step, is_verify


def check_layout_args(op: str, ftp: torch.Tensor, seqlens_q: torch.Tensor, total_q: int) -> None:
    check_tensor(op, "ftp", ftp, [None], "[req_cnt]", [torch.int32])
    check_tensor(op, "seqlens_q", seqlens_q, [ftp.shape[0]], "[req_cnt]", [torch.int32], ftp.device)
    check_flat_layout(op, ftp, seqlens_q, int(total_q))


def prepare_verification_metadata(
    ftp: torch.Tensor,        # [req_cnt] int32, exclusive prefix sum of seqlens_q
    seqlens_q: torch.Tensor,  # [req_cnt] int32, >= 1
    total_q: int,             # sum(seqlens_q)
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Returns ``row_to_req [total_q] int32``, ``local_step [total_q] int32``, ``is_verify [total_q] bool``."""
    op = "prepare_verification_metadata"
    check_layout_args(op, ftp, seqlens_q, total_q)
    backend = select_backend(op, ftp.device, has_kernel=True)
    if backend is Backend.TILELANG and ftp.numel() > 0:  # an empty grid is not a valid launch
        return prepare_verification_metadata_tilelang(ftp.contiguous(), seqlens_q.contiguous(), int(total_q))
    return prepare_verification_metadata_ref(ftp, seqlens_q, int(total_q))
