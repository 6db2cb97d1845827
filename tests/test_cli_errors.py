"""Bad input gets one line on stderr naming the problem and exit code 2, never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def _run(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "adaspark_app.cli", *args], capture_output=True, text=True,
                          timeout=120, cwd=cwd)


def _one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    for n in needles:
        assert n in lines[0], lines[0]


@pytest.fixture
def good_script(tmp_path):
    p = tmp_path / "ok.jsonl"
    p.write_text(json.dumps({"id": "a", "turns": ["Hello"]}) + "\n")
    return p


def test_missing_model(good_script, tmp_path):
    _one_line_error(_run("run", str(good_script), "--model", str(tmp_path / "nope.gguf")), "not found", "nope.gguf")


def test_model_that_is_not_gguf(good_script, tmp_path):
    bad = tmp_path / "fake.gguf"
    bad.write_bytes(b"PK\x03\x04 this is a zip, not a model")
    _one_line_error(_run("run", str(good_script), "--model", str(bad)), "not a GGUF", "fake.gguf")


def test_malformed_json_line_names_file_and_line(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text(json.dumps({"id": "a", "turns": ["Hi"]}) + "\n" + "{not json\n")
    _one_line_error(_run("run", str(p)), "bad.jsonl:2", "malformed JSON")


def test_conversation_without_turns(tmp_path):
    p = tmp_path / "empty.jsonl"
    p.write_text(json.dumps({"id": "x", "turns": []}) + "\n")
    _one_line_error(_run("run", str(p)), "empty.jsonl:1", "no turns")


@pytest.mark.parametrize("flag,value", [("--temperature", "0.7"), ("--top-p", "0.9"), ("--seed", "3")])
def test_sampling_options_rejected(good_script, flag, value):
    _one_line_error(_run("run", str(good_script), flag, value), flag, "greedily")


def test_unknown_arm(good_script):
    _one_line_error(_run("run", str(good_script), "--arm", "beam:4"), "unknown arm")


def test_bad_max_tokens(good_script):
    _one_line_error(_run("run", str(good_script), "--max-tokens", "zero"), "--max-tokens")


def test_missing_script(tmp_path):
    _one_line_error(_run("run", str(tmp_path / "none.jsonl")), "script not found")
