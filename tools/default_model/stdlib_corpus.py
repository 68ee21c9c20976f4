"""The training corpus of the default model: the `.py` files of the running Python's standard library.

Files are split into train and held-out sets *by top-level module* (a package and all its
submodules land on the same side), using a stable hash of the module name so the split does not
depend on file order, machine or Python build. Test suites (`test/`, `tests/`, `idle_test/`),
`site-packages` and generated tables are excluded.
"""

from __future__ import annotations

import hashlib
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

HELD_OUT_PERCENT = 5  # of top-level modules
EXCLUDED_DIRS = {"site-packages", "test", "tests", "idle_test", "__pycache__", "lib2to3", "turtledemo"}
MAX_FILE_BYTES = 400_000  # skip generated tables (e.g. big unicode/encoding maps)


@dataclass(frozen=True)
class CorpusFile:
    path: Path
    module: str  # top-level module name the split is keyed on

    def read(self) -> str:
        return self.path.read_text(encoding="utf-8", errors="replace")


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def is_held_out(module: str) -> bool:
    digest = hashlib.sha256(module.encode()).digest()
    return int.from_bytes(digest[:4], "little") % 100 < HELD_OUT_PERCENT


def corpus_files(root: Path | None = None) -> list[CorpusFile]:
    root = root or stdlib_root()
    files = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if any(part in EXCLUDED_DIRS for part in rel.parts[:-1]):
            continue
        if path.stat().st_size > MAX_FILE_BYTES or path.name.startswith("_pydecimal"):
            continue
        files.append(CorpusFile(path, rel.parts[0].removesuffix(".py")))
    return files


def split(files: list[CorpusFile]) -> tuple[list[CorpusFile], list[CorpusFile]]:
    train = [f for f in files if not is_held_out(f.module)]
    held_out = [f for f in files if is_held_out(f.module)]
    return train, held_out


if __name__ == "__main__":
    train, held_out = split(corpus_files())
    size = lambda fs: sum(f.path.stat().st_size for f in fs)  # noqa: E731
    print(f"python {sys.version.split()[0]} stdlib at {stdlib_root()}")
    print(f"train: {len(train)} files, {size(train) / 1e6:.1f} MB")
    print(f"held-out: {len(held_out)} files, {size(held_out) / 1e6:.1f} MB, modules: "
          + ", ".join(sorted({f.module for f in held_out})))
