"""`adaspark bench` end to end on the bundled model: every report file is written."""

from __future__ import annotations

import json
import os
import re

import pytest

from adaspark_app import cli

pytestmark = pytest.mark.model


def test_bench_two_conversations_two_arms_writes_every_report_file(tmp_path):
    pytest.importorskip("llama_cpp")
    script = tmp_path / "two.jsonl"
    script.write_text(
        json.dumps({"id": "c0", "category": "math", "turns": ["What is 2+2?", "And 3+3?"]}) + "\n"
        + json.dumps({"id": "c1", "category": "chat", "turns": ["Say hi."]}) + "\n")
    out = tmp_path / "report"
    code = cli.main(["bench", str(script), "--arms", "ar,chain:4", "--max-tokens", "16",
                     "--report", str(out), "--no-progress"])
    assert code == 0
    for name in ("report.md", "report.json", "replies.jsonl", "speed_ratio_by_category.png",
                 "width_shares.png"):
        assert (out / name).stat().st_size > 0, name
    assert (out / "speed_ratio_by_category.png").read_bytes()[:4] == b"\x89PNG"
    data = json.loads((out / "report.json").read_text())
    assert data["meta"]["arms"] == ["ar", "chain:4"] and data["meta"]["replies_done"] == 6
    overall = data["summary"]["comparisons"]["chain:4"]["overall"]
    # every paired reply is either compared or counted as left out
    assert overall["paired"] == 3
    assert overall["replies"] + overall["excluded_looped"] + overall["excluded_no_speed"] == 3
    if overall["replies"]:
        lo, hi = overall["ci95"]
        assert lo <= overall["geomean_ratio"] <= hi
    replies = [json.loads(l) for l in (out / "replies.jsonl").read_text().splitlines()]
    assert {r["arm"] for r in replies} == {"ar", "chain:4"}
    assert all(r["n_tokens"] <= 16 for r in replies)
    assert data["summary"]["arms"]["ar"]["width_shares"] in ({"1": 1.0}, {})
    # which kernels each arm's one-row steps ran on (engine/one_row.py), so arms are comparable
    verdicts = data["meta"]["one_row"]
    assert set(verdicts) == {"ar", "chain:4"}
    verdict = (r"(ours|vec_dot|wide) \(vec_dot/ours \d\.\d{3}(, wide/ours \d\.\d{3})?\)"
               r"|learning \((wide, )?\d+/12 blocks\)")
    assert all(re.fullmatch(verdict, v) for v in verdicts.values()), verdicts
    assert f"`ar` {verdicts['ar']}" in (out / "report.md").read_text()
    assert verdicts["ar"] == verdicts["chain:4"], "the arms share one trial: one verdict"


def test_bench_prints_each_engine_notice_once_for_all_its_arms(tmp_path, capsys):
    """`--gpu-layers all` on this CPU-only build: every arm's engine has the notice, bench prints
    it once; and the report names the device the arms ran on."""
    from adaspark_app.engine.offload import build_can_offload

    assert not build_can_offload()
    script = tmp_path / "one.jsonl"
    script.write_text(json.dumps({"id": "c0", "turns": ["Say hi."]}) + "\n")
    out = tmp_path / "report"
    code = cli.main(["bench", str(script), "--arms", "ar,pinned:4", "--max-tokens", "8", "--gpu-layers", "all",
                     "--report", str(out), "--no-progress"])
    assert code == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("adaspark: note:")]
    assert len(notes) == 1 and "cannot offload to a GPU" in notes[0], notes
    assert json.loads((out / "report.json").read_text())["meta"]["machine"]["device"] == "CPU"


def test_brackets_and_escapes_in_ids_and_paths_are_text(tmp_path, capsys):
    """A conversation id or a report folder with `[/]` was read as Rich markup (MarkupError, a
    traceback) by the progress line and the summary; an id with ESC went to the terminal raw."""
    script = tmp_path / "odd.jsonl"
    script.write_text(json.dumps({"id": "conv[/]x\u001b[2J", "category": "c[/]", "turns": ["Say hi."]}) + "\n")
    out = tmp_path / "out[/]dir"
    assert cli.main(["bench", str(script), "--arms", "ar,adaspark", "--max-tokens", "4", "--report", str(out)]) == 0
    err = capsys.readouterr().err
    assert f"report: {out}/report.md" in err.replace("\n", "") and "\x1b[2J" not in err  # (rich wraps at 80)
    assert (out / "report.md").exists()


def test_an_arm_without_a_ratio_says_why_and_what_to_do(tmp_path, capsys):
    """Every reply reaching the cap left bench saying only "no comparable replies"."""
    script = tmp_path / "long.jsonl"
    script.write_text(json.dumps({"id": "c0", "turns": ["Write a long poem about the sea.", "Another."]}) + "\n")
    assert cli.main(["bench", str(script), "--arms", "ar,adaspark", "--max-tokens", "4",
                     "--report", str(tmp_path / "r"), "--no-progress"]) == 0
    err = " ".join(capsys.readouterr().err.split())  # rich wraps at 80 columns
    assert "adaspark: no comparable replies: 2 of 2 pairs reached --max-tokens 4 in an arm" in err
    assert "--keep-capped" in err


def test_a_report_folder_whose_name_is_not_utf8_gets_its_report(tmp_path, capsys):
    """A folder name with a byte that is not UTF-8 reaches Python as a surrogate escape: writing
    the command line into report.md raised UnicodeEncodeError after every reply had run."""
    script = tmp_path / "one.jsonl"
    script.write_text(json.dumps({"id": "c0", "turns": ["Say hi."]}) + "\n")
    out = tmp_path / os.fsdecode(b"report\xff")
    assert cli.main(["bench", str(script), "--arms", "ar,adaspark", "--max-tokens", "4", "--report", str(out),
                     "--no-progress"]) == 0
    assert "--report" in (out / "report.md").read_text(encoding="utf-8") and (out / "report.json").exists()
