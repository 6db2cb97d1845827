"""adaspark_app.bench.stats: the comparison arithmetic of `adaspark bench` (pure, seeded)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from adaspark_app.bench import stats
from adaspark_app.bench.stats import ReplyRecord


def rec(arm, conv, turn, speed, *, tokens=100, looped=False, category=None, text=None, repeat=0,
        rounds=0, widths=None):
    return ReplyRecord(arm=arm, conversation=conv, turn=turn, n_tokens=tokens,
                       decode_s=tokens / speed if speed else 0.0, looped=looped, category=category,
                       text=f"{conv}/{turn}" if text is None else text, repeat=repeat, rounds=rounds,
                       widths=widths or {})


def two_arm(ratios_by_conv, base_speed=100.0, category=None):
    out = []
    for conv, ratios in ratios_by_conv.items():
        for t, r in enumerate(ratios):
            out.append(rec("ar", conv, t, base_speed, category=category))
            out.append(rec("x", conv, t, base_speed * r, category=category))
    return out


def test_geometric_mean_of_reciprocal_ratios_is_one():
    assert stats.geometric_mean([2.0, 0.5]) == pytest.approx(1.0)
    assert stats.geometric_mean([1.0, 4.0]) == pytest.approx(2.0)
    with pytest.raises(ValueError):
        stats.geometric_mean([])
    with pytest.raises(ValueError):
        stats.geometric_mean([1.0, 0.0])


def test_known_ratio_is_recovered_with_a_degenerate_interval():
    records = two_arm({"a": [1.25, 1.25], "b": [1.25], "c": [1.25, 1.25, 1.25]})
    c = stats.compare(stats.merge_repeats(records), "x", "ar")
    assert c.ratio == pytest.approx(1.25)
    assert c.ci_low == pytest.approx(1.25) and c.ci_high == pytest.approx(1.25)
    assert (c.replies, c.conversations, c.excluded_looped) == (6, 3, 0)


def test_ratio_is_per_reply_geometric_mean_not_ratio_of_totals():
    # reply 1: 2x faster, reply 2: 2x slower -> geomean 1.0 whatever the token counts
    records = [rec("ar", "a", 0, 100, tokens=1000), rec("x", "a", 0, 200, tokens=1000),
               rec("ar", "a", 1, 100, tokens=10), rec("x", "a", 1, 50, tokens=10)]
    c = stats.compare(stats.merge_repeats(records), "x", "ar")
    assert c.ratio == pytest.approx(1.0)


def test_bootstrap_interval_contains_point_estimate_and_has_width():
    rng = np.random.default_rng(7)
    data = {f"c{i}": list(np.exp(rng.normal(math.log(1.3), 0.2, size=rng.integers(1, 4))))
            for i in range(15)}
    c = stats.compare(stats.merge_repeats(two_arm(data)), "x", "ar")
    assert c.ci_low < c.ratio < c.ci_high
    assert 1.0 < c.ci_low and c.ci_high < 1.8


def test_bootstrap_is_seeded_and_resamples_conversations():
    logs = {"a": [0.0, 0.0, 0.0], "b": [math.log(2.0)]}
    one = stats.bootstrap_interval(logs, seed=3)
    assert one == stats.bootstrap_interval(logs, seed=3)
    # Resampling whole conversations: the only possible statistics are exp(mean) of pooled
    # replies of {a,a}, {a,b}, {b,b}: 1.0, 2**(1/4), 2.0.
    lo, hi = one
    assert lo == pytest.approx(1.0) and hi == pytest.approx(2.0)
    single = stats.bootstrap_interval({"a": [0.1, 0.3]})
    assert single[0] == pytest.approx(math.exp(0.2)) == pytest.approx(single[1])


def test_looped_reply_is_excluded_and_counted_in_either_arm():
    records = two_arm({"a": [1.5, 1.5], "b": [1.5]})
    # a looped reply in the arm: absurdly fast, must not move the ratio
    records.append(rec("ar", "b", 1, 100))
    records.append(rec("x", "b", 1, 100 * 40, looped=True))
    # a looped reply in the base arm only
    records.append(rec("ar", "c", 0, 100, looped=True))
    records.append(rec("x", "c", 0, 100 * 0.1))
    c = stats.compare(stats.merge_repeats(records), "x", "ar")
    assert c.ratio == pytest.approx(1.5)
    assert c.excluded_looped == 2
    assert c.replies == 3 and c.paired == 5
    summary = stats.full_comparison(records, ["ar", "x"])
    assert summary["looped_any_arm"] == 2
    assert summary["arms"]["x"]["looped"] == 1 and summary["arms"]["ar"]["looped"] == 1


def test_reply_without_decode_interval_is_excluded_and_counted():
    records = two_arm({"a": [2.0]})
    records.append(ReplyRecord("ar", "a", 1, n_tokens=1, decode_s=0.0))
    records.append(ReplyRecord("x", "a", 1, n_tokens=1, decode_s=0.0))
    c = stats.compare(stats.merge_repeats(records), "x", "ar")
    assert c.ratio == pytest.approx(2.0)
    assert c.excluded_no_speed == 1


def test_identical_share_counts_equal_texts():
    records = two_arm({"a": [1.0, 1.0], "b": [1.0, 1.0]})
    records[-1].text = "different"
    c = stats.compare(stats.merge_repeats(records), "x", "ar")
    assert (c.identical, c.paired) == (3, 4)
    assert c.identical_share == pytest.approx(0.75)


def test_per_category_comparison_uses_only_that_category():
    records = two_arm({"a": [2.0], "b": [2.0]}, category="code") + \
        two_arm({"c": [1.0], "d": [1.0, 1.0]}, category="chat")
    summary = stats.full_comparison(records, ["ar", "x"], resamples=200)
    comp = summary["comparisons"]["x"]
    assert summary["categories"] == ["chat", "code"]
    assert comp["by_category"]["code"]["geomean_ratio"] == pytest.approx(2.0)
    assert comp["by_category"]["chat"]["geomean_ratio"] == pytest.approx(1.0)
    assert comp["by_category"]["chat"]["replies"] == 3
    assert comp["overall"]["geomean_ratio"] == pytest.approx(2.0 ** (2 / 5))


def test_context_bands_double_from_256_tokens():
    assert [stats.context_band(c) for c in (0, 255, 256, 511, 512, 1023, 1024, 2047, 2048, 5000)] == \
        ["0-255", "0-255", "256-511", "256-511", "512-1023", "512-1023", "1024-2047", "1024-2047",
         "2048-4095", "4096-8191"]
    assert stats.context_band(None) is None


def test_per_band_comparison_groups_turns_by_where_the_base_reply_started():
    """Known answer: first turns (short prompts) at 1.5x, second turns (long histories) at 0.8x;
    the band is the base reply's start, and replies with no recorded start join no band."""
    records = []
    for conv in ("a", "b", "c"):
        for turn, (start, r) in enumerate(((100, 1.5), (1500, 0.8))):
            base, arm = rec("ar", conv, turn, 100.0), rec("x", conv, turn, 100.0 * r)
            base.start_context, arm.start_context = start, start + 7
            records += [base, arm]
    records += [rec("ar", "d", 0, 100.0), rec("x", "d", 0, 300.0)]  # no start recorded
    summary = stats.full_comparison(records, ["ar", "x"], resamples=200)
    by_band = summary["comparisons"]["x"]["by_band"]
    assert summary["bands"] == ["0-255", "1024-2047"]
    assert by_band["0-255"]["geomean_ratio"] == pytest.approx(1.5)
    assert by_band["1024-2047"]["geomean_ratio"] == pytest.approx(0.8)
    assert by_band["0-255"]["replies"] == by_band["1024-2047"]["replies"] == 3
    assert summary["comparisons"]["x"]["overall"]["replies"] == 7
    # read back from OUT.jsonl-style dicts: the start is `prompt_length`
    assert ReplyRecord.from_json({"arm": "x", "conversation": "a", "turn": 0, "n_tokens": 1,
                                  "decode_s": 1.0, "prompt_length": 1500}).start_context == 1500


