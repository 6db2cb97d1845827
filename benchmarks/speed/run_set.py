"""Run a named held-out set (benchmarks/sets/index.toml): its speed runs, and its cold runs.

    python -m benchmarks.speed.run_set --list
    LLAMA_SERVER_BIN=.../llama-server python -m benchmarks.speed.run_set NAME [--model M ...]
        [--cold | --cold-only] [--dry-run]

Each run of the set's entry (or only those of the --model names given) becomes one command:
`benchmarks/speed/run_peers.py` (tool "peers": AdaSpark's arms against llama-server, which needs
LLAMA_SERVER_BIN) or `adaspark bench` (tool "bench": AdaSpark's arms only), greedy, the entry's
arms and max tokens, capped replies kept, the report in benchmarks/results/speed/MODEL-KIND/NAME/.
With --cold, also the entry's cold runs: `adaspark run` on a fresh store with --log-rounds, then
benchmarks/cold_start/cold_start.py on the rounds, into benchmarks/results/cold_start/
MODEL-NAME-REPEAT.txt. Models are target GGUFs in $ADASPARK_TARGETS (default
~/.cache/adaspark/targets) or `smollm2`, the bundled model. --dry-run prints the commands and runs
nothing. Run on a quiet machine: a failed command stops the run.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import RESULTS, ROOT, SETS, cpu_model, targets_dir

INDEX = SETS / "index.toml"
BUNDLED = "smollm2"  # a run's model name for the bundled model (no --model)


@dataclass
class Step:
    """One command of a set's run, and where its stdout goes (None: the terminal)."""
    label: str
    argv: list[str]
    stdout: Path | None = None

    def line(self) -> str:
        return shlex.join(self.argv) + (f" > {shlex.quote(rel(self.stdout))}" if self.stdout else "")


def rel(path: Path) -> str:
    """`path` from the checkout's root, where the commands run."""
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


def load_index(path: Path = INDEX) -> tuple[dict, dict[str, dict]]:
    """The index's defaults and its sets by name; each set's file must be in the sets folder."""
    with path.open("rb") as fh:
        index = tomllib.load(fh)
    sets = index.get("sets", {})
    for name, entry in sets.items():
        if not (path.parent / entry["file"]).is_file():
            raise SystemExit(f"run_set: {path}: set {name!r} names {entry['file']}, which is not in {path.parent}")
    return index.get("defaults", {}), sets


def kind_of(name: str) -> str:
    """A set's kind from its name (SOURCE-KIND-COUNT-LETTER): chat, paste or code."""
    parts = name.split("-")
    if len(parts) < 4:
        raise SystemExit(f"run_set: {name!r} is not named SOURCE-KIND-COUNT-LETTER")
    return parts[1]


def model_args(model: str) -> list[str]:
    return [] if model == BUNDLED else ["--model", str(targets_dir() / f"{model}.gguf")]


def chosen(entry: dict, key: str, models: set[str] | None) -> list[dict]:
    """The entry's runs of one kind ("runs" or "cold"), only those of `models` when given."""
    return [run for run in entry.get(key, []) if not models or run["model"] in models]


def speed_steps(name: str, entry: dict, defaults: dict, models: set[str] | None) -> list[Step]:
    set_path = rel(SETS / entry["file"])
    steps = []
    for run in chosen(entry, "runs", models):
        model = run["model"]
        opts = {**defaults, **run}
        out = rel(RESULTS / "speed" / f"{model}-{kind_of(name)}" / name)
        capped = ["--keep-capped"] if opts.get("keep_capped", True) else []
        if opts.get("tool", "peers") == "peers":
            argv = ["python", "-m", "benchmarks.speed.run_peers", set_path, *model_args(model),
                    "--peers", opts["arms"], "--max-tokens", str(opts["max_tokens"]), *capped, "--out", out]
        elif opts["tool"] == "bench":
            argv = ["adaspark", "bench", set_path, *model_args(model), "--arms", opts["arms"],
                    "--max-tokens", str(opts["max_tokens"]), *capped, "--no-progress", "--report", out]
        else:
            raise SystemExit(f"run_set: {name}: unknown tool {opts['tool']!r} (peers or bench)")
        steps.append(Step(f"{name} {model}", argv))
    return steps


