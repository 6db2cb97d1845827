"""benchmarks/cost/cost_replay.py: replaying logged verifies through the cost model, on rounds written
by hand with known times (pure, no model)."""

from __future__ import annotations

import json

import pytest

from benchmarks.cost import cost_replay


def _rows(n: int, slow_from: int | None = None, factor: float = 1.3) -> list[dict]:
    """One reply: a prefill row, then plain steps of 10 ms and every 4th round a 4-row verify of
    15 ms, at a context that grows by one; from round ``slow_from`` on the machine runs ``factor``
    slower."""
    rows = [{"prefill": True, "width": 1, "context": 100, "verify_ms": 50.0, "fixed_ms": 0.0}]
    for k in range(n):
        w = 4 if k % 4 == 3 else 1
        t = 15.0 if w == 4 else 10.0
        if slow_from is not None and k >= slow_from:
            t *= factor
        rows.append({"width": w, "context": 100 + k, "verify_ms": t, "fixed_ms": 1.0 if w > 1 else 0.0})
    return rows


def test_steady_times_are_priced_exactly_once_learned():
    res = cost_replay.replay(_rows(200))
    for w in (1, 4):
        tail = res["errors"][w][-10:]
        assert len(tail) == 10 and max(abs(e) for e in tail) < 0.01, (w, tail)
    assert res["ratio_4_3"] == [], "3 rows never ran: no price of 3 rows to compare"


def test_the_shipped_level_follows_a_slower_machine_and_no_level_does_not():
    rows = _rows(400, slow_from=200)
    shipped = cost_replay.replay(rows, "min", 8)["errors"][1]
    flat = cost_replay.replay(rows, "none", 8)["errors"][1]
    # 150 plain steps ran on the slower machine: min of 8 caught up within 8 of them
    assert max(abs(e) for e in shipped[-140:]) < 0.01
    # without a level only the online law follows, slowly (the refit waits for the reply's end):
    # its first 50 slow steps still cost over 16% more than their price (log 0.15)
    assert min(flat[-150:-100]) > 0.15
    assert sum(flat[-150:]) / 150 > sum(shipped[-150:]) / 150 + 0.1


def test_cli_prints_each_rule_and_refuses_bad_input_with_one_line(tmp_path, capsys):
    f = tmp_path / "rounds.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in _rows(60)))
    assert cost_replay.main([str(f), "--levels", "min:8,none:8"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [ln.split()[0] for ln in out] == ["min:8", "none:8"]
    assert cost_replay.main([str(f), "--levels", "mean:8"]) == 2
    assert cost_replay.main([str(tmp_path / "missing.jsonl")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(ln.startswith("cost_replay: ") for ln in err)


def test_unknown_rule_is_a_value_error():
    with pytest.raises(ValueError):
        cost_replay.level_rule("min", 0)
