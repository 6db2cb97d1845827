"""`adaspark store list | show | export | import | reset` through the argument parser."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from learned_states import learned_state

from adaspark_app.errors import StoreError
from adaspark_app.learn.acceptance import AcceptanceModel
from adaspark_app.learn.precision import SourcePrecision
from adaspark_app.learn.scheduler import WidthScheduler
from adaspark_app.store import LearnedKey, Store
from adaspark_app.store.transfer import export_json
from adaspark_app.store import commands

K1 = LearnedKey("1111111111111111", "dddddddddddddddd")
K2 = LearnedKey("2222222222222222", "dddddddddddddddd", "3333333333333333")
META1 = {"model": {"id": K1.model_id, "name": "SmolLM2-135M"}, "device": {"id": K1.device_id,
         "name": "EPYC, 2 threads, cpu"}, "drafter": None}
META2 = {"model": {"id": K2.model_id, "name": "Gemma-270M"}, "device": {"id": K2.device_id,
         "name": "EPYC, 2 threads, cpu"}, "drafter": {"id": K2.drafter_id, "name": "dspark-tiny"}}


@pytest.fixture(autouse=True)
def _store_env(tmp_path, monkeypatch):
    monkeypatch.setenv("ADASPARK_STORE", str(tmp_path / "env-store.db"))


@pytest.fixture
def default_db(tmp_path) -> Path:
    return tmp_path / "env-store.db"


def cli(*argv: str) -> int:
    return commands.main_for_tests(list(argv))


def file_state(path: Path) -> tuple[str, int]:
    return hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns


def trained_state() -> tuple[dict, WidthScheduler]:
    """Real learner state: a scheduler whose cost model has priced every width."""
    s = WidthScheduler()
    for _ in range(3):
        for w in s.cost.widths():
            for ctx in (200, 400, 800, 1600):
                s.cost.observe(w, ctx, 0.01 * (1 + 0.1 * w) * (1 + ctx / 4000))
        s.end_request()
    return {"scheduler": s.state_dict(), "acceptance": AcceptanceModel().state_dict(),
            "precision": SourcePrecision().state_dict()}, s


def fill(path: Path, state: dict | None = None) -> None:
    with Store.open(path) as s:
        s.save_learned(K1, state or learned_state(0), {"arm": "adaspark", "conversation": "c",
                       "turn": 0, "n_tokens": 100, "decode_s": 1.25, "widths": {"1": 3, "8": 20}},
                       key_meta=META1)
        s.save_learned(K2, learned_state(1), None, key_meta=META2)


def test_list_prints_keys_with_names_and_counts(default_db, capsys):
    """`store list` shows one row per key: id, model, device, drafter, requests."""
    fill(default_db)
    assert cli("store", "list") == 0
    out = capsys.readouterr().out
    assert K1.key_id in out and K2.key_id in out
    assert "SmolLM2-135M" in out and "Gemma-270M" in out and "dspark-tiny" in out
    line = next(ln for ln in out.splitlines() if K1.key_id in ln)
    assert "│        1 │" in line  # one request summary


def test_looking_does_not_create_a_store(tmp_path, default_db, capsys):
    """list/show on a missing store say so without creating a file; export is an error."""
    assert cli("store", "list") == 0
    assert "no learned state" in capsys.readouterr().out
    assert cli("store", "show", "--store", str(tmp_path / "typo.db")) == 0
    assert cli("store", "export") == 2
    assert "no store at" in capsys.readouterr().err
    assert not default_db.exists() and not (tmp_path / "typo.db").exists()
    Store.open(default_db).close()
    assert cli("store", "list") == 0
    assert "no learned state" in capsys.readouterr().out


def test_store_option_on_parent_and_action(tmp_path, capsys):
    """--store works before the action and after it; the action's value wins."""
    a, b = tmp_path / "a.db", tmp_path / "b.db"
    fill(a)
    Store.open(b).close()
    assert cli("store", "--store", str(a), "list") == 0
    assert K1.key_id in capsys.readouterr().out
    assert cli("store", "list", "--store", str(a)) == 0
    assert K1.key_id in capsys.readouterr().out
    assert cli("store", "--store", str(a), "list", "--store", str(b)) == 0
    assert "no learned state" in capsys.readouterr().out


