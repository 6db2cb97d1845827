"""The store file: opening, migrations, refusal of foreign/newer files, learned state, chats."""

from __future__ import annotations

import hashlib
import os
import sqlite3
import threading
from pathlib import Path

import pytest
from sqlite_utils import Database

from adaspark_app.errors import StoreError
from adaspark_app.store import (
    APPLICATION_ID,
    LearnedKey,
    Store,
    default_store_path,
    migrate,
    schema_version,
    title_from,
)
from adaspark_app.store import migrations as mig
from full_disk import fill_disk, small_disk  # noqa: F401 - small_disk is a fixture

KEY = LearnedKey("a1b2c3d4e5f60718", "0123456789abcdef")
KEY_D = LearnedKey("a1b2c3d4e5f60718", "0123456789abcdef", "ffeeddccbbaa9988")


@pytest.fixture(autouse=True)
def _store_env(tmp_path, monkeypatch):
    """Isolate: the default store is a file in this test's tmp dir."""
    monkeypatch.setenv("ADASPARK_STORE", str(tmp_path / "env-store.db"))


def fingerprint_of(path: Path) -> tuple[str, int, int]:
    """(sha256, size, mtime_ns): what 'left untouched' means."""
    data = path.read_bytes()
    st = path.stat()
    return hashlib.sha256(data).hexdigest(), st.st_size, st.st_mtime_ns


def siblings(path: Path) -> list[str]:
    return sorted(p.name for p in path.parent.iterdir() if p.name.startswith(path.name))


def state(i: int = 0) -> dict:
    return {
        "scheduler": {"widths": {"1": {"a": 0.01 * i}, "8": {"a": 0.05}}, "d_clock": 0.002},
        "acceptance": {"counters": {"rounds": i}, "z": [0.1, -0.2]},
    }


# --- opening and the default path -----------------------------------------------------------------


def test_default_path_follows_env_var(tmp_path):
    """ADASPARK_STORE overrides the platformdirs location, so tests never touch the user's store."""
    assert default_store_path() == tmp_path / "env-store.db"
    s = Store.open()
    try:
        assert s.path == tmp_path / "env-store.db"
        assert s.path.exists()
    finally:
        s.close()


def test_default_path_without_env_is_user_data_dir(monkeypatch):
    """Without the variable the store lives in platformdirs' user data dir for 'adaspark'."""
    from platformdirs import user_data_dir

    monkeypatch.delenv("ADASPARK_STORE")
    assert default_store_path() == Path(user_data_dir("adaspark")) / "adaspark.db"


def test_new_store_is_wal_with_busy_timeout_and_marked(tmp_path):
    """WAL (readers never block the writer) and a busy timeout are what let two processes share
    one store; the application id marks the file as ours."""
    s = Store.open(tmp_path / "sub" / "dir" / "s.db")  # missing folders are created
    try:
        assert s.db.conn.execute("pragma journal_mode").fetchone()[0] == "wal"
        assert s.db.conn.execute("pragma busy_timeout").fetchone()[0] >= 5000
        info = s.schema()
        assert info["application_id"] == APPLICATION_ID
        assert info["user_version"] == schema_version()
        assert info["migrations"] == mig.known_names()
    finally:
        s.close()


def test_migrations_from_empty_file(tmp_path):
    """A zero-byte file (e.g. from `touch`) is initialised by running every migration."""
    p = tmp_path / "empty.db"
    p.touch()
    with Store.open(p) as s:
        assert s.schema()["migrations"] == mig.known_names()
        assert mig.known_names()[:3] == ["m001_initial", "m002_request_extra_and_indexes",
                                         "m003_learned_quarantine"]
        s.save_learned(KEY, state(), {"arm": "adaspark", "n_tokens": 3, "extra_key": 1})
        assert s.load_learned(KEY) == state()


def test_migrations_recorded_by_name_and_run_once(tmp_path):
    """Reopening runs nothing: each migration is recorded once by function name."""
    p = tmp_path / "s.db"
    Store.open(p).close()
    Store.open(p).close()
    conn = sqlite3.connect(p)
    rows = conn.execute("select name from _migrations order by rowid").fetchall()
    conn.close()
    assert [r[0] for r in rows] == mig.known_names()


