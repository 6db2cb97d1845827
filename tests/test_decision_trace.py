"""The decision trace: every ROUNDS.jsonl row says which layer set its width, and `adaspark explain`
summarises it per reply."""

from __future__ import annotations

import json
import pytest

from adaspark_app.cli import main
from adaspark_app.engine.arms import AdaSparkPolicy, Arm
from adaspark_app.engine.candidates import Sources
from adaspark_app.engine.ngram import BACKOFF_EVIDENCE
from adaspark_app.engine.proposers import NgramSource
from adaspark_app.engine.rounds import RoundStart
from adaspark_app.explain import account, read_rounds
from adaspark_app.learn.constants import (COLD_ALWAYS_BELOW, CONDITIONAL_MEASUREMENTS, LADDER, MEASUREMENTS_BEFORE_PRICED,
                                          PENDING_STALL)
from adaspark_app.learn.law import context_band
from adaspark_app.learn.gates import PROBE_NONE
from adaspark_app.learn.kinds import Decider, NgramKind
from adaspark_app.learn.learned_state import Learners
from adaspark_app.learn.scheduler import WidthScheduler

TRACE_FIELDS = ("decided_by", "incumbent", "argmax", "values", "rho", "D_ms", "gains", "draft_skipped",
                "drafter_skipped", "bounded", "ends_at")


def _round_start(context: int) -> RoundStart:
    return RoundStart(t0=0.0, context=context, first_round=False, budget=None)


def _priced(learners: Learners, context: int) -> WidthScheduler:
    """The learners' scheduler with width 1 priced and no cold width forcing drafting."""
    s = learners.scheduler
    for _ in range(MEASUREMENTS_BEFORE_PRICED):
        s.observe_plain(context, 0.01, first_round=False)
    s.stall = PENDING_STALL
    return s


def _policy(text: list[int]) -> tuple[AdaSparkPolicy, Learners]:
    """The adaspark policy over an n-gram source holding `text` as a reply's committed text, no drafter."""
    learners = Learners()
    ngram = NgramSource(lambda token: False, learners.precision)
    ngram.begin(text)
    return AdaSparkPolicy(Arm("adaspark"), learners, Sources(ngram)), learners


def test_gate_names_no_proposal_when_there_is_nothing_to_draft():
    """Guards decided_by for a round with no drafter and no n-gram continuation: a plain step that
    says why, rather than one that looks like the chooser's width 1."""
    policy, _ = _policy([1, 2, 3, 4, 5])
    gate = policy.gate(_round_start(6))
    assert not gate.draft and gate.decided_by == Decider.NO_PROPOSAL


def test_a_backoff_follower_is_drafted_under_the_no_proposal_gate():
    """Where only the last 2 tokens' follower proposes (ngram.py's backoff), the round is not a
    NO_PROPOSAL plain step: it drafts, under the probe class of no proposal, whose draft gate
    learns apart from the copies' and followers' whether such guesses pay."""
    text = [1, 2, 3, 9, 2, 3]  # (2, 3) was followed by 9 once; (9, 2, 3) never occurred before
    policy, learners = _policy(text)
    sched = _priced(learners, len(text))
    step = policy.sources.ngram.index.first_step()
    assert (step.token, step.kind, step.evidence) == (9, NgramKind.FOLLOWER, BACKOFF_EVIDENCE)
    assert policy.sources.ngram.probe() == PROBE_NONE
    gate = policy.gate(_round_start(len(text)))
    assert gate.draft and gate.decided_by is None and gate.probe == PROBE_NONE
    assert (context_band(len(text)), PROBE_NONE) in sched.gates
    plain = NgramSource(lambda token: False, learners.precision, backoff=())
    plain.begin(text)
    assert AdaSparkPolicy(Arm("adaspark"), learners, Sources(plain)).gate(
        _round_start(len(text))).decided_by == Decider.NO_PROPOSAL


def test_gate_names_the_draft_gate_when_it_skips():
    """Guards decided_by and draft_skipped when the draft gate's skip is running: the round is plain
    and the trace says the draft gate decided it; once the skip is spent the round drafts."""
    text = [7, 8, 9, 10, 11, 12] * 4  # the anchor's context recurs: the index proposes a copy
    ctx = len(text)
    policy, learners = _policy(text)
    sched = _priced(learners, ctx)
    probe = policy.sources.ngram.probe()
    assert probe != PROBE_NONE
    sched.probe = probe
    sched._gate(ctx).skip_left = 1  # the gate learned to skip one round here
    gate = policy.gate(_round_start(ctx))
    assert not gate.draft and gate.decided_by == Decider.DRAFT_GATE and gate.draft_skipped
    assert sched.gates[(context_band(ctx), probe)].skip_left == 0
    again = policy.gate(_round_start(ctx))
    assert again.draft and again.decided_by is None and not again.draft_skipped