def test_show_prices_learned_widths_and_acceptance(default_db, capsys):
    """`store show` prints each learned width's priced verify time (ms) at 256/1024/4096 tokens
    and the acceptance model's state."""
    state, sched = trained_state()
    fill(default_db, state)
    assert cli("store", "show", "--key", K1.model_id[:6]) == 0
    out = capsys.readouterr().out
    assert "ctx 256" in out and "ctx 1024" in out and "ctx 4096" in out
    row8 = next(ln for ln in out.splitlines() if ln.strip("│ ").startswith("8 "))
    for ctx in (256, 1024, 4096):
        assert f"{sched.price_table(ctx)[8] * 1e3:.2f}" in row8
    assert "priced by" in out and "head" in out
    assert "guard loss, fitted" in out and "counters.rounds" in out
    assert "cold start: 7 of 7 widths priced" in out
    assert "last 1 request " in out and "1:3 8:20" in out and "1 request, 1 save," in out
    assert K2.key_id not in out  # --key selected one key


def test_show_survives_partial_state(default_db, capsys):
    """Partial or foreign learner state never crashes `show`: it says why the state does not
    load (naming the field) and shows the raw fields."""
    with Store.open(default_db) as s:
        s.save_learned(K1, {"scheduler": {"version": 999, "d_clock": 0.5}, "acceptance": "junk",
                            "gains": {"band": {"rate": 80.0}}})
        s.save_learned(K2, {})
    assert cli("store", "show") == 0
    out = capsys.readouterr().out
    assert "learned state: does not load (scheduler.version: this AdaSpark reads version 2, got 999)" in out
    assert "d_clock" in out and "0.5" in out
    assert "acceptance: junk" in out and "band.rate" in out
    assert "does not load (learned state.scheduler: missing)" in out
    assert K2.key_id in out


def test_show_and_list_name_a_state_kept_aside(default_db, capsys):
    """A state the engine kept aside (it did not load) is named by `list` and `show` with its
    reason, and `reset` deletes it with the key's learned state."""
    fill(default_db)
    with Store.open(default_db) as s:
        assert s.quarantine_learned(K2, "scheduler.version: this AdaSpark reads version 2, got 9",
                                    s.load_learned(K2))
    assert cli("store", "list") == 0
    out = capsys.readouterr().out
    assert f"for key {K2.key_id}: a learned state that did not load (scheduler.version" in out
    assert cli("store", "show") == 0
    out = capsys.readouterr().out
    assert "widths" in out and f"for key {K2.key_id}" in out
    assert cli("store", "reset", "--yes") == 0
    with Store.open(default_db) as s:
        assert s.quarantined() == []


