"""tools/sparse_mla_quads_diag.py: every variant still finds the code it compiles out (the kernel's
source moves on; a substitution that no longer applies must fail, not time the base kernel)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

import sparse_mla_quads_diag as diag  # noqa: E402


@pytest.mark.parametrize("name", sorted(diag.VARIANTS))
def test_each_variant_changes_the_source_it_names(name):
    src = diag.variant_source(name)
    compile(src, f"{name}.py", "exec")                      # still Python
    assert (src == diag.SOURCE.read_text()) == (not diag.VARIANTS[name][0])


@pytest.mark.parametrize("name", sorted(diag.VARIANTS))
def test_each_variant_builds_a_prim_func(name):
    pytest.importorskip("tilelang")
    func = diag.variant_prim_func(name)     # the step that failed on the H200 with a NameError
    assert "Pool" in {b.name for b in func.buffer_map.values()}


def test_a_stale_substitution_fails_loudly(monkeypatch):
    monkeypatch.setitem(diag.VARIANTS, "stale", ([("T.gemm(no such call)", "pass")], {}))
    with pytest.raises(ValueError, match="stale"):
        diag.variant_source("stale")
