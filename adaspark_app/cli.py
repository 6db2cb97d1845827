"""Entry points: adaspark chat | run | bench | store | drafter.

Every user-caused failure becomes one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import sys
from pathlib import Path
from typing import Sequence, TextIO

from . import native
from .engine import limits
from .errors import AdaSparkError, ArgumentError
from .hard_exit import TemporaryDir
from .interrupts import exit_code, stop_between_rounds, stop_words, stops_on_signals
from .output_paths import check_writable, open_output
from .options import add_gpu_layers_option, add_sampling_options, check_gpu_layers_option, check_sampling_options
from .wording import one_line

class OneLineParser(argparse.ArgumentParser):
    """argparse with a one-line error (exit 2) instead of the usage dump."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"adaspark: error: {one_line(str(message))}\n")
        raise SystemExit(2)


def _check_numbers(args: argparse.Namespace) -> None:
    """The numeric options, through engine/limits.py: the bounds LlamaBackend checks for library
    users too, so a bad value is one line and exit 2 before anything loads."""
    args.n_ctx = limits.check_n_ctx(args.n_ctx)
    args.threads = limits.check_threads(args.threads)
    args.max_tokens = limits.check_max_tokens(args.max_tokens)


def version_text() -> str:
    """`adaspark --version`: this package's version and what a bug report needs beside it: the
    llama.cpp build (CPU only, or able to offload to a GPU), the CPU kernels and the round's
    pricing in use, Python and the machine."""
    import platform
    from importlib import metadata

    from .engine.offload import build_can_offload
    from .native import pricing

    native.activate()  # the kernels this process would use, as every command chooses them
    try:
        llama = metadata.version("llama-cpp-python")
    except metadata.PackageNotFoundError:
        llama = "not installed"
    try:
        device = "GPU offload" if build_can_offload() else "CPU only"
    except Exception as exc:  # a broken llama.cpp install: the version line is what is asked for
        device = f"does not load: {type(exc).__name__}"
    variant = native.variant()
    kernels = native.status() + (f", ggml's {variant} feature set" if variant else "")
    return "\n".join([
        f"adaspark {metadata.version('adaspark-app')}",
        f"llama-cpp-python {llama}, llama.cpp built for: {device}",
        f"CPU kernels: {kernels}; round pricing: {pricing.status()}",
        f"Python {platform.python_version()}, {platform.system()} {platform.machine()}",
    ])


