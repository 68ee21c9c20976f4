"""Benchmarks: SwiGLU's activation (`silu_mul`) on halves of a fused gate/up GEMM output, the
TileLang kernel beside torch's two element-wise kernels (`F.silu(gate) * up`), graph replays with
the L2 flushed: bytes read and written / time against copy bandwidth. Shapes: the MoE prefill of
`mini` (32,768 tokens x top-6 rows of 512, one rounding) and its dense FFN at a 16K-token chunk."""

import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.gpu

T = pytest.importorskip("deepinfer_kernels.testing")


@pytest.mark.parametrize("path", ["tilelang", "torch"])
@pytest.mark.parametrize("rows,inter,round_silu", [(196_608, 512, False), (16_384, 2816, True)],
                         ids=["moe_prefill", "dense_ffn"])
def test_bench_silu_mul(benchmark, rows, inter, round_silu, path):
    from deepinfer_kernels.tilelang.activation import silu_mul_tilelang

    gate_up = torch.randn(rows, 2 * inter, device="cuda").to(torch.bfloat16)
    gate, up = gate_up[:, :inter], gate_up[:, inter:]
    if path == "tilelang":
        fn = lambda: silu_mul_tilelang(gate, up, round_silu)   # noqa: E731
    elif round_silu:
        fn = lambda: F.silu(gate) * up                          # noqa: E731
    else:
        fn = lambda: (F.silu(gate.float()) * up.float()).to(torch.bfloat16)   # noqa: E731
    T.record_benchmark(benchmark, fn, bytes_moved=3 * rows * inter * 2,
                       extra={"rows": rows, "inter": inter, "path": path})
