"""Sampling without a model: settings, the processed distribution against a full-sort reference of
llama.cpp's chain, the seeded draw, the repeat penalty per tree path, and the CLI's exit 2."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from adaspark_app.cli import main
from adaspark_app.engine.sampling import (LLAMA_TEMPERATURE, TOP_K_GAPS, Distribution, Sampler,
                                          SamplingSettings, _top_k_within, chat_defaults, processed_distribution,
                                          settings_from, temperature_band, uniform)
from adaspark_app.engine.tree import Candidates, child_labels, layout, sampled_path, KIND_NGRAM
from adaspark_app.errors import ArgumentError


def reference(logits: np.ndarray, s: SamplingSettings, history=()) -> dict[int, float]:
    """llama.cpp's chain the slow way: penalties, full sort, top-k, top-p, min-p, temperature."""
    x = np.asarray(logits, dtype=np.float32).copy()
    if s.repeat_penalty != 1.0 and s.repeat_last_n > 0:
        for t in set(list(history)[-s.repeat_last_n:]):
            x[t] = x[t] * np.float32(s.repeat_penalty) if x[t] <= 0 else x[t] / np.float32(s.repeat_penalty)
    x = x.astype(np.float64)
    order = np.lexsort((np.arange(len(x)), -x))
    if s.top_k > 0:
        order = order[:s.top_k]
    p = np.exp(x[order] - x[order[0]])
    p /= p.sum()
    if s.top_p < 1.0:
        n = int(np.flatnonzero(np.cumsum(p) >= s.top_p)[0]) + 1
        order, p = order[:n], p[:n]
    if s.min_p > 0:
        keep = x[order] >= x[order[0]] + math.log(s.min_p)
        order = order[keep]
    q = np.exp((x[order] - x[order[0]]) / s.temperature)
    return {int(t): float(v) for t, v in zip(order, q / q.sum())}


SETTINGS = [
    SamplingSettings(temperature=0.8),  # llama.cpp's defaults
    SamplingSettings(temperature=1.0, top_k=0, top_p=0.9, min_p=0.0),  # top-p over the whole vocabulary
    SamplingSettings(temperature=0.5, top_k=5, top_p=1.0, min_p=0.0),
    SamplingSettings(temperature=1.3, top_k=0, top_p=1.0, min_p=0.1),
    SamplingSettings(temperature=0.7, top_k=100, top_p=0.5, min_p=0.02, repeat_penalty=1.5, repeat_last_n=8),
    SamplingSettings(temperature=2.0, top_k=0, top_p=1.0, min_p=0.0),  # nothing cut
]


@pytest.mark.parametrize("s", SETTINGS, ids=lambda s: s.label())
def test_processed_distribution_matches_the_full_sort_reference(s):
    rng = np.random.default_rng(7)
    for trial in range(5):
        logits = (rng.standard_normal(5000) * 3).astype(np.float32)
        history = rng.integers(0, 5000, size=20).tolist()
        got = processed_distribution(logits, s, history)
        want = reference(logits, s, history)
        assert got.tokens.tolist() == list(want), f"trial {trial}: kept tokens or their order differ"
        np.testing.assert_allclose(got.probs, list(want.values()), rtol=1e-9, atol=1e-12)


def test_canonical_order_breaks_ties_by_token_id():
    logits = np.array([1.0, 3.0, 3.0, 0.5, 3.0], dtype=np.float32)
    d = processed_distribution(logits, SamplingSettings(temperature=1.0, top_k=2, top_p=1.0, min_p=0.0))
    assert d.tokens.tolist() == [1, 2]  # three tie at 3.0: top-2 keeps the lowest ids, in id order


def _rows_of_every_spread(rng, n=49_152):
    """Rows of a real vocabulary's size whose top k lie within each gap of TOP_K_GAPS, beyond them
    all, with many ties at the k-th logit, and with most of the row at -inf."""
    for scale in (0.5, 5.0, 12.0, 18.0, 40.0, 200.0):
        yield f"spread {scale}", (rng.standard_normal(n) * scale).astype(np.float32)
    tied = np.round(rng.standard_normal(n) * 3).astype(np.float32)  # thousands share each value
    yield "ties at the cut", tied
    masked = np.full(n, -np.inf, dtype=np.float32)
    masked[rng.choice(n, 30, replace=False)] = rng.standard_normal(30).astype(np.float32)
    yield "30 finite logits", masked


