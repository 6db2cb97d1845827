"""Paths a command writes (--out, --log-rounds, --report, --store-dir, drafter and corpora --out):
one line and exit 2 when they cannot be written, checked before the long work, an earlier file left
whole. Real files and folders; `adaspark run` and `bench` fail here before any model loads."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from adaspark_app.errors import OutputError
from adaspark_app.output_paths import check_writable, make_output_dir, open_output


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "adaspark_app.cli", *args], capture_output=True, text=True,
                          timeout=120)


def _one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> str:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def script(tmp_path):
    p = tmp_path / "ok.jsonl"
    p.write_text(json.dumps({"id": "a", "turns": ["Hello"]}) + "\n")
    return p


@pytest.fixture
def a_file(tmp_path):
    p = tmp_path / "a-file"
    p.write_text("not a folder\n")
    return p


def test_check_writable_changes_nothing(tmp_path):
    earlier = tmp_path / "earlier.jsonl"
    earlier.write_text("kept\n")
    assert check_writable(earlier, "--out") == earlier
    assert earlier.read_text() == "kept\n"
    fresh = tmp_path / "fresh.jsonl"
    check_writable(fresh, "--out")
    assert not fresh.exists()


def test_check_writable_refuses_a_folder_and_a_missing_folder(tmp_path, a_file):
    with pytest.raises(OutputError, match="it is a folder"):
        check_writable(tmp_path, "--out")
    with pytest.raises(OutputError, match="no folder"):
        check_writable(tmp_path / "missing" / "out.jsonl", "--out")
    with pytest.raises(OutputError, match="no folder"):
        check_writable(a_file / "out.jsonl", "--out")


def test_open_output_turns_oserror_into_one_line(tmp_path):
    with pytest.raises(OutputError, match=r"cannot write --out .*missing"):
        open_output(tmp_path / "missing" / "out.jsonl", "--out")
    with open_output(tmp_path / "out.jsonl", "--out") as fp:
        fp.write("x\n")
    assert (tmp_path / "out.jsonl").read_text() == "x\n"


def test_make_output_dir_makes_parents_and_names_a_file_in_the_way(tmp_path, a_file):
    made = make_output_dir(tmp_path / "a" / "b", "the report folder")
    assert made.is_dir()
    with pytest.raises(OutputError, match="a-file is a file"):
        make_output_dir(a_file, "the report folder")
    with pytest.raises(OutputError, match="a-file is a file"):
        make_output_dir(a_file / "x" / "y", "the stores' folder")


@pytest.mark.parametrize("flag", ["--out", "--log-rounds"])
def test_run_refuses_an_unwritable_path_before_the_model_loads(script, tmp_path, a_file, flag):
    _one_line_error(_run("run", str(script), flag, str(tmp_path / "missing" / "x.jsonl")), flag, "no folder")
    _one_line_error(_run("run", str(script), flag, str(tmp_path)), flag, "it is a folder")
    _one_line_error(_run("run", str(script), flag, str(a_file / "x.jsonl")), flag)


def test_run_leaves_an_earlier_out_whole_when_another_path_fails(script, tmp_path):
    earlier = tmp_path / "replies.jsonl"
    earlier.write_text('{"earlier": true}\n')
    _one_line_error(_run("run", str(script), "--out", str(earlier), "--log-rounds", str(tmp_path / "no" / "r.jsonl")),
                    "--log-rounds")
    assert earlier.read_text() == '{"earlier": true}\n'


def test_bench_refuses_report_and_store_folders_in_a_files_place(script, a_file):
    _one_line_error(_run("bench", str(script), "--arms", "ar,adaspark", "--report", str(a_file)),
                    "--report", "is a file")
    _one_line_error(_run("bench", str(script), "--arms", "ar,adaspark", "--report", str(a_file.parent / "rep"),
                         "--store-dir", str(a_file / "stores")), "--store-dir", "is a file")


def test_drafter_init_and_corpora_refuse_unwritable_out(tmp_path, a_file):
    _one_line_error(_run("drafter", "init", "--out", str(tmp_path)), "--out", "it is a folder")
    _one_line_error(_run("drafter", "init", "--out", str(a_file / "d.gguf")), "--out", "is a file")
    assert not any(p.name.endswith(".tmp") for p in tmp_path.iterdir())
    _one_line_error(_run("bench-corpus", "--out", str(a_file / "corpora")), "--out", "is a file")
