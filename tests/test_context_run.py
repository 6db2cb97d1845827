"""`adaspark run` past the context: every turn answers, each reply is written as it completes, and
a message too long for the context is one line naming the script line and turn, exit 2."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.model, pytest.mark.long]

TOPICS = ["rivers", "volcanoes", "bridges", "deserts", "glaciers", "forests", "islands", "canals",
          "mountains", "lakes", "caves", "reefs", "valleys", "storms", "tides", "comets", "metals",
          "clocks", "maps", "trains"]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "adaspark_app.cli", "run", *args], capture_output=True,
                          text=True, timeout=900)


def _rows(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_eight_turns_at_n_ctx_256_answer_every_turn(tmp_path):
    """The context fills after three turns; from then on each turn drops the oldest turns."""
    turns = [f"Tell me something interesting about {t}, and explain in a few plain sentences why people "
             f"have long been fascinated by {t} in many different parts of the world." for t in TOPICS[:8]]
    script = tmp_path / "long.jsonl"
    script.write_text(json.dumps({"id": "long", "system": "You answer briefly.", "turns": turns}) + "\n")
    out = tmp_path / "out.jsonl"
    proc = _run(str(script), "--n-ctx", "256", "--max-tokens", "24", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    rows = _rows(out)
    assert [r["turn"] for r in rows] == list(range(8))
    assert all(r["conversation"] == "long" and r["n_tokens"] > 0 and r["text"].strip() for r in rows)
    dropped = [r["dropped_turns"] for r in rows]
    assert dropped == sorted(dropped) and dropped[0] == 0 and dropped[-1] > 0, dropped
    assert sum(d > 0 for d in dropped) >= 3, dropped  # several turns ran with turns dropped
    assert all(r["prompt_length"] + 24 <= 255 for r in rows)


def test_a_too_long_message_exits_2_naming_line_and_turn_and_keeps_earlier_replies(tmp_path):
    huge = " ".join(f"word{i}" for i in range(700))
    script = tmp_path / "script.jsonl"
    script.write_text(json.dumps({"id": "a", "turns": ["Say hello.", "Say goodbye."]}) + "\n"
                      + json.dumps({"id": "b", "turns": ["Name a colour.", huge, "Never reached."]}) + "\n")
    out = tmp_path / "out.jsonl"
    proc = _run(str(script), "--n-ctx", "256", "--max-tokens", "8", "--out", str(out))
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "script.jsonl:2" in lines[0] and "turn 2" in lines[0] and "'b'" in lines[0], lines[0]
    assert "message is" in lines[0] and "the context holds 256" in lines[0], lines[0]
    rows = _rows(out)
    assert [(r["conversation"], r["turn"]) for r in rows] == [("a", 0), ("a", 1), ("b", 0)]
    assert all(r["text"].strip() for r in rows)
