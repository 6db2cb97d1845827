"""Wide widths at an upper bound against the cold measurement it replaced, interleaved in one process.

    python benchmarks/wide_bound.py SCRIPT.jsonl [--model M] [--drafter default] [--passes 1] [--max-tokens 128]

Three engines, each with fresh learners: `ar`; adaspark measuring the unmeasured ladder widths of
16 rows and more where they could win at a lower bound on their price ("before",
``VerifyCostModel.bound_wide = False``, the rule until session 30); adaspark offering them at an
upper bound instead ("now"). Conversations run in rotating arm order (``interleaved.compare``).
Printed: the speed table (ratios against `ar` and now / before, 95% bootstrap intervals over
conversations, replies identical to `ar`), then per adaspark arm the cold start of its rounds
(``cold_start.py``'s definition, on a fresh store: the whole cold start over the first reply's
decode time, and the first verifies at a bound beside it) and its calibration (expected accepted
tokens over accepted, on tree rounds).
"""

from __future__ import annotations

import argparse
import json

from cold_start import calibration, cold_start  # benchmarks/ is the script's own directory
from interleaved import compare

from adaspark_app import native
from adaspark_app.engine.chat_engine import ChatEngine


def _engine(model: str | None, drafter: str | None, arm: str, bound_wide: bool = True) -> ChatEngine:
    eng = ChatEngine(model, drafter_path=drafter, arm=arm, n_ctx=4096, n_threads=2)
    eng.decoder.scheduler.cost.bound_wide = bound_wide
    return eng


def main() -> None:
    native.activate()  # the patched kernels, if built, before anything imports llama_cpp
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("script")
    ap.add_argument("--model", default=None, help="GGUF (default: the bundled SmolLM2)")
    ap.add_argument("--drafter", default=None, help="'default' for the bundled model's drafter")
    ap.add_argument("--passes", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--rounds-out", default=None, help="write each adaspark arm's rounds to PREFIX-ARM.jsonl")
    a = ap.parse_args()
    arms = {"ar": _engine(a.model, None, "ar"), "before": _engine(a.model, a.drafter, "adaspark", False),
            "now": _engine(a.model, a.drafter, "adaspark")}
    rounds: dict[str, list[dict]] = {}
    print("\n" + compare(arms, a.script, a.passes, a.max_tokens, rounds))
    print("\n| arm | cold start / first reply | first verifies at a bound / first reply | measured rounds |"
          " tree rounds | calibration |\n|---|---|---|---|---|---|")
    for name in ("before", "now"):
        if a.rounds_out:
            with open(f"{a.rounds_out}-{name}.jsonl", "w", encoding="utf-8") as fp:
                fp.writelines(json.dumps(r) + "\n" for r in rounds[name])
        cs = cold_start(rounds[name])
        n, exp, acc = calibration(rounds[name])
        cal = f"{exp / acc:.3f}" if acc else "-"
        print(f"| {name} | {100 * cs['cold_over_first']:.1f}% | {100 * cs['bounded_over_first']:.1f}% "
              f"({cs['bounded_rounds']} rounds) | {cs['measured_rounds']} ({cs['measured_rows']} rows) | {n} | {cal} |")


if __name__ == "__main__":
    main()
