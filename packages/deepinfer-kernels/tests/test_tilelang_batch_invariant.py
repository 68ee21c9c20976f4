"""GPU tests: under `batch_invariant_kernels()` a row's sparse-MLA and routed-expert result is
bit-identical whatever the number of rows in the call (the split-KV count and the MoE kernel /
tile choice no longer follow the row count)."""

import pytest
import torch

pytestmark = pytest.mark.gpu

T = pytest.importorskip("deepinfer_kernels.testing")


def test_sparse_mla_row_result_independent_of_row_count():
    from deepinfer_kernels.batch_invariant import batch_invariant_kernels
    from deepinfer_kernels.tilelang.sparse_mla import plan, sparse_mla_attention_tilelang

    case = T.make_sparse_mla_case(132, 16, 512, 2048, 20000, "cuda", seed=21)
    assert plan(1, 16, 512, 2048, 132)["num_splits"] > 1      # one row alone would be split
    with batch_invariant_kernels():
        full_o, full_l = sparse_mla_attention_tilelang(case.q, case.pool, case.indices, case.sm_scale)
        for rows in (1, 3, 17):
            o, lse = sparse_mla_attention_tilelang(case.q[:rows], case.pool, case.indices[:rows], case.sm_scale)
            assert torch.equal(o, full_o[:rows]) and torch.equal(lse, full_l[:rows])


def test_routed_experts_token_result_independent_of_token_count():
    from deepinfer_kernels.batch_invariant import batch_invariant_kernels
    from deepinfer_kernels.ops.moe import TILELANG_MOE_MAX_TOKENS, routed_experts, routed_experts_ref

    tokens = 4 * TILELANG_MOE_MAX_TOKENS       # above the TileLang / grouped-GEMM switch
    x, w, ids, w13, w2 = T.make_moe_case(tokens, 1024, 512, 64, 6, "cuda", seed=5)
    with batch_invariant_kernels():
        full = routed_experts(x, w, ids, w13, w2)
        for n in (1, 7, 64, 300):
            assert torch.equal(routed_experts(x[:n], w[:n], ids[:n], w13, w2), full[:n])
    torch.testing.assert_close(full.float(), routed_experts_ref(x, w, ids, w13, w2).float(), atol=3e-2, rtol=3e-2)
