"""Per-conversation settings and the chat actions (settings dialog, regenerate, edit and resend,
copy a code block, save a reply, --continue), through Pilot with the scripted engine in its own
process (tests/ui_fakes.py), a real SQLite store and the real Textual app. The same features on
the real model are in tests/test_ui_real.py."""

from __future__ import annotations

import functools
import os
from pathlib import Path
from types import SimpleNamespace

import gguf
import numpy as np
import pytest

from adaspark_app import cli
from adaspark_app.engine.sampling import SamplingSettings
from adaspark_app.errors import ArgumentError
from adaspark_app.store import Store
from adaspark_app.store import migrations as mig
from adaspark_app.ui.app import AdaSparkApp
from adaspark_app.ui.chat_settings import ChatSettings, resume_last
from adaspark_app.ui.screens import ChatScreen, HelpScreen, SaveFileScreen, SettingsScreen
from adaspark_app.engine.worker import EngineConfig
from ui_fakes import ScriptedEngine, _log, notifications, notified, read_log, scripted, wait_until

pytestmark = pytest.mark.long  # scheduled first (tests/conftest.py)

SIZE = (100, 30)
T08 = SamplingSettings(temperature=0.8)


@pytest.fixture
def store(tmp_path):
    s = Store.open(tmp_path / "ui.db")
    yield s
    s.close()


@pytest.fixture
def log(tmp_path):
    return str(tmp_path / "engine-calls.jsonl")


def make_app(store, factory, tmp_path, **kwargs) -> AdaSparkApp:
    return AdaSparkApp(factory, store, store_label="ui.db", export_dir=tmp_path, exit_on_load_error=False, **kwargs)


async def send(pilot, text: str) -> None:
    prompt = pilot.app.chat_screen.prompt
    prompt.focus()
    prompt.text = text
    await pilot.press("enter")


async def finished(pilot, timeout: float = 10.0) -> ChatScreen:
    chat = pilot.app.chat_screen
    await wait_until(pilot, lambda: not chat.generating, timeout=timeout, what="the reply to finish")
    return chat



def texts(chat) -> list[str]:
    return [m.text for m in chat.chat_view.messages()]


# ---------------------------------------------------------------------------- the store
def test_migration_adds_conversation_settings_and_keeps_old_rows(tmp_path):
    """A store at the previous schema gains the settings column; its conversations still open,
    with no settings (the app's defaults then apply)."""
    import sqlite3

    from sqlite_utils import Database

    p = tmp_path / "old.db"
    conn = sqlite3.connect(p)
    mig.migrate(Database(conn), stop_after="m003_learned_quarantine")
    conn.execute("insert into conversations (id, title, model, system, created, updated) "
                 "values ('c1', 'old', 'm', 'Be brief.', 'x', 'x')")
    conn.commit()
    conn.close()
    with Store.open(p) as s:
        assert "m004_conversation_settings" in s.schema()["migrations"]
        row = s.get_conversation("c1")
        assert row["settings"] is None and row["system"] == "Be brief."
        settings, problems = ChatSettings.from_stored(row, ChatSettings(max_tokens=77, sampling=T08))
        assert problems == [] and settings.system == "Be brief." and settings.max_tokens == 77
        assert settings.sampling == T08


def test_stored_settings_that_fail_the_checks_fall_back_with_a_reason(store):
    cid = store.create_conversation("t", "m", settings={"max_tokens": 0, "sampling": {"temperature": 0.5, "top_p": 7}})
    settings, problems = ChatSettings.from_stored(store.get_conversation(cid), ChatSettings(sampling=T08))
    assert settings.max_tokens == 512 and settings.sampling.top_p == T08.top_p
    assert settings.sampling.temperature == 0.5  # the valid field is kept
    assert any("--max-tokens" in p for p in problems) and any("--top-p" in p for p in problems)
    store._conn.execute("update conversations set settings = '{not json' where id = ?", (cid,))
    row = store.get_conversation(cid)
    assert row["settings"] is None and "not JSON" in row["settings_error"]
    assert ChatSettings.from_stored(row, ChatSettings())[1]


