"""What a verify of a few rows costs against a plain one-row step, in the engine as it serves.

Each reply runs on a ``pinned:N`` arm (N = 2 and 4 by default), whose rounds are one-row plain steps
where nothing is proposed and N-row verifies where something is: the two kinds of forward come
interleaved in one reply, at the same contexts, on the same threads. Per reply, the median
``verify_ms`` of its N-row rounds over the median of its one-row rounds; the figure is the geometric
mean over replies with a 95% bootstrap interval over the set's conversations. Under 1.0, N rows
cost less than one (issue 41's "the verify cost per width"; the design's "Two rows can cost less
than one").

    python -m benchmarks.cost.width_steps [--model GGUF] [--set SET.jsonl] [--limit 8]
        [--widths 2,4] [--max-tokens 96] [--out FILE]
"""

from __future__ import annotations

import argparse
import math
import platform
import statistics
from pathlib import Path

from benchmarks.common import CORPORA, ROOT, command_line, cpu_model, emit_report, read_jsonl


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="a GGUF (default: the bundled model)")
    ap.add_argument("--set", type=Path, default=CORPORA / "longpaste.jsonl.gz",
                    help="conversations (their first turns; pastes, so most replies copy some)")
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("--widths", default="2,4")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    widths = [int(w) for w in args.widths.split(",")]
    from adaspark_app import native

    native.activate()
    from adaspark_app.bench.stats import bootstrap_interval, geometric_mean
    from adaspark_app.engine.chat_engine import ChatEngine

    convs = [c for c in read_jsonl(args.set) if c.get("turns")][:args.limit]
    shown = args.set.resolve().relative_to(ROOT) if args.set.resolve().is_relative_to(ROOT) else args.set
    engines = {w: ChatEngine(args.model, arm=f"pinned:{w}", n_ctx=4096) for w in widths}
    logs: dict[int, dict[str, list[float]]] = {w: {} for w in widths}
    medians: dict[int, list[tuple[float, float]]] = {w: [] for w in widths}
    try:
        for i, conv in enumerate(convs):
            for w in (widths if i % 2 == 0 else widths[::-1]):  # the arms alternate per conversation
                engine = engines[w]
                events = []
                engine.reset_conversation()
                engine.generate(str(conv["id"]), [{"role": "user", "content": conv["turns"][0]}],
                                max_tokens=args.max_tokens, on_round=events.append)
                one = [e.verify_ms for e in events if e.width == 1 and not e.prefill]
                wide = [e.verify_ms for e in events if e.width == w and not e.prefill]
                if len(one) >= 3 and len(wide) >= 3:
                    m1, mw = statistics.median(one), statistics.median(wide)
                    medians[w].append((m1, mw))
                    logs[w][str(conv["id"])] = [math.log(mw / m1)]
    finally:
        for engine in engines.values():
            engine.close()
    lines = [
        "# A verify of a few rows against a plain one-row step, in the engine",
        "",
        f"- command: `{command_line('benchmarks.cost.width_steps', argv)}`",
        f"- model: `{args.model or 'the bundled model'}`; set: `{shown}` (first turns, {len(convs)} conversations)",
        f"- machine: {cpu_model()} ({platform.platform()}), Python {platform.python_version()}",
        "",
        "| rows | replies | one-row step, median ms | rows' verify, median ms | rows / one row |",
        "|---|---|---|---|---|",
    ]
    for w in widths:
        pairs = medians[w]
        if not pairs:
            lines.append(f"| {w} | 0 | - | - | - (no reply had 3 rounds of each) |")
            continue
        ratio = geometric_mean([mw / m1 for m1, mw in pairs])
        low, high = bootstrap_interval(logs[w])
        lines.append(f"| {w} | {len(pairs)} | {statistics.median(m for m, _ in pairs):.2f} | "
                     f"{statistics.median(m for _, m in pairs):.2f} | **{ratio:.3f}x [{low:.3f}, {high:.3f}]** |")
    emit_report(lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
