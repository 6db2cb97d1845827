"""`adaspark models`: the GGUF files found, one line each (or JSON), broken ones marked.

It exits 0 whatever it finds: a file that cannot be used is a row saying why, not an error. Only
a bad config file (whose folders it would search) is an error, exit 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Sequence

from ..wording import one_line, printable
from .entry import SOURCE_LABELS, ModelEntry, human_size

COLUMNS = ("NAME", "SOURCE", "ARCH", "QUANT", "SIZE", "FORMAT", "LEARNED", "STATUS")


def add_parser(sub: Any) -> None:
    """Register `adaspark models` on the CLI's subparsers."""
    p = sub.add_parser("models", help="GGUFs found (HF cache, LM Studio, Ollama, bundled, config folders)")
    p.add_argument("--json", action="store_true", help="one JSON object per model, on one line each")
    p.add_argument("--paths", action="store_true", help="add each model's file path")
    p.add_argument("--store", help="learned-state database to look in (default: user data dir, or $ADASPARK_STORE)")
    p.set_defaults(func=cmd_models)


def format_label(e: ModelEntry) -> str:
    """What the FORMAT column says: "chat" for a GGUF with a template, else "base model ..."."""
    if e.turn_format is None:
        return "-"
    if e.turn_format == "chat template":
        return "chat"
    return e.turn_format


def row_cells(e: ModelEntry, paths: bool = False) -> list[str]:
    """One table row (also the picker's columns)."""
    learned = "-" if e.learned is None else ("yes" if e.learned else "no")
    status = "ok" if not e.broken else f"broken: {e.problem}"
    cells = [e.name, SOURCE_LABELS.get(e.source, e.source), e.architecture or "-", e.quantisation or "-",
             human_size(e.size), format_label(e), learned, status]
    if paths:
        cells.append(e.path)
    return cells


def render_table(entries: Sequence[ModelEntry], paths: bool = False) -> str:
    """The entries as aligned text columns, a header first."""
    header = list(COLUMNS) + (["PATH"] if paths else [])
    # names and paths come from file names and GGUF metadata: their control characters as escapes
    rows = [header] + [[printable(c) for c in row_cells(e, paths)] for e in entries]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = []
    for r in rows:
        # the last column is not padded: it is the longest, and a trailing pad is noise
        lines.append("  ".join(c.ljust(w) for c, w in zip(r[:-1], widths[:-1])) + "  " + r[-1])
    return "\n".join(lines)


def cmd_models(args: argparse.Namespace) -> int:
    from ..config import load_config
    from .discovery import discover_models, learned_rows, mark_learned

    cfg = load_config()
    # a --store the user named that is not a store is their error (one line, exit 2); the
    # default store, absent or unreadable, only means nothing is learned yet
    rows = learned_rows(args.store, strict=args.store is not None)
    notes: list[str] = []
    entries = discover_models(cfg.folders(), learned=False, notes=notes)
    mark_learned(entries, rows=rows)
    for note in notes:
        sys.stderr.write(f"adaspark: note: {one_line(note)}\n")
    out = sys.stdout
    if args.json:
        for e in entries:
            out.write(json.dumps(e.to_json()) + "\n")
        return 0
    if not entries:
        out.write("no GGUF files found\n")
        return 0
    out.write(render_table(entries, paths=args.paths) + "\n")
    broken = sum(e.broken for e in entries)
    out.write(f"\n{len(entries) - broken} usable, {broken} broken. Use one with: adaspark chat --model NAME\n")
    return 0
