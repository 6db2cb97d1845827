"""The UI's imports run one way: the app imports the screens, the screens the widgets and the
plain modules, and nothing imports the app back (ui/host.py is what the chat screen knows of it).
No circle anywhere in the package is tests/test_import_graph.py's."""

from __future__ import annotations

from test_import_graph import PACKAGE, import_graph


def test_nothing_in_the_ui_imports_the_app():
    """Only the command line (cli.py) starts the app; no screen, widget or UI module reaches it."""
    graph = import_graph(PACKAGE)
    importers = [m for m, deps in sorted(graph.items()) if "adaspark_app.ui.app" in deps]
    assert importers == ["adaspark_app.cli"]