def test_migration_from_previous_schema_keeps_data(tmp_path):
    """A store written at schema 1 (m001 only) is migrated on open and its data still loads."""
    p = tmp_path / "old.db"
    conn = sqlite3.connect(p, isolation_level=None)
    db = Database(conn)
    ran = migrate(db, stop_after="m001_initial")
    assert ran == ["m001_initial"]
    conn.execute(
        "insert into learned (key_id, model_id, device_id, drafter_id, state, key_meta, n_saves, "
        "created, updated) values (?, ?, ?, null, ?, null, 4, '2025-01-01', '2025-01-02')",
        (KEY.key_id, KEY.model_id, KEY.device_id, '{"scheduler":{"w":1}}'),
    )
    conn.execute(
        "insert into requests (key_id, arm, n_tokens, widths, created) values (?, 'ar', 9, '{\"1\":9}', 'x')",
        (KEY.key_id,),
    )
    assert conn.execute("pragma user_version").fetchone()[0] == 1
    assert "extra" not in db["requests"].columns_dict
    conn.close()

    with Store.open(p) as s:
        assert s.schema()["migrations"] == mig.known_names()
        assert s.schema()["user_version"] == schema_version()
        assert "extra" in s.db["requests"].columns_dict
        assert s.load_learned(KEY) == {"scheduler": {"w": 1}}
        old = s.request_summaries(KEY)
        assert old[0]["arm"] == "ar" and old[0]["widths"] == {1: 9}
        s.save_learned(KEY, {"scheduler": {"w": 2}}, {"arm": "adaspark", "looped": True})
        new = s.request_summaries(KEY)
        assert new[0]["looped"] is True and len(new) == 2
        assert s.list_learned()[0]["n_saves"] == 5


def test_failed_migration_rolls_back_whole(tmp_path, monkeypatch):
    """A migration that fails leaves the previous schema, not half a migration."""
    p = tmp_path / "s.db"
    conn = sqlite3.connect(p, isolation_level=None)
    migrate(Database(conn), stop_after="m001_initial")
    conn.close()

    def m003_broken(db):
        db["requests"].add_column("will_vanish", str)
        raise RuntimeError("boom")

    monkeypatch.setattr(mig, "MIGRATIONS", [*mig.MIGRATIONS, m003_broken])
    with pytest.raises(RuntimeError):
        Store.open(p)
    conn = sqlite3.connect(p)
    names = [r[0] for r in conn.execute("select name from _migrations")]
    cols = [r[1] for r in conn.execute("pragma table_info(requests)")]
    conn.close()
    assert names == ["m001_initial"]
    assert "extra" not in cols and "will_vanish" not in cols


# --- refusing files that are not ours ------------------------------------------------------------


def test_random_bytes_file_refused_untouched(tmp_path):
    """A random file given as the store raises StoreError and is not modified."""
    p = tmp_path / "random.db"
    p.write_bytes(os.urandom(4096))
    before = fingerprint_of(p)
    with pytest.raises(StoreError, match="not an AdaSpark store"):
        Store.open(p)
    assert fingerprint_of(p) == before
    assert siblings(p) == ["random.db"]


def test_random_bytes_with_sqlite_magic_refused_untouched(tmp_path):
    """Garbage after SQLite's magic is caught by SQLite itself, still without writing."""
    p = tmp_path / "fake.db"
    p.write_bytes(b"SQLite format 3\x00" + os.urandom(8192))
    before = fingerprint_of(p)
    with pytest.raises(StoreError):
        Store.open(p)
    assert fingerprint_of(p) == before
    assert siblings(p) == ["fake.db"]


def test_foreign_sqlite_database_refused_untouched(tmp_path):
    """Another application's SQLite database (its own tables, no marker) is refused untouched."""
    p = tmp_path / "other.db"
    conn = sqlite3.connect(p)
    conn.execute("create table notes (id integer primary key, body text)")
    conn.execute("insert into notes (body) values ('keep me')")
    conn.commit()
    conn.close()
    before = fingerprint_of(p)
    with pytest.raises(StoreError, match="another application"):
        Store.open(p)
    assert fingerprint_of(p) == before
    assert siblings(p) == ["other.db"]