def test_replace_messages_from_drops_the_tail_in_one_write(store):
    cid = store.create_conversation("t", "m")
    ids = [store.add_message(cid, r, c) for r, c in (("user", "a"), ("assistant", "A"), ("user", "b"), ("assistant", "B"))]
    new = store.replace_messages_from(cid, ids[2], [("user", "b2", None), ("assistant", "B2", {"seed": 5})])
    msgs = store.get_messages(cid)
    assert [m["content"] for m in msgs] == ["a", "A", "b2", "B2"] and [m["id"] for m in msgs[2:]] == new
    assert msgs[3]["meta"] == {"seed": 5}
    with pytest.raises(Exception):
        store.replace_messages_from(cid, ids[0], [("robot", "x", None)])
    assert [m["content"] for m in store.get_messages(cid)] == ["a", "A", "b2", "B2"]  # nothing changed


# ---------------------------------------------------------------------------- settings
async def test_a_conversation_written_elsewhere_opens_and_goes_on(store, tmp_path, log):
    """A blob as a message's text or a conversation's title, and meta that is not JSON (a store
    from another version or edited by hand): the chat lists and shows them instead of failing,
    and replies."""
    cid = store.create_conversation("elsewhere", "m")
    with store.write() as conn:
        for role, content, meta in [("user", b"caf\xc3\xa9", None), ("assistant", 42, "{not json")]:
            conn.execute("insert into messages (conversation_id, role, content, meta, created) values (?, ?, ?, ?, 'x')",
                         (cid, role, content, meta))
        conn.execute("insert into conversations (id, title, model, created, updated) values ('c2', x'ff', 'm', 'x', 'x')")
    app = make_app(store, scripted(["and more"], log_path=log), tmp_path)
    async with app.run_test(size=(140, 30)) as pilot:  # the conversations list shown
        chat = app.chat_screen
        assert chat.sidebar.option_list.option_count == 2
        await chat.open_conversation(cid)
        assert texts(chat) == ["café", "42"]
        await send(pilot, "go on")
        await finished(pilot)
        assert texts(chat) == ["café", "42", "go on", "and more"]
    assert read_log(log, "generate")[0]["messages"][:2] == [{"role": "user", "content": "café"},
                                                          {"role": "assistant", "content": "42"}]


def test_regenerate_seed_rule():
    fixed = ChatSettings(sampling=SamplingSettings(temperature=0.7, seed=11))
    assert fixed.regenerate_sampling(11).seed == 12 and fixed.regenerate_sampling(12).seed == 13
    assert fixed.regenerate_sampling(None).seed == 12
    free = ChatSettings(sampling=T08)
    seeds = {free.regenerate_sampling(5).seed for _ in range(5)}
    assert None not in seeds and 5 not in seeds and len(seeds) == 5
    assert ChatSettings().regenerate_sampling(3).greedy


def test_form_uses_the_cli_rules():
    s = ChatSettings(sampling=T08)
    values = s.form_values()
    assert s.with_form(values) == s
    for field, bad, flag in (("top_p", "0", "--top-p"), ("temperature", "hot", "--temperature"),
                             ("max_tokens", "-1", "--max-tokens"), ("seed", "1.5", "--seed")):
        with pytest.raises(ArgumentError, match=flag):
            s.with_form({**values, field: bad})
    assert s.with_form({**values, "seed": " 42 "}).sampling.seed == 42


