"""The command line every diag script starts from: which model, how many requests, how many drafts."""

from __future__ import annotations

import argparse


def model_run_parser(doc: str | None, *, model: str = "preset:mini", batch: int = 1, nextn: int = 0
                     ) -> argparse.ArgumentParser:
    """A parser with ``--model``, ``--batch`` and ``--nextn`` (the defaults given); ``doc`` is the
    script's docstring, shown as its description."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=model, help="'default' or preset:<name> or a checkpoint dir")
    ap.add_argument("--batch", type=int, default=batch)
    ap.add_argument("--nextn", type=int, default=nextn)
    return ap
