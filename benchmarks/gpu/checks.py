"""What the GPU run's checks (graph_check, argmax_check) share: their widths option, the models
they were given, and the verdict run.sh reads to fall back to stock behaviour for its later stages."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Callable

from benchmarks.common import command_line, cpu_model


def parse_widths(ap: argparse.ArgumentParser, text: str) -> list[int]:
    """``--widths``: comma-separated row counts from 1 to 64, sorted and without repeats."""
    try:
        widths = sorted({int(x) for x in text.split(",")})
    except ValueError:
        ap.error(f"--widths: comma-separated row counts, not {text!r}")
    if not widths or widths[0] < 1 or widths[-1] > 64:
        ap.error("--widths: row counts from 1 to 64")
    return widths


def missing_model(prog: str, models: list[str]) -> bool:
    """Whether a model file is missing (said in one line on stderr)."""
    for m in models:
        if not Path(m).is_file():
            print(f"{prog}: no model file {m}", file=sys.stderr)
            return True
    return False


def verdict(prog: str, path: str, what: str, unsound: Callable[[dict], str | None]) -> int:
    """Judge a check's --out-json file: 0 if its behaviour may be used after it, 1 with the reason
    on stderr if not, 2 if the file is not ``what``."""
    try:
        why = unsound(json.loads(Path(path).read_text()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        print(f"{prog}: {path}: not {what} ({e})", file=sys.stderr)
        return 2
    if why:
        print(f"{prog}: {why}", file=sys.stderr)
    return 1 if why else 0


def report_head(title: str, module: str, argv: list[str] | None, what: str) -> list[str]:
    """A check's report opening: its title, the command, the machine and what was measured."""
    return [f"# {title}", "", f"`{command_line(module, argv)}`", "", f"Machine: {cpu_model()}. {what}", ""]