def test_foreign_wal_database_refused_untouched(tmp_path):
    """A foreign WAL-mode database is inspected without leaving -wal/-shm files beside it."""
    p = tmp_path / "otherwal.db"
    conn = sqlite3.connect(p)
    conn.execute("pragma journal_mode=wal")
    conn.execute("create table t (x)")
    conn.commit()
    conn.close()
    before = fingerprint_of(p)
    with pytest.raises(StoreError):
        Store.open(p)
    assert fingerprint_of(p) == before
    assert siblings(p) == ["otherwal.db"]


def test_sqlite_with_other_application_id_refused(tmp_path):
    """An empty-looking database stamped by another application is not adopted."""
    p = tmp_path / "stamped.db"
    conn = sqlite3.connect(p)
    conn.execute("pragma application_id = 12345")
    conn.commit()
    conn.close()
    before = fingerprint_of(p)
    with pytest.raises(StoreError):
        Store.open(p)
    assert fingerprint_of(p) == before


def test_newer_schema_refused_untouched(tmp_path):
    """A store written by a newer AdaSpark (unknown migration, higher version) is refused and
    neither migrated nor written."""
    p = tmp_path / "future.db"
    with Store.open(p) as s:
        s.save_learned(KEY, state())
    conn = sqlite3.connect(p, isolation_level=None)
    conn.execute("insert into _migrations (name, applied_at) values ('m003_from_the_future', 'x')")
    conn.execute(f"pragma user_version = {schema_version() + 1}")
    conn.close()
    before = fingerprint_of(p)
    with pytest.raises(StoreError, match="newer AdaSpark"):
        Store.open(p)
    assert fingerprint_of(p) == before
    assert siblings(p) == ["future.db"]


def test_directory_as_store_refused(tmp_path):
    with pytest.raises(StoreError, match="directory"):
        Store.open(tmp_path)


# --- learned state ---------------------------------------------------------------------------------


def test_save_and_load_learned_round_trip(tmp_path):
    """What save_learned stored is what load_learned returns after a restart (new process view)."""
    p = tmp_path / "s.db"
    with Store.open(p) as s:
        assert s.load_learned(KEY) is None
        s.save_learned(KEY, state(1))
        s.save_learned(KEY, state(2))
        s.save_learned(KEY_D, state(7))
    with Store.open(p) as s:
        assert s.load_learned(KEY) == state(2)
        assert s.load_learned(KEY_D) == state(7)


def test_save_learned_converts_numpy_and_int_keys(tmp_path):
    """Learner state with numpy values and int width keys is stored as plain JSON."""
    import numpy as np  # a dependency of the package: never skipped
    with Store.open(tmp_path / "s.db") as s:
        s.save_learned(
            KEY,
            {"scheduler": {8: np.float32(1.5), "arr": np.arange(3), "n": np.int64(4), "ok": np.bool_(True)}},
        )
        assert s.load_learned(KEY) == {"scheduler": {"8": 1.5, "arr": [0, 1, 2], "n": 4, "ok": True}}


def test_unserialisable_state_rejected_without_writing(tmp_path):
    """A state that cannot be JSON raises StoreError and the previous state survives."""
    with Store.open(tmp_path / "s.db") as s:
        s.save_learned(KEY, state(1))
        with pytest.raises(StoreError, match="cannot be stored"):
            s.save_learned(KEY, {"scheduler": object()}, {"arm": "x"})
        assert s.load_learned(KEY) == state(1)
        assert s.request_summaries(KEY) == []


def test_summary_and_state_saved_together(tmp_path):
    """save_learned writes state and summary in one transaction: a bad summary saves neither."""
    with Store.open(tmp_path / "s.db") as s:
        s.save_learned(KEY, state(1), {"arm": "adaspark", "turn": 0})
        with pytest.raises(StoreError, match="turn"):
            s.save_learned(KEY, state(2), {"arm": "adaspark", "turn": "first"})
        assert s.load_learned(KEY) == state(1)
        assert len(s.request_summaries(KEY)) == 1
        assert s.list_learned()[0]["n_saves"] == 1


