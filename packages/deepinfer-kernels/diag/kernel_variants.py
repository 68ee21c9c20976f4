"""Builder variants for the kernel diagnostics (``sparse_mla_quads_diag.py``,
``sparse_mla_decode_diag.py``): a TileLang builder module re-executed from its source with text
substitutions (a part of the kernel compiled out), never merged. A substitution that no longer
finds its text fails loudly instead of timing the unchanged kernel.
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing as mp
import re
import sys
import time
import types
from dataclasses import dataclass
from pathlib import Path

TILELANG_DIR = Path(__file__).resolve().parents[1] / "src/deepinfer_kernels/tilelang"
Substitution = tuple["str | re.Pattern[str]", str]


@dataclass(frozen=True)
class ModuleEdit:
    """Substitutions of one module of ``deepinfer_kernels.tilelang`` (``name``: e.g. "sparse_mla.bulk")."""

    name: str
    substitutions: tuple[Substitution, ...] = ()

    @property
    def path(self) -> Path:
        return TILELANG_DIR / f"{self.name.replace('.', '/')}.py"


def edited_source(edit: ModuleEdit, label: str) -> str:
    """The module's source with ``edit``'s substitutions; ValueError naming ``label`` when one no
    longer applies."""
    src = edit.path.read_text()
    for old, new in edit.substitutions:
        if isinstance(old, re.Pattern):
            src, n = old.subn(new, src)
        else:
            n = src.count(old)
            src = src.replace(old, new)
        if n == 0:
            raise ValueError(f"variant {label}: {old!r} is no longer in {edit.path.name}")
    return src


@contextlib.contextmanager
def _standing_in(full_name: str, module: types.ModuleType):
    """``module`` as ``sys.modules[full_name]`` while the next module's imports run."""
    saved = sys.modules.get(full_name)
    sys.modules[full_name] = module
    try:
        yield
    finally:
        if saved is None:
            del sys.modules[full_name]
        else:
            sys.modules[full_name] = saved


def load_variant(edits: list[ModuleEdit], label: str) -> types.ModuleType:
    """Execute each edited module in order (a later one imports the earlier ones' edited versions)
    and return the last. Each source is written under /tmp (TileLang reads it for its errors) and
    compiled with ``dont_inherit=True``: this file's ``from __future__ import annotations`` would
    postpone the builders' annotations, which TileLang evaluates against the builders' locals."""
    with contextlib.ExitStack() as stack:
        module = None
        for edit in edits:
            stem = f"{edit.name.replace('.', '_')}_{label}"
            path = Path(f"/tmp/{stem}.py")
            path.write_text(edited_source(edit, label))
            module = types.ModuleType(stem)
            module.__file__ = str(path)
            exec(compile(path.read_text(), str(path), "exec", dont_inherit=True), module.__dict__)  # noqa: S102 (our source)
            stack.enter_context(_standing_in(f"deepinfer_kernels.tilelang.{edit.name}", module))
        assert module is not None, "no module to load"
        return module


def median_us(fn, runs: int = 20) -> float:
    """Median device time of ``fn()`` in microseconds (CUDA events, after 3 warm-up calls)."""
    from deepinfer_kernels.tilelang.timing import cuda_time_us

    return cuda_time_us(fn, reps=runs, warmup=3, flush_l2=False)["median_us"]


def compile_variant(prim_func):
    """A variant's prim_func compiled for the device the way the launchers compile these kernels
    (their own syncs: ``NO_AUTO_SYNC``)."""
    import tilelang

    from deepinfer_kernels.tilelang._common import TARGET
    from deepinfer_kernels.tilelang.sparse_mla.common import NO_AUTO_SYNC

    return tilelang.compile(prim_func, target=TARGET, pass_configs=NO_AUTO_SYNC)


def _timed_build(build, name: str) -> tuple[str, float | None, str | None]:
    start = time.perf_counter()
    try:
        build(name)
    except Exception as e:  # noqa: BLE001 (reported, the other variants go on)
        return name, None, repr(e)[:300]
    return name, round(time.perf_counter() - start, 1), None


def compile_in_workers(build, names: list[str]) -> None:
    """``build(name)`` for every variant in spawned worker processes, in parallel: fills TileLang's
    disk cache for the timing process. Prints each variant's compile seconds or its error."""
    with mp.get_context("spawn").Pool(len(names)) as workers:
        for name, seconds, error in workers.map(functools.partial(_timed_build, build), names):
            print("compile", name, seconds if error is None else error, flush=True)