def test_plan_trace_names_cold_measurements_then_the_chooser():
    """Guards the scheduler's trace: on a fresh scheduler the first rounds measure ladder widths
    (decided_by cold, measured); once every width is priced the chooser decides, and its width is
    the argmax of its own scores unless hysteresis, a stand-in or the CUSUM held another."""
    import numpy as np

    s = WidthScheduler()
    s_d = np.zeros(66)
    s_n = np.concatenate([[0.0, 0.0], np.cumsum(np.full(64, 0.6))])  # a long, likely chain
    seen: list[str] = []
    cold_widths: list[int] = []
    for i in range(120):
        ctx = 300 + i
        plan = s.plan(ctx, s_d, s_n, 0.001)
        seen.append(plan.decided_by.value)
        if plan.decided_by == Decider.COLD:
            cold_widths.append(plan.width)
        if plan.decided_by in (Decider.COLD, Decider.SPLIT, Decider.RECHECK):
            assert plan.measured
        else:
            assert not plan.measured
        if plan.decided_by == Decider.CHOOSER:
            assert plan.width == plan.argmax
        if plan.decided_by == Decider.HYSTERESIS:
            assert plan.width == plan.incumbent and plan.width != plan.argmax
        assert set(plan.values) == set(plan.offered) or plan.rho is None
        rows = plan.width
        verify = 0.01 * (1 + 0.5 * (rows - 1))  # each row costs half a step
        q = np.full(rows - 1, 0.6)
        acc = np.zeros(rows - 1, dtype=bool)
        acc[: min(rows - 1, 2)] = True
        s.observe(plan, ctx, verify, 0.001, int(acc.sum()) + 1, i == 0, q, np.ones(rows - 1, np.int64), acc)
    assert seen[0] == Decider.COLD.value
    # width 1 three times after the request's first round (which teaches nothing), then each
    # narrow ladder width once (CONDITIONAL_MEASUREMENTS); 16 rows and up wait at their bound
    narrow = [w for w in LADDER if 1 < w < COLD_ALWAYS_BELOW]
    assert cold_widths == [1] * (MEASUREMENTS_BEFORE_PRICED + 1) + [w for w in narrow for _ in range(CONDITIONAL_MEASUREMENTS)]
    assert Decider.CHOOSER.value in seen[-40:]


