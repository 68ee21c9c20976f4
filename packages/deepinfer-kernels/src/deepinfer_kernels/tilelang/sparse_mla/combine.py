"""TileLang builder of the split-KV combine kernel of sparse MLA: a row's split partials merged into
its output (``common.py`` for the split-KV layout)."""

# No `from __future__ import annotations`: TileLang evaluates the prim_func annotations at
# decoration time against the builder locals.

from deepinfer_kernels.tilelang._common import PDL, pdl_sync
from deepinfer_kernels.tilelang.sparse_mla.common import LOG2E


def _build_combine(heads: int, d: int):
    """Merge split partials: out = sum_s 2^(L_s - L) O_s, lse = L / log2(e), L = log2 sum_s 2^L_s."""
    import tilelang.language as T

    H = heads
    R = T.dynamic("R")
    NS = T.dynamic("NS")
    NT = min(128, d // 4)
    PER = d // NT

    @T.prim_func
    def main(
        Opart: T.Tensor((NS, R, H, d), T.float32),
        Lpart: T.Tensor((NS, R, H), T.float32),
        Out: T.Tensor((R, H, d), T.bfloat16),
        Lse: T.Tensor((R, H), T.float32),
    ):
        with T.Kernel(R, H, threads=NT) as (r, h):
            if PDL:   # wait for the previous kernel before touching memory (_common.PDL)
                T.evaluate(pdl_sync())
            tx = T.get_thread_binding()
            mx = T.alloc_var(T.float32)
            tot = T.alloc_var(T.float32)
            acc = T.alloc_local((PER,), T.float32)
            ov = T.alloc_local((PER,), T.float32)
            mx = -T.infinity(T.float32)
            for s in T.serial(NS):
                mx = T.max(mx, Lpart[s, r, h])
            tot = 0.0
            for v in T.vectorized(PER):
                acc[v] = 0.0
            if mx > -T.infinity(T.float32):
                for s in T.serial(NS):
                    wgt = T.exp2(Lpart[s, r, h] - mx)
                    tot = tot + wgt
                    for v in T.vectorized(PER):
                        ov[v] = Opart[s, r, h, tx * PER + v]
                    for v in T.vectorized(PER):
                        acc[v] = acc[v] + wgt * ov[v]
            for v in T.vectorized(PER):
                Out[r, h, tx * PER + v] = T.cast(T.if_then_else(tot > 0, acc[v] / tot, 0.0), T.bfloat16)
            if tx == 0:
                Lse[r, h] = T.if_then_else(tot > 0, (T.log2(tot) + mx) / LOG2E, -T.infinity(T.float32))

    return main
