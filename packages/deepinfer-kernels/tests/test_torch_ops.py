"""The TileLang launchers as torch custom ops (tilelang/torch_ops.py): registration, fake shapes and
the compiled-graph plumbing, on the CPU (where each op's implementation is its torch reference).
A function calling them compiles with fullgraph=True, writes a *view* of the KV pool in place
through the mutating store ops, and matches the eager references."""

import pytest
import torch

from deepinfer_kernels.ops import indexer, kv_fp4, kv_fp8, moe, sparse_mla
from deepinfer_kernels.platform import CUSTOM_OP_KERNELS
from deepinfer_kernels import testing
from deepinfer_kernels.tilelang import LAUNCHERS
from deepinfer_kernels.tilelang.torch_ops import COMPILED_LAUNCHERS


def test_every_wrapped_launcher_is_a_custom_op():
    assert set(COMPILED_LAUNCHERS) == CUSTOM_OP_KERNELS <= set(LAUNCHERS)
    for name in CUSTOM_OP_KERNELS:
        assert hasattr(torch.ops.deepinfer, name)


def _step(kv_plane, index_plane, new_kv, new_k, slots, q, idx, qi, wi, iidx, vlen, x, w, ids, w13, w2):
    ops = torch.ops.deepinfer
    ops.store_kv_fp8(new_kv, kv_plane, slots)
    ops.store_index_k_fp4(new_k, index_plane, slots)
    out, lse = ops.sparse_mla_attention(q, kv_plane, idx, 0.125, "auto")
    scores = ops.indexer_scores(qi, wi, index_plane, iidx)
    blocks = ops.indexer_topk_blocks(qi, wi, index_plane, iidx, vlen, 4, 2)
    return out * 2, lse, scores.relu(), blocks, ops.routed_experts(x, w, ids, w13, w2) + 1


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_custom_ops_compile_and_match_the_references(backend):
    d, di, slots = 64, 32, 40
    kv_pool = torch.cat([testing.make_pool(slots, d, "cpu", seed=1)] * 2)          # two planes
    index_pool = kv_fp4.quantize_index_k_fp4_ref(torch.randn(2 * slots, di))
    new_kv, new_k = torch.randn(3, d), torch.randn(3, di)
    slots_w = torch.tensor([5, -1, 17])
    case = testing.make_sparse_mla_case(4, 2, d, 24, slots, "cpu", seed=2, ragged=True, empty_rows=(1,))
    icase = testing.make_indexer_case(4, 2, di, 12, slots, "cpu", seed=3)
    x, w, ids, w13, w2 = testing.make_moe_case(5, 64, 32, 8, 2, "cpu", seed=4)
    x, w13, w2 = x.float(), w13.float(), w2.float()
    q = case.q.float()

    def args(kv, ix):
        return (kv[slots:], ix[slots:], new_kv, new_k, slots_w, q, case.indices, icase.q.float(), icase.weights,
                icase.indices, icase.valid_lens, x, w, ids, w13, w2)

    kv_c, ix_c = kv_pool.clone(), index_pool.clone()
    torch._dynamo.reset()
    got = torch.compile(_step, fullgraph=True, backend=backend)(*args(kv_c, ix_c))
    torch._dynamo.reset()
    kv_r, ix_r = kv_pool.clone(), index_pool.clone()
    kv_fp8.store_kv_fp8_ref(new_kv, kv_r[slots:], slots_w)
    kv_fp4.store_index_k_fp4_ref(new_k, ix_r[slots:], slots_w)
    out, lse = sparse_mla.sparse_mla_attention_ref(q, kv_r[slots:], case.indices, 0.125)
    scores = indexer.indexer_scores_ref(icase.q.float(), icase.weights, ix_r[slots:], icase.indices)
    blocks = indexer.indexer_topk_blocks_ref(icase.q.float(), icase.weights, ix_r[slots:], icase.indices,
                                             icase.valid_lens, 4, 2)
    want = (out * 2, lse, scores.relu(), blocks, moe.routed_experts_ref(x, w, ids, w13, w2) + 1)
    assert torch.equal(kv_c, kv_r) and torch.equal(ix_c, ix_r)        # the views were written in place
    assert not torch.equal(kv_c, kv_pool)
    for g, e in zip(got, want, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5, equal_nan=True)
