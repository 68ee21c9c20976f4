"""The quad sparse MLA kernel lowers to CUDA within SM90's per-block limits (no GPU needed; runs
where TileLang is installed). Its first two H200 runs failed on exactly these: 231,680 bytes of
dynamic shared memory (over the limit once the static mbarriers' 1 KB is counted) and setmaxnreg
budgets of 216 + 216 + 80 registers a thread against the 3 x 168 the CTA gets at launch (a hang)."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("tilelang")

SMEM_PER_BLOCK = 232_448        # SM90 opt-in maximum, static + dynamic
STATIC_SMEM = 1_024             # the mbarriers, rounded up to the dynamic buffer's 1 KB alignment


@pytest.fixture(scope="module")
def lowered():
    import tilelang
    from tilelang import tvm

    from deepinfer_kernels.tilelang.sparse_mla.common import NO_AUTO_SYNC
    from deepinfer_kernels.tilelang.sparse_mla.quads import _build_quads

    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
    with tvm.transform.PassContext(config=NO_AUTO_SYNC), target:
        art = tilelang.lower(_build_quads(512), target=target)
    return art.kernel_source, str(art.device_mod.script())


def test_shared_memory_fits_one_block(lowered):
    src, script = lowered
    (dyn,) = [int(n) for n in re.findall(r'buf_dyn_shmem = T\.alloc_buffer\(\((\d+),\)', script)]
    assert dyn + STATIC_SMEM <= SMEM_PER_BLOCK, dyn
    offsets = dict(re.findall(r"void\* (\w+) = \(\(void\*\)\(\(char\*\)buf_dyn_shmem \+ (\d+)\)\)", src))
    assert set(offsets) == {"meta", "Kb", "Q_s", "K8"}, offsets       # the small buffers stay in meta
    assert len(set(offsets.values())) == 4                              # nothing laid over another


def test_register_budgets_fit_the_launch_allocation(lowered):
    src, _ = lowered
    threads = int(re.search(r"__launch_bounds__\((\d+), 1\)", src).group(1))
    per_thread = 65_536 // threads // 8 * 8
    raised = [int(n) for n in re.findall(r"warpgroup_reg_alloc<(\d+)>", src)]     # one per consumer warpgroup
    lowered_to = [int(n) for n in re.findall(r"warpgroup_reg_dealloc<(\d+)>", src)]   # the producer warpgroup
    assert threads == 384 and len(raised) == 2 and len(lowered_to) == 1
    assert sum(raised) + sum(lowered_to) <= 3 * per_thread, (raised, lowered_to, per_thread)


def test_both_warpgroups_load_q_in_16_byte_vectors(lowered):
    """Each consumer warpgroup loads its half of the quad's queries with 16-byte loads. Written as a
    T.Parallel with the half inside the index, the second warpgroup's became 2-byte loads: with
    the output's divisions (below) they took half of the kernel's time (H200, 2026-12-01)."""
    src, _ = lowered
    assert src.count("(uint4*)(Q + ") == 2


def test_the_output_divides_once_per_query_column(lowered):
    """The output multiplies by one reciprocal per column: a division per element compiles to an
    IEEE division call each (128 a thread)."""
    src, _ = lowered
    assert not re.search(r"\.[xy]/", src)                  # no element-wise division of acc_o pairs
    assert len(re.findall(r"/ l_i", src)) == 2             # 1 / l, once in each consumer warpgroup


def test_the_dequantizers_load_a_batch_of_chunks_before_converting(lowered):
    """The producer reads QUAD_LOAD_BATCH 16-byte FP8 chunks into its scratch before it converts
    and stores any: chunk by chunk, each shared load waited behind the previous chunk's stores
    (they may alias), 329.5 vs 318.9 us on `mini`'s prefill rows (H200, 2026-12-01)."""
    from deepinfer_kernels.tilelang.sparse_mla.quads import QUAD_LOAD_BATCH

    src, _ = lowered
    # the part's 4 scale bytes in one load after the batch's chunks, the chunks in a loop of 16-byte loads
    assert re.search(rf"\*\(uint\*\)\(qv \+ {16 * QUAD_LOAD_BATCH}\) = \*\(uint\*\)\(\(\(uchar\*\)K8\)", src)
    assert re.search(r"\*\(uint4\*\)\(qv \+ \(c\w* \* 16\)\) = \*\(uint4\*\)\(\(\(uchar\*\)K8\)", src)
