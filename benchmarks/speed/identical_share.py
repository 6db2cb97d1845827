"""Identical share of each arm against the base arm, from an `adaspark bench` replies.jsonl.

Works on a run cut short too (the bench writes each reply as it completes): only replies whose
base-arm counterpart (same conversation, turn and repeat) exists count. Prints per arm the
identical count, the total, the verify widths used, and each differing reply with the first
character where it departs.

    python -m benchmarks.speed.identical_share REPORT_DIR/replies.jsonl [--base ar]
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

from benchmarks.common import read_jsonl


def shares(rows: list[dict], base: str = "ar") -> dict[str, dict]:
    """arm -> {"identical", "total", "widths", "differ": [(conversation, turn, first diff char)]}."""
    ref = {(r["conversation"], r["turn"], r.get("repeat", 0)): r["text"] for r in rows if r["arm"] == base}
    out: dict[str, dict] = {}
    for r in rows:
        if r["arm"] == base:
            continue
        key = (r["conversation"], r["turn"], r.get("repeat", 0))
        if key not in ref:
            continue
        a = out.setdefault(r["arm"], {"identical": 0, "total": 0, "widths": Counter(), "differ": []})
        a["total"] += 1
        a["widths"].update({int(w): n for w, n in r.get("widths", {}).items()})
        if r["text"] == ref[key]:
            a["identical"] += 1
        else:
            first = next((i for i, (x, y) in enumerate(zip(r["text"], ref[key])) if x != y),
                         min(len(r["text"]), len(ref[key])))
            a["differ"].append((r["conversation"], r["turn"], first))
    return out


def main(argv: list[str] | None = None) -> int:
    """CLI entry point: 0 if every compared reply is identical, else 1."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("replies", type=Path)
    ap.add_argument("--base", default="ar")
    a = ap.parse_args(argv)
    rows = read_jsonl(a.replies)
    res = shares(rows, a.base)
    ok = True
    for arm, s in res.items():
        ok &= s["identical"] == s["total"]
        widths = ", ".join(f"{w}:{n}" for w, n in sorted(s["widths"].items()))
        print(f"{arm}: {s['identical']}/{s['total']} identical to {a.base}; rounds by width {widths}")
        for conv, turn, at in s["differ"]:
            print(f"  differs: {conv} turn {turn} from char {at}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
