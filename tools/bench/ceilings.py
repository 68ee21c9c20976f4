"""Hardware ceilings measured in the same run as a benchmark: device copy bandwidth and bf16 matmul rate."""

from __future__ import annotations

import torch


def bf16_matmul_flops(n: int = 8192, iters: int = 20) -> float:
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    a @ b
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        a @ b
    end.record()
    torch.cuda.synchronize()
    return 2 * n**3 / (start.elapsed_time(end) / iters * 1e-3)


def measure_ceilings() -> dict:
    """Copy: bytes read + written per second of back-to-back 2 GiB device copies (the kernels'
    benchmarks divide by the same measure); matmul: an 8192^3 bf16 GEMM."""
    from deepinfer_kernels.tilelang.timing import copy_bytes_per_s

    return dict(device=torch.cuda.get_device_name(), copy_bw_tb_s=copy_bytes_per_s(2 << 30) / 1e12,
                bf16_matmul_tflops=bf16_matmul_flops() / 1e12)
