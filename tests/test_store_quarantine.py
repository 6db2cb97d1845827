"""Keeping aside a learned state that does not load (no model): the store's quarantine, and the
engine's restore step (``ChatEngine._restore_learned``) on a real store or one whose writes fail."""

from __future__ import annotations

import json
import sqlite3

import pytest
from learned_states import learned_state

from adaspark_app.engine.chat_engine import ChatEngine
from adaspark_app.errors import StoreError
from adaspark_app.store import LearnedKey, Store

KEY = LearnedKey("1111111111111111", "dddddddddddddddd")
FOREIGN = {"scheduler": {"version": 7}, "acceptance": {}}


def test_quarantine_moves_the_row_exactly_and_the_next_save_starts_fresh(tmp_path):
    """The row's bytes go to learned_quarantine with the reason; the key then loads as nothing
    learned, its request summaries stay, and a save works."""
    p = tmp_path / "s.db"
    with Store.open(p) as s:
        s.save_learned(KEY, FOREIGN, {"arm": "adaspark", "n_tokens": 5})
        text = sqlite3.connect(p).execute("select state from learned").fetchone()[0]
        assert s.quarantine_learned(KEY, "scheduler.version: this AdaSpark reads\nversion 2", FOREIGN)
        assert s.load_learned(KEY) is None
        assert len(s.request_summaries(KEY)) == 1
        (q,) = s.quarantined(KEY)
        assert q["state"] == text and q["reason"] == "scheduler.version: this AdaSpark reads version 2"
        s.save_learned(KEY, learned_state(0))
        assert s.load_learned(KEY) == learned_state(0)
        assert not s.quarantine_learned(LearnedKey("2222222222222222", "dddddddddddddddd"), "x", None)


def test_quarantine_leaves_a_state_saved_since_it_was_read(tmp_path):
    """Another process saved a new state between the read and the quarantine: nothing moves."""
    with Store.open(tmp_path / "s.db") as s:
        s.save_learned(KEY, FOREIGN)
        read = s.load_learned(KEY)
        s.save_learned(KEY, learned_state(0))  # the other process
        assert not s.quarantine_learned(KEY, "old layout", read)
        assert s.load_learned(KEY) == learned_state(0) and s.quarantined() == []


def test_quarantine_of_an_unreadable_row(tmp_path):
    """A row that is not JSON is kept aside when the caller read nothing usable (None)."""
    p = tmp_path / "s.db"
    with Store.open(p) as s:
        s.save_learned(KEY, FOREIGN)
    conn = sqlite3.connect(p)
    with conn:
        conn.execute("update learned set state = '{\"sched'")
    conn.close()
    with Store.open(p) as s:
        with pytest.raises(StoreError, match="unreadable JSON"):
            s.load_learned(KEY)
        assert s.quarantine_learned(KEY, "unreadable", None)
        assert [q["state"] for q in s.quarantined()] == ['{"sched']


class _Decoder:
    def __init__(self) -> None:
        self.loaded: list[dict] = []

    def load_state(self, state: dict) -> None:
        self.loaded.append(state)


def _engine_without_model(store) -> ChatEngine:
    """A ChatEngine with just what _restore_learned uses: the decoder, notices and the key."""
    eng = ChatEngine.__new__(ChatEngine)
    eng.decoder, eng.notices, eng.store_key = _Decoder(), [], KEY
    return eng


def test_restore_keeps_a_foreign_state_aside_with_one_notice(tmp_path):
    with Store.open(tmp_path / "s.db") as s:
        s.save_learned(KEY, FOREIGN)
        eng = _engine_without_model(s)
        eng._restore_learned(s)
        assert eng.decoder.loaded == [] and len(eng.notices) == 1
        assert "scheduler.version" in eng.notices[0] and "kept it aside" in eng.notices[0]
        assert eng.store_key == KEY  # saving stays on: the next save starts the key afresh
        assert [json.loads(q["state"]) for q in s.quarantined(KEY)] == [FOREIGN]


def test_restore_loads_a_good_state_silently(tmp_path):
    with Store.open(tmp_path / "s.db") as s:
        s.save_learned(KEY, learned_state(0))
        eng = _engine_without_model(s)
        eng._restore_learned(s)
        assert eng.decoder.loaded == [learned_state(0)] and eng.notices == []


def test_restore_looks_again_when_another_process_saved_meanwhile(tmp_path):
    """The state read does not load, but by the time it would be kept aside a good one was
    saved: the second look loads that one, with no notice and nothing kept aside."""
    with Store.open(tmp_path / "s.db") as s:
        s.save_learned(KEY, FOREIGN)
        real = s.quarantine_learned

        def racing(key, reason, loaded):
            s.save_learned(KEY, learned_state(0))  # the other process, just before
            return real(key, reason, loaded)

        s.quarantine_learned = racing
        eng = _engine_without_model(s)
        eng._restore_learned(s)
        assert eng.decoder.loaded == [learned_state(0)] and eng.notices == []
        assert s.quarantined() == []


def test_restore_never_overwrites_a_state_it_could_not_keep_aside():
    """If keeping it aside fails (a read-only store, say), the engine starts fresh with one
    notice and saves nothing this session (store_key None), so the old state is not lost."""

    class ReadOnly:
        def load_learned(self, key):
            return FOREIGN

        def quarantine_learned(self, key, reason, loaded):
            raise StoreError("store s.db: write failed: attempt to write a readonly database")

    eng = _engine_without_model(ReadOnly())
    eng._restore_learned(ReadOnly())
    assert len(eng.notices) == 1 and "could not be kept aside" in eng.notices[0]
    assert "learning is not saved" in eng.notices[0] and eng.store_key is None