def test_repeats_average_speed_and_loop_in_any_repeat_counts():
    records = [rec("ar", "a", 0, 100, repeat=0), rec("ar", "a", 0, 100, repeat=1),
               rec("x", "a", 0, 100, repeat=0), rec("x", "a", 0, 200, repeat=1),
               rec("ar", "a", 1, 100, repeat=0), rec("ar", "a", 1, 100, repeat=1, looped=True),
               rec("x", "a", 1, 100, repeat=0), rec("x", "a", 1, 100, repeat=1)]
    merged = stats.merge_repeats(records)
    assert merged[("x", "a", 0)].speed == pytest.approx(150.0)
    c = stats.compare(merged, "x", "ar")
    assert c.ratio == pytest.approx(1.5) and c.excluded_looped == 1


def test_tokens_per_round_and_width_shares():
    records = [rec("x", "a", 0, 100, tokens=30, rounds=10, widths={1: 5, 8: 5}),
               rec("x", "a", 1, 100, tokens=20, rounds=10, widths={8: 10}),
               rec("x", "a", 2, 100, tokens=500, rounds=50, widths={16: 50}, looped=True)]
    s = stats.summarize_arm(records, "x")
    assert s.tokens_per_round == pytest.approx(50 / 20)  # the looped reply is left out
    assert s.width_shares == pytest.approx({1: 5 / 70, 8: 15 / 70, 16: 50 / 70})
    assert s.tokens_per_s == pytest.approx(100.0)
    assert stats.width_shares({}) == {}