def test_request_summaries_fields_and_order(tmp_path):
    """Summaries come back newest first with typed fields, width keys as ints, extras kept, and
    tokens_per_s derived when absent; an epoch `created` becomes an ISO time."""
    with Store.open(tmp_path / "s.db") as s:
        for t in range(3):
            s.save_learned(
                KEY,
                state(t),
                {
                    "arm": "adaspark",
                    "conversation": "c1",
                    "turn": t,
                    "n_tokens": 100,
                    "decode_s": 2.0,
                    "rounds": 40,
                    "widths": {"1": 10, "8": 30},
                    "measure_rounds": 5 - t,
                    "created": 1_700_000_000.0 + t,
                    "rows_by_source": {"ngram": 3},
                },
            )
        s.save_learned(KEY_D, state(), {"arm": "chain:4"})
        rows = s.request_summaries(KEY)
        assert [r["turn"] for r in rows] == [2, 1, 0]
        r = rows[0]
        assert r["widths"] == {1: 10, 8: 30}
        assert r["tokens_per_s"] == pytest.approx(50.0)
        assert r["rows_by_source"] == {"ngram": 3}
        assert r["created"].startswith("2023-11-14T22:13:22")
        assert len(s.request_summaries()) == 4
        assert len(s.request_summaries(limit=2)) == 2


def test_list_learned_names_and_counts(tmp_path):
    """`store list` rows: names from key_meta (fingerprints or explicit names), request counts."""
    meta = {
        "model": {"id": KEY.model_id, "name": "SmolLM2"},
        "device": {"id": KEY.device_id, "name": "EPYC, 2 threads, cpu"},
        "drafter": None,
    }
    with Store.open(tmp_path / "s.db") as s:
        s.save_learned(KEY, state(), {"arm": "a"}, key_meta=meta)
        s.save_learned(KEY, state(), {"arm": "a"})  # key_meta kept when not given
        s.save_learned(KEY_D, state(), None, key_meta={**meta, "drafter_name": "dspark-1"})
        rows = {r["key_id"]: r for r in s.list_learned()}
        assert rows[KEY.key_id]["model_name"] == "SmolLM2"
        assert rows[KEY.key_id]["device_name"] == "EPYC, 2 threads, cpu"
        assert rows[KEY.key_id]["n_requests"] == 2
        assert rows[KEY.key_id]["n_saves"] == 2
        assert rows[KEY_D.key_id]["drafter_name"] == "dspark-1"
        assert rows[KEY_D.key_id]["n_requests"] == 0


def test_invalid_key_rejected(tmp_path):
    """Key ids with '/' would make two keys collide: refused with StoreError."""
    with Store.open(tmp_path / "s.db") as s:
        with pytest.raises(StoreError):
            s.save_learned(LearnedKey("a/b", "c"), state())
        with pytest.raises(StoreError):
            s.load_learned(LearnedKey("", "c"))


def test_reset_one_key_and_all_keeps_conversations(tmp_path):
    """reset deletes learned state and summaries (one key or all) but never the user's chats."""
    with Store.open(tmp_path / "s.db") as s:
        cid = s.create_conversation("hello", "m")
        s.add_message(cid, "user", "hello")
        s.save_learned(KEY, state(), {"arm": "a"})
        s.save_learned(KEY_D, state(), {"arm": "a"})
        assert s.reset(KEY_D) == 1
        assert s.load_learned(KEY_D) is None and s.load_learned(KEY) == state()
        assert s.request_summaries(KEY_D) == []
        assert s.reset() == 1
        assert s.list_learned() == [] and s.request_summaries() == []
        assert s.reset() == 0
        assert len(s.get_messages(cid)) == 1


def test_store_shared_between_threads(tmp_path):
    """The engine's worker thread saves while the UI thread reads chats on one Store."""
    with Store.open(tmp_path / "s.db") as s:
        cid = s.create_conversation("t", "m")
        errors: list[BaseException] = []

        def worker():
            try:
                for i in range(50):
                    s.save_learned(KEY, state(i), {"arm": "a", "turn": i})
            except BaseException as e:  # pragma: no cover - reported below
                errors.append(e)

        th = threading.Thread(target=worker)
        th.start()
        for i in range(50):
            s.add_message(cid, "user", f"m{i}")
            s.list_conversations()
        th.join()
        assert not errors
        assert len(s.request_summaries(KEY, limit=None)) == 50
        assert len(s.get_messages(cid)) == 50


def test_closed_store_raises_store_error(tmp_path):
    s = Store.open(tmp_path / "s.db")
    s.close()
    with pytest.raises(StoreError, match="closed"):
        s.load_learned(KEY)


