"""`adaspark explain ROUNDS.jsonl`: per reply, which layer decided each round's width, and what it cost.

Every ROUNDS.jsonl row carries its decision trace (`decided_by`, `argmax`, `values`, ...). A round
that the chooser decided verified its best-scored width (Eq. 7, or the per-round ratio until the
band's rate is known); every other layer (a cold, split or recheck measurement, hysteresis, the CUSUM, a
stand-in, a clamp) verified another width, and its cost is what it gave up against that choice:
V(argmax) - V(width), in tokens at the round's price of time rho, and in milliseconds at that
price. (In ratio mode the ratio's best need not be V's best, so a cost can be negative.) A round the gates made plain built no tree, so it
has no values to compare, and a measured width has no price until its measurements are in: such
rounds are counted, not priced.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any, TextIO

from .errors import ScriptError
from .runner import read_jsonl
from .wording import counted, printable
from .learn.kinds import Decider

REQUIRED = ("conversation", "turn", "width", "decided_by")
#: Layers that make a round a plain step before any tree is built: nothing to price.
PLAIN_LAYERS = {Decider.DRAFT_GATE.value, Decider.DRAFTER_GATE.value, Decider.NO_PROPOSAL.value,
                Decider.ARM.value, Decider.PLAIN_ONLY.value}


@dataclass
class LayerTally:
    """The rounds one layer decided in a reply and what they cost against the chooser's choice."""

    rounds: int = 0
    priced: int = 0  # rounds with values for both the chosen width and the argmax
    cost_tokens: float = 0.0
    cost_ms: float = 0.0


@dataclass
class ReplyAccount:
    """One reply's rounds by deciding layer."""

    conversation: str
    turn: int
    rounds: int = 0
    committed: int = 0
    draft_skipped: int = 0
    drafter_skipped: int = 0
    layers: dict[str, LayerTally] = field(default_factory=dict)


def round_cost(row: dict[str, Any]) -> tuple[float, float] | None:
    """(tokens, ms) the round's width gave up against Eq. (7)'s best width, or None if unpriced."""
    values = row.get("values") or {}
    best, width, rho = row.get("argmax"), row.get("width"), row.get("rho")
    if best is None or not values:
        return None
    vb, vw = values.get(str(best)), values.get(str(width))
    if vb is None or vw is None:
        return None
    tokens = float(vb) - float(vw)
    ms = tokens / float(rho) * 1e3 if rho else 0.0
    return tokens, ms


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _wrong_field(row: dict[str, Any]) -> str | None:
    """What is wrong with a row's fields that the account reads (a log edited by hand, or
    written by another version), or None."""
    if not isinstance(row["conversation"], (str, int)) or isinstance(row["conversation"], bool):
        return '"conversation" must be a string'
    for name in ("turn", "width"):
        if not _is_int(row[name]):
            return f'"{name}" must be an integer'
    if not isinstance(row["decided_by"], str):
        return '"decided_by" must be a string'
    if row.get("committed") is not None and not _is_int(row["committed"]):
        return '"committed" must be an integer'
    values = row.get("values")
    if values is not None and not (isinstance(values, dict) and all(_is_number(v) for v in values.values())):
        return '"values" must map widths to numbers'
    if row.get("rho") is not None and not _is_number(row["rho"]):
        return '"rho" must be a number'
    if row.get("argmax") is not None and not (_is_int(row["argmax"]) or isinstance(row["argmax"], str)):
        return '"argmax" must be a width'
    return None


def read_rounds(path: str) -> list[dict[str, Any]]:
    """Read ROUNDS.jsonl; a missing file or a malformed row is a ScriptError naming the line."""
    rows = []
    for n, row in read_jsonl(path, "rounds log"):
        if not isinstance(row, dict):
            raise ScriptError(f"{path}:{n}: expected a JSON object")
        missing = [k for k in REQUIRED if k not in row]
        if missing:
            raise ScriptError(f"{path}:{n}: not a ROUNDS.jsonl row with a decision trace "
                              f"(missing {', '.join(missing)}; written by an older adaspark?)")
        wrong = _wrong_field(row)
        if wrong:
            raise ScriptError(f"{path}:{n}: {wrong}")
        rows.append(row)
    if not rows:
        raise ScriptError(f"{path}: the rounds log has no rounds")
    return rows


