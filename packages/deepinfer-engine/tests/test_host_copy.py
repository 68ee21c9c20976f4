"""host_copy.py: per-step host -> device copies (page-locked and asynchronous on CUDA)."""

import numpy as np
import pytest
import torch

from deepinfer_engine.host_copy import ALIGN_BYTES, array_to_device, arrays_to_device, to_device


def test_cpu_copies_never_alias_their_source():
    src = torch.arange(6, dtype=torch.int64)
    out = to_device(src, torch.device("cpu"))
    src[0] = 99
    assert out.tolist() == [0, 1, 2, 3, 4, 5]


def test_read_only_and_strided_arrays_convert_dtype():
    arr = np.arange(12, dtype=np.int64).reshape(3, 4)[:, ::2]   # strided view
    arr.setflags(write=False)                                    # the scheduler hands out read-only views
    out = array_to_device(arr, torch.int32, torch.device("cpu"))
    assert out.dtype == torch.int32 and out.tolist() == [[0, 2], [4, 6], [8, 10]]


def test_packed_arrays_keep_values_shapes_and_alignment():
    """arrays_to_device: one buffer per dtype, each result a view shaped like its array, starting
    ALIGN_BYTES-aligned within the buffer; writing one result never touches another."""
    table = np.arange(12, dtype=np.int64).reshape(3, 4)[:, ::2]             # strided
    table.setflags(write=False)
    items = [(np.array([5, 6, 7]), torch.int64), (table, torch.int32), (np.zeros(0), torch.int64),
             (np.array([1.5, -2.0]), torch.float32), (np.array([True, False]), torch.bool),
             (np.array([-1, 9]), torch.int32)]
    got = arrays_to_device(items, torch.device("cpu"))
    assert [g.dtype for g in got] == [d for _, d in items]
    assert got[0].tolist() == [5, 6, 7] and got[1].tolist() == [[0, 2], [4, 6], [8, 10]]
    assert got[2].shape == (0,) and got[3].tolist() == [1.5, -2.0] and got[4].tolist() == [True, False]
    assert got[5].tolist() == [-1, 9]
    for g in got:
        assert g.storage_offset() * g.element_size() % ALIGN_BYTES == 0
    got[1][0, 0] = 99                                                       # same int32 buffer as got[5]
    assert got[5].tolist() == [-1, 9]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_copy_does_not_wait_for_queued_work():
    """The copy is enqueued behind queued device work and the host returns before the stream
    reaches it (a synchronizing copy would return only once the queued matmuls were done); the
    result is right once the stream gets there."""
    x = torch.randn(4096, 4096, device="cuda")
    arrays_to_device([(np.zeros(1), torch.int64)], torch.device("cuda"))   # the first page-locked allocation is slow
    torch.cuda.synchronize()
    for _ in range(40):                                        # ~0.1 s of fp32 matmuls queued
        x = x @ x / 64.0
    out, flags = arrays_to_device([(np.array([3, 1, 2]), torch.int64), (np.array([True]), torch.bool)],
                                  torch.device("cuda"))
    still_queued = not torch.cuda.current_stream().query()
    torch.cuda.synchronize()
    assert still_queued, "arrays_to_device waited for the queued device work"
    assert out.tolist() == [3, 1, 2] and flags.tolist() == [True]
