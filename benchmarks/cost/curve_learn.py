"""What the verify-cost model learns of a measured curve, and whether the widths it picks pay.

    python -m benchmarks.cost.curve_learn PROBE.json [--pick SHAPE/MODE] [--acceptance paste|chat]
        [--requests 3] [--rounds 200] [--seed 7] [--out FILE.md]

PROBE.json (or PROBE.json.gz) is a probe's output (`benchmarks/gpu/run.sh` gathers one per model shape and kernel
mode in probes.json: pick one with ``--pick q7/exact``): the one-row time and T(n)/T(1) per context for the widths it measured. The true curve
T(n, c) is that table, linear in n between measured widths and in c between the measured
contexts (held flat outside them). AdaSpark's width scheduler then runs seeded rounds on it
(``benchmarks/sim/learn_sim.py``: trees with a known acceptance law, verify times with jitter and
interference, D = 3 ms), requests starting at each measured context. Per context band it reports:

- the learned price of every width the scheduler offers, beside the measured T(n), both over
  the measured one-row time: does the learned curve follow the steps?
- the scheduler's decode rate against the best pinned width and plain decode, and the widths it
  verified: does it pick widths that pay?

``--acceptance``: ``paste`` (n-gram copies in half the rounds, the drafter's picks at 0.7) or
``chat`` (copies in a fifth of the rounds, picks at 0.6); the drafter block has 8 positions.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from adaspark_app.learn.law import context_band
from benchmarks.common import emit_report, open_text
from benchmarks.sim.learn_sim import Acceptance, Machine, interp_table, simulate

ACCEPTANCE = {"paste": Acceptance(pick=0.7, ngram_share=0.5), "chat": Acceptance(pick=0.6, ngram_share=0.2)}


def load_curve(path: str | Path, pick: str | None = None):
    """(curve(n, c) in seconds, {context: {width: measured seconds}}) from a probe's JSON, or with
    ``pick`` ("SHAPE/MODE", e.g. "q7/exact") from run.sh's probes.json ({shape: {mode: probe}})."""
    with open_text(path) as fh:  # plain, or .json.gz as committed where the tree needs the room
        probe = json.load(fh)
    if pick:
        shape, _, mode = pick.partition("/")
        probe = probe.get(shape, {}).get(mode) if isinstance(probe, dict) else None
        if probe is None:
            raise ValueError(f"{path}: no probe {pick!r} in it")
    curves = probe.get("curves") if isinstance(probe, dict) else None
    if not curves:
        raise ValueError(f"{path}: no 'curves' (a probe's output has one per context)")
    table: dict[int, dict[int, float]] = {}
    for ctx, entry in curves.items():
        one = float(entry["one_row_ms"]) / 1e3
        table[int(ctx)] = {int(n): one * float(r) for n, r in entry["ratio"].items()}
    contexts = sorted(table)

    def at_context(n, c: int) -> np.ndarray:
        per = [interp_table(table[k], n) for k in contexts]
        if len(contexts) == 1:
            return per[0]
        return np.array([np.interp(c, contexts, [p[i] for p in per]) for i in range(np.size(n))]).reshape(np.shape(n))

    def curve(n, c: int):
        out = at_context(np.atleast_1d(n), int(c))
        return out if np.ndim(n) else float(out[0])

    return curve, table


def run(path: str | Path, acceptance: str = "paste", requests: int = 3, rounds: int = 200,
        seed: int = 7, pick: str | None = None) -> list[str]:
    curve, table = load_curve(path, pick)
    contexts = sorted(table)
    reqs = [(c, rounds) for c in contexts] * requests
    res = simulate(Machine(curve), ACCEPTANCE[acceptance], reqs, seed=seed)
    sch = res.scheduler
    lines = [f"# What AdaSpark learns of `{Path(path).name}`'s verify curve ({acceptance} acceptance)", "",
             f"`python -m benchmarks.cost.curve_learn {path} --acceptance {acceptance} --requests {requests} "
             f"--rounds {rounds} --seed {seed}`", "",
             "Simulated rounds on the measured curve; prices and times over the measured one-row time at that "
             "context. Decode rates are on expected tokens and noise-free times (benchmarks/sim/learn_sim.py).", ""]
    for c in contexts:
        one = table[c][1] if 1 in table[c] else float(curve(1, c))
        band = context_band(c)
        prices = sch.price_table(c)
        widths = sorted(set(prices) | set(table[c]))
        lines += [f"## Context {c} (band {band})", "", "| width | measured T(n)/T(1) | learned price / T(1) |",
                  "|---|---|---|"]
        for w in widths:
            meas = f"{table[c][w] / one:.3f}" if w in table[c] else ""
            learned = f"{prices[w] / one:.3f}" if w in prices else ""
            lines.append(f"| {w} | {meas} | {learned} |")
        sc = res.bands.get(band)
        if sc is not None and sc.rounds:
            best_w, best = sc.best_pinned()
            used = ", ".join(f"{w}: {n}" for w, n in sorted(sc.widths.items()))
            lines += ["", f"Decode rate {sc.rate():.1f} tok/s over {sc.rounds} rounds: "
                      f"{sc.rate() / best:.3f}x the best pinned width ({best_w} rows, {best:.1f} tok/s), "
                      f"{sc.rate() / sc.plain_rate():.3f}x plain decode. Widths verified: {used}."]
        lines.append("")
    return lines


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("probe")
    ap.add_argument("--pick", default=None, help="SHAPE/MODE of run.sh's probes.json, e.g. q7/exact")
    ap.add_argument("--acceptance", choices=sorted(ACCEPTANCE), default="paste")
    ap.add_argument("--requests", type=int, default=3, help="requests per measured context")
    ap.add_argument("--rounds", type=int, default=200, help="rounds per request")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    emit_report(run(a.probe, a.acceptance, a.requests, a.rounds, a.seed, a.pick), a.out)


if __name__ == "__main__":
    main()