def account(rows: list[dict[str, Any]]) -> list[ReplyAccount]:
    """Group rounds by reply, in the order the replies first appear."""
    replies: dict[tuple[str, int], ReplyAccount] = {}
    for row in rows:
        key = (str(row["conversation"]), int(row["turn"]))
        acc = replies.get(key)
        if acc is None:
            acc = replies[key] = ReplyAccount(*key)
        acc.rounds += 1
        acc.committed += int(row.get("committed", 0))
        acc.draft_skipped += int(bool(row.get("draft_skipped")))
        acc.drafter_skipped += int(bool(row.get("drafter_skipped")))
        tally = acc.layers.setdefault(str(row["decided_by"]), LayerTally())
        tally.rounds += 1
        cost = round_cost(row)
        if cost is not None:
            tally.priced += 1
            tally.cost_tokens += cost[0]
            tally.cost_ms += cost[1]
    return list(replies.values())


def _layer_line(name: str, t: LayerTally, rounds: int) -> str:
    share = 100.0 * t.rounds / max(rounds, 1)
    if name == Decider.CHOOSER.value:
        cost = "its own choice"
    elif t.priced == 0:
        cost = "no tree built" if name in PLAIN_LAYERS else "width not priced yet (being measured)"
    else:
        unpriced = f", {t.rounds - t.priced} unpriced" if t.priced < t.rounds else ""
        cost = f"cost {t.cost_tokens:.2f} tokens ({t.cost_ms:.1f} ms at rho){unpriced}"
    rounds_word = "round " if t.rounds == 1 else "rounds"  # the column stays aligned
    return f"  {printable(name):<13} {t.rounds:>5} {rounds_word} {share:5.1f}%  {cost}"


def write_report(accounts: list[ReplyAccount], out: TextIO) -> None:
    """A short account per reply, then the run's totals."""
    total = ReplyAccount("all replies", -1)
    for acc in accounts:
        out.write(f"{printable(str(acc.conversation))} turn {acc.turn}: {counted(acc.rounds, 'round')}, "
                  f"{counted(acc.committed, 'token')}"
                  f" (draft gate skipped {acc.draft_skipped}, drafter left out {acc.drafter_skipped})\n")
        for name, t in sorted(acc.layers.items(), key=lambda kv: -kv[1].rounds):
            out.write(_layer_line(name, t, acc.rounds) + "\n")
            agg = total.layers.setdefault(name, LayerTally())
            agg.rounds += t.rounds
            agg.priced += t.priced
            agg.cost_tokens += t.cost_tokens
            agg.cost_ms += t.cost_ms
        total.rounds += acc.rounds
        total.committed += acc.committed
        total.draft_skipped += acc.draft_skipped
        total.drafter_skipped += acc.drafter_skipped
    replies = counted(len(accounts), "reply", "replies")
    out.write(f"\n{'all ' if len(accounts) > 1 else ''}{replies}: {counted(total.rounds, 'round')}, "
              f"{counted(total.committed, 'token')}"
              f" (draft gate skipped {total.draft_skipped}, drafter left out {total.drafter_skipped})\n")
    for name, t in sorted(total.layers.items(), key=lambda kv: -kv[1].rounds):
        out.write(_layer_line(name, t, total.rounds) + "\n")


def cmd_explain(args: argparse.Namespace) -> int:
    import sys

    write_report(account(read_rounds(args.rounds)), sys.stdout)
    return 0


def add_parser(sub: Any) -> None:
    """Register `adaspark explain` on the CLI's subparsers."""
    p = sub.add_parser("explain", help="per-reply account of what decided each round's width")
    p.add_argument("rounds", help="ROUNDS.jsonl written by `adaspark run --log-rounds`")
    p.set_defaults(func=cmd_explain)
