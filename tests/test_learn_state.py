"""The learned state on disk (learn/state.py): per-learner versions, strict all-or-nothing loads,
and the migration of the previous layout (b9fbe7f). Pure: no model."""

from __future__ import annotations

import copy
import gzip
import json
import math
from pathlib import Path

import numpy as np
import pytest
from learned_states import exercise, learned_state, reloaded, run_round, views

from adaspark_app.learn import learned_state as st
from adaspark_app.learn.acceptance import AcceptanceModel
from adaspark_app.learn.chooser import WidthChooser
from adaspark_app.learn.cost import VerifyCostModel
from adaspark_app.learn.gains import Gains
from adaspark_app.learn.gates import DraftGate, DrafterGate
from adaspark_app.learn.precision import SourcePrecision
from adaspark_app.learn.rate import LongRunRate
from adaspark_app.learn.scheduler import WidthScheduler
from adaspark_app.learn.state import StateError
from adaspark_app.store import LearnedKey, Store
from adaspark_app.store.transfer import export_json

DATA = Path(__file__).parent / "data"
OLD = DATA / "learned_state_b9fbe7f.json.gz"


def _fixture(path: Path) -> dict:
    """A gzip'd JSON fixture of tests/data."""
    return json.loads(gzip.decompress(path.read_bytes()))


def learners_of(state: dict) -> tuple[WidthScheduler, AcceptanceModel, SourcePrecision]:
    sched, acc, prec = WidthScheduler(), AcceptanceModel(), SourcePrecision()
    sched.load_state(state["scheduler"])
    acc.load_state(state["acceptance"])
    prec.load_state(state["precision"])
    return sched, acc, prec


def trained_parts():
    """Every learner with a state, exercised on seeded synthetic rounds: (name, learner)."""
    sched, acc, prec = exercise(3)
    gate = next(g for g in sched.gates.values() if g.rounds)
    dgate = max(sched.drafter_gates.values(), key=lambda g: min(g.counts))  # rounds with and without it
    return [("scheduler", sched), ("cost", sched.cost), ("chooser", sched.chooser), ("gains", sched.gains),
            ("rate", sched.rate), ("draft gate", gate), ("drafter gate", dgate), ("acceptance", acc),
            ("precision", prec)]


PARTS = trained_parts()


@pytest.mark.parametrize("name, learner", PARTS, ids=[n for n, _ in PARTS])
def test_each_learner_round_trips_its_trained_state(name, learner):
    """A state made by learning, through JSON, loads into a fresh learner to the same state_dict,
    and the state is not the fresh one (so the load really carried what was learned)."""
    state = json.loads(json.dumps(learner.state_dict()))
    fresh = type(learner)()
    assert fresh.state_dict() != state, f"{name}: exercising taught it nothing"
    fresh.load_state(state)
    assert fresh.state_dict() == learner.state_dict()
    assert isinstance(state["version"], int)


def test_a_reloaded_scheduler_plans_as_the_original():
    """Beyond equal dicts: the reloaded learners make the same width decision and q."""
    sched, acc, prec = exercise(5)
    sched2, acc2, prec2 = reloaded(sched, acc, prec)
    a, b = np.random.default_rng(9), np.random.default_rng(9)
    run_round(sched, acc, prec, a)
    run_round(sched2, acc2, prec2, b)
    assert json.dumps(sched.state_dict()) == json.dumps(sched2.state_dict())
    assert json.dumps(acc.state_dict()) == json.dumps(acc2.state_dict())