def _write_rows(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def test_explain_prices_each_layer_against_the_choosers_choice(tmp_path, capsys):
    """Guards `adaspark explain`'s arithmetic on a log with known values: a cold round that verified
    1 row where the chooser's best was 8 costs V(8) - V(1) tokens, and that over rho in ms."""
    base = {"conversation": "c1", "turn": 0, "committed": 1, "draft_skipped": False, "drafter_skipped": False}
    rows = [
        {**base, "width": 8, "decided_by": "chooser", "argmax": 8, "values": {"1": 1.0, "8": 1.5}, "rho": 100.0},
        {**base, "width": 1, "decided_by": "cold", "argmax": 8, "values": {"1": 1.0, "8": 1.5}, "rho": 100.0},
        {**base, "width": 1, "decided_by": "cold", "argmax": 8, "values": {"1": 0.75, "8": 1.0}, "rho": 50.0},
        {**base, "width": 1, "decided_by": "draft_gate", "draft_skipped": True, "values": {}, "argmax": None},
        {**base, "turn": 1, "width": 4, "decided_by": "hysteresis", "argmax": 2, "values": {"2": 2.0, "4": 1.9},
         "rho": 10.0},
    ]
    log = tmp_path / "rounds.jsonl"
    _write_rows(log, rows)
    accts = account(read_rounds(str(log)))
    assert [(a.conversation, a.turn, a.rounds) for a in accts] == [("c1", 0, 4), ("c1", 1, 1)]
    cold = accts[0].layers["cold"]
    assert cold.rounds == 2 and cold.cost_tokens == pytest.approx(0.75)
    assert cold.cost_ms == pytest.approx(0.5 / 100 * 1e3 + 0.25 / 50 * 1e3)
    assert accts[0].layers["draft_gate"].priced == 0 and accts[0].draft_skipped == 1
    assert accts[1].layers["hysteresis"].cost_tokens == pytest.approx(0.1)
    assert main(["explain", str(log)]) == 0
    out = capsys.readouterr().out
    assert "cold" in out and "cost 0.75 tokens (10.0 ms at rho)" in out
    assert "no tree built" in out
    assert "c1 turn 1: 1 round, 1 token (" in out and "c1 turn 0: 4 rounds, 4 tokens (" in out
    assert "all 2 replies: 5 rounds, 5 tokens (" in out
    assert "hysteresis        1 round  100.0%" in out  # the count's column keeps its width


@pytest.mark.parametrize("content, needle", [
    ("{not json\n", "malformed JSON"),
    ('{"conversation": "a", "turn": 0, "width": 1}\n', "missing decided_by"),
    ("", "no rounds"),
    # fields of the wrong type (edited by hand, another version) raised a traceback
    ('{"conversation": "a", "turn": [1], "width": 1, "decided_by": "cold"}\n', '"turn" must be an integer'),
    ('{"conversation": "a", "turn": 0, "width": "4", "decided_by": "cold"}\n', '"width" must be an integer'),
    ('{"conversation": {}, "turn": 0, "width": 1, "decided_by": "cold"}\n', '"conversation" must be a string'),
    ('{"conversation": "a", "turn": 0, "width": 1, "decided_by": ["cold"]}\n', '"decided_by" must be a string'),
    ('{"conversation": "a", "turn": 0, "width": 1, "decided_by": "cold", "committed": "2"}\n', '"committed"'),
    ('{"conversation": "a", "turn": 0, "width": 2, "decided_by": "cold", "argmax": 4, "rho": 1, '
     '"values": {"2": "x", "4": 1}}\n', '"values" must map widths to numbers'),
    ('{"conversation": "a", "turn": 0, "width": 2, "decided_by": "cold", "argmax": 4, "rho": [], '
     '"values": {"2": 1, "4": 1}}\n', '"rho" must be a number'),
    ('{"conversation": "a", "turn": 0, "width": 2, "decided_by": "cold", "argmax": {}, '
     '"values": {"2": 1, "4": 1}}\n', '"argmax" must be a width'),
])
def test_explain_refuses_a_bad_log_in_one_line(tmp_path, capsys, content, needle):
    """Guards the untrusted-input rule for `adaspark explain`: one line naming the file, exit 2."""
    log = tmp_path / "bad.jsonl"
    log.write_text(content, encoding="utf-8")
    assert main(["explain", str(log)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0] and "bad.jsonl" in err[0]


@pytest.mark.model
@pytest.mark.parametrize("arm, allowed", [
    ("adaspark", {d.value for d in Decider} - {Decider.ARM.value, Decider.PLAIN_ONLY.value}),
    ("pinned:4", {Decider.ARM.value, Decider.CLAMP.value, Decider.NO_PROPOSAL.value}),
    ("ar", {Decider.ARM.value}),
])
def test_every_logged_round_carries_its_decision_trace(tmp_path, arm, allowed):
    """Guards the ROUNDS.jsonl contract on the real model: every round row has the decision fields,
    names a layer its arm can have, and a measured round is one a measurement decided; `adaspark
    explain` then accounts for every round."""
    script = tmp_path / "s.jsonl"
    text = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n"
    script.write_text(json.dumps({"id": "c", "turns": [f"Repeat this code exactly:\n{text}",
                                                      "Now repeat it again."]}) + "\n")
    rounds = tmp_path / "rounds.jsonl"
    out = tmp_path / "out.jsonl"
    assert main(["run", str(script), "--arm", arm, "--max-tokens", "48", "--fresh-store",
                 "--out", str(out), "--log-rounds", str(rounds)]) == 0
    rows = [json.loads(x) for x in rounds.read_text().splitlines()]
    replies = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(rows) == sum(r["rounds"] for r in replies)
    for row in rows:
        for f in TRACE_FIELDS:
            assert f in row, f
        assert row["decided_by"] in allowed
        assert row["measured"] == (row["decided_by"] in ("cold", "split", "recheck"))
        if row["ends_at"]:  # the chain-end credit scored a rate-mode round; no verify runs past the chain
            assert row["mode"] == "rate" and row["values"] and row["width"] <= row["ends_at"]
        if row["bounded"]:  # a first verify at a bound is the chooser's own choice, not a measurement
            assert not row["measured"] and any(int(w) >= 16 for w in row["offered"])
    if arm == "adaspark":
        # width 1 is timed first, by a plain step: nothing proposed, or the draft gate's wait for it
        assert rows[0]["decided_by"] in ("cold", "no_proposal", "draft_gate") and rows[0]["width"] == 1
        assert any(r["decided_by"] == "cold" for r in rows)  # a fresh store measures its widths
    accts = account(read_rounds(str(rounds)))
    assert sum(a.rounds for a in accts) == len(rows)
    per_reply = {(r["conversation"], r["turn"]): r["decided_by"] for r in replies}
    for a in accts:
        assert {k: t.rounds for k, t in a.layers.items()} == per_reply[(a.conversation, a.turn)]
