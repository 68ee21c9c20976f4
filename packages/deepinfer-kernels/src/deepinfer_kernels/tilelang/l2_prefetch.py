"""L2 prefetch of a weight's region (``ops.l2_prefetch``) in one launch (TileLang, SM90).

One thread per row of the region (a row prefix of a wide weight, or a CHUNK_BYTES piece of a
contiguous prefix), 32 threads a CTA; each thread issues at most four ``cp.async.bulk.prefetch.L2``
requests of at most CHUNK_BYTES. The TMA unit takes each request in some tens of ns, so the rows
are spread over many CTAs (one per 32 rows): each SM's unit queues a few dozen at most. The kernel
returns once the requests are issued; the fill continues behind it.
"""

import torch

from deepinfer_kernels.ops.l2_prefetch import CHUNK_BYTES, prefetch_region
from deepinfer_kernels.tilelang._common import PDL, compile_cached, pdl_sync, require_cuda
from deepinfer_kernels.tilelang._cuda import PREFETCH_SRC

# No `from __future__ import annotations` (TileLang evaluates prim_func annotations).

THREADS = 32


def _build(row_bytes: int):
    import tilelang.language as T

    R = T.dynamic("R")
    S = T.dynamic("S")
    requests = (row_bytes + CHUNK_BYTES - 1) // CHUNK_BYTES

    @T.prim_func
    def main(W: T.Tensor((R, S), "uint8")):
        with T.Kernel(T.ceildiv(R, THREADS), threads=THREADS) as b:
            T.import_source(PREFETCH_SRC)
            if PDL:   # _common.PDL: wait for the previous kernel of the stream
                T.evaluate(pdl_sync())
            r = b * THREADS + T.get_thread_binding()
            if r < R:
                for c in T.unroll(requests):
                    T.evaluate(T.call_extern("handle", "di_prefetch_l2", T.access_ptr(W[r, c * CHUNK_BYTES], "r"),
                                             T.min(CHUNK_BYTES, row_bytes - c * CHUNK_BYTES)))

    return main


def _kernel(row_bytes: int):
    return compile_cached("l2_prefetch", (row_bytes,), lambda: _build(row_bytes))


def l2_prefetch_tilelang(weight: torch.Tensor, budget_bytes: int) -> None:
    """Same arguments as ``ops.l2_prefetch.l2_prefetch_ref``: warm ``prefetch_region(weight, budget_bytes)``."""
    require_cuda(weight=weight)
    region = prefetch_region(weight, budget_bytes)
    if region is None:
        return
    flat = weight.view(-1).view(torch.uint8)
    if region.whole_rows:   # a contiguous prefix as rows of CHUNK_BYTES (a shorter prefix: one row)
        piece = min(region.row_bytes, CHUNK_BYTES)
        view, row_bytes = flat[: region.row_bytes].view(region.row_bytes // piece, piece), piece
    else:                   # the first row_bytes of every row of W
        view, row_bytes = flat.view(region.rows, region.stride_bytes), region.row_bytes
    _kernel(row_bytes)(view)
