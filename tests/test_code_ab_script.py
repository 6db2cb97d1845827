"""benchmarks/speed/code_ab.py: head's adaspark/ar against base's, and the identity counts, on
hand-made runs with known answers."""

from __future__ import annotations

import math

import pytest

from benchmarks.speed import code_ab


def _run(speedup: dict[str, float], text_of=lambda conv, arm: f"{conv} reply") -> list[dict]:
    """One bench run: per conversation two turns, ar at 10 tok/s, adaspark at 10 x speedup."""
    out = []
    for conv, s in speedup.items():
        for turn in range(2):
            out.append({"arm": "ar", "conversation": conv, "turn": turn, "n_tokens": 100, "decode_s": 10.0,
                        "text": text_of(conv, "ar")})
            out.append({"arm": "adaspark", "conversation": conv, "turn": turn, "n_tokens": 100,
                        "decode_s": 10.0 / s, "text": text_of(conv, "adaspark")})
    return out


def test_head_over_base_is_the_geometric_mean_of_each_conversations_change():
    """Base runs at 1.2x ar on a and 1.5x on b; head at 1.32x and 1.5x: head over base is
    sqrt(1.1 x 1.0), and each side's own figure is the geometric mean of its ratios."""
    base = [_run({"a": 1.2, "b": 1.5}), _run({"a": 1.2, "b": 1.5})]
    head = [_run({"a": 1.32, "b": 1.5}), _run({"a": 1.32, "b": 1.5})]
    res = code_ab.compare(base, head)
    assert res["conversations"] == 2
    assert res["head_over_base"] == pytest.approx(math.sqrt(1.1))
    assert res["base"] == pytest.approx(math.sqrt(1.2 * 1.5))
    assert res["head"] == pytest.approx(math.sqrt(1.32 * 1.5))
    lo, hi = res["interval"]
    assert lo == pytest.approx(1.0) and hi == pytest.approx(1.1)  # resampling picks a, b or both
    assert res["identical"] == (16, 16) and res["ar_same"] == (8, 8)  # 4 runs x 4 replies; 2 head runs x 4


def test_a_reply_that_differs_from_ar_is_counted():
    """One head run whose adaspark reply differs from ar's on conversation b: 7 of 8 identical;
    ar's replies are compared across checkouts separately."""
    base = [_run({"a": 1.2, "b": 1.5})]
    head = [_run({"a": 1.2, "b": 1.5}, text_of=lambda c, arm: "other" if (c, arm) == ("b", "adaspark") else f"{c} reply")]
    res = code_ab.compare(base, head)
    assert res["identical"] == (6, 8)
    assert res["ar_same"] == (4, 4)


def test_a_missing_script_or_checkout_is_one_line_and_exit_2(tmp_path, capsys):
    assert code_ab.main([str(tmp_path / "none.jsonl"), "--base", str(tmp_path), "--out", str(tmp_path)]) == 2
    script = tmp_path / "s.jsonl"
    script.write_text('{"id": "x", "turns": ["hi"]}\n')
    assert code_ab.main([str(script), "--base", str(tmp_path), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("code_ab: error:") for line in err)


def test_each_sides_own_figure_has_its_interval():
    """Each checkout's adaspark/ar comes with a bootstrap interval over conversations that holds it."""
    res = code_ab.compare([_run({"a": 1.2, "b": 1.5, "c": 1.4})], [_run({"a": 1.3, "b": 1.5, "c": 1.1})])
    for side in ("base", "head"):
        lo, hi = res[f"{side}_interval"]
        assert lo <= res[side] <= hi
    assert res["base_interval"] == pytest.approx((1.2, 1.5), rel=1e-9)  # the single conversations bound it


@pytest.mark.model
def test_a_start_store_is_where_the_adaspark_arm_starts_and_goes_on_learning(tmp_path):
    """--start-store: the run's adaspark arm opens a copy of the given learned store, learns into
    the copy (the request summaries it held, and its own), and leaves the given file as it was; a
    store that is not there is one line, exit 2."""
    import json
    import sqlite3

    from adaspark_app.store import Store
    from benchmarks.common import ROOT

    script = tmp_path / "s.jsonl"
    script.write_text(json.dumps({"id": "a", "turns": ["Say hello."]}) + "\n")
    empty = tmp_path / "empty.db"
    Store.open(empty).close()

    def requests(db) -> int:
        with sqlite3.connect(db) as conn:
            return conn.execute("select count(*) from requests").fetchone()[0]

    code_ab.run_side(ROOT, script, tmp_path / "first", None, 8, start_store=empty)
    learned = tmp_path / "first" / "stores" / "adaspark.db"
    assert (requests(learned), requests(empty)) == (1, 0)
    code_ab.run_side(ROOT, script, tmp_path / "second", None, 8, start_store=learned)
    assert (requests(tmp_path / "second" / "stores" / "adaspark.db"), requests(learned)) == (2, 1)
    assert code_ab.main([str(script), "--base", str(ROOT), "--start-store", str(tmp_path / "nope.db"),
                         "--out", str(tmp_path / "x")]) == 2