def test_import_of_a_corrupted_learned_state_exits_2_with_one_line(tmp_path, default_db, capsys):
    """An export whose learned state was corrupted in one field is refused: exit 2, one line
    naming the entry and the field, and nothing imported."""
    fill(default_db)
    f = tmp_path / "e.json"
    assert cli("store", "export", "--out", str(f)) == 0
    doc = json.loads(f.read_text())
    doc["learned"][1]["state"]["scheduler"]["cost"]["classes"][0]["law"]["samples"] = "many"
    f.write_text(json.dumps(doc))
    other = tmp_path / "other.db"
    capsys.readouterr()
    assert cli("store", "import", str(f), "--store", str(other)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("adaspark: error: ")
    assert "learned[1].state" in err and "scheduler.cost.classes[0].law.samples: must be an integer" in err
    with Store.open(other) as s:
        assert s.list_learned() == []


@pytest.mark.parametrize("turn", [10**30, 1e308, -2**63 - 1])
def test_import_of_a_summary_integer_sqlite_cannot_hold_exits_2(tmp_path, default_db, capsys, turn):
    """A request summary whose integer field is past SQLite's 64-bit range (a tampered export) is
    refused with one line naming the field, not an OverflowError; nothing imported."""
    fill(default_db)
    f = tmp_path / "e.json"
    assert cli("store", "export", "--out", str(f)) == 0
    doc = json.loads(f.read_text())
    doc["learned"][0]["requests"][0]["turn"] = turn
    f.write_text(json.dumps(doc))
    other = tmp_path / "other.db"
    capsys.readouterr()
    assert cli("store", "import", str(f), "--store", str(other)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("adaspark: error: ") and "'turn'" in err
    with Store.open(other) as s:
        assert s.list_learned() == []


def test_import_of_a_lone_surrogate_exits_2_with_one_line(tmp_path, default_db, capsys):
    """A summary's text with JSON's \\udfff escape (no character: a tampered export) raised
    UnicodeEncodeError in SQLite, a traceback; nothing is imported now."""
    fill(default_db)
    f = tmp_path / "e.json"
    assert cli("store", "export", "--out", str(f)) == 0
    doc = json.loads(f.read_text())
    doc["learned"][0]["requests"][0]["arm"] = "a\udfff"
    f.write_text(json.dumps(doc))  # ensure_ascii: the escape
    other = tmp_path / "other.db"
    capsys.readouterr()
    assert cli("store", "import", str(f), "--store", str(other)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "a lone surrogate \\udfff" in err
    assert not other.exists() or Store.open(other).list_learned() == []


def test_export_import_files_round_trip(tmp_path, default_db, capsys):
    """export --out, import into another store, export again: identical files."""
    fill(default_db)
    f1, f2 = tmp_path / "one.json", tmp_path / "two.json"
    assert cli("store", "export", "--out", str(f1)) == 0
    other = tmp_path / "other.db"
    assert cli("store", "import", str(f1), "--store", str(other)) == 0
    out = capsys.readouterr().out
    assert out.count("added") == 2
    assert cli("store", "export", "--out", str(f2), "--store", str(other)) == 0
    assert f1.read_bytes() == f2.read_bytes()
    assert json.loads(f1.read_text())["format"] == "adaspark-store"


def test_export_to_stdout_and_one_key(default_db, capsys):
    fill(default_db)
    assert cli("store", "export") == 0
    with Store.open(default_db) as s:
        assert capsys.readouterr().out == export_json(s)
    assert cli("store", "export", "--key", "Gemma") == 0
    doc = json.loads(capsys.readouterr().out)
    assert [e["key"]["model_id"] for e in doc["learned"]] == [K2.model_id]


def test_import_merge_flag(tmp_path, default_db, capsys):
    fill(default_db)
    f = tmp_path / "e.json"
    assert cli("store", "export", "--out", str(f)) == 0
    assert cli("store", "import", str(f), "--merge") == 0
    out = capsys.readouterr().out
    assert out.count("merged") == 2 and "kept the local state" in out


def test_import_errors_are_one_line_exit_2(tmp_path, default_db, capsys):
    """A missing or malformed import file: exit 2, one line naming the file, store unchanged."""
    fill(default_db)
    with Store.open(default_db) as s:
        before = export_json(s)
    assert cli("store", "import", str(tmp_path / "nope.json")) == 2
    err = capsys.readouterr().err
    assert err.startswith("adaspark: error: import: no such file") and err.count("\n") == 1
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "adaspark-store", "version": 1, "learned": [{"key": 1}]}')
    assert cli("store", "import", str(bad)) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "learned[0]" in err and err.count("\n") == 1
    with Store.open(default_db) as s:
        assert export_json(s) == before


def test_import_reads_at_most_its_limit_and_a_device_is_one_line(tmp_path, default_db, capsys, monkeypatch):
    """An export past IMPORT_LIMIT is refused before it is parsed, nothing imported; /dev/zero (a
    read that never ends: a MemoryError traceback before) is one line, exit 2."""
    fill(default_db)
    f = tmp_path / "export.json"
    assert cli("store", "export", "--out", str(f)) == 0
    capsys.readouterr()
    monkeypatch.setattr(commands, "IMPORT_LIMIT", f.stat().st_size - 1)
    other = tmp_path / "other.db"
    assert cli("store", "import", str(f), "--store", str(other)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "export.json is larger than" in err
    with Store.open(other) as s:
        assert s.list_learned() == []
    monkeypatch.setattr(commands, "IMPORT_LIMIT", f.stat().st_size)
    assert cli("store", "import", str(f), "--store", str(other)) == 0
    out = subprocess.run([sys.executable, "-m", "adaspark_app.cli", "store", "import", "/dev/zero"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stderr.count("\n") == 1
    assert "/dev/zero is larger than 256 MiB" in out.stderr


def test_reset_without_tty_or_yes_refuses(default_db, capsys, monkeypatch):
    """No terminal to ask and no --yes: exit 2 and nothing deleted."""
    fill(default_db)
    monkeypatch.setattr(sys, "stdin", open(os.devnull))
    assert cli("store", "reset") == 2
    assert "--yes" in capsys.readouterr().err
    with Store.open(default_db) as s:
        assert len(s.list_learned()) == 2


def test_reset_asks_on_a_tty(default_db, capsys, monkeypatch):
    """On a terminal reset asks; 'no' deletes nothing, 'yes' deletes."""
    fill(default_db)

    class Tty:
        def isatty(self):
            return True

    monkeypatch.setattr(sys, "stdin", Tty())
    answers = iter([False, True])
    asked: list[str] = []
    monkeypatch.setattr(commands, "_confirm", lambda q: asked.append(q) or next(answers))
    assert cli("store", "reset") == 1
    with Store.open(default_db) as s:
        assert len(s.list_learned()) == 2
    assert cli("store", "reset", "--key", K2.key_id) == 0
    assert K2.key_id in asked[1]
    with Store.open(default_db) as s:
        assert [r["key_id"] for r in s.list_learned()] == [K1.key_id]


def test_reset_yes(default_db, capsys):
    fill(default_db)
    assert cli("store", "reset", "--yes") == 0
    assert "deleted learned state of 2 keys" in capsys.readouterr().out
    with Store.open(default_db) as s:
        assert s.list_learned() == []


@pytest.mark.parametrize("n", ["-3", str(commands.SHOW_REQUESTS_MAX + 1), str(1 << 70)])
def test_show_requests_out_of_range_exits_2(default_db, capsys, n):
    """`show --requests N` past 0..SHOW_REQUESTS_MAX is one line, exit 2 (a negative count listed
    nothing; one past SQLite's 64-bit LIMIT was an OverflowError)."""
    fill(default_db)
    assert cli("store", "show", "--requests", n) == 2
    err = capsys.readouterr().err
    assert err.startswith("adaspark: error: ") and err.count("\n") == 1
    assert f"--requests must be from 0 to {commands.SHOW_REQUESTS_MAX}, got {n}" in err


def test_show_requests_zero_lists_none_and_n_lists_n(default_db, capsys):
    """--requests 0 shows the state without the request table; N caps the table at N rows."""
    with Store.open(default_db) as s:
        for turn in range(3):
            s.save_learned(K1, learned_state(0), {"arm": "adaspark", "conversation": "c", "turn": turn,
                           "n_tokens": 10, "decode_s": 1.0, "widths": {"1": 1}}, key_meta=META1)
    assert cli("store", "show", "--requests", "0") == 0
    out = capsys.readouterr().out
    assert "key " + K1.key_id + ": 3 requests" in out and "last " not in out
    assert cli("store", "show", "--requests", "2") == 0
    assert "last 2 requests" in capsys.readouterr().out


def test_ambiguous_or_unknown_key(default_db, capsys):
    fill(default_db)
    assert cli("store", "show", "--key", "zzz") == 2
    assert "no learned key matches" in capsys.readouterr().err
    with Store.open(default_db) as s:
        s.save_learned(LearnedKey("1111111111111112", "dddddddddddddddd"), {})
    assert cli("store", "export", "--key", "111111111111111") == 2
    assert "matches 2 keys" in capsys.readouterr().err


@pytest.mark.parametrize("action", ["list", "show", "export", "reset --yes"])
def test_random_file_as_store_exit_2_untouched(tmp_path, capsys, action):
    """A random file as --store: exit 2, one-line error, file byte-identical, for every action."""
    p = tmp_path / "random.bin"
    p.write_bytes(os.urandom(3000))
    before = file_state(p)
    assert cli("store", *action.split(), "--store", str(p)) == 2
    err = capsys.readouterr().err
    assert err.startswith("adaspark: error: ") and err.count("\n") == 1
    assert "not an AdaSpark store" in err
    assert file_state(p) == before
    assert sorted(x.name for x in tmp_path.iterdir()) == ["random.bin"]


def test_run_raises_store_error_directly(tmp_path):
    """run(args) raises StoreError (the main CLI prints it and exits 2)."""
    p = tmp_path / "random.bin"
    p.write_bytes(b"hello")
    args = argparse.Namespace(store_action="list", store=str(p))
    with pytest.raises(StoreError) as info:
        commands.run(args)
    assert info.value.exit_code == 2


def test_main_cli_dispatches_store(tmp_path, default_db, capsys):
    """Through adaspark's own CLI: `adaspark store list` works and a random --store exits 2."""
    from adaspark_app import cli as cli_mod

    fill(default_db)
    assert cli_mod.main(["store", "list"]) == 0
    assert K1.key_id in capsys.readouterr().out
    p = tmp_path / "random.bin"
    p.write_bytes(os.urandom(1000))
    before = file_state(p)
    assert cli_mod.main(["store", "show", "--store", str(p)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("adaspark: error: ") and err.count("\n") == 1
    assert file_state(p) == before


def test_names_from_a_gguf_print_their_control_characters_as_escapes(default_db, capsys):
    """A model name is a GGUF's metadata: ESC or BEL in it would reach the terminal as a command
    (retitle the window, set the clipboard); `store list` and `show` print them as escapes."""
    evil = {"model": {"id": K1.model_id, "name": "Evil\x1b]0;pwned\x07\x1b[31m"}, "device": META1["device"],
            "drafter": None}
    with Store.open(default_db) as s:
        s.save_learned(K1, learned_state(0), None, key_meta=evil)
    for action in ("list", "show"):
        assert cli("store", action) == 0
        out = capsys.readouterr().out
        assert "\x1b" not in out and "\x07" not in out
        assert "Evil\\x1b]0;pwned" in out and "\\x1b[31m" in out  # (rich drops the BEL itself)


def test_export_into_a_pipe_writes_through_it_and_leaves_it_a_pipe(tmp_path, default_db, capsys):
    """An export is written beside its file and renamed over it; over a device or a pipe the
    rename replaced the device itself (as root, `--out /dev/null` left /dev/null a regular file
    and broke every later writer to it). A pipe here, read by a thread, stands for /dev/null."""
    import stat
    import threading

    fill(default_db)
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(pipe.read_bytes()), daemon=True)
    reader.start()
    assert cli("store", "export", "--out", str(pipe)) == 0
    reader.join(10)
    assert stat.S_ISFIFO(os.stat(pipe).st_mode)
    assert json.loads(got[0])["format"] == "adaspark-store"
    assert [p.name for p in tmp_path.iterdir() if p.name != "pipe" and not p.name.endswith(".db")] == []
