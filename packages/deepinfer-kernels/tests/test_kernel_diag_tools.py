"""diag/sparse_mla_quads_diag.py, diag/sparse_mla_decode_diag.py and diag/sparse_mla_mma_diag.py:
every variant still finds the code it compiles out (the kernels' source moves on; a substitution
that no longer applies must fail, not time the base kernel), and builds its TileLang prim_func where
TileLang is installed. diag/sparse_mla_decode_timeline.py: its marks land where it says and its
phase arithmetic."""

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "diag"))

import kernel_variants  # noqa: E402
import sparse_mla_decode_diag  # noqa: E402
import sparse_mla_decode_timeline  # noqa: E402
import sparse_mla_mma_ab  # noqa: E402
import sparse_mla_mma_diag  # noqa: E402
import sparse_mla_quads_diag  # noqa: E402

TOOLS = {"quads": sparse_mla_quads_diag, "decode": sparse_mla_decode_diag, "mma": sparse_mla_mma_diag}
CASES = [(tool, name) for tool, module in TOOLS.items() for name in sorted(module.VARIANTS)]


@pytest.mark.parametrize(("tool", "name"), CASES)
def test_each_variant_changes_the_source_it_names(tool, name):
    for edit in TOOLS[tool].edits(name):
        src = kernel_variants.edited_source(edit, name)
        compile(src, f"{edit.name}.py", "exec")                     # still Python
        assert (src == edit.path.read_text()) == (not edit.substitutions)


@pytest.mark.parametrize(("tool", "name"), CASES)
def test_each_variant_builds_a_prim_func(tool, name):
    pytest.importorskip("tilelang")
    func = TOOLS[tool].variant_prim_func(name)    # the step that failed on the H200 with a NameError
    assert "Pool" in {b.name for b in func.buffer_map.values()}


def test_a_variant_of_two_modules_builds_on_the_edited_first_one():
    """The decode variants edit the consumer (sparse_mla/common.py) that sparse_mla/bulk.py imports:
    the loaded bulk module must see the edited consumer, and the real module stays in place."""
    import deepinfer_kernels.tilelang.sparse_mla.common as real

    bulk = kernel_variants.load_variant(sparse_mla_decode_diag.edits("no_pv"), "no_pv_probe")
    consumer_source = Path(bulk._staged_consumer_macro.__globals__["__file__"])
    assert consumer_source.name == "sparse_mla_common_no_pv_probe.py"
    assert sparse_mla_decode_diag.PV not in consumer_source.read_text()
    assert sparse_mla_decode_diag.PV in Path(real.__file__).read_text()
    assert sys.modules["deepinfer_kernels.tilelang.sparse_mla.common"] is real


def test_a_stale_substitution_fails_loudly():
    edit = kernel_variants.ModuleEdit("sparse_mla.quads", (("T.gemm(no such call)", "pass"),))
    with pytest.raises(ValueError, match="stale"):
        kernel_variants.edited_source(edit, "stale")


def test_timeline_marks_every_event_once_per_role():
    consumer, producer = sparse_mla_decode_timeline._consumer_edit(), sparse_mla_decode_timeline._producer_edit()
    consumer_src = kernel_variants.edited_source(consumer, "timeline")
    producer_src = kernel_variants.edited_source(producer, "timeline")
    ev = sparse_mla_decode_timeline.EV
    for name in ("c_ready", "c_qk", "c_softmax", "c_pv"):
        assert consumer_src.count(f"({ev[name]}) * {sparse_mla_decode_timeline.MAX_BLOCKS}") == 1, name
    blocks = sparse_mla_decode_timeline.MAX_BLOCKS
    for name in ("p0_fp8", "p0_kb", "p0_done"):         # each producer warpgroup's thread 0: its own events
        assert producer_src.count(f"({ev[name]} + 3 * (tp // 128)) * {blocks}") == 1, name
    for name in ("i_free", "i_issued"):
        assert producer_src.count(f"({ev[name]}) * {blocks}") == 1, name
    compile(consumer_src, "c.py", "exec")
    compile(producer_src, "p.py", "exec")


