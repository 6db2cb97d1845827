"""benchmarks/cold_start/cold_start.py: the cold start of a ROUNDS.jsonl file, on rows written by hand."""

from __future__ import annotations

import json

import pytest

from benchmarks.cold_start import cold_start


def _row(conv, turn, width, verify_ms, committed, measured=False, prefill=False, fixed_ms=1.0):
    return {"conversation": conv, "turn": turn, "width": width, "verify_ms": verify_ms, "fixed_ms": fixed_ms,
            "committed": committed, "measured": measured, "prefill": prefill}


def test_excess_is_time_beyond_plain_decode_of_the_same_tokens(tmp_path, capsys):
    rows = [_row("a", 0, 1, 0.0, 1, prefill=True, fixed_ms=0.0)]
    rows += [_row("a", 0, 1, 9.0, 1) for _ in range(6)]           # plain steps: 10 ms each
    rows += [_row("a", 0, 8, 49.0, 2, measured=True)]              # 50 ms for 2 tokens: 30 ms excess
    rows += [_row("a", 0, 4, 29.0, 4, measured=True)]              # 30 ms for 4 tokens: paid for itself
    rows += [_row("b", 0, 16, 99.0, 1, measured=True)]             # 100 ms for 1 token: 90 ms excess
    rows += [_row("b", 0, 1, 9.0, 1) for _ in range(2)]
    res = cold_start.cold_start(rows)
    a, b = res["replies"]
    assert a["excess_ms"] == pytest.approx(30.0) and a["decode_ms"] == pytest.approx(140.0)
    assert a["measured_widths"] == [8, 4] and a["rows_beyond_committed"] == 6
    assert b["excess_ms"] == pytest.approx(90.0), "a reply with few plain steps uses the file's"
    assert res["cold_over_first"] == pytest.approx(120.0 / 140.0)
    # every round of a: 140 ms for 12 tokens that plain decode takes 120 ms for
    assert a["over_plain_ms"] == pytest.approx(20.0) and res["first_over_plain"] == pytest.approx(20.0 / 140.0)
    path = tmp_path / "ROUNDS.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert cold_start.main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "85.7%" in out and "every round: 14.3%" in out
    assert cold_start.main([str(tmp_path / "missing.jsonl")]) == 2
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(rows[0]) + "\n{not json\n")
    assert cold_start.main([str(bad)]) == 2
    assert "bad.jsonl:2: malformed JSON" in capsys.readouterr().err


def test_first_verifies_at_a_bound_are_reported_beside_the_cold_start():
    """A width's first verify at its upper bound is the chooser's choice, not a measurement: its
    excess is reported on its own (here 64 rows, 120 ms for 3 tokens at 10 ms a token: 90 ms)."""
    rows = [_row("a", 0, 1, 9.0, 1) for _ in range(6)]
    rows += [dict(_row("a", 0, 64, 119.0, 3), bounded=True)]
    rows += [_row("a", 0, 8, 49.0, 2, measured=True)]              # 30 ms excess, a measurement
    res = cold_start.cold_start(rows)
    (a,) = res["replies"]
    assert a["excess_ms"] == pytest.approx(30.0) and a["bounded_widths"] == [64]
    assert a["bounded_excess_ms"] == pytest.approx(90.0)
    assert res["bounded_over_first"] == pytest.approx(90.0 / 230.0)


def test_calibration_counts_priced_tree_rounds_only(tmp_path, capsys):
    """Expected over accepted by the bench's rule: plain, measured and unpriced rounds left out."""
    def priced(width, expected, accepted, **kw):
        return dict(_row("a", 0, width, 20.0, accepted + 1, **kw), priced_by="fit",
                    expected_accepted=expected, accepted=accepted)
    rows = [dict(_row("a", 0, 1, 9.0, 1), priced_by="none", expected_accepted=0.0, accepted=0) for _ in range(6)]
    rows += [priced(4, 3.0, 2), priced(8, 5.0, 6)]                  # counted: 8.0 expected, 8 accepted
    rows += [priced(8, 7.0, 0, measured=True)]                      # a cold measurement: left out
    rows += [dict(priced(4, 9.0, 1), priced_by="none")]             # not priced: left out
    rows += [priced(2, 2.0, 2)]                                     # counted: 10.0 over 10
    assert cold_start.calibration(rows) == (3, pytest.approx(10.0), 10)
    rows[-1] = priced(2, 2.0, 0)                                    # now 10.0 over 8
    path = tmp_path / "ROUNDS.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert cold_start.main([str(path)]) == 0
    assert "3 priced tree rounds, cold measurements left out): 10.0 / 8 = 1.250" in capsys.readouterr().out


def test_split_measurements_are_told_apart_from_the_ladders_cold_start(tmp_path, capsys):
    """Known answer: a ladder measurement in the first reply (30 ms excess) and a split in the
    second (90 ms): the whole is 120 ms over the first reply's 110 ms, of which the split 90."""
    rows = [_row("a", 0, 1, 9.0, 1) for _ in range(6)]
    rows += [dict(_row("a", 0, 8, 49.0, 2, measured=True), decided_by="cold")]
    rows += [_row("b", 0, 1, 9.0, 1) for _ in range(6)]
    rows += [dict(_row("b", 0, 12, 99.0, 1, measured=True), decided_by="split")]
    res = cold_start.cold_start(rows)
    assert res["cold_over_first"] == pytest.approx(120.0 / 110.0)
    assert res["split_rounds"] == 1 and res["split_over_first"] == pytest.approx(90.0 / 110.0)
    path = tmp_path / "ROUNDS.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert cold_start.main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "1 rounds, 81.8% of the first reply's decode time; the ladder's (and reach's) cold start: 27.3%" in out