BAD = [  # (learner, corruption of its state_dict, field named in the message)
    (VerifyCostModel, lambda s: s["classes"][1]["law"].update(scale=-1.0), "classes[1].law.scale"),
    (VerifyCostModel, lambda s: s["classes"][0].update(width=s["classes"][1]["width"]), "classes[1]"),
    (VerifyCostModel, lambda s: s["classes"][2]["law"]["ftrl"]["n"].pop(), "law.ftrl.n"),
    (WidthChooser, lambda s: s.update(held="3"), "chooser.held"),
    (Gains, lambda s: s["lines"].pop(), "gains.lines"),
    (Gains, lambda s: s["lines"][0][2]["stats"].__setitem__(0, math.nan), "lines[0][2].stats[0]"),
    (LongRunRate, lambda s: s["bands"][0][1].__setitem__(2, -1.0), "rate.bands[0][1][2]"),
    (DraftGate, lambda s: s.update(backoff=10**9), "draft gate.backoff"),
    (DrafterGate, lambda s: s.update(probe_due=1), "drafter gate.probe_due"),
    (WidthScheduler, lambda s: s["gates"][0].__setitem__(1, 99), "scheduler.gates[0][1]"),
    (WidthScheduler, lambda s: s.pop("stall"), "scheduler.stall"),
    (WidthScheduler, lambda s: s.update(version=1), "scheduler.version"),
    (AcceptanceModel, lambda s: s["ftrl"]["open"].__setitem__(3, "yes"), "acceptance.ftrl.open[3]"),
    (AcceptanceModel, lambda s: s["request"].update(b_req=1e6), "acceptance.request.b_req"),
    (AcceptanceModel, lambda s: s.update(layout={"coefficients": 3}), "acceptance.layout"),
    (SourcePrecision, lambda s: s["class_trials"].__setitem__(1, [0] * 33), "precision.class_hits[1]"),
    (SourcePrecision, lambda s: s.update(surprise=1), "unknown field 'surprise'"),
]


@pytest.mark.parametrize("cls, corrupt, field", BAD, ids=[f for _, _, f in BAD])
def test_a_bad_state_raises_state_error_naming_the_field_and_changes_nothing(cls, corrupt, field):
    """StateError names the field; the learner keeps the state it had (all or nothing)."""
    learner = dict((type(x), x) for _, x in PARTS)[cls]
    before = json.dumps(learner.state_dict())
    bad = json.loads(before)
    corrupt(bad)
    with pytest.raises(StateError) as info:
        learner.load_state(bad)
    assert field in str(info.value), str(info.value)
    assert "\n" not in str(info.value)
    assert json.dumps(learner.state_dict()) == before


