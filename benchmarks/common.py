"""What the benchmark scripts share: the checkout's paths, the target models' default place,
JSONL files read whole (plain or gzip-compressed), verify-cost tables, and the command line a
report records.

Scripts run from the checkout's root as modules (``python -m benchmarks.speed.run_peers ...``),
so ``benchmarks`` and ``adaspark_app`` import from the checkout as they are; a script that starts another one starts it with ``-m`` (``module_argv``).
"""

from __future__ import annotations

import gzip
import json
import os
import shlex
import statistics
import sys
from pathlib import Path
from typing import IO, Callable

import numpy as np

ROOT = Path(__file__).resolve().parents[1]  # the checkout
BENCH = ROOT / "benchmarks"
CORPORA = BENCH / "corpora"
SETS = BENCH / "sets"
RESULTS = BENCH / "results"


def targets_dir() -> Path:
    """Where benchmarks/targets/assemble.py puts the target GGUFs (qwen0.5b.gguf, ...):
    $ADASPARK_TARGETS, else ~/.cache/adaspark/targets."""
    return Path(os.environ.get("ADASPARK_TARGETS") or Path.home() / ".cache" / "adaspark" / "targets")


def cpu_model() -> str:
    """The CPU a result was measured on, with its family and model numbers where the kernel names
    them (``adaspark_app.bench.runner.cpu_name``, the line `adaspark bench` reports carry): a name
    such as "AMD EPYC" alone covers a Zen 3 (family 25, model 1; AVX2 kernels) and a Zen 4
    (family 25, model 17; AVX-512 kernels), whose replies and speeds differ."""
    from adaspark_app.bench.runner import cpu_name

    return cpu_name() or "unknown"


def open_text(path: str | Path) -> IO[str]:
    """A text file opened for reading, decompressed on the way if its name ends in .gz (the
    committed replies and rounds files are kept as .jsonl.gz)."""
    path = Path(path)
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8")
    return path.open(encoding="utf-8")


def write_text(path: str | Path, text: str) -> None:
    """Write `text` to `path`, gzip-compressed (with no time stamp, so the same text gives the
    same bytes) if its name ends in .gz."""
    path = Path(path)
    data = text.encode("utf-8")
    if path.suffix == ".gz":
        data = gzip.compress(data, mtime=0)
    path.write_bytes(data)


def read_jsonl(path: str | Path) -> list:
    """Every non-blank line of a JSONL file (plain or .gz), parsed."""
    with open_text(path) as fh:
        return [json.loads(line) for line in fh if line.strip()]


def emit_report(lines: list[str], out: str | Path | None) -> str:
    """A markdown report: printed, and written to `out` when one is given."""
    text = "\n".join(lines) + "\n"
    print(text)
    if out:
        Path(out).write_text(text, encoding="utf-8")
    return text


def module_argv(module: str, *args: str) -> list[str]:
    """The argv that runs a benchmark module with this interpreter (run it with cwd=ROOT)."""
    return [sys.executable, "-m", module, *args]


def command_line(module: str, argv: list[str] | None) -> str:
    """How a report records the command that made it."""
    return f"python -m {module} " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))


# Qwen2.5-Coder-0.5B Q4_K_M, verify over one-row step at 400 tokens (issue 19's table).
QWEN05_COSTS = {1: 1.0, 4: 2.12, 8: 3.72, 16: 6.92, 32: 13.4, 64: 24.1}


def load_costs(path: str | Path | None) -> dict[int, float]:
    """Verify-cost ratios by width: the median process time per width over its one-row time
    (benchmarks/cost/verify_cost_cpu.py's JSON, mode "off"), or the issue's Qwen-0.5B table."""
    if not path:
        return dict(QWEN05_COSTS)
    with open_text(path) as fh:
        d = json.load(fh)
    runs = d["runs"]["off"]
    ws = sorted(int(w) for w in runs[0]["process_s"])
    med = {w: statistics.median(r["process_s"][str(w)] for r in runs) for w in ws}
    return {w: med[w] / med[1] for w in ws}


def cost_fn(table: dict[int, float]) -> Callable[[int], float]:
    """A width's verify cost over one row, interpolated in `table` (and past its widest width,
    along its last segment)."""
    ws = sorted(table)
    cs = [table[w] for w in ws]
    slope = (cs[-1] - cs[-2]) / (ws[-1] - ws[-2])

    def cost(w: int) -> float:
        if w > ws[-1]:  # 65 rows (ngram-mod's widest): extend the last segment
            return cs[-1] + slope * (w - ws[-1])
        return float(np.interp(w, ws, cs))
    return cost
