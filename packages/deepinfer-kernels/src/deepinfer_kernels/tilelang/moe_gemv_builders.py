"""TileLang builders of the few-token routed experts (``moe.routed_experts_tilelang`` where
``moe.gemv_pays``: one token over narrow experts): matrix-vector products over each (token, slot)
pair's expert, two launches in all, no routing bookkeeping.

At batch 1 the grouped GEMMs of ``moe_builders.py`` give each active expert's weights to few CTAs
(gate/up: 8 column tiles per expert, 48 CTAs for top-6 on 132 SMs) and need a permutation before
and a combine after. Here:

* gate/up: one CTA per (pair, ``bn`` gate columns): it streams the expert's ``bn`` gate rows and
  the ``bn`` matching up rows through a cp.async pipeline, multiplies them by the token's row on
  CUDA cores, reduces over K and writes ``silu(g) * u`` (g and u rounded to the dtype first, as the
  reference rounds the gate/up GEMM's output).
* down + combine: one CTA per (token, ``bn`` output columns) walks the token's ``top_k`` experts
  in slot order in one pipeline and accumulates ``w[t, j] * act[t, j] . W2[e_j, col]`` in fp32,
  then adds the shared expert and the residual with the combine kernel's roundings. The expert
  outputs are not rounded to the dtype before weighting (the reference rounds each one): results
  agree with it to rounding, not bit for bit.
"""

from deepinfer_kernels.tilelang._common import PDL, pdl_sync

# No `from __future__ import annotations` (TileLang evaluates prim_func annotations).

NT = 128   # threads per CTA


def _build_gate_up_gemv(E: int, H: int, I: int, topk: int, bn: int, bk: int, stages: int, dtype: str):
    """Act[p, c] = silu(X[p // topk] . W13[e, c]) * (X[p // topk] . W13[e, I + c]), e = Ids[p]."""
    import tilelang.language as T

    assert H % bk == 0 and I % bn == 0
    TOK = T.dynamic("TOK")
    P = T.dynamic("P")                  # tokens * topk

    @T.prim_func
    def main(
        X: T.Tensor((TOK, H), dtype),
        Ids: T.Tensor((P,), T.int32),
        W13: T.Tensor((E, 2 * I, H), dtype),
        Act: T.Tensor((P, I), dtype),
    ):
        with T.Kernel(I // bn, P, threads=NT) as (bx, p):
            if PDL:   # wait for the previous kernel before touching memory (_common.PDL)
                T.evaluate(pdl_sync())
            x_s = T.alloc_shared((1, bk), dtype)
            g_s = T.alloc_shared((bn, bk), dtype)
            u_s = T.alloc_shared((bn, bk), dtype)
            acc_g = T.alloc_fragment((bn, bk), T.float32)
            acc_u = T.alloc_fragment((bn, bk), T.float32)
            sum_g = T.alloc_fragment((bn,), T.float32)
            sum_u = T.alloc_fragment((bn,), T.float32)
            e = Ids[p]
            t = p // topk
            T.clear(acc_g)
            T.clear(acc_u)
            for ko in T.Pipelined(H // bk, num_stages=stages):
                T.copy(X[t:t + 1, ko * bk:(ko + 1) * bk], x_s)
                T.copy(W13[e, bx * bn:(bx + 1) * bn, ko * bk:(ko + 1) * bk], g_s)
                T.copy(W13[e, I + bx * bn:I + (bx + 1) * bn, ko * bk:(ko + 1) * bk], u_s)
                for i, k in T.Parallel(bn, bk):
                    acc_g[i, k] += T.cast(g_s[i, k], T.float32) * T.cast(x_s[0, k], T.float32)
                    acc_u[i, k] += T.cast(u_s[i, k], T.float32) * T.cast(x_s[0, k], T.float32)
            T.reduce_sum(acc_g, sum_g, dim=1)
            T.reduce_sum(acc_u, sum_u, dim=1)
            for i in T.Parallel(bn):
                g = T.cast(T.cast(sum_g[i], dtype), T.float32)
                u = T.cast(T.cast(sum_u[i], dtype), T.float32)
                Act[p, bx * bn + i] = T.cast(g / (1.0 + T.exp(-g)) * u, dtype)

    return main


def _build_down_combine_gemv(E: int, H: int, I: int, topk: int, bn: int, bk: int, stages: int, dtype: str,
                             add_shared: bool, add_residual: bool):
    """Out[t, c] = sum_j Wk[t, j] * (Act[t * topk + j] . W2[Ids[t * topk + j], c]) in fp32, j
    ascending, rounded to dtype; then ``+ Shared[t, c]`` and ``Residual[t, c] + ...``, each rounded
    (the combine kernel's order). Unused addend operands are never read."""
    import tilelang.language as T

    assert I % bk == 0 and H % bn == 0
    KI = I // bk
    TOK = T.dynamic("TOK")
    P = T.dynamic("P")

    @T.prim_func
    def main(
        Act: T.Tensor((P, I), dtype),
        Ids: T.Tensor((P,), T.int32),
        Wk: T.Tensor((TOK, topk), T.float32),
        W2: T.Tensor((E, H, I), dtype),
        Shared: T.Tensor((TOK, H), dtype),
        Residual: T.Tensor((TOK, H), dtype),
        Out: T.Tensor((TOK, H), dtype),
    ):
        with T.Kernel(H // bn, TOK, threads=NT) as (bx, t):
            if PDL:   # wait for the previous kernel before touching memory (_common.PDL)
                T.evaluate(pdl_sync())
            a_s = T.alloc_shared((1, bk), dtype)
            w_s = T.alloc_shared((bn, bk), dtype)
            acc = T.alloc_fragment((bn, bk), T.float32)
            tot = T.alloc_fragment((bn,), T.float32)
            T.clear(acc)
            # all top_k experts in one pipeline (a pipeline per expert would drain between them);
            # the routing weight scales the activation, so one accumulator serves every slot
            for it in T.Pipelined(topk * KI, num_stages=stages):
                p = t * topk + it // KI
                T.copy(Act[p:p + 1, (it % KI) * bk:(it % KI + 1) * bk], a_s)
                T.copy(W2[Ids[p], bx * bn:(bx + 1) * bn, (it % KI) * bk:(it % KI + 1) * bk], w_s)
                for i, k in T.Parallel(bn, bk):
                    acc[i, k] += T.cast(w_s[i, k], T.float32) * (T.cast(a_s[0, k], T.float32) * Wk[t, it // KI])
            T.reduce_sum(acc, tot, dim=1)
            for i in T.Parallel(bn):
                y = T.cast(tot[i], dtype)
                if add_shared:
                    y = T.cast(T.cast(y, T.float32) + T.cast(Shared[t, bx * bn + i], T.float32), dtype)
                if add_residual:
                    y = T.cast(T.cast(Residual[t, bx * bn + i], T.float32) + T.cast(y, T.float32), dtype)
                Out[t, bx * bn + i] = y

    return main