# --- conversations ------------------------------------------------------------------------------------


def test_conversation_crud(tmp_path):
    """Create, append, read in order, rename and delete a conversation (messages go with it)."""
    with Store.open(tmp_path / "s.db") as s:
        cid = s.create_conversation("What is speculative decoding?", "SmolLM2", system="be brief")
        assert len(cid) == 32 and int(cid, 16) >= 0
        m1 = s.add_message(cid, "user", "What is speculative decoding?")
        m2 = s.add_message(cid, "assistant", "Drafting then verifying.", meta={"tokens": 5, "tps": 80.5})
        assert m2 > m1
        msgs = s.get_messages(cid)
        assert [(m["role"], m["content"]) for m in msgs] == [
            ("user", "What is speculative decoding?"),
            ("assistant", "Drafting then verifying."),
        ]
        assert msgs[1]["meta"] == {"tokens": 5, "tps": 80.5} and msgs[0]["meta"] is None
        conv = s.get_conversation(cid)
        assert conv["system"] == "be brief" and conv["model"] == "SmolLM2"
        s.rename_conversation(cid, "Spec decoding")
        assert s.list_conversations()[0]["title"] == "Spec decoding"
        assert s.list_conversations()[0]["n_messages"] == 2
        s.delete_conversation(cid)
        assert s.list_conversations() == []
        assert s.get_messages(cid) == []
        left = s.db.conn.execute("select count(*) from messages").fetchone()[0]
        assert left == 0


def test_conversation_errors(tmp_path):
    """Unknown ids and roles are clear StoreErrors, not silent no-ops."""
    with Store.open(tmp_path / "s.db") as s:
        with pytest.raises(StoreError, match="no conversation"):
            s.add_message("nope", "user", "x")
        with pytest.raises(StoreError, match="no conversation"):
            s.rename_conversation("nope", "x")
        with pytest.raises(StoreError, match="no conversation"):
            s.delete_conversation("nope")
        cid = s.create_conversation("x", "m")
        with pytest.raises(StoreError, match="role"):
            s.add_message(cid, "robot", "x")


def test_messages_written_elsewhere_read_as_text_with_their_figures_or_none(tmp_path):
    """SQLite keeps any type in any column: a store written by another version or by hand may hold
    a number or a blob as a message's text, or meta that is not JSON. Each message still reads
    (its text as text, unreadable meta as None), so the conversation opens."""
    with Store.open(tmp_path / "s.db") as s:
        cid = s.create_conversation("x", "m")
        with s.write() as conn:
            for content, meta in [(5, '{"n_tokens": 1}'), (b"caf\xc3\xa9 \xff", None), ("ok", "not json")]:
                conn.execute("insert into messages (conversation_id, role, content, meta, created) "
                             "values (?, 'user', ?, ?, 'x')", (cid, content, meta))
        rows = s.get_messages(cid)
    assert [r["content"] for r in rows] == ["5", "café \ufffd", "ok"]
    assert [r["meta"] for r in rows] == [{"n_tokens": 1}, None, None]


def test_conversations_written_elsewhere_list_and_open_with_text_titles(tmp_path):
    """A blob as a conversation's title or model (a store edited by hand) reads as text, so the
    conversations list and the chat's header show it instead of failing."""
    with Store.open(tmp_path / "s.db") as s:
        with s.write() as conn:
            conn.execute("insert into conversations (id, title, model, created, updated) "
                         "values ('c1', x'c3a9ff', x'00', 'x', x'31')")
        (row,) = s.list_conversations()
        assert (row["title"], row["model"], row["updated"]) == ("é\ufffd", "\x00", "1")
        assert s.get_conversation("c1")["title"] == "é\ufffd"
        with s.write() as conn:  # settings nested past the recursion limit: the defaults, with the reason
            conn.execute("update conversations set settings = ? where id = 'c1'", ("[" * 100_000,))
        row = s.get_conversation("c1")
        assert row["settings"] is None and "not JSON" in row["settings_error"]


