"""Regenerate the decode-PPL baseline of the shipped default model for one platform.

    python tools/default_model/refresh_ppl_baseline.py                 # CPU -> default/ppl_baseline_cpu.json
    python tools/default_model/refresh_ppl_baseline.py --device cuda   # GPU -> default/ppl_baseline_cuda.json
    python tools/default_model/refresh_ppl_baseline.py --check         # compare with the stored baseline, write nothing

Prompts, token count and tolerance: tools/default_model/baseline.py. Refresh only after a deliberate
change of the model or of the numerics (and say so in the commit); the test
tests/test_default_model_ppl.py compares every CPU run with ppl_baseline_cpu.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # tools/: the default_model package

from default_model import baseline  # noqa: E402

DEFAULT_DIR = Path(__file__).resolve().parents[2] / "packages/deepinfer-model/src/deepinfer_model/default"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=DEFAULT_DIR)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    if not (args.model / "config.json").is_file():
        print(f"{args.model}: no checkpoint (config.json missing)", file=sys.stderr)
        return 2
    kind = "cuda" if args.device.startswith("cuda") else "cpu"
    if args.check:
        stored = json.loads((args.model / f"ppl_baseline_{kind}.json").read_text())
        ok, msg = baseline.compare(baseline.decode_ppl(args.model, args.device), stored)
        print(("OK: " if ok else "REGRESSION: ") + msg)
        return 0 if ok else 1
    path = baseline.write_baseline(args.model, args.device)
    res = json.loads(path.read_text())
    print(f"wrote {path}: decode PPL {res['decode_ppl']:.4f} over {res['tokens']} tokens ({res['seconds']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
