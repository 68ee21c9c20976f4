"""Render the measured results (docs/results/*.json, format in docs/results/README.md) into the
README's table, docs/benchmarks.md's per-capability tables and the plots in docs/img/.

    python tools/render_results.py            # rewrite the tables and plots in place (make results)
    python tools/render_results.py --check    # exit 1 if a committed table differs from a fresh render
    python tools/render_results.py --root DIR # render into DIR's README.md / docs/ instead

A table lives between two marker comments, `<!-- results:NAME:begin -->` and
`<!-- results:NAME:end -->` (NAME `readme` for the README's headline rows, else a row group such
as `decode`); everything outside the markers is left alone, so rendering twice changes nothing.
Plots: one PNG per series (`series` + `x` in the rows) that has a plotter below.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
from bench.rows import GROUPS, load_rows  # noqa: E402

TIME_UNITS = ("ms", "us", "s")


def fmt_value(v: float) -> str:
    return f"{int(v):,}" if float(v).is_integer() else f"{v:,}"


def fmt_ratio(row: dict) -> str:
    r = row["ratio"]
    if r is None:
        return ""
    if row["unit"] in TIME_UNITS:   # lower is better
        speedup = row["baseline_value"] / row["value"]
        return f"**{speedup:.2f}x** faster" if speedup >= 1 else f"+{100 * (r - 1):.1f}% time"
    return f"**{r:.2f}x**"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def table(rows: list[dict], with_command: bool = True) -> str:
    head = ["what", "ours", "baseline (same run)", "ratio", "card, date"] + (["command"] if with_command else [])
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join(["---"] * len(head)) + " |"]
    for r in rows:
        what = r["what"] + (f"<br><sub>{r['note']}</sub>" if r.get("note") else "")
        base = "" if r["baseline_value"] is None else f"{r['baseline']}: {fmt_value(r['baseline_value'])}"
        cells = [what, f"{fmt_value(r['value'])} {r['unit']}", base, fmt_ratio(r), f"{r['device']}, {r['date']}"]
        if with_command:
            cells.append(f"`{r['command']}`")
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines)


def tables(rows: list[dict]) -> dict[str, str]:
    """Marker name -> table: `readme` (the headline rows) and one per row group that has rows."""
    headline = sorted((r for r in rows if r.get("headline")), key=lambda r: GROUPS.index(r["group"]))
    out = {"readme": table(headline)}
    for group in GROUPS:
        grows = [r for r in rows if r["group"] == group]
        if grows:
            out[group.replace(" ", "-")] = table(grows)
    return out


def fill(text: str, name: str, body: str) -> str:
    """`text` with what lies between NAME's begin and end markers replaced by `body`."""
    begin, end = f"<!-- results:{name}:begin -->", f"<!-- results:{name}:end -->"
    pat = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
    if not pat.search(text):
        raise ValueError(f"markers {begin} ... {end} not found")
    return pat.sub(lambda _: f"{begin}\n{body}\n{end}", text, count=1)


def marker_names(text: str) -> list[str]:
    return re.findall(r"<!-- results:([\w-]+):begin -->", text)


def render_text(text: str, rendered: dict[str, str]) -> str:
    for name in marker_names(text):
        if name not in rendered:
            raise ValueError(f"markers for {name!r}: no rows of that group")
        text = fill(text, name, rendered[name])
    return text


# --- plots -------------------------------------------------------------------------------------

def _series(rows: list[dict], name: str) -> list[dict]:
    return sorted((r for r in rows if r.get("series") == name), key=lambda r: r["x"])


def _subtitle(points: list[dict]) -> str:
    devices = sorted({p["device"] for p in points})
    dates = sorted({p["date"] for p in points})
    return f"{', '.join(devices)}; {dates[0]}" + (f" .. {dates[-1]}" if len(dates) > 1 else "")


def plot_decode_vs_batch(plt, points: list[dict]):
    fig, ax = plt.subplots(figsize=(6, 3.6))
    xs = list(range(len(points)))
    ours = [p["value"] for p in points]
    peer = [p["baseline_value"] or 0 for p in points]
    ax.bar([x - 0.2 for x in xs], ours, 0.4, label="DeepInfer", color="#1f77b4")
    ax.bar([x + 0.2 for x in xs], peer, 0.4, label=points[0]["baseline"] or "baseline", color="#aaaaaa")
    for x, p in zip(xs, points):
        ax.annotate(f"{fmt_value(p['value'])}" + (f"\n{p['ratio']:.1f}x" if p["ratio"] else ""),
                    (x - 0.2, p["value"]), ha="center", va="bottom", fontsize=8)
    ax.set_yscale("log")
    ax.set_xticks(xs, [f"batch {p['x']}" for p in points])
    ax.set_ylabel("decode tokens/s (log)")
    ax.set_ylim(top=max(ours) * 8)
    model = points[0]["what"].split(",")[1].strip()
    ax.set_title(f"Decode, {model}, beside the peer measured in the same run\n{_subtitle(points)}", fontsize=9)
    ax.legend(fontsize=8, loc="upper left")
    return fig