async def test_settings_dialog_validates_saves_and_the_header_follows(store, tmp_path, log):
    app = make_app(store, scripted(["one", "two"], log_path=log), tmp_path, sampling=T08)
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, "hello")
        chat = await finished(pilot)
        cid = chat.conversation.id
        assert "T 0.8" in app.sub_title and "no system prompt" in app.sub_title
        await pilot.press("f3")
        await wait_until(pilot, lambda: isinstance(app.screen, SettingsScreen))
        dialog = app.screen
        dialog.query_one("#system").text = "You are a pirate."
        dialog.query_one("#top_p").value = "1.5"
        await pilot.click("#save")
        await wait_until(pilot, lambda: "--top-p must be in (0, 1]" in dialog.error, what=lambda: f"{dialog.error!r} {app.screen} {notifications(app)}")
        assert isinstance(app.screen, SettingsScreen)
        assert store.get_conversation(cid)["system"] is None  # nothing saved
        dialog.query_one("#top_p").value = "0.9"
        dialog.query_one("#max_tokens").value = "64"
        dialog.query_one("#seed").value = "7"
        dialog.query_one("#seed").focus()
        await pilot.press("enter")  # Enter in a field saves too
        await wait_until(pilot, lambda: isinstance(app.screen, ChatScreen), what=lambda: dialog.error)
        row = store.get_conversation(cid)
        assert row["system"] == "You are a pirate."
        assert row["settings"]["max_tokens"] == 64 and row["settings"]["sampling"]["top_p"] == 0.9
        assert row["settings"]["sampling"]["seed"] == 7
        assert "top-p 0.9" in app.sub_title and "max 64 tok" in app.sub_title and "system prompt" in app.sub_title
        await send(pilot, "again")
        await finished(pilot)
        call = read_log(log, "generate")[-1]
        assert call["messages"][0] == {"role": "system", "content": "You are a pirate."}
        assert call["max_tokens"] == 64 and call["sampling"]["top_p"] == 0.9 and call["sampling"]["seed"] == 7
        assert store.get_messages(cid)[-1]["meta"]["seed"] == 7
        # A fresh conversation starts from the defaults, the old one keeps its own.
        await pilot.press("ctrl+n")
        await wait_until(pilot, lambda: "no system prompt" in app.sub_title)
        await chat.open_conversation(cid)
        assert chat.conversation.settings.system == "You are a pirate." and chat.conversation.settings.max_tokens == 64


async def test_settings_from_the_palette_and_listed_in_help(store, tmp_path):
    app = make_app(store, scripted(), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        chat = app.chat_screen
        commands = {c.title: c for c in app.get_system_commands(chat)}
        for title in ("Conversation settings: system prompt, max tokens, sampling",
                      "Regenerate the last reply with a new seed (earlier turns are kept)",
                      "Save the last reply as a Markdown file"):
            assert title in commands
        commands["Conversation settings: system prompt, max tokens, sampling"].callback()
        await wait_until(pilot, lambda: isinstance(app.screen, SettingsScreen))
        await pilot.press("escape")
        await wait_until(pilot, lambda: isinstance(app.screen, ChatScreen))
        await pilot.press("f1")
        await wait_until(pilot, lambda: isinstance(app.screen, HelpScreen))
        for key in ("F3", "F5", "F4 / Ctrl+Up", "Ctrl+Down", "F9", "F12"):
            assert f"| {key} |" in app.screen.markdown, key


async def test_settings_of_a_new_conversation_are_stored_with_it(store, tmp_path, log):
    app = make_app(store, scripted(["hi"], log_path=log), tmp_path, system="Answer in French.", max_tokens=40)
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, "hello")
        chat = await finished(pilot)
        (call,) = read_log(log, "generate")
        assert call["messages"] == [{"role": "system", "content": "Answer in French."},
                                    {"role": "user", "content": "hello"}]
        assert call["max_tokens"] == 40
        assert chat.conversation.history == [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}]
        row = store.get_conversation(chat.conversation.id)
        assert row["system"] == "Answer in French." and row["settings"]["max_tokens"] == 40
        exported = chat.export_markdown()
        assert "## System\n\nAnswer in French.\n\n## You\n\nhello" in exported.read_text()


# ---------------------------------------------------------------------------- regenerate
async def test_regenerate_replaces_the_last_reply_with_a_new_seed(store, tmp_path, log):
    app = make_app(store, scripted(["first", "second", "third"], log_path=log), tmp_path, sampling=T08)
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, "q1")
        chat = await finished(pilot)
        await send(pilot, "q2")
        await finished(pilot)
        cid = chat.conversation.id
        seed_before = store.get_messages(cid)[-1]["meta"]["seed"]
        await pilot.press("f5")
        await finished(pilot)
        assert texts(chat) == ["q1", "first", "q2", "third"]
        assert chat.conversation.history[-1] == {"role": "assistant", "content": "third"} and len(chat.conversation.history) == 4
        msgs = store.get_messages(cid)
        assert [m["content"] for m in msgs] == ["q1", "first", "q2", "third"]
        assert msgs[-1]["meta"]["seed"] != seed_before and isinstance(msgs[-1]["meta"]["seed"], int)
        calls = read_log(log, "generate")
        assert calls[-1]["messages"] == calls[-2]["messages"]  # the same prompt, only the seed differs
        assert calls[-1]["sampling"]["seed"] == msgs[-1]["meta"]["seed"]