def test_unpaired_replies_are_counted_not_compared():
    records = two_arm({"a": [1.5]}) + [rec("x", "z", 0, 999)]
    c = stats.compare(stats.merge_repeats(records), "x", "ar")
    assert c.unpaired == 1 and c.replies == 1 and c.ratio == pytest.approx(1.5)


# ------------------------------------------------------------ acceptance by source and calibration
def _round(turn, width, expected, accepted, *, measured=False, prefill=False, priced_by="fitted"):
    from adaspark_app.engine.events import RoundEvent

    return RoundEvent(conversation="c", turn=turn, round_index=0, context=10, width=width,
                      measured=measured, verify_ms_predicted=1.0, verify_ms=1.0, fixed_ms=0.1,
                      expected_accepted=expected, accepted=accepted, committed=accepted + 1,
                      priced_by=priced_by, prefill=prefill)


def test_calibration_tally_counts_only_priced_tree_rounds_per_turn():
    """Plain steps, cold-start measurements, unpriced rounds and the prefill are not what the
    acceptance model priced to win: they must not enter the calibration."""
    from adaspark_app.bench.runner import CalibrationTally

    t = CalibrationTally()
    for ev in [_round(0, 4, 2.0, 1), _round(0, 8, 3.0, 4), _round(0, 1, 0.0, 0),
               _round(0, 16, 9.0, 0, measured=True), _round(0, 4, 5.0, 0, priced_by="none"),
               _round(0, 4, 7.0, 0, prefill=True), _round(1, 2, 0.5, 1)]:
        t(ev)
    assert t.pop(0) == {"rounds": 2, "expected": 5.0, "accepted": 5}
    assert t.pop(1) == {"rounds": 1, "expected": 0.5, "accepted": 1}
    assert t.pop(2) == {"rounds": 0, "expected": 0.0, "accepted": 0}


def test_arm_summary_calibration_and_accepted_per_round_by_source():
    """Expected over accepted on tree rounds, and accepted tokens per round by source, summed over
    the arm's non-looped replies (a looped reply's rounds are left out of every rate)."""
    def rec(conv, cal, acc, rounds, looped=False):
        return ReplyRecord.from_json({"arm": "adaspark", "conversation": conv, "turn": 0, "n_tokens": 20,
                                      "decode_s": 1.0, "rounds": rounds, "looped": looped,
                                      "accepted_by_source": acc, "calibration": cal})

    rs = [rec("a", {"rounds": 3, "expected": 6.0, "accepted": 4}, {"ngram": 4, "drafter": 2}, 10),
          rec("b", {"rounds": 1, "expected": 3.0, "accepted": 4}, {"ngram": 2}, 10),
          rec("c", {"rounds": 5, "expected": 50.0, "accepted": 1}, {"ngram": 9}, 10, looped=True)]
    a = stats.summarize_arm(rs, "adaspark")
    assert a.tree_rounds == 4 and a.accepted == 8
    assert a.calibration == pytest.approx(9.0 / 8.0)
    assert a.accepted_per_round_by_source == pytest.approx({"drafter": 0.1, "ngram": 0.3})
    j = a.to_json()
    assert j["calibration"] == pytest.approx(1.125)
