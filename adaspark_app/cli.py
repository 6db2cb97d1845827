"""Entry points: adaspark chat | run | bench | store | drafter.

Every user-caused failure becomes one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Sequence

from .errors import AdaSparkError, ArgumentError

SAMPLING_FLAGS = ("--temperature", "--top-p", "--top-k", "--min-p", "--seed", "--repeat-penalty")


class OneLineParser(argparse.ArgumentParser):
    """argparse with a one-line error (exit 2) instead of the usage dump."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"adaspark: error: {message}\n")
        raise SystemExit(2)


def _add_sampling(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sampling (rejected: AdaSpark decodes greedily)")
    for flag in SAMPLING_FLAGS:
        g.add_argument(flag, dest=flag[2:].replace("-", "_"), default=None, help=argparse.SUPPRESS)


def _check_sampling(args: argparse.Namespace) -> None:
    for flag in SAMPLING_FLAGS:
        val = getattr(args, flag[2:].replace("-", "_"), None)
        if val is None:
            continue
        if flag == "--temperature":
            try:
                if float(val) == 0.0:
                    continue
            except ValueError:
                pass
        raise ArgumentError(f"{flag} is not supported: AdaSpark decodes greedily (the target's argmax "
                            "at every token), so sampling settings cannot apply")


def _positive(name: str):
    def conv(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a whole number, got {text!r}") from None
        if v < 1:
            raise argparse.ArgumentTypeError(f"{name} must be at least 1, got {v}")
        return v
    return conv


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="adaspark", description="Terminal chat with lossless speculative decoding "
                      "on llama.cpp, scheduled by AdaSpark.")
    sub = p.add_subparsers(dest="command", metavar="{chat,run,bench,bench-corpus,store,drafter}",
                           parser_class=OneLineParser)
    sub.required = True

    c = sub.add_parser("chat", help="interactive chat (Textual TUI)")
    c.add_argument("--model", help="target GGUF (default: the bundled SmolLM2-135M-Instruct)")
    c.add_argument("--drafter", help="DSpark drafter GGUF, or 'default'")
    c.add_argument("--store", help="learned-state database (default: user data dir, or $ADASPARK_STORE)")
    c.add_argument("--arm", default="adaspark", help=argparse.SUPPRESS)
    _add_sampling(c)

    r = sub.add_parser("run", help="headless scripted conversations")
    r.add_argument("script", help="SCRIPT.jsonl: one conversation per line")
    r.add_argument("--model")
    r.add_argument("--drafter")
    r.add_argument("--arm", default="adaspark", help="adaspark | ar | chain:K | pinned:N")
    r.add_argument("--max-tokens", type=_positive("--max-tokens"), default=256)
    g = r.add_mutually_exclusive_group()
    g.add_argument("--store")
    g.add_argument("--fresh-store", action="store_true", help="learn from empty in a temporary store")
    r.add_argument("--out", help="OUT.jsonl: one object per reply (default: stdout)")
    r.add_argument("--log-rounds", help="ROUNDS.jsonl: one object per round")
    r.add_argument("--n-ctx", type=_positive("--n-ctx"), default=4096)
    r.add_argument("--threads", type=_positive("--threads"), default=None)
    r.add_argument("--self-check", action="store_true", help="assert every emitted token is its row's argmax")
    _add_sampling(r)

    from .bench import commands as bench_commands
    from .engine import drafter_init
    from .store import commands as store_commands

    store_commands.add_parser(sub)
    bench_commands.add_parser(sub)
    bench_commands.add_corpus_parser(sub)
    drafter_init.add_parser(sub)
    return p


def cmd_run(args: argparse.Namespace) -> int:
    from .engine.arms import parse_arm
    from .engine.backend import check_gguf_file
    from .runner import load_script, run_conversation

    _check_sampling(args)
    parse_arm(args.arm)
    convs = load_script(args.script)
    if args.model:
        check_gguf_file(args.model, "model")
    store = None
    tmpdir = None
    if args.fresh_store or args.store:
        from .store import Store

        if args.fresh_store:
            tmpdir = tempfile.TemporaryDirectory(prefix="adaspark-fresh-")
            store = Store.open(Path(tmpdir.name) / "fresh.db")
        else:
            store = Store.open(args.store)
    elif os.environ.get("ADASPARK_STORE"):
        from .store import Store

        store = Store.open(None)
    from .engine.chat_engine import ChatEngine

    engine = ChatEngine(args.model, args.drafter, store=store, arm=args.arm, n_threads=args.threads,
                        n_ctx=args.n_ctx, self_check=args.self_check)
    for note in engine.notices:
        sys.stderr.write(f"adaspark: note: {note}\n")
    out = open(args.out, "w", encoding="utf-8") if args.out else sys.stdout
    log = open(args.log_rounds, "w", encoding="utf-8") if args.log_rounds else None
    total_turns = sum(len(c.turns) for c in convs)
    progress = None
    if sys.stderr.isatty():
        from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

        progress = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                            TimeRemainingColumn(), transient=True)
        progress.start()
        task = progress.add_task(f"run {args.arm}", total=total_turns)
    try:
        for conv in convs:
            for res in run_conversation(engine, conv, args.max_tokens, log_rounds=log):
                row = res.to_json()
                row.pop("tokens", None)
                if conv.category:
                    row["category"] = conv.category
                out.write(json.dumps(row) + "\n")
                out.flush()
                if progress is not None:
                    progress.advance(task)
            engine.reset_conversation()
    finally:
        if progress is not None:
            progress.stop()
        if out is not sys.stdout:
            out.close()
        if log is not None:
            log.close()
        engine.close()
        if store is not None:
            store.close()
        if tmpdir is not None:
            tmpdir.cleanup()
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    _check_sampling(args)
    from .engine.arms import parse_arm
    from .engine.backend import check_gguf_file

    parse_arm(args.arm)
    if args.model:
        check_gguf_file(args.model, "model")
    if args.drafter and args.drafter != "default":
        check_gguf_file(args.drafter, "drafter")
    from .ui.app import run_chat

    return run_chat(args.model, args.drafter, args.store) or 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "run":
            return cmd_run(args)
        if args.command == "chat":
            return cmd_chat(args)
        return int(args.func(args) or 0)  # store, bench, bench-corpus, drafter: set by add_parser
    except AdaSparkError as exc:
        sys.stderr.write(f"adaspark: error: {exc}\n")
        return exc.exit_code
    except KeyboardInterrupt:
        sys.stderr.write("adaspark: interrupted\n")
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
