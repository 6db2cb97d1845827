"""The package's structure as its imports draw it: no module reaches back to one that imports it."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "adaspark_app"


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the package's modules it imports, read from the source (imports under
    TYPE_CHECKING and inside functions count: they are edges a reader follows too). ``from pkg
    import name`` is an edge to ``pkg`` and, when ``name`` is a module, to ``pkg.name``."""
    modules: dict[str, tuple[Path, bool]] = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        modules[".".join(parts[:-1] if is_pkg else parts)] = (path, is_pkg)
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, (path, is_pkg) in modules.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    here = name.split(".") if is_pkg else name.split(".")[:-1]
                    here = here[:len(here) - (node.level - 1)]
                    base = ".".join(here + ([node.module] if node.module else []))
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            graph[name].update(t for t in targets if t in modules and t != name)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_cycle_finder_finds_a_circle_through_a_package_init(tmp_path):
    """The finder itself: a module importing its package's __init__, which imports it back, is a
    circle; two modules importing a third are not."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from .a import x\n")
    (pkg / "a.py").write_text("from pkg import b\nx = 1\n")
    (pkg / "b.py").write_text("y = 2\n")
    (pkg / "c.py").write_text("from . import b\n")
    assert cycles(import_graph(pkg)) == [["pkg", "pkg.a"]]


def test_no_import_circle_in_the_package():
    """Every module of adaspark_app can be read without first reading one that imports it."""
    assert cycles(import_graph(PACKAGE)) == []
