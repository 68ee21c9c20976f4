"""Expand two KV segments per token into a dense `-1`-padded index array.

Each query token's visible KV is described by four int32 pivots
`[first offset, first length, second offset, second length]`; the output row lists
`first offset .. first offset + first length - 1`, then the second segment, then `-1`::

    pivots [5, 3, 20, 2], width 8  ->  [5, 6, 7, 20, 21, -1, -1, -1]

Lengths must be >= 0 and `first length + second length <= width`.
"""

from __future__ import annotations

import torch

from deepinfer_kernels.ops._checks import check_dim, check_tensor
from deepinfer_kernels.ops.capture import host_checks
from deepinfer_kernels.platform import select_backend


def expand_swa_index_ref(pivots: torch.Tensor, width: int) -> torch.Tensor:
    """pivots int32 [n, 4] -> int32 [n, width]."""
    p = pivots.long()
    col = torch.arange(width, device=pivots.device).unsqueeze(0)          # [1, width]
    off1, len1, off2, len2 = (p[:, i : i + 1] for i in range(4))
    first = col < len1
    second = (col >= len1) & (col < len1 + len2)
    out = torch.full((pivots.shape[0], width), -1, dtype=torch.long, device=pivots.device)
    out = torch.where(first, off1 + col, out)
    out = torch.where(second, off2 + col - len1, out)
    return out.to(torch.int32)


def expand_swa_index(pivots: torch.Tensor, width: int) -> torch.Tensor:
    """pivots int32 [n, 4] (offset1, len1, offset2, len2) -> int32 [n, width], -1 padded."""
    check_tensor("pivots", pivots, 2, (torch.int32,))
    check_dim("pivots", pivots, 1, 4)
    if width < 0:
        raise ValueError(f"width={width}: must be >= 0")
    if host_checks(pivots) and pivots.numel():  # value checks: CPU only (no sync on CUDA)
        lens = pivots[:, 1].long() + pivots[:, 3].long()
        if bool((pivots[:, 1] < 0).any() or (pivots[:, 3] < 0).any()):
            raise ValueError("pivots: segment lengths must be >= 0")
        if int(lens.max()) > width:
            raise ValueError(f"pivots: a row needs {int(lens.max())} columns, width is {width}")
    select_backend("expand_swa_index", pivots.device, has_kernel=False)
    return expand_swa_index_ref(pivots, width)


def window_positions(positions: torch.Tensor, lo: torch.Tensor, width: int) -> torch.Tensor:
    """positions [N], lo [N] (first position that exists for this branch) -> int64 [N, width]
    virtual positions of each row's window, max(p - width + 1, lo) .. p, -1 padded (one segment)."""
    start = torch.maximum(positions - width + 1, lo)
    length = (positions - start + 1).clamp(min=0)
    zeros = torch.zeros_like(start)
    pivots = torch.stack([start, length, zeros, zeros], dim=1).to(torch.int32)
    return expand_swa_index(pivots, width).long()