class _VersionAction(argparse.Action):
    """--version: ``version_text``, built only when asked (it loads llama.cpp)."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, **kwargs) -> None:
        super().__init__(option_strings, dest=dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        print(version_text())
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="adaspark", description="Terminal chat with lossless speculative decoding "
                      "on llama.cpp, scheduled by AdaSpark.")
    p.add_argument("--version", action=_VersionAction,
                   help="the version, the llama.cpp build (CPU only or GPU), the kernels in use; then exit")
    sub = p.add_subparsers(dest="command", metavar="{chat,run,bench,bench-corpus,store,drafter,explain,models}",
                           parser_class=OneLineParser)
    sub.required = True

    c = sub.add_parser("chat", help="interactive chat (Textual TUI)")
    c.add_argument("--model", help="target GGUF (default: the bundled SmolLM2-135M-Instruct)")
    c.add_argument("--drafter", help="DSpark drafter GGUF, or 'default'")
    c.add_argument("--store", help="learned-state database (default: user data dir, or $ADASPARK_STORE)")
    c.add_argument("--max-tokens", default=None,
                   help="tokens per reply at most (default 512; with --continue, the conversation's)")
    c.add_argument("--system", default=None, metavar="TEXT",
                   help="system prompt of a new conversation (with --continue: replaces the conversation's)")
    c.add_argument("--continue", dest="continue_last", action="store_true",
                   help="resume the most recent conversation with its stored settings (options given "
                        "here replace them)")
    c.add_argument("--n-ctx", default=None,
                   help="context size in tokens (default: the model's training context, capped so the KV "
                        "cache takes at most half the free memory, and at 32768)")
    add_gpu_layers_option(c)
    add_sampling_options(c)

    r = sub.add_parser("run", help="headless scripted conversations")
    r.add_argument("script", help='SCRIPT.jsonl: one conversation per line, {"id": "c1", "turns": ["a user '
                                  'message", ...], "system": "optional system prompt"}')
    r.add_argument("--model", help="target GGUF, a path or a name `adaspark models` lists (default: the bundled "
                                   "SmolLM2-135M-Instruct)")
    r.add_argument("--drafter", help="DSpark drafter GGUF, or 'default'")
    r.add_argument("--arm", default="adaspark", help="adaspark | ar | chain:K | pinned:N")
    r.add_argument("--max-tokens", default=256, help="tokens per reply at most (default 256)")
    g = r.add_mutually_exclusive_group()
    g.add_argument("--store", help="learned-state database, read and kept up to date (default: user data dir, "
                                   "or $ADASPARK_STORE)")
    g.add_argument("--fresh-store", action="store_true", help="learn from empty in a temporary store")
    r.add_argument("--out", help="OUT.jsonl: one object per reply (default: stdout)")
    r.add_argument("--log-rounds", help="ROUNDS.jsonl: one object per round")
    r.add_argument("--n-ctx", default=4096,
                   help=f"context size in tokens ({limits.MIN_N_CTX}..{limits.MAX_N_CTX})")
    r.add_argument("--threads", default=None,
                   help=f"llama.cpp threads (1..{limits.MAX_THREADS})")
    r.add_argument("--self-check", action="store_true", help="assert every emitted token is its row's argmax")
    add_gpu_layers_option(r)
    add_sampling_options(r)

    from .bench import commands as bench_commands
    from . import explain
    from .engine import drafter_init
    from .store import commands as store_commands

    store_commands.add_parser(sub)
    bench_commands.add_parser(sub)
    bench_commands.add_corpus_parser(sub)
    drafter_init.add_parser(sub)
    explain.add_parser(sub)
    from .models import command as models_command

    models_command.add_parser(sub)
    return p


def cmd_run(args: argparse.Namespace) -> int:
    from .engine.arms import parse_arm
    from .engine.backend import check_gguf_file
    from .runner import load_script, run_conversation

    check_sampling_options(args)
    _check_numbers(args)
    gpu_layers = check_gpu_layers_option(args)
    parse_arm(args.arm)
    convs = load_script(args.script)
    for path, what in ((args.out, "--out"), (args.log_rounds, "--log-rounds")):
        if path:
            check_writable(path, what)  # before the model loads, and without truncating an earlier run
    if args.model:
        from .config import resolve_model_arg

        args.model = resolve_model_arg(args.model)  # a path or a name `adaspark models` lists
        check_gguf_file(args.model, "model")
    from .store import Store

    tmpdir = None
    if args.fresh_store:
        tmpdir = TemporaryDir(prefix="adaspark-fresh-")  # removed by a stop at once too
        store = Store.open(Path(tmpdir.name) / "fresh.db")
    else:  # what the run learns is kept, as the chat's is: --store, else $ADASPARK_STORE or the default
        store = Store.open(args.store)
    from .engine.chat_engine import ChatEngine

    try:
        engine = ChatEngine(args.model, args.drafter, store=store, arm=args.arm, n_threads=args.threads,
                            n_ctx=args.n_ctx, self_check=args.self_check, gpu_layers=gpu_layers)
    except BaseException:  # a file llama.cpp refuses, a stop while it loads: the store and its folder go too
        try:
            store.close()
        finally:
            if tmpdir is not None:
                tmpdir.cleanup()
        raise
    for note in engine.notices:
        sys.stderr.write(f"adaspark: note: {one_line(note)}\n")
    out: TextIO = sys.stdout
    log: TextIO | None = None
    total_turns = sum(len(c.turns) for c in convs)
    progress = None
    if sys.stderr.isatty():
        from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

        progress = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                            TimeRemainingColumn(), transient=True)
        progress.start()
        task = progress.add_task(f"run {args.arm}", total=total_turns)

    unsaved: list[str] = []  # the store's refusals of learned state, said once

    def write(conv, res) -> None:
        # each reply as it completes, flushed: an error or a crash in a later turn loses none
        if res.learned_not_saved and not unsaved:
            unsaved.append(res.learned_not_saved)
            sys.stderr.write(f"adaspark: note: learned state not saved: {one_line(res.learned_not_saved)}\n")
        row = res.to_json()
        row.pop("tokens", None)
        if conv.category:
            row["category"] = conv.category
        out.write(json.dumps(row) + "\n")
        out.flush()
        if log is not None:
            log.flush()
        if progress is not None:
            progress.advance(task)

    try:
        if args.out:
            out = open_output(args.out, "--out")
        if args.log_rounds:
            log = open_output(args.log_rounds, "--log-rounds")
        with stop_between_rounds() as cancel:  # a stop ends the reply at its next round, kept as stopped
            for conv in convs:
                run_conversation(engine, conv, args.max_tokens, log_rounds=log, sampling=args.sampling,
                                 on_reply=lambda res, conv=conv: write(conv, res), cancel=cancel)
                if cancel.is_set():
                    break
                engine.reset_conversation()
    finally:
        if progress is not None:
            progress.stop()
        try:  # a full disk fails these too: the engine, the store and the temporary store still close
            if out is not sys.stdout:
                out.close()
            if log is not None:
                log.close()
        finally:
            engine.close()
            if store is not None:
                store.close()
            if tmpdir is not None:
                tmpdir.cleanup()
    return 0


def check_text_option(value: str | None, name: str) -> str | None:
    """An option's text as the model will read it: bytes that are not UTF-8 reach Python as
    surrogate escapes, which nothing that writes UTF-8 takes (the chat ended with a traceback)."""
    if value is None:
        return None
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        byte = os.fsencode(value[exc.start])
        raise ArgumentError(f"{name} is not UTF-8 text (byte {byte!r} at character {exc.start + 1})") from None
    return value


def cmd_chat(args: argparse.Namespace) -> int:
    from .engine.backend import check_gguf_file
    from .ui.chat_settings import SAMPLING_FIELDS, default_settings, resume_last
    from .config import load_config, resolve_model

    args.system = check_text_option(args.system, "--system")

    # the config file's defaults (a bad file: one line, exit 2); options given here win
    cfg = load_config()
    if args.model or (cfg.model and not args.continue_last):
        args.model = resolve_model(args.model or cfg.model, cfg.folders())
    values = {name: getattr(args, name, None) for name in SAMPLING_FIELDS}
    resume = None
    if args.continue_last:
        from .store import Store

        with Store.open(args.store) as store:
            cid, resumed, problems = resume_last(store, model=args.model, system=args.system,
                                                 max_tokens=args.max_tokens, sampling=values)
        for problem in problems:
            sys.stderr.write(f"adaspark: note: the conversation's stored settings: {one_line(problem)} "
                             "(default used)\n")
        resume = (cid, resumed)
        args.model = resumed.model_path
    if args.model:
        check_gguf_file(args.model, "model")
    # chat samples by default: the GGUF's recommended settings where present, else llama.cpp's;
    # an unset seed stays unset, so each reply draws (and records) a fresh one. A config file's
    # chat defaults go in as `config=` (keys: system, max_tokens and the sampling field names).
    settings = default_settings(args.model, system=args.system, max_tokens=args.max_tokens, sampling=values,
                                config=cfg.chat_defaults())
    sampling = args.sampling = settings.sampling
    if args.drafter and args.drafter != "default":
        check_gguf_file(args.drafter, "drafter")
    args.max_tokens = settings.max_tokens
    args.n_ctx = _chat_n_ctx(args)
    gpu_layers = check_gpu_layers_option(args, cfg)
    from .ui.app import run_chat

    # what the user set (config, then options): a model chosen in the picker keeps these and
    # takes its own GGUF's recommended values for the rest
    given = {k: v for k, v in cfg.chat_defaults().items() if k in SAMPLING_FIELDS and v is not None}
    given.update({k: v for k, v in values.items() if v is not None})
    return run_chat(args.model, args.drafter, args.store, max_tokens=args.max_tokens, sampling=sampling,
                    n_ctx=args.n_ctx, system=settings.system, resume_id=resume[0] if resume else None,
                    sampling_given=given, gpu_layers=gpu_layers, saved_context_mb=cfg.saved_context_mb,
                    read_ahead=cfg.read_ahead) or 0


def _chat_n_ctx(args: argparse.Namespace) -> int | None:
    """--n-ctx through engine/limits.py; None (not given): the engine process takes the model's
    default (engine/context_size.py), for each model the picker loads."""
    if getattr(args, "n_ctx", None) is not None:
        return limits.check_n_ctx(args.n_ctx)
    return None


#: what a full or failing disk makes a write raise: one line and exit 2, never a traceback
WRITE_FAILURES = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO, errno.EROFS})


def main(argv: Sequence[str] | None = None) -> int:
    """The `adaspark` command. Returns the exit code: 0, 2 for a user-caused error, 130 on ^C."""
    parser = build_parser()
    args = parser.parse_args(argv)
    # The Q4_1 kernels, if built, before any command imports llama_cpp (importing the package
    # does not do it: adaspark_app has no import-time side effects).
    native.activate()
    try:
        if args.command == "chat":
            return cmd_chat(args)  # Ctrl+C is a key there
        with stops_on_signals():  # SIGTERM and SIGHUP as Ctrl+C; a second at once, even inside llama.cpp
            if args.command == "run":
                return cmd_run(args)
            return int(args.func(args) or 0)  # store, bench, bench-corpus, drafter: set by add_parser
    except AdaSparkError as exc:
        sys.stderr.write(f"adaspark: error: {one_line(str(exc))}\n")
        return exc.exit_code
    except KeyboardInterrupt as exc:  # Ctrl+C, or SIGTERM or SIGHUP (interrupts.Stopped)
        sys.stderr.write(f"adaspark: {stop_words(exc)}\n")
        return exit_code(exc)
    except BrokenPipeError:
        return 0
    except OSError as exc:
        if exc.errno not in WRITE_FAILURES:
            raise
        where = f" {exc.filename}" if exc.filename else ""
        sys.stderr.write(f"adaspark: error: cannot write{one_line(where)}: {exc.strerror or exc}\n")
        return 2


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
