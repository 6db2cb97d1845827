"""A run's replies against another base arm: e.g. every arm over `adaspark` instead of `ar`.

`run_peers.py` and `adaspark bench` compare every arm with the first one. Whether a pinned width
or a peer beats `adaspark` beyond its interval (issue 19) needs `adaspark` as the base; this
re-reads a run's `replies.jsonl` and renders the same report (ratios of the geometric mean with
bootstrap intervals over conversations, by category and by context band) with BASE first.

    python -m benchmarks.speed.rebase_report RUN/replies.jsonl --base adaspark [--out DIR]

Several runs pool into one report (the bootstrap resamples the conversations of all of them;
each conversation keeps its own run's interleaved arms), e.g. the held-out sets run on one
decode path: each conversation is named RUN/conversation (RUN: the replies file's directory).

    python -m benchmarks.speed.rebase_report s38/qwen0.5b-paste/replies.jsonl s39/qwen0.5b-paste/replies.jsonl --base adaspark:ar

Without --out the markdown goes to stdout; with it, DIR gets report.md, report.json and the plots.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from adaspark_app.bench.report import build_report, render_markdown, write_report
from benchmarks.common import command_line, read_jsonl


def run_name(path: Path) -> str:
    """A run's name in a pooled report: its replies file's directory, with the set's above it
    (s39/qwen0.5b-paste for s39/qwen0.5b-paste/replies.jsonl)."""
    p = path.resolve().parent
    return f"{p.parent.name}/{p.name}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("replies", type=Path, nargs="+", help="one run's replies.jsonl, or several to pool")
    ap.add_argument("--base", required=True, help="the arm every other arm is divided by")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    names = [run_name(p) for p in args.replies]
    if len(set(names)) < len(names):
        print(f"rebase_report: error: two runs share the name {max(names, key=names.count)!r}: pool runs from "
              "differently named directories", file=sys.stderr)
        return 2
    records = []
    for path, name in zip(args.replies, names):
        try:
            run = read_jsonl(path)
        except (OSError, EOFError, ValueError) as exc:
            print(f"rebase_report: error: cannot read {path}: {exc}", file=sys.stderr)
            return 2
        if not all(isinstance(r, dict) and "arm" in r and "conversation" in r for r in run):
            print(f"rebase_report: error: {path}: not a replies file (each line needs an arm and a conversation)",
                  file=sys.stderr)
            return 2
        if len(args.replies) > 1:
            run = [dict(r, conversation=f"{name}/{r['conversation']}") for r in run]
        records += run
    arms: list[str] = []
    for r in records:
        if r.get("arm") not in arms:
            arms.append(r.get("arm"))
    if args.base not in arms:
        print(f"rebase_report: error: no arm {args.base!r} in {' '.join(map(str, args.replies))} (arms: {', '.join(map(str, arms))})",
              file=sys.stderr)
        return 2
    meta = {"arms": [args.base] + [a for a in arms if a != args.base],
            "script": " ".join(map(str, args.replies)), "command": command_line("benchmarks.speed.rebase_report", argv)}
    if args.out:
        write_report(records, meta, args.out)
        print(f"wrote {args.out}/report.md")
    else:
        print(render_markdown(build_report(records, meta)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
