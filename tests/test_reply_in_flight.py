"""The chat's reply in flight is written to the store as it streams, so a chat killed mid-reply
(SIGKILL, a crash) loses neither the message nor the text so far: the next chat keeps them.

The store's rows and `settle_cut_replies` on a real SQLite file; the chat through Pilot with the
scripted engine in its own process (tests/ui_fakes.py). The real `adaspark chat` killed in a
terminal on the bundled model is in tests/test_ui_signals.py."""

from __future__ import annotations

import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlite_utils import Database

from adaspark_app.store import Store
from adaspark_app.store import migrations as mig
from adaspark_app.store.owner import owner_alive, this_owner
from adaspark_app.ui.app import AdaSparkApp
from adaspark_app.ui.conversation import CHAT_ENDED, reply_note
from adaspark_app.ui.cut_replies import settle_cut_replies, settled_notice
from ui_fakes import notified, scripted, spawn_event, wait_until

SIZE = (100, 30)


@pytest.fixture
def store(chat_store):
    return chat_store


@pytest.fixture(scope="module")
def gone() -> str:
    """The owner string of a process of this host that has ended."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return f"{socket.gethostname()}:{proc.pid}:1"


def conversation(store: Store, *turns: str) -> tuple[str, list[int]]:
    """A stored conversation of alternating user and assistant `turns`; its id and message ids."""
    cid = store.create_conversation("t", "m")
    ids = store.replace_messages_from(cid, None, [("user" if i % 2 == 0 else "assistant", t, None)
                                                  for i, t in enumerate(turns)])
    return cid, ids


def contents(store: Store, cid: str) -> list[tuple[str, str]]:
    return [(m["role"], m["content"]) for m in store.get_messages(cid)]


# ---------------------------------------------------------------------------- the owner
def test_an_owner_is_alive_while_its_process_runs(gone):
    me = this_owner()
    host, pid, start = me.rsplit(":", 2)
    assert owner_alive(me) is True
    assert owner_alive(gone) is False
    if start:  # where /proc tells a process's start: a pid given to a new process is not the old one
        assert owner_alive(f"{host}:{pid}:{int(start) + 1}") is False
    assert owner_alive(f"another-{host}:{pid}:{start}") is None  # only the caller can judge it
    assert owner_alive("not an owner") is False


def test_a_process_that_ended_is_gone_before_it_is_reaped():
    host = socket.gethostname()
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        owner = f"{host}:{proc.pid}:{proc_start(proc.pid)}"
        assert owner_alive(owner) is True
        proc.stdin.close()  # it ends; not waited for, it stays a zombie
        deadline = time.monotonic() + 20
        while b") Z " not in Path(f"/proc/{proc.pid}/stat").read_bytes() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert owner_alive(owner) is False
    finally:
        proc.wait()


def proc_start(pid: int) -> str:
    stat = Path(f"/proc/{pid}/stat").read_bytes()
    return stat[stat.rfind(b")") + 2:].split()[19].decode()


# ---------------------------------------------------------------------------- the store
def test_a_reply_in_flight_is_written_updated_and_settled_by_its_record(store):
    cid, _ = conversation(store, "hi", "hello")
    rid = store.begin_reply(cid, "and now?", None, {"model": "m", "n_tokens": 0}, this_owner())
    store.update_reply(rid, "Now we", {"model": "m", "n_tokens": 2})
    (row,) = store.replies_in_flight()
    assert (row["prompt"], row["content"], row["meta"]["n_tokens"]) == ("and now?", "Now we", 2)
    store.replace_messages_from(cid, None, [("user", "and now?", None), ("assistant", "Now we talk.", None)],
                                in_flight=rid)
    assert store.replies_in_flight() == []
    assert contents(store, cid)[-1] == ("assistant", "Now we talk.")


def test_a_reply_asked_for_makes_its_conversation_the_last_one(store, gone):
    """`chat --continue` opens the conversation a killed chat was replying in."""
    cid, _ = conversation(store, "hi", "hello")
    conversation(store, "a later conversation")
    store.begin_reply(cid, "back to the first", None, {}, gone)
    assert store.last_conversation()["id"] == cid


def test_a_withdrawn_or_deleted_reply_in_flight_leaves_no_row(store):
    cid, _ = conversation(store, "hi", "hello")
    rid = store.begin_reply(cid, "x", None, {}, this_owner())
    store.end_reply(rid)
    assert store.replies_in_flight() == []
    store.begin_reply(cid, "y", None, {}, this_owner())
    store.delete_conversation(cid)
    assert store.replies_in_flight() == []


def test_the_migration_adds_replies_in_flight_and_keeps_the_conversations(tmp_path):
    p = tmp_path / "old.db"
    conn = sqlite3.connect(p)
    mig.migrate(Database(conn), stop_after="m004_conversation_settings")
    conn.execute("insert into conversations (id, title, model, created, updated) values ('c1', 'old', 'm', 'x', 'x')")
    conn.execute("insert into messages (conversation_id, role, content, created) values ('c1', 'user', 'hi', 'x')")
    conn.commit()
    conn.close()
    with Store.open(p) as s:
        assert contents(s, "c1") == [("user", "hi")]
        s.begin_reply("c1", None, None, {}, this_owner())
        assert len(s.replies_in_flight()) == 1


# ---------------------------------------------------------------------------- settling
def test_a_dead_chats_reply_keeps_the_message_and_the_text_so_far(store, gone):
    cid, _ = conversation(store, "hi", "hello")
    rid = store.begin_reply(cid, "tell me more", None, {"model": "m", "n_tokens": 0, "seed": 7}, gone)
    store.update_reply(rid, "Well, there", {"model": "m", "n_tokens": 3, "seed": 7, "stopped": True})
    (s,) = settle_cut_replies(store)
    assert (s.conversation_id, s.prompt, s.replied, s.n_tokens) == (cid, "tell me more", True, 3)
    assert contents(store, cid)[2:] == [("user", "tell me more"), ("assistant", "Well, there")]
    meta = store.get_messages(cid)[-1]["meta"]
    assert meta[CHAT_ENDED] is True and meta["seed"] == 7  # a later regenerate draws after it
    assert reply_note(meta) == "3 tokens · stopped: the chat ended"
    assert "Your message and the 3 tokens generated so far are kept" in settled_notice([s])
    assert store.replies_in_flight() == [] and settle_cut_replies(store) == []  # kept once


def test_a_live_chats_reply_is_left_to_it(store):
    cid, _ = conversation(store, "hi", "hello")
    store.begin_reply(cid, "mine", None, {}, this_owner())
    assert settle_cut_replies(store) == []
    assert len(store.replies_in_flight()) == 1 and len(contents(store, cid)) == 2


def test_another_hosts_reply_is_settled_once_it_stopped_writing(store):
    cid, _ = conversation(store, "hi", "hello")
    rid = store.begin_reply(cid, "from afar", None, {}, f"another-{socket.gethostname()}:12:34")
    assert settle_cut_replies(store) == []  # written just now: that chat may still run
    with store.write() as conn:
        conn.execute("update replies_in_flight set updated = '2026-01-01T00:00:00+00:00' where id = ?", (rid,))
    (s,) = settle_cut_replies(store)
    assert not s.replied and contents(store, cid)[-1] == ("user", "from afar")


def test_a_message_whose_reply_had_not_begun_is_kept_on_its_own(store, gone):
    cid = store.create_conversation("new", "m")  # made for the message, as the chat does
    store.begin_reply(cid, "first words", None, {}, gone)
    (s,) = settle_cut_replies(store)
    assert contents(store, cid) == [("user", "first words")]
    assert "F5 answers it" in settled_notice([s])


def test_a_regenerate_keeps_the_previous_reply_until_text_arrived(store, gone):
    cid, ids = conversation(store, "hi", "hello")
    store.begin_reply(cid, None, ids[1], {}, gone)
    assert settle_cut_replies(store) == []  # nothing new to keep: nothing changes
    assert contents(store, cid) == [("user", "hi"), ("assistant", "hello")]
    rid = store.begin_reply(cid, None, ids[1], {}, gone)
    store.update_reply(rid, "Hey", {"n_tokens": 1})
    (s,) = settle_cut_replies(store)
    assert contents(store, cid) == [("user", "hi"), ("assistant", "Hey")]
    assert "The 1 token generated so far is kept" in settled_notice([s])


def test_an_edit_replaces_the_turns_it_was_replacing(store, gone):
    cid, ids = conversation(store, "q1", "a1", "q2", "a2")
    rid = store.begin_reply(cid, "q1 edited", ids[0], {}, gone)
    store.update_reply(rid, "b1", {"n_tokens": 1})
    settle_cut_replies(store)
    assert contents(store, cid) == [("user", "q1 edited"), ("assistant", "b1")]


def test_rows_of_a_deleted_conversation_or_damaged_do_not_stop_the_others(store, gone):
    cid, _ = conversation(store, "hi", "hello")
    rid = store.begin_reply(cid, "q", None, {}, gone)
    with store.write() as conn:
        conn.execute("update replies_in_flight set meta = '[1, 2', content = 'partial' where id = ?", (rid,))
        conn.execute("insert into replies_in_flight (conversation_id, prompt, content, owner, created, updated) "
                     "values ('no-such-conversation', 'lost', '', ?, 'x', 'x')", (gone,))
        conn.execute("insert into replies_in_flight (conversation_id, prompt, replace_from, content, owner, created, "
                     "updated) values (?, x'c3a9', 'first', x'21', ?, 'x', 'x')", (cid, gone))
    first, second = settle_cut_replies(store)
    assert first.replied and first.n_tokens == 0 and "the text generated so far" in settled_notice([first])
    assert second.prompt == "é"  # a blob where text belongs (a store edited by hand) reads as text
    assert contents(store, cid)[2:] == [("user", "q"), ("assistant", "partial"), ("user", "é"), ("assistant", "!")]
    assert store.replies_in_flight() == []


# ---------------------------------------------------------------------------- the chat
def make_app(store, factory, tmp_path) -> AdaSparkApp:
    return AdaSparkApp(factory, store, store_label="chat.db", export_dir=tmp_path, exit_on_load_error=False)


async def test_the_chat_writes_the_reply_as_it_streams_and_settles_it_at_its_end(store, tmp_path):
    full = "one two three four five six seven eight nine ten"
    held, gate = spawn_event(), spawn_event()
    app = make_app(store, scripted([full], hold_after_rounds=3, held=held, gate=gate), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        chat = app.chat_screen
        chat.prompt.text = "count"
        await pilot.press("enter")
        await wait_until(pilot, held.is_set, what="the engine to be mid-reply")
        await wait_until(pilot, lambda: any(r["content"] for r in store.replies_in_flight()),
                         what="the text so far in the store")
        (row,) = store.replies_in_flight()
        assert row["prompt"] == "count" and full.startswith(row["content"]) and row["content"] != full
        assert row["owner"] == this_owner() and row["meta"][CHAT_ENDED] is True
        assert row["meta"]["n_tokens"] == len(row["content"].split())
        gate.set()
        await wait_until(pilot, lambda: not chat.generating, what="the reply to end")
        assert store.replies_in_flight() == []
        cid = chat.conversation.id
        assert contents(store, cid) == [("user", "count"), ("assistant", full)]


async def test_a_withdrawn_reply_leaves_no_row(store, tmp_path):
    held = spawn_event()
    app = make_app(store, scripted(["never seen"], hold_after_rounds=0, held=held), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        chat = app.chat_screen
        chat.prompt.text = "are you there?"
        await pilot.press("enter")
        await wait_until(pilot, held.is_set)
        assert [r["prompt"] for r in store.replies_in_flight()] == ["are you there?"]
        await pilot.press("escape")
        await wait_until(pilot, lambda: not chat.generating)
        assert chat.prompt.text == "are you there?"
        assert store.replies_in_flight() == [] and store.list_conversations() == []


async def test_the_chat_keeps_what_a_killed_chat_left_and_says_so(store, tmp_path, gone):
    cid, _ = conversation(store, "hi", "hello")
    rid = store.begin_reply(cid, "go on", None, {"n_tokens": 0}, gone)
    store.update_reply(rid, "I was saying", {"n_tokens": 3, "tokens_per_s": 319.7, "rounds": 208, CHAT_ENDED: True,
                                             "stopped": True})
    later, _ = conversation(store, "another chat, used since")
    app = make_app(store, scripted(["ok"]), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await notified(pilot, "The chat ended during a reply last time", "3 tokens", "first conversation of the list")
        chat = app.chat_screen
        ol = chat.sidebar.option_list
        assert [ol.get_option_at_index(i).id for i in range(ol.option_count)] == [cid, later]
        await chat.open_conversation(cid)
        await pilot.pause()
        assert [m.text for m in chat.chat_view.messages()] == ["hi", "hello", "go on", "I was saying"]
        note = chat.chat_view.messages()[-1].query_one(".note")
        assert str(note.render()) == "3 tokens · 319.7 tok/s · 208 rounds · stopped: the chat ended"
        assert note.size.height == 2  # wider than the column: it wraps instead of losing its end
    assert store.replies_in_flight() == []


async def test_quitting_before_the_first_token_keeps_the_message_unanswered(store, tmp_path):
    """The message box goes with the app, so the message stays in the conversation instead."""
    held = spawn_event()
    app = make_app(store, scripted(["never seen"], hold_after_rounds=0, held=held), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        app.chat_screen.prompt.text = "are you there?"
        await pilot.press("enter")
        await wait_until(pilot, held.is_set)
        await pilot.press("ctrl+q")
        await wait_until(pilot, lambda: app.return_code is not None, what="the app to exit")
    (conv,) = store.list_conversations()
    assert contents(store, conv["id"]) == [("user", "are you there?")]
    assert store.replies_in_flight() == []


async def test_a_full_store_keeps_the_reply_on_screen_and_says_what_was_not_saved(store, tmp_path):
    """A full disk mid-conversation: the reply is shown and kept in the open conversation, and
    two notices say that neither it nor what it taught the scheduler was saved."""
    refusal = "store x: commit failed: database or disk is full"
    app = make_app(store, scripted(["First.", "Second reply."], learned_not_saved=refusal), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        chat = app.chat_screen
        chat.prompt.text = "one"
        await pilot.press("enter")
        await wait_until(pilot, lambda: chat.conversation.turns and not chat.generating, what="the first reply")
        pages = store._conn.execute("PRAGMA page_count").fetchone()[0]
        store._conn.execute(f"PRAGMA max_page_count = {pages}")  # SQLite's own 'database or disk is full'
        long_message = " ".join(["two"] * 2000)  # more than the pages the store has room in
        chat.prompt.text = long_message
        await pilot.press("enter")
        await notified(pilot, "The reply was not saved", "full")
        await notified(pilot, "taught the scheduler was not saved", refusal)
        await wait_until(pilot, lambda: not chat.generating, what="the second reply to end")
        assert [t.content for t in chat.conversation.turns][-2:] == [long_message, "Second reply."]
        assert chat.prompt.text == ""
    assert contents(store, chat.conversation.id) == [("user", "one"), ("assistant", "First.")]