@pytest.mark.parametrize("top_k,paths_taken", [(1, {12.0}), (40, {12.0, 24.0, "whole row"}),
                                               (300, {12.0, 48.0, "whole row"})])
def test_the_top_k_taken_near_the_largest_logit_is_the_whole_rows(top_k, paths_taken):
    rng = np.random.default_rng(11)
    s = SamplingSettings(temperature=0.9, top_k=top_k, top_p=0.95, min_p=0.01)
    paths = set()
    for what, logits in _rows_of_every_spread(rng):
        within = _top_k_within(logits, top_k)
        paths.add("whole row" if within is None else
                  next(g for g in TOP_K_GAPS if len(within) == np.count_nonzero(logits >= logits.max() - np.float32(g))))
        if within is not None:  # every logit at or above the k-th largest, ties with it included
            kth = np.sort(logits)[::-1][top_k - 1]
            assert set(np.flatnonzero(logits >= kth).tolist()) <= set(within.tolist()), what
        with np.errstate(divide="ignore", invalid="ignore"):
            want = reference(logits, s)
        got = processed_distribution(logits, s)
        assert got.tokens.tolist() == list(want), f"{what}: kept tokens or their order differ"
        np.testing.assert_allclose(got.probs, list(want.values()), rtol=1e-9, atol=1e-12)
    assert paths == paths_taken  # the rows reach each gap they were made for (TOP_K_GAPS: 12, 24, 48)


def test_draw_is_the_inverse_cdf_of_u():
    d = Distribution(np.array([9, 4, 6]), np.array([0.5, 0.3, 0.2]))
    assert [d.draw(u) for u in (0.0, 0.49, 0.5, 0.79, 0.8, 0.999999)] == [9, 9, 4, 4, 6, 6]


def test_uniform_is_a_pure_function_of_seed_and_position_and_looks_uniform():
    assert uniform(11, 5) == uniform(11, 5)
    assert uniform(11, 5) != uniform(12, 5) and uniform(11, 5) != uniform(11, 6)
    us = np.array([uniform(3, p) for p in range(20000)])
    assert us.min() >= 0.0 and us.max() < 1.0
    # Kolmogorov-Smirnov against U(0, 1); false-alarm rate 1e-3
    from scipy import stats  # imported here: 0.7 s, else paid by every worker at collection
    assert stats.kstest(us, "uniform").pvalue > 1e-3
    # successive positions uncorrelated (|r| < 4 sigma of 1/sqrt(n))
    assert abs(np.corrcoef(us[:-1], us[1:])[0, 1]) < 4 / math.sqrt(len(us))


def test_repeat_penalty_reads_each_tree_paths_own_history():
    """Two sibling paths under the anchor, rows with identical logits: the next token at each row is
    penalised for the tokens of its own path only (and for the committed ones), as plain decode
    of that prefix would penalise it."""
    s = SamplingSettings(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=2.0, repeat_last_n=4,
                         seed=5)
    sampler = Sampler(s)
    committed = [1, 2]
    logits = np.log(np.array([0.1, 0.1, 0.1, 0.1, 0.2, 0.2, 0.2], dtype=np.float32)) + 3.0  # all > 0
    hist_a = sampler.history(committed, [4])  # the path anchor -> 4
    hist_b = sampler.history(committed, [5])  # the path anchor -> 5
    assert hist_a == [1, 2, 4] and hist_b == [1, 2, 5]
    pa = processed_distribution(logits, s, hist_a).as_dict()
    pb = processed_distribution(logits, s, hist_b).as_dict()
    assert pa[4] < pa[5] and pb[5] < pb[4]  # each path's own token is penalised, not its sibling's
    assert pa[1] < pa[0] and pb[1] < pb[0]  # committed tokens are penalised on both paths
    assert pa[4] == pytest.approx(pb[5]) and pa[5] == pytest.approx(pb[4])
    # the window is the prefix's last repeat_last_n tokens: committed tokens drop out as the path grows
    assert sampler.history([1, 2, 3], [4, 5, 6]) == [3, 4, 5, 6]


