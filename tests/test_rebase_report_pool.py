"""benchmarks/speed/rebase_report.py: one run rebased, and several runs pooled into one report."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import pytest

from benchmarks.speed import rebase_report as rebase


def _run(path: Path, speedups: dict[str, float]) -> Path:
    """A replies file: per conversation, `base` at 10 tokens/s and `fast` at 10 * speedup."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = []
    for conv, s in speedups.items():
        for arm, tps in (("base", 10.0), ("fast", 10.0 * s)):
            lines.append({"arm": arm, "conversation": conv, "turn": 0, "category": "paste", "n_tokens": 20,
                          "decode_s": 20 / tps, "text": "same"})
    path.write_text("".join(json.dumps(r) + "\n" for r in lines), encoding="utf-8")
    return path


def _headline(out: Path) -> dict:
    return json.loads((out / "report.json").read_text())["headline"]["fast"]


def test_pooled_runs_are_one_geometric_mean_over_all_their_conversations(tmp_path):
    a = _run(tmp_path / "s1" / "paste" / "replies.jsonl", {"c1": 2.0, "c2": 2.0})
    # the same conversation names in another run stay distinct conversations
    b = _run(tmp_path / "s2" / "paste" / "replies.jsonl", {"c1": 0.5, "c2": 1.0, "c3": 1.0})
    assert rebase.main([str(a), "--base", "base", "--out", str(tmp_path / "ra")]) == 0
    assert rebase.main([str(a), str(b), "--base", "base", "--out", str(tmp_path / "pooled")]) == 0
    assert _headline(tmp_path / "ra")["geomean_ratio"] == pytest.approx(2.0)
    pooled = _headline(tmp_path / "pooled")
    assert pooled["replies"] == 5
    assert pooled["geomean_ratio"] == pytest.approx(math.exp((2 * math.log(2.0) + math.log(0.5)) / 5))
    lo, hi = pooled["ci95"]
    assert lo < pooled["geomean_ratio"] < hi  # five conversations that differ: an interval, not a point


def test_runs_with_one_name_or_a_bad_file_are_one_line_and_exit_2(tmp_path, capsys):
    a = _run(tmp_path / "x" / "s1" / "paste" / "replies.jsonl", {"c1": 2.0})
    b = _run(tmp_path / "y" / "s1" / "paste" / "replies.jsonl", {"c1": 1.0})
    assert rebase.main([str(a), str(b), "--base", "base"]) == 2
    err = capsys.readouterr().err
    assert "share the name 's1/paste'" in err and len(err.strip().splitlines()) == 1
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"arm": "base"}\n', encoding="utf-8")
    assert rebase.main([str(a), str(bad), "--base", "base"]) == 2
    err = capsys.readouterr().err
    assert "not a replies file" in err and len(err.strip().splitlines()) == 1
    assert rebase.main([str(a), "--base", "nope"]) == 2
    assert "no arm 'nope'" in capsys.readouterr().err


def test_a_gzip_compressed_replies_file_reads_as_the_plain_one(tmp_path, capsys):
    """The committed runs keep replies.jsonl.gz: a run reads the same compressed or not, pools with
    a plain run, and a damaged .gz is one line and exit 2."""
    a = _run(tmp_path / "s1" / "paste" / "replies.jsonl", {"c1": 2.0, "c2": 0.5, "c3": 1.0})
    gz = tmp_path / "s1z" / "paste" / "replies.jsonl.gz"
    gz.parent.mkdir(parents=True)
    gz.write_bytes(gzip.compress(a.read_bytes()))
    assert rebase.main([str(a), "--base", "base", "--out", str(tmp_path / "plain")]) == 0
    assert rebase.main([str(gz), "--base", "base", "--out", str(tmp_path / "gz")]) == 0
    assert _headline(tmp_path / "gz") == _headline(tmp_path / "plain")
    b = _run(tmp_path / "s2" / "paste" / "replies.jsonl", {"c1": 4.0})
    assert rebase.main([str(gz), str(b), "--base", "base", "--out", str(tmp_path / "pooled")]) == 0
    assert _headline(tmp_path / "pooled")["replies"] == 4
    capsys.readouterr()
    bad = tmp_path / "s3" / "paste" / "replies.jsonl.gz"
    bad.parent.mkdir(parents=True)
    bad.write_bytes(gzip.compress(a.read_bytes())[:-12])  # cut short
    assert rebase.main([str(bad), "--base", "base"]) == 2
    err = capsys.readouterr().err
    assert "cannot read" in err and len(err.strip().splitlines()) == 1
