"""The shared-key list kernel lowers to CUDA with its hash sets and column entries in one shared
buffer that nothing else overlaps (no GPU needed; runs where TileLang is installed).

On 2026-12-01 TileLang's memory planner was found laying the column entries over the hash sets when the
column loop had a single iteration (256-slot sets, 128-column rows): other threads were still
probing the sets, and the lists came out wrong on the H200."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("tilelang")


def _lower(table: int, rows: int = 2) -> str:
    import tilelang
    from tilelang import tvm

    from deepinfer_kernels.tilelang.shared_keys import _build

    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
    with tvm.transform.PassContext(config={"tl.disable_thread_storage_sync": True}), target:
        return tilelang.lower(_build(table, rows), target=target).kernel_source


@pytest.mark.parametrize("table,rows", [(256, 2), (1024, 2), (256, 4), (1024, 4)])
def test_shared_key_work_buffer_overlaps_nothing(table, rows):
    src = _lower(table, rows)
    offsets = {name: int(off) for name, off in re.findall(r"void\* (\w+) = \(\(void\*\)\(\(char\*\)buf_dyn_shmem \+ (\d+)\)\)", src)}
    assert "work" in offsets, offsets
    start, end = offsets["work"], offsets["work"] + (rows + rows // 2) * table * 4   # the sets + the column entries
    for name, off in offsets.items():
        if name != "work":
            assert not start <= off < end, f"{name} at byte {off} lies inside work [{start}, {end})"
    assert src.count("__syncthreads()") >= 5 and "atomicCAS" in src
