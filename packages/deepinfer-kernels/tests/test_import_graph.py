"""No import cycle among the modules of ``deepinfer_kernels``: every ``import`` of the package's
source, at module level and inside functions, parsed with ``ast`` (nothing is imported). The
direction is ops -> platform -> tilelang -> leaf modules (envs, constants); a function-level import
that closes a loop is a cycle too: it only defers the loop to the first call."""

from __future__ import annotations

import ast
from pathlib import Path

import deepinfer_kernels

PACKAGE = "deepinfer_kernels"
ROOT = Path(deepinfer_kernels.__file__).resolve().parent


def module_name(path: Path) -> str:
    parts = (PACKAGE, *path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, modules: set[str]) -> set[str]:
    """The package modules ``path`` imports anywhere in its source (``from pkg import mod`` names
    the submodule where one exists, else the package)."""
    name = module_name(path)
    is_pkg = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:   # relative: resolved against this module's package
                base = name.split(".")[: len(name.split(".")) - node.level + (1 if is_pkg else 0)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{a.name}" for a in node.names)
    # a dotted import also imports each enclosing package (their __init__ runs first), except this
    # module's own: they are imported before it, whoever imports it
    closed = {".".join(m.split(".")[:i]) for m in found for i in range(1, m.count(".") + 2)}
    own = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
    return (closed & modules) - own - {name}


def import_graph() -> dict[str, set[str]]:
    paths = sorted(ROOT.rglob("*.py"))
    modules = {module_name(p) for p in paths}
    return {module_name(p): imported_modules(p, modules) for p in paths}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as [a, b, ..., a], or None (depth-first search, three colours)."""
    state: dict[str, int] = {}   # 1: on the current path, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_find_cycle_reports_a_loop_and_accepts_a_tree():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_the_graph_sees_function_level_and_relative_imports(tmp_path):
    pkg = tmp_path / PACKAGE
    (pkg / "sub").mkdir(parents=True)
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "a.py").write_text("def f():\n    from . import b\n")
    (pkg / "sub" / "b.py").write_text("from deepinfer_kernels.sub.a import f\n")
    modules = {f"{PACKAGE}.sub", f"{PACKAGE}.sub.a", f"{PACKAGE}.sub.b"}
    global ROOT
    saved, ROOT = ROOT, pkg
    try:
        assert imported_modules(pkg / "sub" / "a.py", modules) == {f"{PACKAGE}.sub.b"}
        assert imported_modules(pkg / "sub" / "b.py", modules) == {f"{PACKAGE}.sub.a"}
        assert find_cycle({m: imported_modules(pkg / "sub" / f"{m[-1]}.py", modules) for m in modules - {f"{PACKAGE}.sub"}})
    finally:
        ROOT = saved


def test_deepinfer_kernels_has_no_import_cycle():
    graph = import_graph()
    assert len(graph) > 50 and f"{PACKAGE}.ops.sparse_mla" in graph
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)
