"""Replay a `--log-rounds` file's verifies through the verify-cost model, and score its prices.

    python -m benchmarks.cost.cost_replay ROUNDS.jsonl [--levels min:8,q:16,med:16,none:8]

Each non-prefill round's verify (width, context, verify_ms) is priced by a fresh
``VerifyCostModel`` before the model learns from it, as the scheduler's cost model would have
learned it in that run (a reply's first round is priced but not learned from; the law is refit at
each reply's end). The choices are the run's own, so this judges the pricing, not the choosing.
Per width: how many verifies were priced, the mean of log(measured / price) (its bias: the law is a
15% quantile, so above 0 by design) and its standard deviation (its precision, which is what
decides between neighbouring widths); and the spread of the price of 4 rows over 3 rows.

``--levels`` compares rules for a class's level (Eq. 5): ``min:N`` the least measured / law over
the last N verifies (the shipped rule is min:8), ``q:N`` the 15% quantile of the last N,
``med:N`` their median, ``none:N`` no level. Pure: no model is loaded.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections import deque
from pathlib import Path

import adaspark_app.learn.cost as cost
from adaspark_app.learn.constants import TAU_QUANTILE
from adaspark_app.errors import ScriptError
from adaspark_app.runner import read_jsonl

WIDTHS = (1, 2, 3, 4, 8)


def level_rule(kind: str, window: int):
    """RowClass.update_level with another rule (see the module docstring)."""
    if kind not in ("min", "q", "med", "none") or window < 1:
        raise ValueError(f"unknown level rule {kind}:{window}")

    def update_level(self: cost.RowClass) -> None:
        if not self.law.ready or not self.recent:
            self.level = 1.0
            return
        rs = sorted(t / self.law.seconds(c) for c, t in list(self.recent)[-window:])
        lv = {"min": rs[0], "q": rs[min(len(rs) - 1, int(len(rs) * TAU_QUANTILE))],
              "med": rs[len(rs) // 2], "none": 1.0}[kind]
        self.level = min(max(lv, cost.LEVEL_CLAMP[0]), cost.LEVEL_CLAMP[1])

    return update_level


def replay(rows: list[dict], kind: str = "min", window: int = cost.LEVEL_WINDOW) -> dict:
    """{"errors": {width: [log(measured / price)]}, "ratio_4_3": [price(4) / price(3)]}."""
    shipped = cost.RowClass.update_level
    cost.RowClass.update_level = level_rule(kind, window)
    try:
        widths = sorted({int(r["width"]) for r in rows if not r.get("prefill")} | set(cost.LADDER))
        model = cost.VerifyCostModel(ladder=tuple(w for w in widths if w <= 64))
        for cls in model.classes.values():
            cls.recent = deque(maxlen=max(window, cost.LEVEL_WINDOW))
        errors: dict[int, list[float]] = {w: [] for w in WIDTHS}
        ratio: list[float] = []
        first = True
        for r in rows:
            if r.get("prefill"):
                model.end_request()
                first = True
                continue
            c, w, t = int(r["context"]), int(r["width"]), float(r["verify_ms"]) / 1000.0
            if t <= 0.0:
                continue
            if w in errors and model.is_priced(w):
                errors[w].append(math.log(t / model.raw_price(w, c)))
            if w in (3, 4) and model.is_priced(3) and model.is_priced(4):
                ratio.append(model.raw_price(4, c) / model.raw_price(3, c))
            if not first:
                if w > 1:
                    model.note_fixed(float(r.get("fixed_ms") or 0.0) / 1000.0)
                model.observe(w, c, t)
            first = False
        return {"errors": errors, "ratio_4_3": ratio}
    finally:
        cost.RowClass.update_level = shipped


def summary(res: dict) -> str:
    parts = []
    for w, e in res["errors"].items():
        if len(e) >= 2:
            parts.append(f"w{w} n={len(e)} bias {statistics.fmean(e):+.2f} sd {statistics.pstdev(e):.3f}")
    r = sorted(res["ratio_4_3"])
    if r:
        parts.append(f"price 4/3 rows: median {r[len(r) // 2]:.2f}, "
                     f"10-90% {r[int(len(r) * 0.1)]:.2f}-{r[int(len(r) * 0.9)]:.2f}")
    return "; ".join(parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rounds", type=Path)
    ap.add_argument("--levels", default="min:8,q:16,med:16,none:8")
    args = ap.parse_args(argv)
    try:
        rules = [(k, int(n)) for k, n in (x.split(":") for x in args.levels.split(","))]
        for k, n in rules:
            level_rule(k, n)
        rows = [row for _, row in read_jsonl(str(args.rounds), "rounds log")]
        for k, n in rules:
            print(f"{k}:{n}  {summary(replay(rows, k, n))}")
    except (ValueError, KeyError, ScriptError, OSError) as e:
        print(f"cost_replay: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
