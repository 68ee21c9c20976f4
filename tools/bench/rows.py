"""Result rows: the one format every measuring tool writes and tools/render_results.py reads
(docs/results/README.md describes it).

A row is one figure beside the baseline measured in the same run:

    {"group": "decode", "what": "decode, preset:mini, batch 1", "value": 993.5, "unit": "tokens/s",
     "baseline": "HF transformers", "baseline_value": 12.14, "ratio": 81.8, "device": "NVIDIA H200",
     "date": "2026-12-02", "command": "python tools/benchmark.py ...",
     "series": "decode_vs_batch", "x": 1}          # optional: a point of a plot

`baseline`, `baseline_value` and `ratio` are null where a figure has nothing beside it. Optional
keys: `series` + `x` (a point of a plotted series; `label` names the point's bar or line),
`headline` (true: the row is in the README's table), `note` (one short qualifier).
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path

REQUIRED = ("group", "what", "value", "unit", "baseline", "baseline_value", "ratio", "device", "date", "command")
OPTIONAL = ("series", "x", "label", "headline", "note")
GROUPS = ("decode", "prefill", "speculation", "structured output", "kernels", "scheduler", "default model",
          "server", "chat")


def check_row(row: dict) -> dict:
    """`row` unchanged if it is a well-formed result row, else ValueError naming what is wrong."""
    missing = [k for k in REQUIRED if k not in row]
    unknown = [k for k in row if k not in REQUIRED + OPTIONAL]
    if missing or unknown:
        raise ValueError(f"result row {row.get('what')!r}: missing {missing}, unknown {unknown}")
    if row["group"] not in GROUPS:
        raise ValueError(f"result row {row['what']!r}: group {row['group']!r} not one of {GROUPS}")
    if not isinstance(row["value"], (int, float)):
        raise ValueError(f"result row {row['what']!r}: value {row['value']!r} is not a number")
    if (row["baseline_value"] is None) != (row["ratio"] is None):
        raise ValueError(f"result row {row['what']!r}: a ratio needs its baseline_value and back")
    datetime.date.fromisoformat(row["date"])
    if ("series" in row) != ("x" in row):
        raise ValueError(f"result row {row['what']!r}: a series point needs both series and x")
    return row


def load_rows(results_dir: Path) -> list[dict]:
    """Every row of every docs/results/*.json file (each a JSON list of rows), in file order."""
    rows = []
    for path in sorted(Path(results_dir).glob("*.json")):
        for row in json.loads(path.read_text()):
            rows.append(check_row(row))
    return rows


def write_rows(path: Path, rows: list[dict]) -> None:
    """Append `rows` to the JSON list at `path` (created if missing), one row a line."""
    path = Path(path)
    old = json.loads(path.read_text()) if path.exists() else []
    rows = old + [check_row(r) for r in rows]
    path.write_text("[\n" + ",\n".join(json.dumps(r) for r in rows) + "\n]\n")


def row(group: str, what: str, value: float, unit: str, *, device: str, command: str,
        baseline: str | None = None, baseline_value: float | None = None, date: str | None = None,
        **optional) -> dict:
    ratio = None if baseline_value in (None, 0) else round(value / baseline_value, 3)
    out = dict(group=group, what=what, value=value, unit=unit, baseline=baseline if ratio is not None else None,
               baseline_value=baseline_value if ratio is not None else None, ratio=ratio, device=device,
               date=date or datetime.datetime.now(datetime.timezone.utc).date().isoformat(), command=command)
    out.update({k: v for k, v in optional.items() if v is not None and v is not False})
    return check_row(out)


def _decode_what(m: dict) -> str:
    parts = [f"decode, {m['model']}, batch {m['batch']}"]
    if m.get("nextn"):
        parts.append(f"nextn {m['nextn']}" + (" variable-length" if m.get("varlen") else ""))
    for key, text in (("grammar", "JSON-schema masks"), ("batch_invariant", "batch-invariant"),
                      ("compiled_speculation", "compile_speculation")):
        if m.get(key):
            parts.append(text)
    if m.get("zos") is False:
        parts.append("ZOS off")
    if m.get("decode_streams") is False:
        parts.append("one stream")
    return ", ".join(parts)


def _is_plain(m: dict) -> bool:
    return not (m.get("grammar") or m.get("batch_invariant") or m.get("compiled_speculation")
                or m.get("zos") is False or m.get("decode_streams") is False)


def result_rows(measurements: list[dict], *, command: str, device: str) -> list[dict]:
    """tools/benchmark.py's measurement rows (--result-jsonl) as result rows, each beside the
    baseline of the same run: decode and prefill beside the HF peer when it ran (--peer), a
    speculative row beside nextn 0 at the same batch, a compared variant (ZOS off, grammar masks,
    batch invariance, compiled speculation, one stream) beside the plain row it varies."""
    ours = [m for m in measurements if m.get("engine") == "deepinfer"]
    peer = {(m["kind"], m["batch"]): m for m in measurements if m.get("engine") == "hf-transformers"}
    plain = {(m["batch"], m["nextn"], m["varlen"]): m for m in ours if m["kind"] == "decode" and _is_plain(m)}
    out = []
    for m in ours:
        kw = dict(device=device, command=command)
        if m["kind"] == "decode":
            base_name = base_value = None
            if not _is_plain(m):
                base = plain.get((m["batch"], m["nextn"], m["varlen"]))
                base_name = "the same decode without it"
            elif m["nextn"]:
                base = plain.get((m["batch"], 0, False))
                base_name = "nextn 0"
            else:
                base = peer.get(("decode", m["batch"]))
                base_name = "HF transformers"
                kw.update(series="decode_vs_batch", x=m["batch"])
            if base is not None:
                base_value = round(base["tokens_per_s_real"], 1)
            group = "structured output" if m.get("grammar") else "speculation" if m["nextn"] else "decode"
            out.append(row(group, _decode_what(m), round(m["tokens_per_s_real"], 1), "tokens/s",
                           baseline=base_name, baseline_value=base_value, **kw))
            if "weight_read_fraction_of_copy" in m:   # batch 1, nextn 0 on CUDA: the decode roofline
                out.append(row("decode", f"{_decode_what(m)}: weight bytes per step / step time",
                               round(100 * m["weight_read_fraction_of_copy"], 2), "% of copy",
                               device=device, command=command))
        elif m["kind"] == "prefill":
            base = peer.get(("prefill", m["batch"]))
            what = (f"prefill, {m['model']}, {m['batch']} x {m['prompt_len']}, chunks of {m['chunk_tokens']}"
                    + (", pipelined" if m.get("pipelined") else ""))
            out.append(row("prefill", what, round(m["tokens_per_s"], 1), "tokens/s", baseline="HF transformers",
                           baseline_value=None if base is None else round(base["tokens_per_s"], 1),
                           series="prefill_vs_chunk", x=m["chunk_tokens"],
                           label="pipelined" if m.get("pipelined") else "one step at a time", **kw))
    return out
