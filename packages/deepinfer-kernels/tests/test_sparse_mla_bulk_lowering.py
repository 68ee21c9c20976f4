"""The bulk sparse MLA decode kernel and the other ``_bulk_macros`` users lower with batched
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

    from deepinfer_kernels.tilelang.sparse_mla_builders import NO_AUTO_SYNC

    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
    with tvm.transform.PassContext(config=NO_AUTO_SYNC), target:
        art = tilelang.lower(_builders()[name](), target=target)
    (dyn,) = [int(n) for n in re.findall(r"buf_dyn_shmem = T\.alloc_buffer\(\((\d+),\)", str(art.device_mod.script()))]
    return art.kernel_source, dyn


def _builders():
    from deepinfer_kernels.tilelang.sparse_mla_bulk import _build_bulk
    from deepinfer_kernels.tilelang.sparse_mla_bulk_rows import _build_bulk_rows
    from deepinfer_kernels.tilelang.sparse_mla_groups import _build_bulk_groups

    return {"bulk_decode": lambda: _build_bulk(16, 512, 16, False, 2),
            "bulk_split": lambda: _build_bulk(16, 512, 16, True, 2),
            "rows": lambda: _build_bulk_rows(16, 512, 16, 2),
            "pairs": lambda: _build_bulk_groups(16, 512),
            "two_consumers": lambda: _build_bulk(16, 512, 16, True, 2, consumers=2),
            "two_consumers_trim": lambda: _build_bulk(16, 512, 16, True, 2, True, consumers=2)}


@pytest.fixture(scope="module", params=["bulk_decode", "bulk_split", "rows", "pairs", "two_consumers",
                                        "two_consumers_trim"])
def lowered(request):
    return request.param, *_lower(request.param)


def test_shared_memory_fits_one_block(lowered):
    name, _, dyn = lowered
    assert dyn + STATIC_SMEM <= SMEM_PER_BLOCK, (name, dyn)


@pytest.mark.parametrize("name", ["two_consumers", "two_consumers_trim"])
def test_two_consumer_warpgroups_sync_on_their_own_barriers(name):
    """Each consumer warpgroup of the experimental two-consumer kernel syncs its 128 threads on its
    own named barrier (a shared one would pair warps of different warpgroups), both wait for Q_s
    on a third, and each writes its own split of the partials."""
    src, _ = _lower(name)
    assert "__launch_bounds__(512, 1)" in src
    partial = set(re.findall(r"__sync_thread_partial\((\d+), (\d+)\)", src))
    assert partial == {("1", "128"), ("2", "128"), ("3", "256")}, partial
    assert "(((int64_t)((int)blockIdx.y)) * (int64_t)2) + (int64_t)1)" in src     # split 2 sp + 1


def test_the_dequantizers_load_a_batch_of_chunks_before_converting(lowered):
    """LOAD_BATCH chunks of a record part are read before any is converted: decode over KV blocks
    86.3 -> 74.7 us when the loads stopped waiting behind the previous chunk's stores (H200,
    2026-12-01, bit-identical outputs)."""
    from deepinfer_kernels.tilelang.sparse_mla_bulk import LOAD_BATCH

    name, src, _ = lowered
    # the part's 4 scale bytes in one load after the batch's chunks, the chunks in a loop of 16-byte loads
    assert re.search(rf"\*\(uint\*\)\(qv \+ {16 * LOAD_BATCH}\) = \*\(uint\*\)\(\(\(uchar\*\)K8\)", src)
    assert re.search(r"\*\(uint4\*\)\(qv \+ \(c\w* \* 16\)\) = \*\(uint4\*\)\(\(\(uchar\*\)K8\)", src)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_no_register_spill(lowered, ptxas_report):
    name, src, _ = lowered
    report = ptxas_report(src)
    assert "0 bytes spill stores, 0 bytes spill loads" in report, (name, report[-1000:])
