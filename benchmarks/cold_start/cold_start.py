"""Cold start of a `--log-rounds` file: what the rounds that measured a width cost beyond plain decode.

    python3 -m benchmarks.cold_start.cold_start ROUNDS.jsonl [--json]

Definition. A measured round (`measured` true: a cold-start or split measurement) ran a width
for the cost model's sake. Its excess is its time (verify_ms + fixed_ms) less the time plain
decode would take to commit the same tokens, floored at 0:

    excess_r = max(0, verify_ms_r + fixed_ms_r - committed_r * t1)

where t1 is the median time of the file's unmeasured one-row rounds (a plain step; a reply's
own if it has five or more). The cold start of a reply is the sum of its measured rounds'
excess over its decode time (the sum of verify_ms + fixed_ms over its rounds). The headline,
for a file that starts on a fresh store: the whole cold start (every measured round's excess,
in whatever reply it fell) over the first reply's decode time. Per reply shares are reported
too, and how much of the whole is split measurements (``decided_by`` split: a width inside a
class, measured once where it could win, whenever the chooser has held a width long enough, so
also in later replies) against the cold measurements of the ladder (and reach) widths. A short
first reply makes any later measurement a large share.

Rounds that first verified a wide width at its upper bound (``bounded``: the chooser's own
choice at the dearest price, not a measurement) are not in the cold start; their excess, by the
same formula, is reported beside it.

Beside it, what the cold start does not see: a reply's time beyond plain decode of its tokens
over all its rounds (``over_plain_ms`` = decode time - tokens x t1, not floored), which also
counts the drafted rounds that measured nothing (the gates learning whether drafting and the
drafter pay) and the rounds that won. Moving a measurement's cost into unmeasured rounds would
lower the cold start but not this.

Calibration, from the same file: the acceptance model's expected accepted draft tokens over the
tokens the target accepted, by the bench's rule (priced rounds of more than one row, cold
measurements left out): 1.00 is calibrated, above 1 the pricing over-promises.

Load. The counts (measured rounds, their rows, rows beyond what they committed) do not depend
on the machine's load; the time share does, and on a shared machine it is only indicative.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from types import SimpleNamespace

from adaspark_app.bench.runner import CalibrationTally
from adaspark_app.errors import ScriptError
from adaspark_app.runner import read_jsonl


def load(path: Path) -> list[dict]:
    """The rows of a ROUNDS.jsonl file (prefill rows kept: they mark a reply's start); a
    malformed line is a ScriptError naming it (runner.read_jsonl)."""
    return [row for _, row in read_jsonl(str(path), "rounds log")]


def _plain_ms(rows: list[dict]) -> float | None:
    ts = [r["verify_ms"] + r["fixed_ms"] for r in rows
          if not r.get("prefill") and r["width"] == 1 and not r["measured"]]
    return statistics.median(ts) if ts else None


def cold_start(rows: list[dict]) -> dict:
    """Per reply, in file order: measured rounds, rows, excess ms, decode ms and share."""
    replies: dict[tuple[str, int], list[dict]] = {}
    for r in rows:
        replies.setdefault((str(r["conversation"]), int(r["turn"])), []).append(r)
    t1_all = _plain_ms(rows)
    out = []
    for (conv, turn), rs in replies.items():
        rounds = [r for r in rs if not r.get("prefill")]
        own = _plain_ms(rounds)
        n_plain = sum(1 for r in rounds if r["width"] == 1 and not r["measured"])
        t1 = own if own is not None and n_plain >= 5 else t1_all
        measured = [r for r in rounds if r["measured"]]
        bounded = [r for r in rounds if r.get("bounded")]
        decode = sum(r["verify_ms"] + r["fixed_ms"] for r in rounds)

        def _excess(rs: list[dict]) -> float:
            return 0.0 if t1 is None else sum(max(0.0, r["verify_ms"] + r["fixed_ms"] - r["committed"] * t1) for r in rs)
        excess = _excess(measured)
        splits = [r for r in measured if r.get("decided_by") == "split"]
        out.append({
            "conversation": conv, "turn": turn, "rounds": len(rounds), "tokens": sum(r["committed"] for r in rounds),
            "measured_rounds": len(measured), "measured_widths": [r["width"] for r in measured],
            "measured_rows": sum(r["width"] for r in measured),
            "rows_beyond_committed": sum(max(0, r["width"] - r["committed"]) for r in measured),
            "plain_ms": t1, "excess_ms": excess, "decode_ms": decode,
            "share": excess / decode if decode > 0 else 0.0,
            "split_rounds": len(splits), "split_excess_ms": _excess(splits),
            "over_plain_ms": None if t1 is None else decode - sum(r["committed"] for r in rounds) * t1,
            "bounded_rounds": len(bounded), "bounded_widths": [r["width"] for r in bounded],
            "bounded_excess_ms": _excess(bounded),
        })
    total_excess = sum(r["excess_ms"] for r in out)
    total_decode = sum(r["decode_ms"] for r in out)
    first_decode = out[0]["decode_ms"] if out else 0.0
    first_over = out[0]["over_plain_ms"] if out else None
    return {"replies": out, "first_share": out[0]["share"] if out else 0.0,
            "first_over_plain": first_over / first_decode if first_over is not None and first_decode > 0 else None,
            "cold_over_first": total_excess / first_decode if first_decode > 0 else 0.0,
            "total_share": total_excess / total_decode if total_decode > 0 else 0.0,
            "measured_rounds": sum(r["measured_rounds"] for r in out),
            "measured_rows": sum(r["measured_rows"] for r in out),
            "split_rounds": sum(r["split_rounds"] for r in out),
            "split_over_first": (sum(r["split_excess_ms"] for r in out) / first_decode if first_decode > 0 else 0.0),
            "bounded_rounds": sum(r["bounded_rounds"] for r in out),
            "bounded_over_first": (sum(r["bounded_excess_ms"] for r in out) / first_decode if first_decode > 0 else 0.0)}


def calibration(rows: list[dict]) -> tuple[int, float, int]:
    """(tree rounds, expected accepted, accepted), by the bench's rule (``CalibrationTally``:
    priced rounds of more than one row, cold measurements left out)."""
    tally = CalibrationTally()
    for r in rows:
        tally(SimpleNamespace(**r))
    turns = list(tally.by_turn.values())
    return (int(sum(t["rounds"] for t in turns)), sum(t["expected"] for t in turns),
            int(sum(t["accepted"] for t in turns)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("rounds", type=Path, help="ROUNDS.jsonl from adaspark run --log-rounds")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    a = ap.parse_args(argv)
    if not a.rounds.is_file():
        print(f"cold_start: {a.rounds}: no such file", file=sys.stderr)
        return 2
    try:
        rows = load(a.rounds)
    except ScriptError as err:
        print(f"cold_start: {err}", file=sys.stderr)
        return 2
    res = cold_start(rows)
    if a.json:
        print(json.dumps(res, indent=1))
        return 0
    print("reply                     rounds tokens measured rows beyond  excess_ms decode_ms  share  widths")
    for r in res["replies"]:
        print(f"{r['conversation'][:20]:20s} t{r['turn']:<3d} {r['rounds']:6d} {r['tokens']:6d} {r['measured_rounds']:8d}"
              f" {r['measured_rows']:4d} {r['rows_beyond_committed']:6d} {r['excess_ms']:10.1f} {r['decode_ms']:9.1f}"
              f" {100 * r['share']:5.1f}%  {r['measured_widths']}")
    print(f"cold start over the first reply's decode time: {100 * res['cold_over_first']:.1f}%; "
          f"within the first reply: {100 * res['first_share']:.1f}%; over all replies: "
          f"{100 * res['total_share']:.1f}%; {res['measured_rounds']} measured rounds, {res['measured_rows']} rows "
          "(time shares are indicative on a loaded machine; the counts are not)")
    if res["split_rounds"]:
        print(f"of which split measurements (a width learned inside a class, at any age of the store): "
              f"{res['split_rounds']} rounds, {100 * res['split_over_first']:.1f}% of the first reply's decode time; "
              f"the ladder's (and reach's) cold start: {100 * (res['cold_over_first'] - res['split_over_first']):.1f}%")
    if res["bounded_rounds"]:
        print(f"first verifies of wide widths at their upper bound (chosen, not measured): {res['bounded_rounds']} rounds, "
              f"{[w for r in res['replies'] for w in r['bounded_widths']]}; their time beyond plain decode of what they "
              f"committed: {100 * res['bounded_over_first']:.1f}% of the first reply's decode time")
    n, expected, accepted = calibration(rows)
    if n:
        print(f"calibration (expected over accepted draft tokens, {n} priced tree rounds, cold measurements "
              f"left out): {expected:.1f} / {accepted} = {expected / accepted if accepted else float('inf'):.3f}")
    if res["first_over_plain"] is not None:
        print(f"first reply's time beyond plain decode of its tokens, every round: {100 * res['first_over_plain']:.1f}% "
              "of its decode time (negative: faster than plain)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
