"""Does a change keep AdaSpark's speed and its identity to plain decode? Two checkouts, one set.

The same `adaspark bench SET --arms ar,adaspark` runs with each checkout's code (``--base``, a
worktree of the reference commit, and ``--head``, default this checkout), the checkouts in turn,
``--pairs`` times each (A B, B A, A B, ...: a drift of the machine hits both alike). Within a run
the arms are interleaved per conversation, so each run's adaspark/ar ratio is already free of the
machine's slow drift; the question is whether that ratio moved. Per conversation, the geometric
mean of a reply's adaspark/ar speed ratio is taken over every run of a checkout; the figure is
head over base, the geometric mean over conversations with a 95% bootstrap interval over them.
Identity: every run's `adaspark` reply equals its `ar` reply, and `ar`'s replies are the same
under both checkouts (the code under test did not change what plain decode emits).

    python -m benchmarks.speed.code_ab SET.jsonl --base /path/to/reference-checkout \\
        [--head .] [--model GGUF] [--pairs 2] [--max-tokens 128] [--start-store DB] [--temperature T] --out DIR

``--start-store DB``: every run's adaspark arm starts from a copy of that learned store (what a
user's store holds after earlier sessions) instead of an empty one; the copy learns on through
the run as a chat's would.

Each checkout needs its native kernels built (or a link to a build of the same kernels); each
run's report says which kernels ran. Writes DIR/<side>-<k>/ (the bench reports) and DIR/ab.md.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

from adaspark_app.bench.stats import bootstrap_interval, geometric_mean
from benchmarks.common import ROOT, cpu_model, read_jsonl

ARMS = ("ar", "adaspark")


def run_side(checkout: Path, script: Path, out: Path, model: str | None, max_tokens: int,
             start_store: Path | None = None, temperature: float = 0.0) -> None:
    """`adaspark bench` with the package of `checkout` (its own adaspark_app first on the path);
    the adaspark arm from a copy of `start_store` where one is given."""
    argv = [sys.executable, "-m", "adaspark_app.cli", "bench", str(script), "--arms", ",".join(ARMS),
            "--max-tokens", str(max_tokens), "--keep-capped", "--no-progress", "--report", str(out)]
    if model:
        argv += ["--model", model]
    if temperature > 0:  # sampled, llama.cpp's other defaults, one seed: every arm draws the same reply
        argv += ["--temperature", str(temperature), "--seed", "7"]
    if start_store is not None:
        stores = out / "stores"
        stores.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(start_store, stores / "adaspark.db")
        argv += ["--store-dir", str(stores)]
    env = dict(os.environ, PYTHONPATH=str(checkout))
    subprocess.run(argv, cwd=checkout, env=env, check=True)


def replies_file(run_dir: Path) -> Path:
    """A run's replies: replies.jsonl as the bench wrote it, or replies.jsonl.gz as it is committed."""
    plain = run_dir / "replies.jsonl"
    return plain if plain.is_file() else run_dir / "replies.jsonl.gz"


def reply_ratios(replies: list[dict]) -> tuple[dict[str, list[float]], dict[tuple[str, int], tuple[str, str]]]:
    """Per conversation, log(adaspark speed / ar speed) of each reply; and per (conversation,
    turn) the two arms' texts."""
    by: dict[tuple[str, int], dict[str, dict]] = defaultdict(dict)
    for r in replies:
        by[(r["conversation"], int(r["turn"]))][r["arm"]] = r
    logs: dict[str, list[float]] = defaultdict(list)
    texts = {}
    for (conv, turn), arms in sorted(by.items()):
        if not all(a in arms for a in ARMS):
            continue
        ar, ada = arms["ar"], arms["adaspark"]
        texts[(conv, turn)] = (ar["text"], ada["text"])
        if ar["n_tokens"] > 0 and ada["n_tokens"] > 0 and ar["decode_s"] > 0 and ada["decode_s"] > 0:
            logs[conv].append(math.log((ada["n_tokens"] / ada["decode_s"]) / (ar["n_tokens"] / ar["decode_s"])))
    return logs, texts


