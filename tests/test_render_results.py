"""tools/render_results.py: the committed result rows render into the README's and docs' tables and
the plots; the committed tables are a fresh render; rows that break the format are refused."""

import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import render_results  # noqa: E402
from bench.rows import check_row, load_rows, row  # noqa: E402

DOCS = ("README.md", "docs/benchmarks.md")


def _copy_docs(root: Path) -> None:
    for rel in DOCS:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, root / rel)


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_committed_tables_equal_a_fresh_render(tmp_path):
    """The README's and docs/benchmarks.md's tables as committed are what the rows render to."""
    res = subprocess.run([sys.executable, str(ROOT / "tools" / "render_results.py"), "--check"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr


def test_render_writes_tables_and_plots_from_the_rows(tmp_path):
    pytest.importorskip("matplotlib")
    _copy_docs(tmp_path)
    for rel in DOCS:   # emptied tables are filled again
        text = (tmp_path / rel).read_text()
        for name in render_results.marker_names(text):
            text = render_results.fill(text, name, "")
        (tmp_path / rel).write_text(text)
    assert render_results.main(["--root", str(tmp_path)]) == 0

    rows = load_rows(ROOT / "docs" / "results")
    readme = (tmp_path / "README.md").read_text()
    headline = [r for r in rows if r.get("headline")]
    assert headline and all(r["what"] in readme and r["command"] in readme for r in headline)
    bench = (tmp_path / "docs" / "benchmarks.md").read_text()
    assert all(r["what"] in bench for r in rows)                 # every row is in its group's table
    peer = next(r for r in rows if r["what"] == "decode, preset:mini, batch 1")
    line = next(li for li in bench.splitlines() if li.startswith("| decode, preset:mini, batch 1<br>"))
    assert "993.5 tokens/s" in line and "HF transformers: 12.14" in line and f"**{peer['ratio']:.2f}x**" in line
    for rel in DOCS:   # the render equals the committed file, and rendering again changes nothing
        assert (tmp_path / rel).read_text() == (ROOT / rel).read_text()
    assert render_results.main(["--root", str(tmp_path), "--check"]) == 0

    pngs = sorted(p.name for p in (tmp_path / "docs" / "img").glob("*.png"))
    assert pngs == ["decode_vs_batch.png", "dspark_acceptance.png", "kernel_roofline.png", "prefill_vs_chunk.png"]
    for name in pngs:
        width, height = _png_size(tmp_path / "docs" / "img" / name)
        assert 300 <= width <= 1000 and 200 <= height <= 1000
        assert (ROOT / "docs" / "img" / name).exists()          # the committed plots the docs show
    assert "docs/img/decode_vs_batch.png" in readme


def test_check_reports_a_stale_table(tmp_path):
    _copy_docs(tmp_path)
    text = (tmp_path / "README.md").read_text()
    (tmp_path / "README.md").write_text(render_results.fill(text, "readme", "| stale |"))
    assert render_results.main(["--root", str(tmp_path), "--check"]) == 1


def test_time_ratios_read_lower_is_better():
    r = row("scheduler", "step", 0.17, "ms", baseline="python", baseline_value=6.8, device="CPU", command="c",
            date="2026-11-30")
    assert r["ratio"] == 0.025 and render_results.fmt_ratio(r) == "**40.00x** faster"
    slower = row("structured output", "step", 4.92, "ms", baseline="free", baseline_value=4.55, device="d",
                 command="c", date="2026-11-30")
    assert render_results.fmt_ratio(slower) == "+8.1% time"


@pytest.mark.parametrize("change", [
    {"group": "misc"},                                # not a capability group
    {"value": "fast"},                                # not a number
    {"ratio": None},                                  # a baseline without its ratio
    {"date": "yesterday"},
    {"series": "decode_vs_batch"},                    # a series point without x
    {"colour": "blue"},                               # a key outside the format
])
def test_malformed_rows_are_refused(change):
    good = row("decode", "decode, batch 1", 10.0, "tokens/s", baseline="peer", baseline_value=5.0, device="d",
               command="c", date="2026-12-02")
    assert check_row(dict(good)) == good
    with pytest.raises(ValueError):
        check_row({**good, **change})
