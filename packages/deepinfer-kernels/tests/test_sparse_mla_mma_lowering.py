"""The warp-MMA sparse MLA decode kernel (``sparse_mla/mma.py``): its lowering (one
copy of the consumer code, no TileLang bounds guard around the CUDA calls, shared memory within the
SM90 limit, no spill). No GPU needed; the lowering tests run where TileLang is installed, the spill
test where nvcc is too. Its results are checked on the GPU in
``test_tilelang_sparse_mla_mma.py``."""

from __future__ import annotations

import functools
import re
import shutil

import pytest

SMEM_PER_BLOCK = 232_448        # SM90 opt-in maximum, static + dynamic


@functools.cache
def _lower(split: bool, hw_cvt: bool, teams: bool) -> tuple[str, int]:
    import tilelang
    from tilelang import tvm

    from deepinfer_kernels.tilelang.sparse_mla.common import NO_AUTO_SYNC
    from deepinfer_kernels.tilelang.sparse_mla.mma import _build_mma

    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
    with tvm.transform.PassContext(config=NO_AUTO_SYNC), target:
        art = tilelang.lower(_build_mma(16, 512, split, hw_cvt=hw_cvt, teams=teams), target=target)
    (dyn,) = [int(n) for n in re.findall(r"buf_dyn_shmem = T\.alloc_buffer\(\((\d+),\)", str(art.device_mod.script()))]
    return art.kernel_source, dyn


@pytest.fixture(params=[(False, True, True), (True, True, True), (False, False, True), (False, True, False),
                        (True, True, False)],
                ids=["whole_rows", "split", "intcvt", "one_team", "one_team_split"])
def lowered(request):
    pytest.importorskip("tilelang")
    split, hw_cvt, teams = request.param
    return split, teams, *_lower(split, hw_cvt, teams)


def test_one_consumer_call_and_no_guard(lowered):
    """All eight consumer warps run one inlined copy of ``di_mma_consumer`` (or of the two-team
    ``di_mma_teams_consumer``: what keeps the code small), and in a whole-row build TileLang wraps no CUDA call in a
    row-bounds check: an index into the one-row ``Opart`` that launch passes would make it skip every
    CTA but the first (the kernel then hung, 2026-12-02). A split build indexes ``Opart[sp, r]``, whose
    ``RP`` is the row count: its ``r < RP`` check always holds."""
    split, teams, src, dyn = lowered
    consumer = "di_mma_teams_consumer" if teams else "di_mma_consumer"
    assert len(re.findall(consumer + r"<[^>]*>\(", src)) == 1
    assert len(re.findall(r"di_mma_prep<[^>]*>\(", src)) == 1
    assert ("< RP)" in src) == split and "< NS)" not in src
    assert "wgmma" not in src                         # mma.sync only
    assert src.count("warpgroup_reg_alloc<232>") == 1 and src.count("warpgroup_reg_dealloc<40>") == 1
    assert dyn + 1024 <= SMEM_PER_BLOCK


def test_split_writes_partials(lowered):
    split, _, src, _ = lowered
    assert re.search(r"consumer<528, 512, 4, 16, 40, (true|false)", src).group(1) == ("true" if split else "false")
    assert ("Lpart[" in src) == split and ("Lse[" in src) == (not split)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_no_register_spill(lowered, ptxas_report):
    split, _, src, _ = lowered
    report = ptxas_report(src)
    assert "0 bytes spill stores, 0 bytes spill loads" in report, (split, report[-1000:])
