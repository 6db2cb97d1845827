"""What loading a model into an engine costs with a GGUF header walked once, against once per
reader (`gguf_file.SKIP_ARRAYS_KEPT`, 0 keeps none).

Loading reads the model's header three times: the default context size, the checks of what
llama.cpp aborts on and the store's fingerprint. Each load here is what the chat's engine process
does after its imports: open a fresh store, pick the context, build a `ChatEngine`, close both. The ways
alternate load by load (kept, walked, walked, kept, ...), the headers forgotten before each; the
ratio is walked / kept per pair of loads: geometric mean, 95% bootstrap interval over pairs.

    python -m benchmarks.cost.engine_load [--pairs 30] [--model GGUF] [--out FILE]
"""

from __future__ import annotations

import argparse
import math
import platform
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.common import command_line, cpu_model, emit_report

WAYS = ("kept", "walked")


def load_once(model: str | None, folder: Path, keep: int) -> tuple[float, int]:
    """Seconds to open a store and build and close an engine, and the header walks it made."""
    from adaspark_app import gguf_file
    from adaspark_app.engine.backend import default_model_path
    from adaspark_app.engine.chat_engine import ChatEngine
    from adaspark_app.engine.context_size import default_chat_n_ctx
    from adaspark_app.store import Store
    from adaspark_app.store import fingerprint

    gguf_file.SKIP_ARRAYS_KEPT = keep
    gguf_file._SKIP_ARRAYS_READ.clear()
    fingerprint._MODEL_CACHE.clear()  # a new process knows no fingerprint either
    walks = [0]
    walk = gguf_file._Walk

    class Counted(walk):
        def __init__(self, *args, **kwargs):
            walks[0] += 1
            super().__init__(*args, **kwargs)

    gguf_file._Walk = Counted
    try:
        start = time.perf_counter()
        store = Store.open(folder / f"store-{time.monotonic_ns()}.db")
        path = model or default_model_path()
        engine = ChatEngine(model_path=model, store=store, n_ctx=default_chat_n_ctx(path, None).n_ctx)
        engine.close()
        store.close()
        return time.perf_counter() - start, walks[0]
    finally:
        gguf_file._Walk = walk


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=30)
    ap.add_argument("--model", help="a GGUF (default: the bundled model)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    from adaspark_app import native

    native.activate()
    from adaspark_app.bench.stats import bootstrap_interval, geometric_mean
    from adaspark_app.gguf_file import SKIP_ARRAYS_KEPT

    keeps = {"kept": SKIP_ARRAYS_KEPT, "walked": 0}
    times: dict[str, list[float]] = {w: [] for w in WAYS}
    walks: dict[str, set[int]] = {w: set() for w in WAYS}
    with tempfile.TemporaryDirectory(prefix="adaspark-load-") as tmp:
        load_once(args.model, Path(tmp), keeps["kept"])  # the file in the page cache, the imports done
        for i in range(args.pairs):
            for way in (WAYS if i % 2 == 0 else WAYS[::-1]):
                seconds, n = load_once(args.model, Path(tmp), keeps[way])
                times[way].append(seconds)
                walks[way].add(n)
    logs = {f"pair-{i:03d}": [math.log(w / k)] for i, (k, w) in enumerate(zip(times["kept"], times["walked"]))}
    ratio = geometric_mean([w / k for k, w in zip(times["kept"], times["walked"])])
    low, high = bootstrap_interval(logs)
    lines = [
        "# Engine load: the GGUF header walked once, against once per reader",
        "",
        f"- command: `{command_line('benchmarks.cost.engine_load', argv)}`",
        f"- model: `{args.model or 'the bundled model'}`",
        f"- machine: {cpu_model()} ({platform.platform()}), Python {platform.python_version()}",
        f"- {args.pairs} pairs of loads, the ways alternating; header walks per load: kept "
        f"{sorted(walks['kept'])}, walked {sorted(walks['walked'])}",
        "",
        "| way | median load ms |",
        "|---|---|",
        *(f"| {w} | {statistics.median(times[w]) * 1e3:.1f} |" for w in WAYS),
        "",
        f"Walked / kept: **{ratio:.3f}x [{low:.3f}, {high:.3f}]** (geometric mean over pairs, 95% bootstrap).",
    ]
    emit_report(lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
