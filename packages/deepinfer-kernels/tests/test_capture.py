"""Capture-safe helpers: the sync-free masked row write and the capturable store variants equal
the references, including the corner cases (no row kept, every row kept, empty)."""

import pytest
import torch

from deepinfer_kernels.ops.capture import (
    force_capturable,
    host_checks,
    use_capturable,
    write_rows,
    write_rows_capturable,
    write_rows_ref,
)
from deepinfer_kernels.ops.kv_fp4 import INDEX_K_FP4
from deepinfer_kernels.ops.kv_fp8 import KV_FP8

CASES = {
    "mixed": [4, -1, 7, -1, 0],
    "none_kept": [-1, -1, -1],
    "all_kept": [9, 3, 1],
    "first_skipped": [-1, 2, -1],
    "empty": [],
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("shape", [(), (5,)], ids=["1d", "2d"])
def test_write_rows_capturable_equals_reference(case, shape):
    g = torch.Generator().manual_seed(0)
    idx = torch.tensor(CASES[case], dtype=torch.long)
    dst = torch.randn((10,) + shape, generator=g)
    src = torch.randn((idx.numel(),) + shape, generator=g)
    want, got = dst.clone(), dst.clone()
    write_rows_ref(want, idx, src)
    write_rows_capturable(got, idx, src)
    assert torch.equal(got, want)


@pytest.mark.parametrize("case", list(CASES))
def test_capturable_stores_equal_reference(case):
    g = torch.Generator().manual_seed(1)
    slots = torch.tensor(CASES[case], dtype=torch.long)
    kv = torch.randn(slots.numel(), 64, generator=g)
    pool = torch.randint(0, 255, (10, 66), dtype=torch.uint8, generator=g)
    want, got = pool.clone(), pool.clone()
    KV_FP8.store_ref(kv, want, slots)
    KV_FP8.store_capturable(kv, got, slots)
    assert torch.equal(got, want)
    pool4 = torch.randint(0, 255, (10, 34), dtype=torch.uint8, generator=g)
    want, got = pool4.clone(), pool4.clone()
    INDEX_K_FP4.store_ref(kv, want, slots)
    INDEX_K_FP4.store_capturable(kv, got, slots)
    assert torch.equal(got, want)


def test_dispatch_modes():
    t = torch.zeros(3)
    assert not use_capturable(t) and host_checks(t)
    with force_capturable():
        assert use_capturable(t) and not host_checks(t)
        with force_capturable(False):
            assert not use_capturable(t)
        assert use_capturable(t)
    assert not use_capturable(t)
    dst = torch.zeros(4, dtype=torch.int32)
    with force_capturable():
        write_rows(dst, torch.tensor([2, -1]), torch.tensor([5, 6]))
    assert dst.tolist() == [0, 0, 5, 0]
    with pytest.raises(ValueError, match="write_rows"):
        write_rows(dst, torch.tensor([[1]]), torch.tensor([1]))
