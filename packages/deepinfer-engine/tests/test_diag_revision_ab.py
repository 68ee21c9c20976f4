"""diag/revision_ab.py: a script run against another revision's install imports every package from
there (in child processes too); greedy files compare equal only when every token is."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

TOOL = Path(__file__).resolve().parents[1] / "diag" / "revision_ab.py"
PACKAGES = ("deepinfer_engine", "deepinfer_sched", "deepinfer_kernels", "deepinfer_model")


def test_run_imports_every_package_from_the_site_here_and_in_children(tmp_path):
    site = tmp_path / "site"
    for name in PACKAGES:
        (site / name).mkdir(parents=True)
        (site / name / "__init__.py").write_text("")
    script = tmp_path / "where.py"
    script.write_text(textwrap.dedent(f"""
        import importlib, json, subprocess, sys
        names = {PACKAGES!r}
        here = [importlib.import_module(n).__file__ for n in names]
        code = "import importlib, json; print(json.dumps([importlib.import_module(n).__file__ for n in %r]))" % (names,)
        child = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
        print(json.dumps({{"args": sys.argv[1:], "here": here, "child": child}}))
    """))
    out = subprocess.run([sys.executable, str(TOOL), "run", "--site", str(site), "--", str(script), "--x", "1"],
                         capture_output=True, text=True, check=True).stdout
    got = json.loads(out.strip().splitlines()[-1])
    assert got["args"] == ["--x", "1"]
    for path in got["here"] + got["child"]:
        assert Path(path).is_relative_to(site), path


def test_compare_is_exact(tmp_path):
    a, b, c = (tmp_path / f"{n}.json" for n in "abc")
    a.write_text(json.dumps([[1, 2, 3], [4, 5]]))
    b.write_text(json.dumps([[1, 2, 3], [4, 5]]))
    c.write_text(json.dumps([[1, 2, 3], [4, 6]]))
    same = subprocess.run([sys.executable, str(TOOL), "compare", str(a), str(b)], capture_output=True, text=True)
    assert same.returncode == 0 and "identical" in same.stdout
    differ = subprocess.run([sys.executable, str(TOOL), "compare", str(a), str(c)], capture_output=True, text=True)
    assert differ.returncode == 1 and "DIFFER" in differ.stdout and "[1]" in differ.stdout


def test_greedy_writes_each_prompts_tokens_on_the_cpu(tmp_path):
    out = tmp_path / "greedy.json"
    subprocess.run([sys.executable, str(TOOL), "greedy", str(out), "--device", "cpu", "--num-prompts", "2",
                    "--max-tokens", "4"], check=True, capture_output=True)
    ids = json.loads(out.read_text())
    assert [len(x) for x in ids] == [4, 4] and all(isinstance(t, int) for x in ids for t in x)