async def test_regenerate_with_a_fixed_seed_takes_the_next_one(store, tmp_path, log):
    app = make_app(store, scripted(["a", "b", "c"], log_path=log), tmp_path,
                   sampling=SamplingSettings(temperature=0.8, seed=100))
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, "q")
        chat = await finished(pilot)
        await pilot.press("f5")
        await finished(pilot)
        await pilot.press("f5")
        await finished(pilot)
        assert [c["sampling"]["seed"] for c in read_log(log, "generate")] == [100, 101, 102]
        assert texts(chat) == ["q", "c"]


async def test_regenerate_stopped_before_any_token_keeps_the_old_reply(store, tmp_path):
    from ui_fakes import spawn_event

    held, gate = spawn_event(), spawn_event()
    app = make_app(store, scripted(["kept", "never"], hold_after_rounds=0, held=held, gate=gate),
                   tmp_path, sampling=T08)
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, "q")
        await wait_until(pilot, held.is_set)
        gate.set()  # the first reply goes through
        chat = await finished(pilot)
        gate.clear()
        await pilot.press("f5")
        await wait_until(pilot, held.is_set, what="the regenerated reply to be held")
        await pilot.press("escape")
        await finished(pilot)
        assert [m.text for m in chat.chat_view.messages() if m.display] == ["q", "kept"]
        assert chat.prompt.text == "" and chat.conversation.history[-1]["content"] == "kept"
        assert [m["content"] for m in store.get_messages(chat.conversation.id)] == ["q", "kept"]
        await notified(pilot, "previous reply is kept")


async def test_regenerate_withdrawn_shows_the_previous_reply_again(store, tmp_path):
    from adaspark_app.errors import ContextOverflowError

    app = make_app(store, scripted(["kept"], fail=ContextOverflowError("too long"), fail_calls=(1,)),
                   tmp_path, sampling=T08)
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, "q")
        chat = await finished(pilot)
        await pilot.press("f5")
        await finished(pilot)
        visible = [m.text for m in chat.chat_view.messages() if m.display]
        assert visible == ["q", "kept"] and chat.prompt.text == ""
        assert [m["content"] for m in store.get_messages(chat.conversation.id)] == ["q", "kept"]
        await notified(pilot, "previous reply is kept")


async def test_a_reply_cut_by_an_engine_crash_keeps_its_seed_for_regenerate(store, tmp_path):
    from ui_fakes import spawn_event

    held, gate = spawn_event(), spawn_event()
    app = make_app(store, scripted(["one two three four five six seven eight"], hold_after_rounds=3,
                                   held=held, gate=gate), tmp_path, sampling=T08)
    async with app.run_test(size=SIZE) as pilot:
        chat = app.chat_screen
        await send(pilot, "count")
        await wait_until(pilot, held.is_set, what="the engine to be mid-reply")
        await wait_until(pilot, lambda: chat.replies.round_log, what="the first rounds")
        drawn = chat.replies.round_log[-1][1].seed
        app.engine.kill()
        await notified(pilot, "engine process stopped")
        meta = store.get_messages(chat.conversation.id)[1]["meta"]
        assert meta["engine_died"] is True and isinstance(drawn, int) and meta["seed"] == drawn


