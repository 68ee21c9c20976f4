"""The bulk sparse MLA decode kernel and the other ``producer._bulk_macros`` users lower with batched
dequantization loads and no spill (no GPU needed; runs where TileLang and nvcc are installed)."""

from __future__ import annotations

import functools
import re
import shutil

import pytest

pytest.importorskip("tilelang")


SMEM_PER_BLOCK = 232_448        # SM90 opt-in maximum, static + dynamic
STATIC_SMEM = 1_024             # the mbarriers, rounded up to the dynamic buffer's 1 KB alignment


@functools.cache
def _lower(name: str) -> tuple[str, int]:
    """(CUDA source, dynamic shared memory bytes) of one of ``_builders()``."""
    import tilelang
    from tilelang import tvm

    from deepinfer_kernels.tilelang.sparse_mla.common import NO_AUTO_SYNC

    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
    with tvm.transform.PassContext(config=NO_AUTO_SYNC), target:
        art = tilelang.lower(_builders()[name](), target=target)
    (dyn,) = [int(n) for n in re.findall(r"buf_dyn_shmem = T\.alloc_buffer\(\((\d+),\)", str(art.device_mod.script()))]
    return art.kernel_source, dyn


def _builders():
    from deepinfer_kernels.tilelang.sparse_mla.bulk import _build_bulk
    from deepinfer_kernels.tilelang.sparse_mla.bulk_rows import _build_bulk_rows
    from deepinfer_kernels.tilelang.sparse_mla.groups import _build_bulk_groups

    return {"bulk_decode": lambda: _build_bulk(16, 512, 16, False, 2),
            "bulk_split": lambda: _build_bulk(16, 512, 16, True, 2),
            "rows": lambda: _build_bulk_rows(16, 512, 16, 2),
            "pairs": lambda: _build_bulk_groups(16, 512)}


@pytest.fixture(scope="module", params=["bulk_decode", "bulk_split", "rows", "pairs"])
def lowered(request):
    return request.param, *_lower(request.param)


def test_shared_memory_fits_one_block(lowered):
    name, _, dyn = lowered
    assert dyn + STATIC_SMEM <= SMEM_PER_BLOCK, (name, dyn)


def test_the_dequantizers_load_a_batch_of_chunks_before_converting(lowered):
    """LOAD_BATCH chunks of a record part are read before any is converted: decode over KV blocks
    86.3 -> 74.7 us when the loads stopped waiting behind the previous chunk's stores (H200,
    2026-12-01, bit-identical outputs)."""
    from deepinfer_kernels.tilelang.sparse_mla.producer import LOAD_BATCH

    name, src, _ = lowered
    # the part's 4 scale bytes in one load after the batch's chunks, the chunks in a loop of 16-byte loads
    assert re.search(rf"\*\(uint\*\)\(qv \+ {16 * LOAD_BATCH}\) = \*\(uint\*\)\(\(\(uchar\*\)K8\)", src)
    assert re.search(r"\*\(uint4\*\)\(qv \+ \(c\w* \* 16\)\) = \*\(uint4\*\)\(\(\(uchar\*\)K8\)", src)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_no_register_spill(lowered, ptxas_report):
    name, src, _ = lowered
    report = ptxas_report(src)
    assert "0 bytes spill stores, 0 bytes spill loads" in report, (name, report[-1000:])