def compare(base_runs: list[list[dict]], head_runs: list[list[dict]]) -> dict:
    """Head's adaspark/ar against base's, per conversation, and the identity counts."""
    per_side = []
    for runs in (base_runs, head_runs):
        logs: dict[str, list[float]] = defaultdict(list)
        texts: list[dict] = []
        for replies in runs:
            lg, tx = reply_ratios(replies)
            for conv, xs in lg.items():
                logs[conv].extend(xs)
            texts.append(tx)
        per_side.append((logs, texts))
    (blogs, btexts), (hlogs, htexts) = per_side
    convs = sorted(set(blogs) & set(hlogs))
    if not convs:
        raise SystemExit("code_ab: the runs share no conversation with replies under both arms")
    mean = {name: {c: [sum(logs[c]) / len(logs[c])] for c in convs} for name, logs in (("base", blogs), ("head", hlogs))}
    diffs = {c: [mean["head"][c][0] - mean["base"][c][0]] for c in convs}
    identical = sum(a == b for tx in btexts + htexts for a, b in tx.values())
    replies = sum(len(tx) for tx in btexts + htexts)
    ar_same = sum(btexts[0][k][0] == tx[k][0] for tx in htexts for k in tx if k in btexts[0])
    ar_pairs = sum(1 for tx in htexts for k in tx if k in btexts[0])
    return {
        "conversations": len(convs),
        "head_over_base": geometric_mean(math.exp(d[0]) for d in diffs.values()),
        "interval": bootstrap_interval(diffs),
        "base": geometric_mean(math.exp(v[0]) for v in mean["base"].values()),
        "head": geometric_mean(math.exp(v[0]) for v in mean["head"].values()),
        "base_interval": bootstrap_interval(mean["base"]),
        "head_interval": bootstrap_interval(mean["head"]),
        "identical": (identical, replies),
        "ar_same": (ar_same, ar_pairs),
    }


def report(res: dict, args: argparse.Namespace) -> str:
    lo, hi = res["interval"]
    return "\n".join([
        f"# Code A/B on `{Path(args.script).name}`",
        "",
        f"`python -m benchmarks.speed.code_ab {args.script} --base {args.base} --head {args.head} "
        f"--pairs {args.pairs} --max-tokens {args.max_tokens}" + (f" --model {args.model}" if args.model else "")
        + (f" --start-store {args.start_store}" if args.start_store else "")
        + (f" --temperature {args.temperature:g}" if args.temperature > 0 else "")
        + f" --out {args.out}`; {cpu_model()}, {os.cpu_count()} CPUs.",
        "",
        "| | value |",
        "|---|---|",
        f"| adaspark/ar, base | {res['base']:.3f}x [{res['base_interval'][0]:.3f}, {res['base_interval'][1]:.3f}] |",
        f"| adaspark/ar, head | {res['head']:.3f}x [{res['head_interval'][0]:.3f}, {res['head_interval'][1]:.3f}] |",
        f"| head over base (geometric mean over conversations, 95% bootstrap) | **{res['head_over_base']:.3f}x "
        f"[{lo:.3f}, {hi:.3f}]** over {res['conversations']} conversations |",
        f"| adaspark replies identical to ar's, every run | {res['identical'][0]}/{res['identical'][1]} |",
        f"| ar's replies the same under both checkouts | {res['ar_same'][0]}/{res['ar_same'][1]} |",
        "",
    ])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("script", help="a SCRIPT.jsonl (e.g. a set of benchmarks/sets/)")
    ap.add_argument("--base", required=True, help="the reference checkout (its root)")
    ap.add_argument("--head", default=str(ROOT), help="the checkout under test (default: this one)")
    ap.add_argument("--model", default=None, help="target GGUF (default: the bundled model)")
    ap.add_argument("--pairs", type=int, default=2, help="runs of each checkout (default 2)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--out", required=True, metavar="DIR")
    ap.add_argument("--start-store", default=None, metavar="DB",
                    help="the adaspark arm of every run starts from a copy of this learned store")
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="sample at this temperature with seed 7 and llama.cpp's other defaults (default 0: greedy)")
    ap.add_argument("--report-only", action="store_true", help="read DIR's runs; run nothing")
    args = ap.parse_args(argv)
    script = Path(args.script).resolve()
    if not script.is_file():
        print(f"code_ab: error: no script {args.script}", file=sys.stderr)
        return 2
    if args.pairs < 1:
        print("code_ab: error: --pairs must be at least 1", file=sys.stderr)
        return 2
    if args.temperature < 0:
        print("code_ab: error: --temperature must be at least 0 (0 is greedy)", file=sys.stderr)
        return 2
    start = Path(args.start_store).resolve() if args.start_store else None
    if start is not None and not start.is_file():
        print(f"code_ab: error: no store {args.start_store}", file=sys.stderr)
        return 2
    out = Path(args.out)
    sides = {"base": Path(args.base).resolve(), "head": Path(args.head).resolve()}
    for name, path in sides.items():
        if not (path / "adaspark_app" / "__init__.py").is_file():
            print(f"code_ab: error: --{name} {path} is not a checkout of AdaSpark", file=sys.stderr)
            return 2
    if not args.report_only:
        for k in range(args.pairs):
            for name in (("base", "head") if k % 2 == 0 else ("head", "base")):
                print(f"== {name} run {k + 1}", flush=True)
                run_side(sides[name], script, (out / f"{name}-{k + 1}").resolve(), args.model, args.max_tokens, start,
                         args.temperature)
    runs = {name: [read_jsonl(replies_file(out / f"{name}-{k + 1}")) for k in range(args.pairs)] for name in sides}
    text = report(compare(runs["base"], runs["head"]), args)
    (out / "ab.md").write_text(text, encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