def plot_prefill_vs_chunk(plt, points: list[dict]):
    fig, ax = plt.subplots(figsize=(6, 3.6))
    labels = sorted({p.get("label", "") for p in points})
    chunks = sorted({p["x"] for p in points})
    width = 0.8 / (len(labels) + 1)
    for i, label in enumerate(labels):
        for j, chunk in enumerate(chunks):
            p = next((p for p in points if p["x"] == chunk and p.get("label", "") == label), None)
            if p is None:
                continue
            x = j + (i - len(labels) / 2) * width
            ax.bar(x, p["value"] / 1e3, width, color=f"C{i}", label=label if j == 0 else None)
            if p["ratio"]:
                ax.annotate(f"{p['ratio']:.2f}x", (x, p["value"] / 1e3), ha="center", va="bottom", fontsize=8)
    for j, chunk in enumerate(chunks):
        base = next((p["baseline_value"] for p in points if p["x"] == chunk and p["baseline_value"]), None)
        if base:
            ax.bar(j + len(labels) / 2 * width, base / 1e3, width, color="#aaaaaa",
                   label=points[0]["baseline"] if j == 0 else None)
    ax.set_xticks(range(len(chunks)), [f"chunk {c:,} rows" for c in chunks])
    ax.set_ylabel("prefill K tokens/s")
    ax.set_title(f"Prefill by chunk size (only the chunks measured are shown)\n{_subtitle(points)}", fontsize=9)
    ax.legend(fontsize=8, loc="upper left")
    ax.set_ylim(top=max(p["value"] for p in points) / 1e3 * 1.3)
    return fig


def plot_kernel_roofline(plt, points: list[dict]):
    fig, ax = plt.subplots(figsize=(6, 0.28 * len(points) + 1.2))
    ys = list(range(len(points)))[::-1]
    ax.barh(ys, [p["value"] for p in points], color=["C0" if "sparse" in p["label"] else "C2" for p in points])
    for y, p in zip(ys, points):
        ax.annotate(f"{p['value']:.1f}%", (p["value"], y), va="center", fontsize=7, xytext=(2, 0),
                    textcoords="offset points")
    ax.set_yticks(ys, [p["label"] for p in points], fontsize=7)
    ax.axvline(100, color="#888888", lw=0.8)
    ax.set_xlim(0, 110)
    ax.set_xlabel("bytes the kernel must read / time, % of copy bandwidth")
    ax.set_title(f"TileLang kernels at decode sizes, % of copy bandwidth\n{_subtitle(points)}", fontsize=9)
    return fig


def plot_dspark_acceptance(plt, points: list[dict]):
    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.bar([p["x"] for p in points], [p["value"] for p in points], color="C1")
    for p in points:
        ax.annotate(f"{p['value']:.2f}", (p["x"], p["value"]), ha="center", va="bottom", fontsize=8)
    ax.set_xticks([p["x"] for p in points])
    ax.set_xlabel("draft position")
    ax.set_ylabel("accepted (prefix rate)")
    ax.set_ylim(0, 1)
    ax.set_title(f"DSpark drafts accepted by position, default model\n{_subtitle(points)}", fontsize=9)
    return fig


PLOTS = {"decode_vs_batch": plot_decode_vs_batch, "prefill_vs_chunk": plot_prefill_vs_chunk,
         "kernel_roofline": plot_kernel_roofline, "dspark_acceptance": plot_dspark_acceptance}


def render_plots(rows: list[dict], img_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    img_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, plotter in PLOTS.items():
        points = _series(rows, name)
        if not points:
            continue
        fig = plotter(plt, points)
        fig.tight_layout()
        path = img_dir / f"{name}.png"
        fig.savefig(path, dpi=100, metadata={"Software": None})   # no version stamp: same rows, same bytes
        plt.close(fig)
        written.append(path)
    return written


DOCS = ("README.md", "docs/benchmarks.md")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", type=Path, default=ROOT / "docs" / "results")
    ap.add_argument("--root", type=Path, default=ROOT, help="where README.md and docs/ are (read and written)")
    ap.add_argument("--check", action="store_true", help="compare the tables only; write nothing")
    args = ap.parse_args(argv)
    rows = load_rows(args.results)
    rendered = tables(rows)
    stale = []
    for rel in DOCS:
        path = args.root / rel
        old = path.read_text()
        new = render_text(old, rendered)
        if new != old:
            stale.append(rel)
            if not args.check:
                path.write_text(new)
    if args.check:
        for rel in stale:
            print(f"{rel}: tables differ from docs/results (run python tools/render_results.py)")
        return 1 if stale else 0
    for path in render_plots(rows, args.root / "docs" / "img"):
        print(f"wrote {path}")
    for rel in stale:
        print(f"updated {rel}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
