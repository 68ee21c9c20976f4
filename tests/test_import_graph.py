"""No import loops inside any package, and dependencies point one way (docs: ARCHITECTURE.md).

Every module under packages/<p>/src is parsed with `ast` (nothing is imported). Every import
counts: module level, inside functions, under `if TYPE_CHECKING:` (a loop there is still a
loop in the design). An edge points at the most specific module an import names:

    import a.b.c              -> a.b.c
    from a.b import c         -> a.b.c if a/b/c.py or a/b/c/ exists, else a.b
    from . import c  (in a.b.m)  -> a.b.c, resolved like the line above
    from ..x import y (in a.b.m) -> a.x.y or a.x

Importing a.b.c also runs a/__init__ and a/b/__init__; those implicit edges are not drawn (a
package that re-exports its submodules would otherwise always be a loop). Dynamic imports
(`importlib.import_module(f"...")`) are not seen. networkx comes with torch.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

PACKAGES_DIR = Path(__file__).resolve().parents[1] / "packages"
PACKAGES = ["deepinfer_kernels", "deepinfer_model", "deepinfer_sched", "deepinfer_engine"]
MAX_CYCLES_SHOWN = 20  # per strongly connected component


def _src_root(package: str) -> Path:
    return PACKAGES_DIR / package.replace("_", "-") / "src"


def _module_files(root: Path, package: str) -> dict[str, Path]:
    """Dotted module name -> file, for every .py under root/<package>."""
    modules = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _imported_names(module: str, path: Path, known: set[str]) -> set[str]:
    """Every dotted module name this module's imports point at (see the module docstring)."""
    is_package = path.name == "__init__.py"
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                # level 1 is the package holding this module (the module itself for __init__)
                base = module.split(".")
                drop = node.level - 1 if is_package else node.level
                base = base[: len(base) - drop]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                names.add(sub if sub in known else target)
    return names


def _extension_modules(root: Path, package: str) -> set[str]:
    """Compiled modules, known by their stub or shared library (deepinfer_sched._core): leaves."""
    names = set()
    for path in (root / package).rglob("*"):
        if path.suffix in (".pyi", ".so", ".pyd"):
            parent = path.parent.relative_to(root).parts
            names.add(".".join([*parent, path.name.split(".")[0]]))
    return names


def import_graph(root: Path, package: str) -> tuple[nx.DiGraph, dict[str, set[str]]]:
    """(edges between the package's own modules, every module's full set of imported names)."""
    files = _module_files(root, package)
    known = set(files) | _extension_modules(root, package)
    graph = nx.DiGraph()
    graph.add_nodes_from(known)
    imports = {}
    for module, path in files.items():
        imports[module] = _imported_names(module, path, known)
        graph.add_edges_from((module, name) for name in imports[module] if name in known)
    return graph, imports


def import_cycles(graph: nx.DiGraph) -> list[list[str]]:
    """Simple cycles, at most MAX_CYCLES_SHOWN per loop component, shortest first."""
    cycles = []
    for component in sorted(nx.strongly_connected_components(graph), key=min):
        sub = graph.subgraph(component)
        if len(component) == 1 and not any(sub.has_edge(n, n) for n in component):
            continue
        found = []
        for cycle in nx.simple_cycles(sub):
            found.append(cycle)
            if len(found) >= 10 * MAX_CYCLES_SHOWN:
                break
        # each cycle starts at its smallest name, so the report reads the same on every run
        found = [c[c.index(min(c)):] + c[: c.index(min(c))] for c in found]
        found.sort(key=lambda c: (len(c), c))
        cycles.extend(found[:MAX_CYCLES_SHOWN])
    return cycles


def _chain(cycle: list[str], package: str) -> str:
    short = [name.removeprefix(package + ".") or name for name in cycle]
    return " -> ".join(short + [short[0]])


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycles(package: str):
    graph, _ = import_graph(_src_root(package), package)
    assert graph.number_of_nodes() > 1
    cycles = import_cycles(graph)
    report = "\n".join(f"  {_chain(c, package)}" for c in cycles)
    assert not cycles, f"{package}: {len(cycles)} import cycle(s):\n{report}"


# package -> top-level names none of its modules may import
FORBIDDEN = {
    "deepinfer_kernels": {"deepinfer_model", "deepinfer_engine", "deepinfer_sched"},
    "deepinfer_model": {"deepinfer_engine", "deepinfer_sched"},
    "deepinfer_sched": {"torch", "deepinfer_kernels", "deepinfer_model", "deepinfer_engine"},
}


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_layering(package: str):
    _, imports = import_graph(_src_root(package), package)
    offences = sorted(
        f"  {module} imports {name}"
        for module, names in imports.items()
        for name in names
        if name.split(".")[0] in FORBIDDEN[package]
    )
    assert not offences, f"{package} breaks the layering:\n" + "\n".join(offences)


def test_resolver_reads_submodules_relative_imports_and_function_level(tmp_path: Path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from pkg import a\n")
    (pkg / "a.py").write_text("import os\nfrom pkg.sub import b\nfrom pkg.sub import helper\n")
    (pkg / "sub" / "__init__.py").write_text("from . import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from ..a import thing\n    from . import _ext\n")
    (pkg / "sub" / "_ext.pyi").write_text("def g() -> int: ...\n")
    graph, imports = import_graph(tmp_path, "pkg")
    assert imports["pkg.a"] == {"os", "pkg.sub.b", "pkg.sub"}  # helper is an attribute of pkg.sub
    assert imports["pkg.sub"] == {"pkg.sub.b"}
    # function level: two dots up from pkg.sub.b, and a compiled module known by its stub
    assert imports["pkg.sub.b"] == {"pkg.a", "pkg.sub._ext"}
    assert sorted(graph.edges) == [("pkg", "pkg.a"), ("pkg.a", "pkg.sub"), ("pkg.a", "pkg.sub.b"),
                                   ("pkg.sub", "pkg.sub.b"), ("pkg.sub.b", "pkg.a"),
                                   ("pkg.sub.b", "pkg.sub._ext")]
    assert import_cycles(graph) == [["pkg.a", "pkg.sub.b"], ["pkg.a", "pkg.sub", "pkg.sub.b"]]
    assert _chain(["pkg.a", "pkg.sub.b"], "pkg") == "a -> sub.b -> a"
