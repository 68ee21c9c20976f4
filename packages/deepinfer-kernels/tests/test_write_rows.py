"""write_rows: dst[idx[i]] = src[i] where idx[i] >= 0, without a host sync; the TileLang kernel (SM90)
and the capturable torch variant against the reference."""

import pytest
import torch

from deepinfer_kernels.ops.capture import _kernel_takes, force_capturable, write_rows, write_rows_ref

CASES = [  # (dst shape, dst dtype, src dtype, idx dtype): Engram ids, compressor terms, casts
    ((50,), torch.int32, torch.int32, torch.int64),
    ((40, 641), torch.float32, torch.float32, torch.int64),
    ((40, 97), torch.float32, torch.bfloat16, torch.int32),
    ((30, 4, 8), torch.bfloat16, torch.float32, torch.int64),
]


def _case(shape, dst_dtype, src_dtype, idx_dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    dst = (torch.randn(shape, generator=g) * 100).to(dst_dtype)
    idx = torch.tensor([3, -1, 0, shape[0] - 1, -1, 7, 12], dtype=idx_dtype)
    src = (torch.randn((idx.shape[0],) + shape[1:], generator=g) * 100).to(src_dtype)
    return dst.to(device), idx.to(device), src.to(device)


@pytest.mark.parametrize("shape,dst_dtype,src_dtype,idx_dtype", CASES)
def test_capturable_variant_matches_reference(shape, dst_dtype, src_dtype, idx_dtype):
    dst, idx, src = _case(shape, dst_dtype, src_dtype, idx_dtype, "cpu")
    want = dst.clone()
    write_rows_ref(want, idx, src)
    with force_capturable():
        write_rows(dst, idx, src)
    assert torch.equal(dst, want)


def test_kernel_operand_rules():
    i64 = torch.zeros(3, dtype=torch.int64)
    assert _kernel_takes(torch.zeros(10, dtype=torch.int32), i64, torch.zeros(3, dtype=torch.int32))
    assert _kernel_takes(torch.zeros(2, 10, 5)[1], i64, torch.zeros(3, 5, dtype=torch.bfloat16))  # a plane
    assert not _kernel_takes(torch.zeros(10, 5)[:, :3], i64, torch.zeros(3, 3))              # strided rows
    assert not _kernel_takes(torch.zeros(10, 5), i64, torch.zeros(3, 5, dtype=torch.int32))  # int -> float
    assert not _kernel_takes(torch.zeros(0, 5), i64, torch.zeros(3, 5))                      # no rows


@pytest.mark.gpu
@pytest.mark.parametrize("shape,dst_dtype,src_dtype,idx_dtype", CASES)
def test_tilelang_kernel_matches_reference(shape, dst_dtype, src_dtype, idx_dtype):
    pytest.importorskip("tilelang")
    from deepinfer_kernels.tilelang.write_rows import write_rows_tilelang

    dst, idx, src = _case(shape, dst_dtype, src_dtype, idx_dtype, "cuda", seed=1)
    want = dst.cpu().clone()
    write_rows_ref(want, idx.cpu(), src.cpu())
    write_rows_tilelang(dst, idx, src)
    torch.cuda.synchronize()
    assert torch.equal(dst.cpu(), want)
    dst_out = dst.clone()
    write_rows_tilelang(dst_out, torch.tensor([-1, 10_000], dtype=idx_dtype, device="cuda"), src[:2])
    assert torch.equal(dst_out, dst)    # skipped rows and rows past dst write nothing


@pytest.mark.gpu
def test_write_rows_dispatches_to_the_kernel_and_is_capturable():
    pytest.importorskip("tilelang")
    dst, idx, src = _case((40, 641), torch.float32, torch.float32, torch.int64, "cuda", seed=2)
    want = dst.cpu().clone()
    write_rows_ref(want, idx.cpu(), src.cpu())
    write_rows(dst, idx, src)                       # compiles outside the capture
    from deepinfer_kernels.tilelang import compile_times
    assert any(name.startswith("write_rows") for name in compile_times())   # the kernel ran, not torch
    dst.copy_(torch.zeros_like(dst))
    want2 = torch.zeros_like(want)
    write_rows_ref(want2, idx.cpu(), src.cpu())
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        write_rows(dst, idx, src)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(dst.cpu(), want2)