def test_a_line_faded_to_zero_evidence_loads_and_reads_one():
    """After ~140k rounds without teaching a gain line its sum of p^2 underflows to 0.0 while its
    count stays: such a state is real and must load (as a gain of 1), not divide by zero."""
    g = Gains()
    line = g.lines["upper", "ngram"]
    line.observe(2.0, 1.0, 4000)
    for _ in range(140_000 // 128):
        line.fade(0.5)
    assert line.stats[0] == 0.0 and line.count == 1
    again = Gains()
    again.load_state(json.loads(json.dumps(g.state_dict())))
    assert again.at(4000)[3] == 1.0


# --- fuzz: random one-field corruptions of a real exported state -----------------------------

MUTATIONS = ("string", "number", "drop", "nan", "longer", "shorter", "negative", "huge", "null", "bool", "nest")


def exported_state(tmp_path) -> dict:
    """A learned state as `adaspark store export` writes it."""
    key = LearnedKey("1111111111111111", "dddddddddddddddd")
    with Store.open(tmp_path / "s.db") as s:
        s.save_learned(key, learned_state(0))
        return json.loads(export_json(s))["learned"][0]["state"]


def field_paths(node, path: tuple = ()) -> dict[tuple, list[tuple]]:
    """Every field below ``node`` by its pattern (list indexes as "*"): pattern -> the paths."""
    out: dict[tuple, list[tuple]] = {}
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for k, v in items:
        p = (*path, k)
        out.setdefault(tuple("*" if isinstance(x, int) else x for x in p), []).append(p)
        for pat, paths in field_paths(v, p).items():
            out.setdefault(pat, []).extend(paths)
    return out


def corrupted(state: dict, path: tuple, how: str) -> dict:
    """A copy of ``state`` with the field at ``path`` corrupted ``how``."""
    out = copy.deepcopy(state)
    parent = out
    for k in path[:-1]:
        parent = parent[k]
    key = path[-1]
    node = parent[key]
    if how == "drop":
        del parent[key]
    elif how == "longer" and isinstance(node, list):
        node.append(node[-1] if node else 0)
    elif how == "shorter" and isinstance(node, list) and node:
        node.pop()
    else:
        parent[key] = {
            "string": str(node), "number": 7, "nan": math.nan, "negative": -3.5, "huge": 10**30, "null": None,
            "bool": True, "nest": [node], "longer": 1e308, "shorter": 0,
        }[how]
    return out


def test_every_one_field_corruption_loads_and_works_or_raises_state_error(tmp_path):
    """Every field of an exported state (every list item of a pattern counts as one field, a
    random one taken), each corrupted two random ways (a number made a string, a list a
    number, a key dropped, NaN, a list one longer or shorter, ...): validate either refuses
    with StateError or the loaded learners run rounds, every stored gate included, without any
    exception."""
    state = exported_state(tmp_path)
    rng = np.random.default_rng(2024)
    refused = loaded = 0
    patterns = field_paths(state)
    for pattern in sorted(patterns, key=str):
        paths = patterns[pattern]
        path = paths[int(rng.integers(len(paths)))]
        for how in rng.choice(MUTATIONS, size=2, replace=False):
            bad, what = corrupted(state, path, str(how)), f"{how} at {path}"
            try:
                ok = st.validate(bad)
            except StateError:
                refused += 1
                continue
            except Exception as exc:  # noqa: BLE001 - the point: nothing but StateError may escape
                pytest.fail(f"{what}: validate raised {type(exc).__name__}: {exc}")
            try:
                run_round(*learners_of(ok), np.random.default_rng(1))
            except Exception as exc:  # noqa: BLE001
                pytest.fail(f"{what}: loaded, then a round raised {type(exc).__name__}: {exc}")
            loaded += 1
    assert len(patterns) > 100 and refused > 150 and loaded > 10, (len(patterns), refused, loaded)


def test_state_error_is_the_only_error_for_non_object_parts():
    for bad in (None, [], "x", 3, {"scheduler": []}, {"scheduler": {}, "acceptance": {}, "precision": {}}):
        with pytest.raises(StateError):
            st.validate(bad)


# --- the migration of the previous layout ----------------------------------------------------


def test_the_fixture_is_in_the_previous_layout():
    """Guards the fixture itself: written by b9fbe7f's code (tests/data/README.md), it has the
    scheduler's version 1, gates as lists and no versions in the other parts."""
    old = _fixture(OLD)
    s = old["scheduler"]
    assert s["version"] == 1 and all("version" not in s[k] for k in ("cost", "chooser", "gains", "rate"))
    assert isinstance(s["gates"][0][2], list) and isinstance(s["drafter_gates"][0][2], list)
    assert "version" not in old["precision"] and old["acceptance"]["version"] == 1
    with pytest.raises(StateError, match="scheduler.version"):
        WidthScheduler().load_state(s)  # not loadable as is: it needs the migration


def test_previous_layout_migrates_loads_and_computes_what_b9fbe7f_computed(monkeypatch):
    """The b9fbe7f state migrates, loads, and the learners compute from it exactly what b9fbe7f's
    learners computed from the same state (tests/data/learned_state_b9fbe7f.views.json.gz), under
    b9fbe7f's rules: a width measured only where it could win was priced after three
    measurements there (now CONDITIONAL_MEASUREMENTS, a deliberate change of rule, not of layout)."""
    import adaspark_app.learn.cost as cost_module

    monkeypatch.setattr(cost_module, "CONDITIONAL_MEASUREMENTS", cost_module.MEASUREMENTS_BEFORE_PRICED)
    old = _fixture(OLD)
    migrated = st.validate(old)
    assert migrated["scheduler"]["version"] == WidthScheduler().state_dict()["version"] == 2
    assert old["scheduler"]["version"] == 1  # validate did not modify its argument
    learners = learners_of(migrated)
    expected = _fixture(DATA / "learned_state_b9fbe7f.views.json.gz")
    assert json.loads(json.dumps(views(*learners))) == expected
    # the per-kind D clock added optional fields, written with their defaults (an older state
    # without them loads as one clock of rounds without the drafter)
    added = {"d_drafter": False, "d_window_drafter": [], "last_drafter": False}

    def without_added(v):
        if isinstance(v, dict):
            return {k: without_added(x) for k, x in v.items() if not (k in added and x == added[k])}
        return [without_added(x) for x in v] if isinstance(v, list) else v

    assert [without_added(learner.state_dict()) for learner in learners] == [migrated[k] for k in st.PARTS]
    run_round(*learners, np.random.default_rng(0))


def test_migration_reads_the_older_forms_b9fbe7f_read():
    """b9fbe7f also read draft gate entries [band, state] (probe 0), no drafter gates and no
    precision part; the migration turns each into this layout."""
    old = _fixture(OLD)
    old["scheduler"]["gates"] = [[b, g] for b, p, g in old["scheduler"]["gates"] if p == 0]
    del old["scheduler"]["drafter_gates"]
    del old["precision"]
    for c in old["scheduler"]["cost"]["classes"]:
        del c["law"]["dirty"]
    sched, _, prec = learners_of(st.validate(old))
    assert sched.gates and all(p == 0 for _, p in sched.gates)
    assert sched.drafter_gates == {} and prec.trials == 0


def test_a_newer_or_foreign_layout_is_refused_not_guessed():
    new = learned_state(0)
    new["scheduler"]["version"] = 3
    with pytest.raises(StateError, match="scheduler.version"):
        st.validate(new)
    with pytest.raises(StateError, match="scheduler"):
        st.validate({"scheduler": {"version": 7, "layers": [1, 2]}, "acceptance": "x", "precision": {}})


@pytest.mark.parametrize("curve", ["dense_step", "routed", "cpu_linear", "wide_cheaper"])
def test_every_state_the_learners_write_loads(curve):
    """The validator refuses no state the learners themselves write: scheduler states after
    serving on each simulated machine (splits, reach, gates) load back unchanged."""
    from benchmarks.sim import learn_sim

    res = learn_sim.simulate(learn_sim.Machine(getattr(learn_sim, curve)), learn_sim.Acceptance(ngram_share=0.4),
                             [(200, 50), (1500, 40), (5000, 30)], seed=11)
    _, acc, prec = exercise(1)
    state = json.loads(json.dumps({"scheduler": res.scheduler.state_dict(), "acceptance": acc.state_dict(),
                                   "precision": prec.state_dict()}))
    assert st.validate(state) == state


def test_sampled_decodings_learners_per_temperature_band_are_validated_too():
    """The optional by_temperature part (sampled decoding's scheduler and acceptance model per
    band) loads when well formed and is refused, naming the band and field, when not."""
    sched, acc, _ = exercise(2)
    state = learned_state(0)
    state["by_temperature"] = {"2": {"scheduler": sched.state_dict(), "acceptance": acc.state_dict()}}
    state = json.loads(json.dumps(state))
    assert st.validate(state) == state
    bad = copy.deepcopy(state)
    bad["by_temperature"]["2"]["scheduler"]["rate"]["bands"][0][1][0] = "x"
    with pytest.raises(StateError, match=r"by_temperature\.2\.scheduler\.rate\.bands\[0\]\[1\]\[0\]"):
        st.validate(bad)
    for key in ("0", "two", "02"):
        bad = copy.deepcopy(state)
        bad["by_temperature"][key] = bad["by_temperature"].pop("2")
        with pytest.raises(StateError, match="temperature band"):
            st.validate(bad)
    bad = copy.deepcopy(state)
    del bad["by_temperature"]["2"]["acceptance"]
    with pytest.raises(StateError, match=r"by_temperature\.2\.acceptance: missing"):
        st.validate(bad)
