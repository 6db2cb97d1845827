"""The UI's imports run one way: the app imports the screens, the screens the widgets and the
plain modules, and nothing imports the app back (ui/host.py is what the chat screen knows of it).

Imports are read from the source, those under TYPE_CHECKING and inside functions included, and
`from package import name` counts as an import of the package's __init__ (which runs first).
"""

from __future__ import annotations

import ast
from pathlib import Path

import adaspark_app.ui

UI = Path(adaspark_app.ui.__file__).resolve().parent
PACKAGE = "adaspark_app.ui"


def ui_modules() -> dict[str, Path]:
    out = {}
    for path in UI.rglob("*.py"):
        parts = list(path.relative_to(UI).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join([PACKAGE, *parts])] = path
    return out


def imports(module: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The UI modules `module` (at `path`) imports."""
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[:len(parts) - (node.level - 1)]
                base = ".".join(parts + ([node.module] if node.module else []))
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        found |= {n for n in names if n in known and n != module}
    return found


def test_nothing_imports_the_app():
    known = ui_modules()
    importers = [m for m, p in known.items() if f"{PACKAGE}.app" in imports(m, p, known)]
    assert importers == []


def test_the_ui_has_no_import_cycle():
    known = ui_modules()
    graph = {m: imports(m, p, known) for m, p in known.items()}
    done: set[str] = set()

    def cycle_from(module: str, path: list[str]) -> list[str] | None:
        if module in path:
            return path[path.index(module):] + [module]
        if module in done:
            return None
        for nxt in sorted(graph[module]):
            found = cycle_from(nxt, path + [module])
            if found:
                return found
        done.add(module)
        return None

    cycles = [c for c in (cycle_from(m, []) for m in sorted(graph)) if c]
    assert cycles == []