# ---------------------------------------------------------------------------- edit and resend
async def test_edit_an_earlier_message_drops_the_later_turns(store, tmp_path, log):
    app = make_app(store, scripted(["A1", "A2", "A3", "A-edited"], log_path=log), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        chat = app.chat_screen
        for q in ("q1", "q2", "q3"):
            await send(pilot, q)
            await finished(pilot)
        chat.prompt.text = "draft in progress"
        await pilot.press("ctrl+up")
        assert chat.conversation.editing == 4 and chat.prompt.text == "q3"
        assert "Editing message 3 of 3" in chat.prompt.border_title
        await pilot.press("ctrl+up")
        assert chat.conversation.editing == 2 and chat.prompt.text == "q2"
        assert chat.chat_view.messages()[2].has_class("editing")
        await pilot.press("ctrl+down", "ctrl+down")  # past the last: editing ends, the draft is back
        assert chat.conversation.editing is None and chat.prompt.text == "draft in progress"
        await pilot.press("f4", "f4")
        assert chat.conversation.editing == 2
        chat.prompt.text = "q2 edited"
        await pilot.press("enter")
        await finished(pilot)
        assert chat.conversation.editing is None
        assert chat.prompt.text == "draft in progress"  # the edit borrowed the box: it gives the draft back
        assert texts(chat) == ["q1", "A1", "q2 edited", "A-edited"]
        assert chat.conversation.history[2:] == [{"role": "user", "content": "q2 edited"},
                                    {"role": "assistant", "content": "A-edited"}]
        assert [m["content"] for m in store.get_messages(chat.conversation.id)] == ["q1", "A1", "q2 edited", "A-edited"]
        last = read_log(log, "generate")[-1]
        assert last["messages"] == [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "A1"},
                                    {"role": "user", "content": "q2 edited"}]
        assert last["turn"] == 1
        # The next message follows the edited turn.
        await send(pilot, "q4")
        await finished(pilot)
        assert len(read_log(log, "generate")[-1]["messages"]) == 5


async def test_escape_cancels_editing(store, tmp_path):
    app = make_app(store, scripted(["A1"]), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, "q1")
        chat = await finished(pilot)
        await pilot.press("ctrl+up")
        assert chat.conversation.editing == 0
        await pilot.press("escape")
        assert chat.conversation.editing is None and chat.prompt.text == "" and chat.prompt.border_title == "Message"
        assert not chat.chat_view.messages()[0].has_class("editing")
        chat.prompt.text = "half-written"
        await pilot.press("ctrl+up")
        assert chat.prompt.text == "q1"
        cid = chat.conversation.id
        await pilot.press("ctrl+n")  # a new conversation while editing: the draft stays with its own
        await wait_until(pilot, lambda: chat.conversation.id is None)
        assert chat.conversation.editing is None and chat.prompt.text == ""
        await chat.open_conversation(cid)
        assert chat.prompt.text == "half-written"


async def test_a_failed_edit_keeps_the_old_turns_and_goes_back_to_editing(store, tmp_path):
    from adaspark_app.errors import ContextOverflowError

    app = make_app(store, scripted(["A1", "A2"], fail=ContextOverflowError("too long"), fail_calls=(2,)), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, "q1")
        chat = await finished(pilot)
        await send(pilot, "q2")
        await finished(pilot)
        chat.prompt.text = "my draft"
        await pilot.press("ctrl+up", "ctrl+up")
        chat.prompt.text = "q1 edited"
        await pilot.press("enter")
        await finished(pilot)
        assert [m.text for m in chat.chat_view.messages() if m.display] == ["q1", "A1", "q2", "A2"]
        assert chat.conversation.editing == 0 and chat.prompt.text == "q1 edited"
        assert [m["content"] for m in store.get_messages(chat.conversation.id)] == ["q1", "A1", "q2", "A2"]
        await pilot.press("escape")  # the edit ends: the draft typed before it is back
        assert chat.conversation.editing is None and chat.prompt.text == "my draft"


# ---------------------------------------------------------------------------- copy code, save reply
REPLY_WITH_CODE = "Two ways:\n\n```python\nprint(1)\n```\n\nor\n\n```bash\necho 2\necho 3\n```\n"


