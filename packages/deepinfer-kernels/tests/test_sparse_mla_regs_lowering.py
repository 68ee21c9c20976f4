"""The register-operand sparse MLA decode kernel (``sparse_mla_regs.py``, experimental): its PV row
permutation, and its lowering (FP8 QK and register-A PV wgmmas, no bf16 tile, shared memory
within the SM90 limit, no spill). No GPU needed; the lowering tests run where TileLang is
installed, the spill test where nvcc is too. Its results are checked on the GPU in
``test_tilelang_sparse_mla.py -k regs``."""

from __future__ import annotations

import functools
import re
import shutil

import pytest

from deepinfer_kernels.tilelang._cuda_regs import regs_pv_dim

SMEM_PER_BLOCK = 232_448        # SM90 opt-in maximum, static + dynamic


def test_pv_row_permutation_pairs_each_lanes_two_dims():
    """``ldmatrix.trans`` gives lane g dims 2g and 2g+1 of the warp's 16; they become rows g and g+8."""
    assert sorted(regs_pv_dim(m) for m in range(64)) == list(range(64))
    for w in range(4):
        for g in range(8):
            assert (regs_pv_dim(16 * w + g), regs_pv_dim(16 * w + g + 8)) == (16 * w + 2 * g, 16 * w + 2 * g + 1)


@functools.cache
def _lower(split: bool) -> tuple[str, int]:
    import tilelang
    from tilelang import tvm

    from deepinfer_kernels.tilelang.sparse_mla_builders import NO_AUTO_SYNC
    from deepinfer_kernels.tilelang.sparse_mla_regs import _build_regs

    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
    with tvm.transform.PassContext(config=NO_AUTO_SYNC), target:
        art = tilelang.lower(_build_regs(16, 512, split), target=target)
    (dyn,) = [int(n) for n in re.findall(r"buf_dyn_shmem = T\.alloc_buffer\(\((\d+),\)", str(art.device_mod.script()))]
    return art.kernel_source, dyn


@pytest.fixture(params=[False, True], ids=["whole_rows", "split"])
def lowered(request):
    pytest.importorskip("tilelang")
    return request.param, *_lower(request.param)


def test_register_operand_wgmmas_only(lowered):
    _, src, dyn = lowered
    assert "wgmma_ss" not in src                      # no bf16 tile in shared memory
    assert src.count("wgmma_rs<") == 2 * 8            # per consumer: 8 PV fragments
    assert src.count("di_qk_fp8<528, 512, 17, 4>(") == 2 and src.count("di_fill_pv<528>(") == 2 * 8
    assert src.count("warpgroup_reg_alloc<232>") == 2 and src.count("warpgroup_reg_dealloc<40>") == 1
    assert dyn + 1024 <= SMEM_PER_BLOCK


def test_split_writes_partials(lowered):
    split, src, _ = lowered
    assert ("Opart[" in src and "Lpart[" in src) == split
    assert ("Out[" in src) == (not split)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_no_register_spill(lowered, ptxas_report):
    split, src, _ = lowered
    report = ptxas_report(src)
    assert "0 bytes spill stores, 0 bytes spill loads" in report, (split, report[-1000:])
