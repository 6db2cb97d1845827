"""benchmarks/cold_start/node_calibration.py: its classes and tables on records written by hand, and one real
recording on the bundled model (the labels and prices it records are the model's own)."""

from __future__ import annotations


import pytest

from adaspark_app.learn.kinds import NgramKind, NodeKind

from benchmarks.cold_start import node_calibration


def test_node_class_bins_evidence_as_the_acceptance_model_does():
    c = node_calibration.node_class
    assert c(NodeKind.PICK, 0, 0) == "drafter pick"
    assert c(NodeKind.SIBLING, NgramKind.COPY, 9) == "drafter sibling"
    assert c(NodeKind.NGRAM, NgramKind.COPY, 5) == "copy, matched 4-7"
    assert c(NodeKind.NGRAM, NgramKind.COPY, 8) == "copy, matched 8-15"
    assert c(NodeKind.NGRAM, NgramKind.COPY, 40) == "copy, matched 32+"
    assert c(NodeKind.NGRAM, NgramKind.FOLLOWER, 1) == "follower, count 1"
    assert c(NodeKind.NGRAM, NgramKind.FOLLOWER, 3) == "follower, count 2-3"


def test_summarise_reports_known_shares_and_ratios():
    # 10 copies priced 0.9, 8 accepted; 4 followers priced 0.5, 3 accepted
    nodes = [{"cls": "copy, matched 8-15", "q": 0.9, "y": int(i < 8)} for i in range(10)]
    nodes += [{"cls": "follower, count 1", "q": 0.5, "y": int(i < 3)} for i in range(4)]
    rounds = [{"conversation": "a", "expected": 3.0, "accepted": 4}, {"conversation": "a", "expected": 1.0, "accepted": 0},
              {"conversation": "b", "expected": 6.0, "accepted": 4}]
    text = node_calibration.summarise(nodes, rounds)
    assert "| copy, matched 8-15 | 10 | 0.900 | 0.800 | 1.125 |" in text
    assert "| follower, count 1 | 4 | 0.500 | 0.750 | 0.667 |" in text
    assert "| all | 14 | 0.786 | 0.786 | 1.000 |" in text
    assert "| 1 | a | 2 | 4.0 | 4 | 1.000 |" in text
    assert "| 2 | b | 1 | 6.0 | 4 | 1.500 |" in text
    assert "| | all | 3 | 10.0 | 8 | 1.250 |" in text


def test_summarise_bins_nodes_by_depth_in_the_tree():
    # depth 1: 4 nodes at 0.5, 2 accepted; depth 2-3: 2 at 0.8, both; depth 16+: 2 at 0.9 (depths 16 and 40), 1
    nodes = [{"cls": "copy, matched 4-7", "q": 0.5, "y": int(i < 2), "depth": 1} for i in range(4)]
    nodes += [{"cls": "copy, matched 8-15", "q": 0.8, "y": 1, "depth": d} for d in (2, 3)]
    nodes += [{"cls": "copy, matched 32+", "q": 0.9, "y": int(d == 16), "depth": d} for d in (16, 40)]
    text = node_calibration.summarise(nodes, [])
    assert "| 1 | 4 | 0.500 | 0.500 | 1.000 |" in text
    assert "| 2-3 | 2 | 0.800 | 1.000 | 0.800 |" in text
    assert "| 16+ | 2 | 0.900 | 0.500 | 1.800 |" in text
    assert "| 4-7 |" not in text and "| 8-15 |" not in text  # no nodes there: no row


def test_summarise_sets_the_class_precision_beside_the_share_accepted():
    # 4 copies matched 8-15: class precision 0.8, first steps right 0.75, 3 of 4 accepted (0.75);
    # a follower whose class has no first step yet; a drafter node carries no class precision
    nodes = [{"cls": "copy, matched 8-15", "q": 0.7, "y": int(i < 3), "prec": 0.8, "first": 0.75} for i in range(4)]
    nodes += [{"cls": "follower, count 1", "q": 0.5, "y": 1, "prec": 0.5, "first": None}]
    nodes += [{"cls": "drafter pick", "q": 0.6, "y": 1}]
    text = node_calibration.summarise(nodes, [])
    assert "| copy, matched 8-15 | 4 | 0.800 | 0.750 | 1.067 | 0.750 |" in text
    assert "| follower, count 1 | 1 | 0.500 | 1.000 | 0.500 | - |" in text
    table = text.split("## Per n-gram class")[1]
    assert "drafter pick" not in table.split("\n\n", 2)[1]  # only n-gram classes in its rows
    assert "## Per n-gram class" not in node_calibration.summarise(nodes[-1:], [])  # no n-gram node: no table


@pytest.mark.model
def test_scripted_recording_replays_the_reference_replies_and_records_depths(tmp_path):
    """`--scripted`: the bundled model's `ar` replies replayed at a modeled curve; every recorded
    node carries its depth, and the report has the depth table."""
    import json

    script = tmp_path / "s.jsonl"
    # code the reply copies back: the bundled model's greedy reply differs a little from one CPU's
    # kernels to another's, and a copied file stays a copy on each (a word list did not on AVX2)
    code = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n    return a * b\n"
    prompt = f"Here is my code:\n{code}\nAdd type hints to every function and show the whole file."
    script.write_text(json.dumps({"id": "copy", "turns": [prompt]}) + "\n")
    out = tmp_path / "calib.md"
    assert node_calibration.main([str(script), "--max-tokens", "48", "--scripted", "1:0.3,64:0.6",
                                  "--out", str(out)]) == 0
    report = out.read_text()
    assert "the forward replayed at 1:0.3,64:0.6" in report and "| depth | nodes |" in report, report
    assert "| copy, matched" in report.split("## Per n-gram class")[1], report  # the copies' class precision


@pytest.mark.model
def test_recording_on_the_bundled_model_matches_the_bench_rule():
    """The recorded tree rounds are the bench's priced rounds: their count and expected and accepted
    sums are what a CalibrationTally fed the same round events counts."""
    from adaspark_app.bench.runner import CalibrationTally
    from adaspark_app.engine.chat_engine import ChatEngine
    from adaspark_app.runner import Conversation

    code = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n    return a * b\n"
    conv = Conversation("c", [f"Here is my code:\n{code}\nAdd type hints to every function and show the whole file."],
                        None, None)
    tally = CalibrationTally()
    with ChatEngine(None, arm="adaspark") as eng:
        real_generate = eng.generate

        def generate(*a, **k):  # every round event to the tally too, beside the recorder's own
            recorder = k.get("on_round")
            k["on_round"] = lambda ev: (tally(ev), recorder(ev) if recorder else None)
            return real_generate(*a, **k)

        eng.generate = generate
        nodes, rounds = node_calibration.record(eng, [conv], 96)
    t = tally.pop(0)
    assert len(rounds) == t["rounds"] and rounds, "the reply copies the pasted code: some tree rounds were priced"
    assert sum(r["expected"] for r in rounds) == pytest.approx(t["expected"])
    assert sum(r["accepted"] for r in rounds) == t["accepted"]
    assert nodes and all(0.0 <= n["q"] <= 1.0 and n["y"] in (0, 1) for n in nodes)


def test_a_missing_script_is_one_line_and_exit_2(tmp_path, capsys):
    assert node_calibration.main([str(tmp_path / "missing.jsonl")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("node_calibration: error: script not found") and err.count("\n") == 1
