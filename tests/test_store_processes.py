"""Crash and concurrency: a killed writer and two writing processes leave a sound store."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from adaspark_app.store import LearnedKey, Store, commands
from adaspark_app.store.migrations import known_names

ROOT = Path(__file__).resolve().parents[1]

WRITER = r"""
import sys
from adaspark_app.store import LearnedKey, Store

store = Store.open(sys.argv[1])
key = LearnedKey("feedfacefeedface", "0123456789abcdef")
prev = store.load_learned(key)
i = prev["scheduler"]["i"] + 1 if prev else 0
cid = store.create_conversation("killed run", "m")
bank = [[float(j), 0.001 * j] for j in range(400)]  # a few pages per save, like a sample bank
announced = False
while True:
    store.save_learned(
        key,
        {"scheduler": {"i": i, "bank": bank}, "acceptance": {"i": i}},
        {"arm": "adaspark", "conversation": "c", "turn": i, "n_tokens": i},
    )
    store.add_message(cid, "user", "x" * 300)
    i += 1
    if i % 10 == 0 and not announced:
        print("ready", flush=True)
        announced = True
"""


@pytest.fixture(autouse=True)
def _store_env(tmp_path, monkeypatch):
    monkeypatch.setenv("ADASPARK_STORE", str(tmp_path / "env-store.db"))


def integrity(path: Path) -> str:
    conn = sqlite3.connect(path)
    try:
        return conn.execute("pragma integrity_check").fetchone()[0]
    finally:
        conn.close()


def test_killed_writer_leaves_sound_store(tmp_path):
    """SIGKILL in the middle of saving (three times): integrity_check passes, the store opens, and
    state and summaries agree (each save was all-or-nothing), so at most the save in flight is lost.
    """
    db = tmp_path / "killed.db"
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    last = -1
    for attempt in range(3):
        proc = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(db)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            text=True,
        )
        try:
            line = proc.stdout.readline()
            assert line.strip() == "ready", proc.stderr.read()
            time.sleep(0.15 + 0.1 * attempt)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
        assert proc.returncode == -signal.SIGKILL
        assert Path(str(db) + "-wal").exists()  # killed with the WAL in use, not closed cleanly

        assert integrity(db) == "ok"
        with Store.open(db) as s:
            key = LearnedKey("feedfacefeedface", "0123456789abcdef")
            st = s.load_learned(key)
            i = st["scheduler"]["i"]
            assert st["acceptance"]["i"] == i
            assert i > last  # the restarted writer continued from what was saved
            turns = sorted(r["turn"] for r in s.request_summaries(key, limit=None))
            assert turns == list(range(i + 1))  # one summary per saved state, none torn
            assert s.integrity_check() == "ok"
            last = i
        assert commands.main_for_tests(["store", "show", "--store", str(db)]) == 0


def _worker(path: str, name: str, n: int, barrier) -> None:
    barrier.wait()  # both open the new file at once: migrations race too
    store = Store.open(path)
    own = LearnedKey(name * 16, "0123456789abcdef")
    shared = LearnedKey("5" * 16, "0123456789abcdef")
    cid = store.create_conversation(f"from {name}", "m")
    for i in range(n):
        store.save_learned(own, {"scheduler": {"i": i, "who": name}}, {"arm": name, "turn": i})
        store.save_learned(shared, {"scheduler": {"last": name, "i": i}}, {"arm": name, "turn": i})
        store.add_message(cid, "user", f"{name}-{i}")
    store.close()


def test_two_processes_share_one_store(tmp_path):
    """Two processes (the TUI and a headless run) creating and writing one store concurrently
    leave a consistent database holding every row each of them wrote."""
    path = tmp_path / "shared.db"
    n = 60
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(2)
    procs = [ctx.Process(target=_worker, args=(str(path), name, n, barrier)) for name in ("a", "b")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
    assert [p.exitcode for p in procs] == [0, 0]

    assert integrity(path) == "ok"
    with Store.open(path) as s:
        assert s.schema()["migrations"] == known_names()
        for name in ("a", "b"):
            own = LearnedKey(name * 16, "0123456789abcdef")
            assert s.load_learned(own) == {"scheduler": {"i": n - 1, "who": name}}
            assert sorted(r["turn"] for r in s.request_summaries(own, limit=None)) == list(range(n))
        shared = LearnedKey("5" * 16, "0123456789abcdef")
        assert s.load_learned(shared)["scheduler"]["i"] == n - 1
        rows = s.request_summaries(shared, limit=None)
        assert len(rows) == 2 * n
        assert {r["arm"] for r in rows} == {"a", "b"}
        convs = s.list_conversations()
        assert len(convs) == 2
        for c in convs:
            msgs = s.get_messages(c["id"])
            who = c["title"][-1]
            assert [m["content"] for m in msgs] == [f"{who}-{i}" for i in range(n)]
        shared_row = [r for r in s.list_learned() if r["key_id"] == shared.key_id][0]
        assert shared_row["n_saves"] == 2 * n