def test_sampled_path_descends_to_the_child_holding_each_draw():
    cands = Candidates()
    a = cands.add(-1, 10, KIND_NGRAM)
    b = cands.add(-1, 11, KIND_NGRAM)
    a2 = cands.add(a, 12, KIND_NGRAM)
    lay = layout([a, b, a2], cands)
    seen: list[tuple[int, list[int]]] = []
    script = {(): 10, (10,): 12, (10, 12): 99}

    def draw(row, path_tokens):
        seen.append((row, list(path_tokens)))
        return script[tuple(path_tokens)]

    path, bonus, rows, draws = sampled_path(lay, cands, draw)
    assert path == [a, a2] and bonus == 99
    assert rows == [0, lay.row_of[a], lay.row_of[a2]]
    assert [r for r, _ in seen] == rows  # drawn only at the rows of the path, in order
    assert draws[lay.row_of[b]] == -1
    labels = child_labels(cands, lay, draws, path)
    assert labels.tolist() == [1, 0, 1]  # accepted when the draw equals it, the sibling not


def test_settings_validate_in_one_place():
    s = SamplingSettings(temperature="0.7", top_k="10", seed="-3")
    assert (s.temperature, s.top_k, s.seed) == (0.7, 10, -3)
    assert SamplingSettings().greedy and not s.greedy
    with pytest.raises(ArgumentError):
        SamplingSettings(top_k=2.5)
    with pytest.raises(ArgumentError):
        SamplingSettings(temperature=float("inf"))
    js = s.to_json()
    assert json.loads(json.dumps(js)) == js and js["seed"] == -3


def test_unset_seed_resolves_to_a_recorded_random_one():
    s = SamplingSettings(temperature=0.7)
    a, b = s.resolved(), s.resolved()
    assert isinstance(a.seed, int) and a.seed != b.seed
    assert a.resolved() is a
    assert Sampler(s).settings.seed is not None


def test_unset_options_take_llama_cpp_defaults_and_chat_the_models():
    s = settings_from({"temperature": "0.5", "top_k": None})
    assert (s.top_k, s.top_p, s.min_p, s.repeat_penalty, s.repeat_last_n) == (40, 0.95, 0.05, 1.0, 64)
    assert settings_from({}).temperature == 0.0  # run and bench: greedy
    # the bundled GGUF carries no general.sampling.*: chat takes llama.cpp's temperature
    assert chat_defaults(None)["temperature"] == LLAMA_TEMPERATURE


def test_temperature_bands():
    assert [temperature_band(t) for t in (0.0, 0.3, 0.5, 0.7, 0.9, 1.0, 2.0)] == [0, 1, 1, 2, 2, 3, 3]


INVALID = [
    ("--temperature", "-0.1"), ("--temperature", "hot"), ("--temperature", "nan"),
    ("--top-k", "-1"), ("--top-k", "4.5"), ("--top-k", "many"),
    ("--top-p", "0"), ("--top-p", "1.01"), ("--top-p", "x"),
    ("--min-p", "-0.01"), ("--min-p", "1.5"), ("--min-p", "y"),
    ("--repeat-penalty", "0"), ("--repeat-penalty", "-1"), ("--repeat-penalty", "z"),
    ("--repeat-last-n", "-1"), ("--repeat-last-n", "2.5"),
    ("--seed", "abc"), ("--seed", "1.5"),
]


@pytest.mark.parametrize("command", ["run", "bench", "chat"])
@pytest.mark.parametrize("flag,value", INVALID)
def test_each_invalid_value_exits_2_with_one_line(command, flag, value, tmp_path, capsys):
    script = tmp_path / "s.jsonl"
    script.write_text('{"id": "a", "turns": ["hi"]}\n')
    argv = {"run": ["run", str(script)], "bench": ["bench", str(script), "--arms", "ar,adaspark",
                                                     "--report", str(tmp_path / "r")],
            "chat": ["chat"]}[command]
    code = main(argv + [f"{flag}={value}"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("adaspark: error: ") and flag in err, err