def test_timeline_phases_from_synthetic_marks():
    """Blocks every 1,000 cycles; each step a known number of cycles after the block start."""
    import torch

    tl = sparse_mla_decode_timeline
    nblk = 12
    start = torch.arange(nblk, dtype=torch.int64) * 1000
    offsets = {"c_ready": 100, "c_qk": 300, "c_softmax": 700, "c_pv": 900, "p0_fp8": 0, "p0_kb": 50,
               "p0_done": 650, "p1_fp8": 0, "p1_kb": 60, "p1_done": 660, "i_free": 670, "i_issued": 690}
    marks = torch.zeros(2, len(tl.EVENTS), tl.MAX_BLOCKS, dtype=torch.int64)
    for name, off in offsets.items():
        marks[:, tl.EV[name], :nblk] = start + off
    got = tl.phases(marks, nblk)
    assert got["period (consumer, block to block)"] == 1000
    assert got["consumer QK"] == 200 and got["consumer softmax"] == 400
    assert got["consumer waits for its stage"] == 200          # 100 into this block - 900 into the last
    assert got["producer 0 dequantizes"] == 600 and got["producer 1 waits for bf16 stage"] == 60
    assert got["issuer waits for both producers"] == 20 and got["issuing the copies"] == 20
    assert got["copy: issued -> producer 0 sees the stage"] == 2000 - 690


def test_timeline_prim_func_builds():
    pytest.importorskip("tilelang")
    func = sparse_mla_decode_timeline.prim_func("idle_producers")
    assert "Opart" in {b.name for b in func.buffer_map.values()}


def test_mma_timeline_phases():
    """The warp-MMA kernel's marks (built into ``_cuda_mma``): per block, two halves of four steps."""
    import torch

    tl = sparse_mla_decode_timeline
    nblk = 16
    start = torch.arange(nblk, dtype=torch.int64) * 3000
    offsets = dict(zip(tl.MMA_EVENTS, (0, 0, 1000, 1040, 1400, 1500, 2500, 2540, 2900, -2500, -100)))
    marks = torch.zeros(1, len(tl.MMA_EVENTS), tl.MAX_BLOCKS, dtype=torch.int64)
    for name, off in offsets.items():
        marks[:, tl.MMA_EV[name], :nblk] = start + off
    got = tl.mma_phases(marks, nblk)
    assert next(iter(got.values())) == 3000
    assert got["half 1 starts: next block's stage waited for"] == 100
    assert got["half 0: reduce + softmax + next half's QK"] == 1000 and got["half 1: barrier (P complete)"] == 40
    assert got["half 1: PV (rescale, 16 mma)"] == 360
    assert got["prep warp: tables of a block"] == 2400 and got["prep ends -> its block starts"] == 100


def test_mma_ab_build_specs():
    assert sparse_mla_mma_ab.parse_build("bulk") == ("bulk", {}, None)
    assert sparse_mla_mma_ab.parse_build("mma") == ("mma", {}, None)
    assert sparse_mla_mma_ab.parse_build("mma:lazy_rescale=0;hw_cvt=1") == ("mma", {"lazy_rescale": 0, "hw_cvt": 1}, None)
    assert sparse_mla_mma_ab.parse_build("mma@d93b62c:hw_cvt=0") == ("mma", {"hw_cvt": 0}, "d93b62c")
    assert sparse_mla_mma_ab.parse_build("mma@HEAD~2") == ("mma", {}, "HEAD~2")
    for bad in ("regs", "bulk:hw_cvt=0", "mma:lazy_rescale", "mma:hw_cvt=yes", "bulk@HEAD", "mma@a;b"):
        with pytest.raises(ValueError, match="build"):
            sparse_mla_mma_ab.parse_build(bad)


def test_mma_ab_loads_a_revisions_kernel_sources():
    """``mma@REV`` builds from the revision's three kernel files, wired to each other: at HEAD of a
    clean checkout its CUDA source is the package's."""
    root = Path(__file__).resolve().parents[3]          # the repository
    status = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--", sparse_mla_mma_ab.KERNEL_DIR],
                            capture_output=True, text=True)
    if status.returncode != 0 or status.stdout.strip():
        pytest.skip("needs a git checkout with the kernel files as committed")
    from deepinfer_kernels.tilelang import _cuda_mma, _cuda_warp

    build = sparse_mla_mma_ab.load_revision_builder("HEAD", root)
    module = sys.modules[build.__module__]
    assert build.__name__ == "_build_mma" and module.__name__ == "sparse_mla_mma_HEAD"
    assert module.MMA_SRC == _cuda_mma.MMA_SRC and module.WARP_SRC == _cuda_warp.WARP_SRC
    assert sys.modules["_cuda_mma_HEAD"].__file__ != _cuda_mma.__file__
