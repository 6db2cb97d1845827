"""Table 7's rows for this engine from a bench run's replies.jsonl: verified draft rows and
accepted draft tokens by source (drafter / n-gram / agreed), each source's acceptance rate, and
the rounds the n-gram widened (verified rounds with n-gram rows), the rounds that ran the DSpark
drafter, and accepted draft tokens per round by category.

    python benchmarks/source_table.py REPORT_DIR/replies.jsonl > REPORT_DIR/sources.md
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict

SOURCES = ("drafter", "ngram", "agreed")


def main(path: str) -> None:
    rows = defaultdict(lambda: defaultdict(int))
    acc = defaultdict(lambda: defaultdict(int))
    rounds = defaultdict(int)
    widened = defaultdict(int)
    tokens = defaultdict(int)
    drafted = defaultdict(int)
    by_cat = defaultdict(lambda: defaultdict(lambda: [0, 0]))  # category -> arm -> [accepted, rounds]
    for line in open(path):
        r = json.loads(line)
        arm = r["arm"]
        rounds[arm] += r.get("rounds", 0)
        drafted[arm] += r.get("drafter_rounds", 0)
        cell = by_cat[r.get("category") or "-"][arm]
        cell[0] += sum(r.get("accepted_by_source", {}).values())
        cell[1] += r.get("rounds", 0)
        if "ngram_rounds" in r:
            widened[arm] += r["ngram_rounds"]
        elif not r.get("rows_by_source", {}).get("drafter"):  # older replies: no drafter, so every
            widened[arm] += sum(n for w, n in r.get("widths", {}).items() if int(w) > 1)  # wide round
        tokens[arm] += r.get("n_tokens", 0)
        for s in SOURCES:
            rows[arm][s] += r.get("rows_by_source", {}).get(s, 0)
            acc[arm][s] += r.get("accepted_by_source", {}).get(s, 0)
    print(f"# Draft rows and accepted tokens by source (`{path}`)\n")
    print("| arm | rounds | rounds that ran the drafter | rounds widened by the n-gram "
          "| verified draft rows (drafter / n-gram / agreed) "
          "| accepted draft tokens (drafter / n-gram / agreed) | acceptance rate drafter / n-gram / agreed "
          "| accepted per round |")
    print("|---|---|---|---|---|---|---|---|")
    for arm in sorted(rows):
        if sum(rows[arm].values()) == 0:
            continue
        rr = " / ".join(str(rows[arm][s]) for s in SOURCES)
        aa = " / ".join(str(acc[arm][s]) for s in SOURCES)
        rates = " / ".join(f"{acc[arm][s] / rows[arm][s]:.1%}" if rows[arm][s] else "-" for s in SOURCES)
        per = sum(acc[arm].values()) / max(1, rounds[arm])
        print(f"| `{arm}` | {rounds[arm]} | {drafted[arm]} | {widened[arm]} | {rr} | {aa} | {rates} | {per:.3f} |")
    arms = [a for a in sorted(rows) if sum(rows[a].values())]
    if len(by_cat) > 1:
        print("\n## Accepted draft tokens per round by category\n")
        print("| category | " + " | ".join(f"`{a}`" for a in arms) + " |")
        print("|---|" + "---|" * len(arms))
        for cat in sorted(by_cat):
            cells = [by_cat[cat][a] for a in arms]
            print(f"| {cat} | " + " | ".join(f"{c[0] / c[1]:.3f}" if c[1] else "-" for c in cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1])
