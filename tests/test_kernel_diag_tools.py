"""tools/sparse_mla_quads_diag.py and tools/sparse_mla_decode_diag.py: every variant still finds the
code it compiles out (the kernels' source moves on; a substitution that no longer applies must
fail, not time the base kernel), and builds its TileLang prim_func where TileLang is installed."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

import kernel_variants  # noqa: E402
import sparse_mla_decode_diag  # noqa: E402
import sparse_mla_quads_diag  # noqa: E402

TOOLS = {"quads": sparse_mla_quads_diag, "decode": sparse_mla_decode_diag}
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
    """The decode variants edit the consumer (sparse_mla_builders) that sparse_mla_bulk imports:
    the loaded bulk module must see the edited builders, and the real module stays in place."""
    import deepinfer_kernels.tilelang.sparse_mla_builders as real

    bulk = kernel_variants.load_variant(sparse_mla_decode_diag.edits("no_pv"), "no_pv_probe")
    consumer_source = Path(bulk._staged_consumer_macro.__globals__["__file__"])
    assert consumer_source.name == "sparse_mla_builders_no_pv_probe.py"
    assert sparse_mla_decode_diag.PV not in consumer_source.read_text()
    assert sparse_mla_decode_diag.PV in Path(real.__file__).read_text()
    assert sys.modules["deepinfer_kernels.tilelang.sparse_mla_builders"] is real


def test_a_stale_substitution_fails_loudly():
    edit = kernel_variants.ModuleEdit("sparse_mla_quads", (("T.gemm(no such call)", "pass"),))
    with pytest.raises(ValueError, match="stale"):
        kernel_variants.edited_source(edit, "stale")