def test_conversations_newest_first_and_search(tmp_path):
    """The history list is most recently updated first; search matches titles and message text,
    case-insensitively, with % and _ taken literally."""
    with Store.open(tmp_path / "s.db") as s:
        a = s.create_conversation("Rust lifetimes", "m")
        s.add_message(a, "user", "explain borrowck")
        b = s.create_conversation("Pasta recipe", "m")
        s.add_message(b, "user", "carbonara with guanciale")
        c = s.create_conversation("Discounts", "m")
        s.add_message(c, "user", "is 50% off good?")
        assert [x["id"] for x in s.list_conversations()] == [c, b, a]
        s.add_message(a, "assistant", "Lifetimes name how long a borrow lives.")
        assert [x["id"] for x in s.list_conversations()] == [a, c, b]
        assert [x["id"] for x in s.list_conversations("GUANCIALE")] == [b]
        assert [x["id"] for x in s.list_conversations("rust")] == [a]
        assert [x["id"] for x in s.list_conversations("50%")] == [c]
        assert s.list_conversations("5_%") == []
        assert s.list_conversations("nothing like this") == []


def test_title_from_trims_on_word_boundary():
    """Titles come from the first user message: one line, about 60 chars, cut between words."""
    assert title_from("  Hello\n  world  ") == "Hello world"
    long = "Explain the difference between speculative decoding and beam search in simple terms please"
    t = title_from(long)
    assert len(t) <= 61 and t.endswith("…")
    assert long.startswith(t[:-1])
    assert t[-2] != " " and long[len(t) - 1] == " "  # cut at a space, not mid-word
    assert title_from("") == "New conversation"
    assert len(title_from("x" * 200)) == 61


def _posix_locks_held(paths: list[str]) -> list[tuple[str, int, str]]:
    """This process's POSIX record locks on `paths`, from /proc/locks: (kind, inode, range)."""
    import os as _os

    inodes = {_os.stat(p).st_ino for p in paths if _os.path.exists(p)}
    held = []
    with open("/proc/locks", encoding="ascii") as fp:
        for line in fp:
            f = line.split()
            i = 5 if f[1] == "->" else 4  # "->" marks a waiter
            if f[i - 3] == "POSIX" and int(f[i]) == _os.getpid() and int(f[i + 1].split(":")[2]) in inodes:
                held.append((f[i - 1], int(f[i + 1].split(":")[2]), f"{f[i + 2]}-{f[i + 3]}"))
    return sorted(held)


@pytest.mark.skipif(not __import__("os").path.exists("/proc/locks"), reason="needs Linux /proc/locks")
def test_a_second_open_in_the_same_process_keeps_the_first_connections_locks(tmp_path):
    """Closing any descriptor of a file drops every POSIX lock the process holds on it: a second
    Store.open of a file this process holds open (the chat's picker did) must not release the
    first connection's SQLite locks, or another process can recover the WAL under it and the
    file ends "malformed"."""
    path = str(tmp_path / "s.db")
    first = Store.open(path)
    first.create_conversation("t", "m")
    before = _posix_locks_held([path, path + "-shm"])
    assert before, "SQLite holds locks on an open WAL store"
    second = Store.open(path)
    second.close()
    assert _posix_locks_held([path, path + "-shm"]) == before
    first.close()
    # the file is still checked for a later, fresh open
    (tmp_path / "junk.db").write_bytes(b"not sqlite at all" * 10)
    with pytest.raises(StoreError):
        Store.open(str(tmp_path / "junk.db"))


def test_a_store_on_a_full_disk_says_so_and_is_not_called_foreign(small_disk, capsys):
    """With the disk full SQLite cannot make the write-ahead log and says only "disk I/O error";
    `store show` called the store "not an AdaSpark store". Now: which store, and that its disk
    is full."""
    from adaspark_app.store import commands

    path = small_disk / "s.db"
    Store.open(path).close()
    filler = fill_disk(small_disk)
    with pytest.raises(StoreError) as caught:
        Store.open(path)
    assert str(caught.value).startswith(f"cannot open store {path}: ")
    assert "KiB free" in str(caught.value) and "not an AdaSpark store" not in str(caught.value)
    assert commands.main_for_tests(["store", "show", "--store", str(path)]) == 2
    err = capsys.readouterr().err
    assert "KiB free" in err and "not an AdaSpark store" not in err and err.count("\n") == 1
    filler.unlink()
    Store.open(path).close()  # room again: the same store opens