def cold_steps(name: str, entry: dict, defaults: dict, models: set[str] | None, work: Path) -> list[Step]:
    set_path = rel(SETS / entry["file"])
    steps = []
    for run in chosen(entry, "cold", models):
        model = run["model"]
        for k in range(1, int(run.get("repeats", 1)) + 1):
            rounds, replies = work / f"{model}-{k}-rounds.jsonl", work / f"{model}-{k}-out.jsonl"
            steps.append(Step(f"{name} {model} cold {k}", [
                "adaspark", "run", set_path, *model_args(model), "--arm", "adaspark",
                "--max-tokens", str(run.get("max_tokens", defaults["max_tokens"])), "--fresh-store",
                "--out", str(replies), "--log-rounds", str(rounds)]))
            steps.append(Step(f"{name} {model} cold {k} report",
                              ["python", "-m", "benchmarks.cold_start.cold_start", str(rounds)],
                              RESULTS / "cold_start" / f"{model}-{name}-{k}.txt"))
    return steps


def execute(step: Step) -> None:
    print(f"== {step.label} {time.strftime('%H:%M:%S', time.gmtime())} load "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    argv = [sys.executable, *step.argv[1:]] if step.argv[0] == "python" else step.argv
    if step.stdout is None:
        subprocess.run(argv, cwd=ROOT, check=True)
        return
    step.stdout.parent.mkdir(parents=True, exist_ok=True)
    out = subprocess.run(argv, cwd=ROOT, check=True, stdout=subprocess.PIPE, text=True).stdout
    step.stdout.write_text(out, encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("name", nargs="?", help="a set of benchmarks/sets/index.toml")
    ap.add_argument("--list", action="store_true", help="list the sets and their runs")
    ap.add_argument("--model", action="append", default=None, help="only this model's runs (repeatable)")
    ap.add_argument("--cold", action="store_true", help="also the cold runs")
    ap.add_argument("--cold-only", action="store_true", help="only the cold runs")
    ap.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    args = ap.parse_args(argv)
    defaults, sets = load_index()
    if args.list or not args.name:
        for name, entry in sets.items():
            runs = ", ".join(r["model"] for r in entry.get("runs", [])) or "none"
            cold = ", ".join(r["model"] for r in entry.get("cold", [])) or "none"
            print(f"{name}: {entry['count']} {entry['holds']} ({entry['file']}); runs: {runs}; cold: {cold}")
        return 0 if args.list else 2
    if args.name not in sets:
        print(f"run_set: no set {args.name!r} in {rel(INDEX)} (sets: {', '.join(sets)})", file=sys.stderr)
        return 2
    entry, models = sets[args.name], set(args.model or ())
    with tempfile.TemporaryDirectory(prefix="run-set-") as tmp:
        steps = [] if args.cold_only else speed_steps(args.name, entry, defaults, models)
        if args.cold or args.cold_only:
            steps += cold_steps(args.name, entry, defaults, models, Path(tmp))
        if not steps:
            print(f"run_set: {args.name}: nothing to run for {', '.join(sorted(models)) or 'it'}", file=sys.stderr)
            return 2
        if args.dry_run:
            for step in steps:
                print(step.line())
            return 0
        if any(s.argv[2:3] == ["benchmarks.speed.run_peers"] and "server-" in " ".join(s.argv) for s in steps) \
                and not os.environ.get("LLAMA_SERVER_BIN"):
            print("run_set: the llama-server peers need LLAMA_SERVER_BIN (benchmarks/speed/peers.md)", file=sys.stderr)
            return 2
        print(f"CPU: {cpu_model()}", flush=True)
        for step in steps:
            execute(step)
    print(f"== done {time.strftime('%H:%M:%S', time.gmtime())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