async def test_copy_code_block_last_and_under_the_pointer(store, tmp_path):
    from textual.widgets.markdown import MarkdownFence

    app = make_app(store, scripted([REPLY_WITH_CODE]), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        chat = app.chat_screen
        await pilot.press("f9")
        await notified(pilot, "No code block")
        await send(pilot, "show me")
        await finished(pilot)
        await pilot.hover("#status")  # the pointer over no code block: the last one is copied
        await pilot.press("f9")
        assert app.clipboard == "echo 2\necho 3"
        fences = list(chat.query(MarkdownFence))
        assert len(fences) == 2
        await pilot.hover(fences[0], offset=(3, 1))
        await pilot.press("f9")
        assert app.clipboard == "print(1)"


async def test_save_reply_as_markdown_never_overwrites_silently(store, tmp_path):
    app = make_app(store, scripted(["# Title\n\nBody text."]), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, "write it")
        chat = await finished(pilot)
        await pilot.press("f12")
        await wait_until(pilot, lambda: isinstance(app.screen, SaveFileScreen))
        dialog = app.screen
        default = dialog.query_one("#path").value
        assert default.startswith("reply-write-it-") and default.endswith(".md")
        target = tmp_path / "answer.md"
        target.write_text("precious")
        dialog.query_one("#path").value = "answer.md"  # relative: under the export directory
        await pilot.press("enter")
        await wait_until(pilot, lambda: "exists" in dialog.problem)
        assert target.read_text() == "precious" and isinstance(app.screen, SaveFileScreen)
        await pilot.press("enter")  # said so; a second Save overwrites
        await wait_until(pilot, lambda: isinstance(app.screen, ChatScreen))
        assert target.read_text() == "# Title\n\nBody text.\n"
        await pilot.press("f12")
        await wait_until(pilot, lambda: isinstance(app.screen, SaveFileScreen))
        app.screen.query_one("#path").value = str(tmp_path / "no-such-dir" / "x.md")
        await pilot.press("enter")
        await wait_until(pilot, lambda: "Could not write" in app.screen.problem)
        await pilot.press("escape")
        await wait_until(pilot, lambda: isinstance(app.screen, ChatScreen))
        assert chat.conversation.last_reply == "# Title\n\nBody text."


# ---------------------------------------------------------------------------- --continue
def test_continue_with_no_conversation_is_one_line_and_exit_2(tmp_path, capsys):
    db = tmp_path / "empty.db"
    assert cli.main(["chat", "--continue", "--store", str(db)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--continue: no conversation" in err[0]


def test_continue_resumes_the_last_conversation_with_its_settings(tmp_path, monkeypatch):
    db = tmp_path / "s.db"
    with Store.open(db) as s:
        old = s.create_conversation("old", "m", system="Old.", settings=ChatSettings(max_tokens=9).to_json())
        s.add_message(old, "user", "x")
        last = s.create_conversation("last", "m", system="Be terse.", settings=ChatSettings(
            max_tokens=33, sampling=SamplingSettings(temperature=0.3, seed=5)).to_json())
        s.add_message(last, "user", "y")
    seen = {}
    import adaspark_app.ui.app as app_module

    monkeypatch.setattr(app_module, "run_chat", lambda *a, **k: seen.update(args=a, kwargs=k) or 0)
    assert cli.main(["chat", "--continue", "--store", str(db)]) == 0
    assert seen["kwargs"]["resume_id"] == last
    with Store.open(db) as s:
        assert s.get_conversation(last)["settings"]["max_tokens"] == 33  # untouched without options
        # Options given with --continue replace the stored ones, and are saved.
        cid, settings, problems = resume_last(s, max_tokens="21", sampling={"temperature": "0.9"})
        assert cid == last and problems == []
        assert settings.max_tokens == 21 and settings.sampling.temperature == 0.9 and settings.sampling.seed == 5
        assert settings.system == "Be terse."
        assert s.get_conversation(last)["settings"]["max_tokens"] == 21
        with pytest.raises(ArgumentError, match="--top-p"):
            resume_last(s, sampling={"top_p": "2"})


def test_continue_refuses_a_model_that_is_gone(tmp_path):
    with Store.open(tmp_path / "s.db") as s:
        s.create_conversation("t", "gone.gguf", settings=ChatSettings(model_path=str(tmp_path / "gone.gguf")).to_json())
        with pytest.raises(ArgumentError, match="pass --model"):
            resume_last(s)


async def test_app_opens_the_resumed_conversation(store, tmp_path, log):
    cid = store.create_conversation("t", "m", system="Be terse.",
                                    settings=ChatSettings(max_tokens=33, sampling=T08).to_json())
    store.add_message(cid, "user", "earlier")
    store.add_message(cid, "assistant", "reply", meta={"n_tokens": 1})
    app = make_app(store, scripted(["next"], log_path=log), tmp_path, resume_id=cid)
    async with app.run_test(size=SIZE) as pilot:
        chat = app.chat_screen
        await wait_until(pilot, lambda: chat.conversation.id == cid)
        assert texts(chat) == ["earlier", "reply"] and "max 33 tok" in app.sub_title
        await send(pilot, "more")
        await finished(pilot)
        (call,) = read_log(log, "generate")
        assert call["messages"][0] == {"role": "system", "content": "Be terse."}
        assert call["max_tokens"] == 33 and call["sampling"]["temperature"] == 0.8


# ------------------------------------------------------------------ the model follows the conversation
class ConfigEngine(ScriptedEngine):
    """A scripted engine built from an EngineConfig (as the real one is), so the app's model
    switch can change its model_path; logs which model it was built on and says its context."""

    def __init__(self, config: EngineConfig, log_path: str) -> None:
        name = Path(config.model_path).name if config.model_path else "bundled"
        super().__init__([f"a reply from {name}"], model_name=name, log_path=log_path)
        self.backend = SimpleNamespace(n_ctx=config.n_ctx)
        _log(log_path, {"event": "model", "path": config.model_path, "pid": os.getpid()})


def config_engine(model_path: str | None, log_path: str, n_ctx: int = 2048) -> functools.partial:
    """A picklable factory holding an EngineConfig (what factory_with_model replaces)."""
    return functools.partial(ConfigEngine, EngineConfig(model_path=model_path, n_ctx=n_ctx), log_path)


def sampling_gguf(path: Path, **values) -> Path:
    """A tiny GGUF (header and two F32 tensors) with recommended sampling (general.sampling.*)."""
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny")
    w.add_context_length(128)
    w.add_file_type(7)
    for key, value in values.items():
        if isinstance(value, float):
            w.add_float32(f"general.sampling.{key}", value)
        else:
            w.add_int32(f"general.sampling.{key}", value)
    w.add_token_list(["<s>", "</s>", "a", "b"])
    w.add_tensor("token_embd.weight", np.zeros((16, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


async def test_opening_a_conversation_held_with_another_model_switches_the_engine_to_it(store, tmp_path, log):
    one, two = tmp_path / "one.gguf", tmp_path / "two.gguf"
    for p in (one, two):
        p.write_bytes(b"GGUF")  # the scripted engine does not read it; the app checks it exists
    app = make_app(store, config_engine(str(one), log), tmp_path, model_path=str(one), model_label="one.gguf")
    async with app.run_test(size=SIZE) as pilot:
        chat = app.chat_screen
        await wait_until(pilot, lambda: app.engine.ready)
        await send(pilot, "hello one")
        await finished(pilot)
        first = chat.conversation.id
        assert await app.switch_model(str(two), "two.gguf")
        await wait_until(pilot, lambda: app.engine.ready and app.switching_to is None)
        await send(pilot, "hello two")
        await finished(pilot)
        second = chat.conversation.id
        assert second != first and texts(chat)[-1] == "a reply from two.gguf"

        await chat.open_conversation(first)  # held with one.gguf: the engine goes back to it
        await wait_until(pilot, lambda: app.engine.ready and app.switching_to is None, what="the switch back")
        assert app.model_path == str(one) and chat.conversation.id == first
        assert texts(chat) == ["hello one", "a reply from one.gguf"]  # the conversation is kept
        await notified(pilot, "goes on with it")
        await send(pilot, "again")
        await finished(pilot)
        assert texts(chat)[-1] == "a reply from one.gguf"
        models = read_log(log, "model")
        assert [m["path"] for m in models] == [str(one), str(two), str(one)]
        last = read_log(log, "generate")[-1]
        assert last["pid"] == models[-1]["pid"] and last["conversation"] == first

        two.unlink()  # a conversation whose model file is gone: said, and the running model answers
        await chat.open_conversation(second)
        await pilot.pause()
        assert chat.conversation.id == second and app.model_path == str(one)
        await notified(pilot, "is not there any more")
    assert len(read_log(log, "model")) == 3  # no switch to a missing file


async def test_a_narrow_header_gives_the_models_name_and_the_context_first(store, tmp_path, log):
    """At 80 columns the header's subtitle shows about 50 characters: the full form was cut inside the
    model's name. Below 100 columns it takes a short form; wider, the full one comes back."""
    app = make_app(store, config_engine(None, log, n_ctx=1536), tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        chat = app.chat_screen
        await wait_until(pilot, lambda: app.engine.ready and app.n_ctx == 1536)
        await send(pilot, "hello")
        await finished(pilot)
        used = chat.conversation.context_used
        assert used and app.sub_title.startswith(f"{app.model_label.split(' (')[0]} · {used}/1536 tok · ")
        assert "(" not in app.sub_title.split(" · ")[0]
        await pilot.resize_terminal(100, 30)
        await wait_until(pilot, lambda: app.sub_title.startswith(f"model {app.model_label} · context {used} of 1536 tok"),
                         what=lambda: f"the full header at 100 columns, have {app.sub_title!r} at {app.size}")


async def test_the_header_shows_the_context_size_and_what_the_conversation_uses(store, tmp_path, log):
    app = make_app(store, config_engine(None, log, n_ctx=1536), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        chat = app.chat_screen
        await wait_until(pilot, lambda: app.engine.ready and app.n_ctx == 1536)
        assert "context 0 of 1536 tok" in app.sub_title
        await send(pilot, "hello")
        await finished(pilot)
        rows = store.get_messages(chat.conversation.id)
        meta = rows[-1]["meta"]
        used = meta["prompt_length"] + meta["n_tokens"]
        assert meta["n_tokens"] > 0 and f"context {used} of 1536 tok" in app.sub_title
        cid = chat.conversation.id
        await chat.new_conversation()
        assert "context 0 of 1536 tok" in app.sub_title
        await chat.open_conversation(cid)  # reopened: read back from the reply's meta
        assert f"context {used} of 1536 tok" in app.sub_title


async def test_a_model_switch_gives_new_conversations_its_recommended_sampling(store, tmp_path, log):
    recommends = sampling_gguf(tmp_path / "recommends.gguf", temp=0.25, top_k=12, top_p=0.5)
    app = make_app(store, config_engine(None, log), tmp_path, sampling=T08,
                   sampling_given={"top_k": 7})  # the user set top-k (an option or the config file)
    async with app.run_test(size=SIZE) as pilot:
        chat = app.chat_screen
        await wait_until(pilot, lambda: app.engine.ready)
        assert await app.switch_model(str(recommends), "recommends.gguf")
        s = chat.conversation.settings.sampling
        assert (s.temperature, s.top_p, s.top_k) == (0.25, 0.5, 7)  # the GGUF's, but the user's top-k
        assert "T 0.25" in app.sub_title
        await wait_until(pilot, lambda: app.engine.ready and app.switching_to is None)
        await send(pilot, "hi")
        await finished(pilot)
        call = read_log(log, "generate")[-1]
        assert call["sampling"]["temperature"] == 0.25 and call["sampling"]["top_k"] == 7


async def test_settings_dialog_types_after_the_system_prompt_there_is(store, tmp_path, log):
    app = make_app(store, scripted(["one"], log_path=log), tmp_path, sampling=T08, system="You are a pirate.")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f3")
        await wait_until(pilot, lambda: isinstance(app.screen, SettingsScreen))
        await pilot.press(*" Be brief.")
        await pilot.press("enter")  # a new line in the system prompt, not a save
        await pilot.press(*"Arr")
        assert isinstance(app.screen, SettingsScreen)
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: isinstance(app.screen, ChatScreen))
        assert app.chat_screen.conversation.settings.system == "You are a pirate. Be brief.\nArr"


async def test_a_model_that_fails_to_load_exits_with_the_clis_one_line(store, tmp_path):
    from textual.app import App

    from adaspark_app.errors import ModelLoadError
    from ui_fakes import failing

    app = AdaSparkApp(failing(ModelLoadError("llama.cpp could not load the model file /x.gguf")), store,
                      store_label="ui.db", export_dir=tmp_path)
    shown: list[str] = []
    app.exit = lambda *a, message=None, **k: (shown.append(str(message)), App.exit(app, *a, message=message, **k))
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.return_code is not None, what="the app to exit")
    assert app.return_code == 2
    # printed on stderr once the terminal is restored: the same form as every other CLI error
    assert shown == ["adaspark: error: llama.cpp could not load the model file /x.gguf"]
