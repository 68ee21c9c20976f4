"""Hardware ceilings measured in the same run as a benchmark: device copy bandwidth and bf16 matmul rate."""

from __future__ import annotations

import torch


def _time_ms(fn, iters: int = 20) -> float:
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def copy_bandwidth_bytes_per_s(nbytes: int = 2 << 30) -> float:
    """Device-to-device copy: bytes read + bytes written per second (the benchmarks' own measure)."""
    from deepinfer_kernels.tilelang.timing import copy_bytes_per_s

    return copy_bytes_per_s(nbytes)


def bf16_matmul_flops(n: int = 8192) -> float:
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    ms = _time_ms(lambda: a @ b)
    return 2 * n**3 / (ms * 1e-3)


def measure_ceilings() -> dict:
    return dict(device=torch.cuda.get_device_name(), copy_bw_tb_s=copy_bandwidth_bytes_per_s() / 1e12,
                bf16_matmul_tflops=bf16_matmul_flops() / 1e12)


if __name__ == "__main__":
    print(measure_ceilings())
