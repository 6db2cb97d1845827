"""The chat app through Textual's Pilot, with a scripted engine (fast, deterministic).

The engine runs in its own spawned process as in `adaspark chat`: only the model is scripted
(tests/ui_fakes.py); what the engine process was asked is read back from its log.
"""

from __future__ import annotations

import os

import pytest

from adaspark_app.errors import ContextOverflowError, ModelLoadError
from adaspark_app.store import Store
from adaspark_app.ui.app import MAX_RESTARTS, AdaSparkApp
from adaspark_app.ui.screens import ChatScreen, ConfirmScreen, HelpScreen, RenameScreen
from adaspark_app.ui.widgets import ChatView
from ui_fakes import failing, notifications, notified, read_log, scripted, spawn_event, wait_until
from ui_fakes import panel_text as stats_panel_text

pytestmark = pytest.mark.long  # scheduled first (tests/conftest.py)

SIZE = (100, 30)
LONG_REPLY = "\n\n".join(f"Line {i}." for i in range(120))  # two tokens a paragraph: tall quickly


@pytest.fixture
def store(tmp_path):
    s = Store.open(tmp_path / "ui.db")
    yield s
    s.close()


@pytest.fixture
def log(tmp_path):
    return str(tmp_path / "engine-calls.jsonl")


def make_app(store, factory=None, tmp_path=None, **kwargs) -> AdaSparkApp:
    return AdaSparkApp(factory if factory is not None else scripted(), store, store_label="ui.db",
                       export_dir=tmp_path, exit_on_load_error=kwargs.pop("exit_on_load_error", False), **kwargs)


async def type_and_send(pilot, text: str) -> None:
    prompt = pilot.app.chat_screen.prompt
    prompt.focus()
    prompt.text = text
    await pilot.press("enter")



def panel_text(chat) -> str:
    """The panel's text as the widget renders it (same function, same stats)."""
    return stats_panel_text(chat.panel.stats)


async def finished(pilot, timeout: float = 10.0) -> ChatScreen:
    chat = pilot.app.chat_screen
    await wait_until(pilot, lambda: not chat.generating, timeout=timeout,
                     what=lambda: f"the reply to finish ({len(chat.replies.round_log)} rounds in, engine ready "
                                  f"{pilot.app.engine.ready}, notifications {notifications(pilot.app)})")
    return chat


# ---------------------------------------------------------------------------- sending
async def test_send_shows_streamed_reply_panel_figures_and_saves(store, tmp_path, log):
    app = make_app(store, scripted(["Sure: **four**.\n\n```python\nprint(2 + 2)\n```"], log_path=log), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press(*"what is 2+2?")
        await pilot.press("enter")
        chat = await finished(pilot)
        user, reply = chat.chat_view.messages()
        assert user.text == "what is 2+2?"
        assert reply.text == "Sure: **four**.\n\n```python\nprint(2 + 2)\n```"
        assert chat.prompt.text == ""
        # The engine ran in another process and got the conversation so far.
        (call,) = read_log(log, "generate")
        assert call["pid"] != os.getpid() and call["pid"] == app.engine.pid
        assert call["messages"] == [{"role": "user", "content": "what is 2+2?"}]
        # Panel figures from the scripted rounds (synthetic clock: 20 ms a round).
        stats = chat.stats
        assert stats.rounds > 0 and stats.reply_rate and stats.reply_rate > 0
        assert stats.speedup == pytest.approx(stats.reply_rate / 100.0)
        assert stats.width_now in (1, 4, 8) and stats.width_histogram()
        assert sum(r.rows for r in stats.acceptance().values()) > 0
        shown = panel_text(chat)
        assert f"{stats.reply_rate:.1f}" in shown and f"{stats.speedup:.2f}×" in shown
        assert "fitted acceptance model" in shown or "head-based estimate" in shown
        # Saved: conversation titled from the first message, both messages, reply figures.
        (conv,) = store.list_conversations()
        assert conv["title"] == "what is 2+2?" and conv["n_messages"] == 2
        msgs = store.get_messages(conv["id"])
        assert [m["role"] for m in msgs] == ["user", "assistant"]
        assert msgs[1]["meta"]["n_tokens"] > 0 and msgs[1]["meta"]["stopped"] is False
        # The stored speed is the engine's n_tokens / decode_s, the figure the panel ends on.
        meta = msgs[1]["meta"]
        assert meta["tokens_per_s"] == pytest.approx(meta["n_tokens"] / meta["decode_s"], rel=2e-3)
        assert stats.reply_rate == pytest.approx(meta["tokens_per_s"], abs=0.01)
        assert "tokens" in reply.query_one(".note").render().plain


async def test_second_turn_sends_the_whole_history(store, tmp_path, log):
    app = make_app(store, scripted(["First answer.", "Second answer."], log_path=log), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await type_and_send(pilot, "one")
        await finished(pilot)
        await type_and_send(pilot, "two")
        await finished(pilot)
        calls = read_log(log, "generate")
        assert calls[1]["messages"] == [
            {"role": "user", "content": "one"}, {"role": "assistant", "content": "First answer."},
            {"role": "user", "content": "two"}]
        assert calls[0]["conversation"] == calls[1]["conversation"]  # same conversation id: KV reuse
        assert [c["turn"] for c in calls] == [0, 1]
        assert store.list_conversations()[0]["n_messages"] == 4


async def test_enter_sends_and_ctrl_j_inserts_a_newline(store, tmp_path, log):
    app = make_app(store, scripted(["ok"], log_path=log), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.engine.ready)
        await pilot.press("a", "ctrl+j", "b")
        assert app.chat_screen.prompt.text == "a\nb" and not read_log(log, "generate")
        await pilot.press("enter")
        await finished(pilot)
        assert read_log(log, "generate")[0]["messages"][-1]["content"] == "a\nb"


async def test_blank_prompt_is_not_sent(store, tmp_path, log):
    app = make_app(store, scripted(log_path=log), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.engine.ready)
        await pilot.press("space", "enter")
        await pilot.pause(0.05)
        assert not app.chat_screen.generating and not app.chat_screen.chat_view.messages()
    assert read_log(log, "load") and not read_log(log, "generate")


async def test_ui_appears_before_the_engine_has_loaded(store, tmp_path, log):
    """The model loads in the engine process; a prompt sent meanwhile is answered once it is there."""
    app = AdaSparkApp(scripted(["late but here"], load_seconds=0.6, log_path=log), store, store_label="ui.db",
                      export_dir=tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        chat = app.chat_screen
        assert not app.engine.ready
        assert "Loading" in str(chat.query_one("#status").render())
        await type_and_send(pilot, "hello")
        assert chat.generating and not app.engine.ready  # sent before the model was there
        chat = await finished(pilot)
        assert chat.chat_view.messages()[1].text == "late but here"
        (load,) = read_log(log, "load")
        assert load["pid"] != os.getpid()
        assert app.sub_title.startswith("model Scripted-135M (test)")


async def test_model_load_error_exits_with_code_2(store, tmp_path):
    app = AdaSparkApp(failing(ModelLoadError("cannot read model /nope.gguf: no such file")), store,
                      store_label="ui.db", export_dir=tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.return_code is not None, what="the app to exit")
    assert app.return_code == 2


async def test_a_prompt_sent_while_a_load_fails_comes_back(store, tmp_path):
    """A prompt sent while the model loads waits for it; when the load fails (a restarted engine,
    or a model picked in the chat: the app stays open), the prompt is back in the box and the chat
    takes the next one, where it used to wait for ever (Esc did not end it either)."""
    app = make_app(store, failing(ModelLoadError("cannot load /x.gguf: tensors missing"), after_s=0.6), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        chat = app.chat_screen
        assert app.load_error is None and not app.engine.ready
        await type_and_send(pilot, "still loading?")
        assert chat.generating
        await wait_until(pilot, lambda: app.load_error is not None, timeout=30, what="the failed load")
        await finished(pilot)
        assert chat.prompt.text == "still loading?"
        assert not chat.chat_view.messages() and store.list_conversations() == []
        await notified(pilot, "your message is back in the box")
        assert app.engine.pending is None
        assert "failed to load" in str(chat.query_one("#status").render())
        await pilot.press("enter")  # refused now, with the reason, instead of waiting again
        assert not chat.generating
        await notified(pilot, "The model failed to load: cannot load /x.gguf")


# ---------------------------------------------------------------------------- stopping
async def test_escape_mid_reply_keeps_the_partial_text(store, tmp_path):
    full = "one two three four five six seven eight nine ten eleven twelve thirteen fourteen"
    held = spawn_event()
    app = make_app(store, scripted([full], hold_after_rounds=3, held=held), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await type_and_send(pilot, "count")
        chat = app.chat_screen
        await wait_until(pilot, held.is_set, what="the engine to be mid-reply")
        await wait_until(pilot, lambda: chat.chat_view.messages()[1].text != "", what="streamed text")
        await pilot.press("escape")
        await finished(pilot)
        reply = chat.chat_view.messages()[1]
        assert reply.text and full.startswith(reply.text) and len(reply.text) < len(full)
        assert "stopped" in reply.query_one(".note").render().plain
        msgs = store.get_messages(store.list_conversations()[0]["id"])
        assert msgs[1]["content"] == reply.text and msgs[1]["meta"]["stopped"] is True
        assert chat.conversation.history[-1] == {"role": "assistant", "content": reply.text}
        await notified(pilot, "Stopped")
        assert not any(t > chat.replies.cancel_requested_at for t, _ in chat.replies.round_log)  # held rounds: none ran after


async def test_escape_before_the_first_token_gives_the_prompt_back(store, tmp_path):
    held = spawn_event()
    app = make_app(store, scripted(["never seen"], hold_after_rounds=0, held=held), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await type_and_send(pilot, "are you there?")
        await wait_until(pilot, held.is_set)
        await pilot.press("escape")
        chat = await finished(pilot)
        assert chat.prompt.text == "are you there?"
        assert not chat.chat_view.messages()
        assert store.list_conversations() == []


# ---------------------------------------------------------------------------- failures
async def test_failing_engine_restores_the_prompt_and_notifies(store, tmp_path):
    factory = scripted(fail=ContextOverflowError("the conversation (4100 tokens) exceeds the context (4096)"),
                       fail_after_rounds=2)
    app = make_app(store, factory, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await type_and_send(pilot, "a very long question")
        chat = await finished(pilot)
        assert chat.prompt.text == "a very long question"
        assert chat.chat_view.messages() == []
        await notified(pilot, "exceeds the context")
        assert store.list_conversations() == []  # the conversation made for it is gone
        assert chat.conversation.id is None


async def test_failure_in_a_later_turn_keeps_the_conversation(store, tmp_path):
    app = make_app(store, scripted(["fine"], fail=ContextOverflowError("too long"), fail_calls=(1,)), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await type_and_send(pilot, "first")
        chat = await finished(pilot)
        await type_and_send(pilot, "second")
        await finished(pilot)
        assert chat.prompt.text == "second"
        assert [m.text for m in chat.chat_view.messages()] == ["first", "fine"]
        assert store.list_conversations()[0]["n_messages"] == 2
        await notified(pilot, "too long")
        assert app.engine.alive  # an error in a reply does not end the engine process


async def test_unexpected_engine_exception_also_restores_the_prompt(store, tmp_path):
    app = make_app(store, scripted(fail=RuntimeError("boom")), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await type_and_send(pilot, "hi")
        chat = await finished(pilot)
        assert chat.prompt.text == "hi"
        await notified(pilot, "RuntimeError: boom")


# ---------------------------------------------------------------------------- conversations
def seed_conversation(store) -> str:
    cid = store.create_conversation("Capital of France", "SmolLM2")
    store.add_message(cid, "user", "What is the capital of France?")
    store.add_message(cid, "assistant", "Paris.", meta={"n_tokens": 3, "tokens_per_s": 80.0})
    return cid


async def test_resume_a_stored_conversation(store, tmp_path, log):
    cid = seed_conversation(store)
    app = make_app(store, scripted(["About two million."], log_path=log), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        chat = app.chat_screen
        assert chat.sidebar.option_list.option_count == 1
        chat.sidebar.option_list.focus()
        await pilot.press("enter")
        await wait_until(pilot, lambda: len(chat.chat_view.messages()) == 2, what="the stored messages")
        assert [m.text for m in chat.chat_view.messages()] == ["What is the capital of France?", "Paris."]
        assert chat.conversation.id == cid and chat.conversation.last_reply == "Paris."
        await type_and_send(pilot, "How many people live there?")
        await finished(pilot)
        call = read_log(log, "generate")[-1]
        assert (call["conversation"], call["messages"]) == (cid, [
            {"role": "user", "content": "What is the capital of France?"},
            {"role": "assistant", "content": "Paris."},
            {"role": "user", "content": "How many people live there?"}])
        assert store.list_conversations()[0]["n_messages"] == 4


async def test_the_open_conversations_history_is_read_ahead_with_its_settings(store, tmp_path, log):
    """The engine is asked to read the history while the next message is typed: once a loading
    engine is there, on opening, after a settings change and after a reply; not for a new
    conversation (no history)."""
    from dataclasses import replace

    cid = seed_conversation(store)
    history = [{"role": "user", "content": "What is the capital of France?"}, {"role": "assistant", "content": "Paris."}]
    app = make_app(store, scripted(["About two million."], log_path=log, load_seconds=1.0), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        chat = app.chat_screen
        await chat.open_conversation(cid)  # while the model loads: asked once it has
        assert not app.engine.ready
        await wait_until(pilot, lambda: read_log(log, "read_ahead"), what="a read-ahead after the load")
        (call,) = read_log(log, "read_ahead")
        assert (call["conversation"], call["messages"], call["max_tokens"]) == (
            cid, history, chat.conversation.settings.max_tokens)
        chat.apply_settings(replace(chat.conversation.settings, system="Be brief.", max_tokens=77))
        await wait_until(pilot, lambda: len(read_log(log, "read_ahead")) == 2)
        call = read_log(log, "read_ahead")[1]
        assert call["messages"] == [{"role": "system", "content": "Be brief."}, *history] and call["max_tokens"] == 77
        await type_and_send(pilot, "How many people live there?")
        await finished(pilot)
        await wait_until(pilot, lambda: len(read_log(log, "read_ahead")) == 3)
        after = read_log(log, "read_ahead")[2]["messages"]
        assert after[-2:] == [{"role": "user", "content": "How many people live there?"},
                              {"role": "assistant", "content": "About two million."}]
        await pilot.press("ctrl+n")
        await chat.open_conversation(cid)
        await wait_until(pilot, lambda: len(read_log(log, "read_ahead")) == 4)
        assert read_log(log, "read_ahead")[3]["messages"] == after
        await pilot.press("ctrl+n")
    assert [c["event"] for c in read_log(log) if c["event"] != "load"] == [
        "read_ahead", "read_ahead", "generate", "read_ahead", "read_ahead", "close"]


async def test_the_message_box_is_read_ahead_while_it_is_typed(store, tmp_path, log):
    """The engine is asked to read the message box's text too, half a second after it changes and
    so on while typing goes on: in a new conversation (no id yet) and in one with a history; an
    unchanged draft is not asked again, an earlier message being edited is read as its resend's
    prompt once it differs from the message, and a reply's end reads what the box holds by then."""
    from adaspark_app.ui.screens.chat import TYPING_PAUSE_S

    cid = seed_conversation(store)
    history = [{"role": "user", "content": "What is the capital of France?"}, {"role": "assistant", "content": "Paris."}]
    app = make_app(store, scripted(["About two million.", "Yes."], log_path=log), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        chat = app.chat_screen
        await wait_until(pilot, lambda: app.engine.ready)
        chat.prompt.text = "Here is a long text I pasted"
        await wait_until(pilot, lambda: read_log(log, "read_ahead"), what="the new conversation's draft read")
        (call,) = read_log(log, "read_ahead")
        assert (call["conversation"], call["messages"], call["draft"]) == (None, [], "Here is a long text I pasted")
        await pilot.pause(2 * TYPING_PAUSE_S)
        chat.prompt.text = "Here is a long text I pasted"  # the same text: not asked again
        await pilot.pause(2 * TYPING_PAUSE_S)
        assert len(read_log(log, "read_ahead")) == 1
        await chat.open_conversation(cid)  # its history, with the box's draft (none)
        await wait_until(pilot, lambda: len(read_log(log, "read_ahead")) == 2)
        assert (read_log(log, "read_ahead")[1]["messages"], read_log(log, "read_ahead")[1]["draft"]) == (history, "")
        typed = "How many people live there?"
        for i in range(1, len(typed)):  # a key every 0.1 s: read twice or more while typing goes on
            chat.prompt.text = typed[:i]
            await pilot.pause(0.1)
        drafts = [c["draft"] for c in read_log(log, "read_ahead")[2:]]
        assert len(drafts) >= 3 and all(typed.startswith(d) and d for d in drafts), drafts
        chat.prompt.text = typed
        await pilot.press("enter")  # before the next reading: the reply reads the rest itself
        await finished(pilot)
        await wait_until(pilot, lambda: read_log(log, "read_ahead")[-1]["draft"] == "", what="the reply end's ask")
        n = len(read_log(log, "read_ahead"))
        await pilot.pause(2 * TYPING_PAUSE_S)
        assert len(read_log(log, "read_ahead")) == n  # the box's clearing was that same ask
        chat.begin_editing(2)  # "How many people live there?", unchanged: the cache is kept as it is
        await pilot.pause(2 * TYPING_PAUSE_S)
        assert len(read_log(log, "read_ahead")) == n
        chat.prompt.text = "How many people live in Paris?"  # the resend's prompt: the turns before it, the edit
        await wait_until(pilot, lambda: len(read_log(log, "read_ahead")) == n + 1)
        call = read_log(log, "read_ahead")[n]
        assert (call["messages"], call["draft"]) == (history, "How many people live in Paris?")
        await pilot.press("escape")  # the edit left: the history and the box's own text again
        await wait_until(pilot, lambda: len(read_log(log, "read_ahead")) == n + 2)
        assert len(read_log(log, "read_ahead")[n + 1]["messages"]) == 4 and read_log(log, "read_ahead")[n + 1]["draft"] == ""
    events = [c["event"] for c in read_log(log) if c["event"] != "load"]
    assert events[:2] == ["read_ahead", "read_ahead"] and events.count("generate") == 1
    assert events[events.index("generate") + 1] == "read_ahead"


async def test_with_read_ahead_off_the_history_is_read_only_when_a_message_is_sent(store, tmp_path, log):
    cid = seed_conversation(store)
    app = make_app(store, scripted(["About two million."], log_path=log), tmp_path, read_ahead=False)
    async with app.run_test(size=SIZE) as pilot:
        chat = app.chat_screen
        await wait_until(pilot, lambda: app.engine.ready)
        await chat.open_conversation(cid)
        await type_and_send(pilot, "How many people live there?")
        await finished(pilot)
        await pilot.press("ctrl+n")
    assert [c["event"] for c in read_log(log) if c["event"] != "load"] == ["generate", "close"]


async def test_a_reading_ahead_that_fails_ends_its_count_and_the_chat_goes_on(store, tmp_path, log):
    cid = seed_conversation(store)
    app = make_app(store, scripted(["About two million."], log_path=log, read_ahead_fails=True), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        chat = app.chat_screen
        await wait_until(pilot, lambda: app.engine.ready)
        shown: list[str | None] = []
        set_status = chat.set_status
        chat.set_status = lambda text=None: shown.append(text) or set_status(text)  # what the line was told
        status = chat.query_one("#status")
        await chat.open_conversation(cid)
        await wait_until(pilot, lambda: chat.history_read is not None)
        assert chat.history_read.result is None  # the engine said it failed
        assert any(text and text.startswith("Reading history ahead: 0/600 tokens") for text in shown)
        await wait_until(pilot, lambda: str(status.render()) == "Ready.")
        await type_and_send(pilot, "How many people live there?")
        await finished(pilot)
        assert chat.conversation.last_reply == "About two million."


async def test_new_rename_delete_and_search(store, tmp_path):
    seed_conversation(store)
    other = store.create_conversation("Rust lifetimes", "SmolLM2")
    store.add_message(other, "user", "Explain lifetimes")
    app = make_app(store, scripted(), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        chat = app.chat_screen
        sidebar = chat.sidebar
        # search
        await pilot.press("ctrl+f")
        assert sidebar.query_one("#search").has_focus
        await pilot.press(*"lifetimes")
        await wait_until(pilot, lambda: sidebar.option_list.option_count == 1)
        assert sidebar.conversations[0]["id"] == other
        # open it, rename it
        await pilot.press("enter", "enter")
        await wait_until(pilot, lambda: chat.conversation.id == other)
        chat.prompt.focus()
        await pilot.press("f2")
        await wait_until(pilot, lambda: isinstance(app.screen, RenameScreen))
        app.screen.query_one("#title").value = "Borrow checker"
        await pilot.press("enter")
        await wait_until(pilot, lambda: store.get_conversation(other)["title"] == "Borrow checker")
        # delete it after confirming
        await pilot.press("f8")
        await wait_until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.press("y")
        await wait_until(pilot, lambda: store.get_conversation(other) is None)
        assert chat.conversation.id is None and not chat.chat_view.messages()
        # new conversation clears the view
        sidebar.query_one("#search").value = ""
        await wait_until(pilot, lambda: sidebar.option_list.option_count == 1)
        await pilot.press("ctrl+n")
        assert chat.conversation.id is None and chat.conversation.history == []


async def test_delete_is_cancelled_by_default(store, tmp_path):
    cid = seed_conversation(store)
    app = make_app(store, scripted(), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await app.chat_screen.open_conversation(cid)
        app.chat_screen.sidebar.option_list.focus()
        await pilot.press("delete")  # the list's own key for the highlighted conversation
        await wait_until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        assert "Capital of France" in app.screen.question
        await pilot.press("escape")
        await wait_until(pilot, lambda: isinstance(app.screen, ChatScreen))
        assert store.get_conversation(cid) is not None


async def test_export_markdown_and_copy_last_reply(store, tmp_path):
    app = make_app(store, scripted(["The answer is `42`."]), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("ctrl+o")
        await notified(pilot, "No reply")
        await type_and_send(pilot, "meaning of life?")
        await finished(pilot)
        await pilot.press("ctrl+o")
        assert app.clipboard == "The answer is `42`."
        await pilot.press("ctrl+s")
        (path,) = tmp_path.glob("adaspark-*.md")
        text = path.read_text()
        assert "# meaning of life?" in text and "The answer is `42`." in text
        await notified(pilot, str(path))


# ---------------------------------------------------------------------------- follow the bottom
async def test_view_follows_the_bottom_only_while_near_it(store, tmp_path):
    held, gate = spawn_event(), spawn_event()
    app = make_app(store, scripted([LONG_REPLY, LONG_REPLY], hold_after_rounds=40, round_sleep=0.0,
                                   held=held, gate=gate), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        view = app.chat_screen.query_one(ChatView)
        # First reply: the reader stays at the bottom, so the view follows it. Past a page the
        # reply's tail turns pages within itself (no layout while the reader follows).
        await type_and_send(pilot, "long please")
        await wait_until(pilot, held.is_set)
        reply = view.messages()[-1]
        await wait_until(pilot, lambda: reply.tail_widget.window is not None, what="the tail to page")
        await wait_until(pilot, lambda: view.max_scroll_y - view.scroll_y <= view.NEAR_BOTTOM,
                         what="the view to follow the stream")
        gate.set()
        await finished(pilot)
        await wait_until(pilot, lambda: view.max_scroll_y > 10, what="content taller than the view")
        await wait_until(pilot, lambda: view.max_scroll_y - view.scroll_y <= view.NEAR_BOTTOM,
                         what="the view to be at the bottom")
        # Second reply: the reader scrolls up to read; new text must not move the view.
        gate.clear()
        await type_and_send(pilot, "again")
        await wait_until(pilot, held.is_set)
        await pilot.pause(0.1)
        view.scroll_to(y=5, animate=False)
        await wait_until(pilot, lambda: view.scroll_y == 5)
        assert not view.following
        before = view.max_scroll_y
        gate.set()
        await finished(pilot)
        await wait_until(pilot, lambda: view.max_scroll_y > before + 10, what="the reply to grow")
        assert view.scroll_y == 5
        # A scroll that ends within NEAR_BOTTOM lines of the end follows again.
        view.scroll_to(y=view.max_scroll_y - 1, animate=False)
        await wait_until(pilot, lambda: view.following, what="following near the bottom")


# ---------------------------------------------------------------------------- help and palette
async def test_help_screen_and_palette_list_every_action(store, tmp_path):
    app = make_app(store, scripted(), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        chat = app.chat_screen
        ids = [b.id for b in ChatScreen.BINDINGS]
        assert all(ids) and len(set(ids)) == len(ids)
        assert all(b.id for b in AdaSparkApp.BINDINGS)
        commands = {c.title for c in app.get_system_commands(chat)}
        for b in ChatScreen.BINDINGS:
            assert b.tooltip in commands, b.id
            assert callable(getattr(chat, f"action_{b.action}"))
        await pilot.press("f1")
        await wait_until(pilot, lambda: isinstance(app.screen, HelpScreen))
        md = app.screen.markdown
        for b in [*ChatScreen.BINDINGS, *AdaSparkApp.BINDINGS]:
            assert b.tooltip in md, b.id
        assert "Ctrl+J" in md and "Enter" in md and "Ctrl+P" in md
        await pilot.press("escape")
        await wait_until(pilot, lambda: isinstance(app.screen, ChatScreen))
        # '?' opens help too, but types a '?' while the prompt has focus.
        await pilot.press("question_mark")
        assert chat.prompt.text == "?" and isinstance(app.screen, ChatScreen)


async def test_palette_command_runs_the_action(store, tmp_path):
    app = make_app(store, scripted(), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        chat = app.chat_screen
        (toggle,) = [c for c in app.get_system_commands(chat) if c.title.startswith("Show or hide the speculation")]
        assert chat.panel.display
        toggle.callback()
        await pilot.pause()
        assert not chat.panel.display


async def test_sidebar_and_panel_toggle(store, tmp_path):
    """Ctrl+B and Ctrl+G show and hide the sidebar and the panel. Where the two do not fit beside
    CHAT_MIN_COLUMNS of conversation, the one a key shows hides the other (at 100 columns the
    conversation kept 18), which comes back when it is hidden again; where both fit, neither
    hides the other."""
    from adaspark_app.ui.screens.chat import CHAT_MIN_COLUMNS

    app = make_app(store, scripted(), tmp_path)
    async with app.run_test(size=SIZE) as pilot:  # 100 columns: the panel fits, the sidebar does not
        chat = app.chat_screen

        def shown() -> tuple[bool, bool]:
            return chat.sidebar.display, chat.panel.display

        assert shown() == (False, True)
        await pilot.press("ctrl+b")
        await pilot.pause()
        assert shown() == (True, False)
        assert chat.chat_view.region.width >= CHAT_MIN_COLUMNS - 2  # inside the column's padding
        await pilot.press("ctrl+b")
        assert shown() == (False, True)
        await pilot.press("ctrl+g", "ctrl+b")  # the panel hidden by hand stays hidden
        assert shown() == (True, False)
        await pilot.press("ctrl+b", "ctrl+g")
        assert shown() == (False, True)
        await pilot.press("ctrl+f")  # a search shows the sidebar the same way
        assert shown() == (True, False) and chat.sidebar.query_one("#search").has_focus
        await pilot.press("ctrl+g")  # the panel shown makes room in turn
        assert shown() == (False, True)
        await pilot.press("ctrl+g")
        assert shown() == (True, False)
        await pilot.resize_terminal(160, 30)  # both fit: the fit shows both, and a key hides only its own
        await wait_until(pilot, lambda: shown() == (True, True), what="both at 160 columns")
        await pilot.press("ctrl+b")
        assert shown() == (False, True)
        await pilot.press("ctrl+b")
        assert shown() == (True, True)


async def test_the_sidebar_and_the_panel_show_where_the_conversation_keeps_its_room(store, tmp_path):
    """At 80 columns the sidebar and the panel left the conversation 2 columns; now each shows only
    where the conversation keeps CHAT_MIN_COLUMNS beside it, the panel first. A key's choice holds
    until the terminal crosses a width where that answer changes."""
    from adaspark_app.ui.screens.chat import CHAT_MIN_COLUMNS

    app = make_app(store, scripted(), tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        chat = app.chat_screen

        def shown() -> tuple[bool, bool]:
            return chat.sidebar.display, chat.panel.display

        assert shown() == (False, False)
        assert chat.chat_view.region.width >= CHAT_MIN_COLUMNS
        for width, want in ((160, (True, True)), (100, (False, True)), (95, (False, False)), (130, (True, True))):
            await pilot.resize_terminal(width, 30)
            await wait_until(pilot, lambda: shown() == want, what=f"{want} at {width} columns")
            await pilot.pause()
            assert chat.chat_view.region.width >= CHAT_MIN_COLUMNS - 2  # inside the column's padding
        await pilot.press("ctrl+g")  # hidden by hand: it stays so at any width with the same answer
        await pilot.resize_terminal(170, 40)
        await pilot.pause()
        assert shown() == (True, False)
        await pilot.resize_terminal(100, 30)  # the answer changes: the fit applies again
        await wait_until(pilot, lambda: shown() == (False, True), what="the fit at 100 columns")


async def test_quitting_mid_reply_stops_it_and_closes_the_engine(store, tmp_path, log):
    held = spawn_event()
    app = make_app(store, scripted(["a b c d e f g"], hold_after_rounds=2, held=held, log_path=log), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await type_and_send(pilot, "go")
        await wait_until(pilot, held.is_set)
        await pilot.press("ctrl+q")
    # Closing waited for the reply to notice the cancel and return: never closed under it.
    assert read_log(log, "close") and not held.is_set()
    assert app.engine.exitcode == 0 and not app.engine.alive
    assert store.list_conversations()[0]["n_messages"] == 2  # the partial reply was kept
    assert not read_log(log, "read_ahead")  # a reply's end asks for none when the chat quits


# ---------------------------------------------------------------------------- the engine process dies
async def test_engine_killed_mid_reply_keeps_the_text_and_the_next_message_works(store, tmp_path, log):
    full = "one two three four five six seven eight nine ten eleven twelve thirteen fourteen"
    held, gate = spawn_event(), spawn_event()
    app = make_app(store, scripted([full], hold_after_rounds=3, held=held, gate=gate, log_path=log), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        chat = app.chat_screen
        await type_and_send(pilot, "count")
        await wait_until(pilot, held.is_set, what="the engine to be mid-reply")
        await wait_until(pilot, lambda: chat.chat_view.messages()[1].text != "", what="streamed text")
        first_pid = app.engine.pid
        app.engine.kill()
        await notified(pilot, "engine process stopped")
        assert not chat.generating
        await notified(pilot, "signal 9", "Kept the")
        # The text so far is kept: on screen, in the history and in the store.
        user, reply = chat.chat_view.messages()
        assert reply.text and full.startswith(reply.text) and len(reply.text) < len(full)
        assert chat.conversation.history == [{"role": "user", "content": "count"}, {"role": "assistant", "content": reply.text}]
        msgs = store.get_messages(chat.conversation.id)
        assert [m["content"] for m in msgs] == ["count", reply.text]
        assert msgs[1]["meta"]["stopped"] is True and msgs[1]["meta"]["engine_died"] is True
        # A new engine process starts, and the next message is answered with the whole history.
        await wait_until(pilot, lambda: app.engine.ready and app.engine.loads == 2, what="the restarted engine")
        assert app.engine.pid != first_pid
        gate.set()  # the new engine process replies in full
        await type_and_send(pilot, "again")
        await finished(pilot)
        assert [m.text for m in chat.chat_view.messages()][-2:] == ["again", full]
        last = read_log(log, "generate")[-1]
        assert last["pid"] == app.engine.pid and last["messages"][:2] == chat.conversation.history[:2]
        assert store.list_conversations()[0]["n_messages"] == 4
        await notified(pilot, "running again")


async def test_engine_killed_before_any_text_gives_the_prompt_back(store, tmp_path):
    held = spawn_event()
    app = make_app(store, scripted(["never seen"], hold_after_rounds=0, held=held), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        chat = app.chat_screen
        await type_and_send(pilot, "are you there?")
        await wait_until(pilot, held.is_set)
        app.engine.kill()
        await notified(pilot, "back in the box")
        assert chat.prompt.text == "are you there?" and not chat.generating
        assert not chat.chat_view.messages() and store.list_conversations() == []


def test_the_error_line_an_engine_died_with_is_its_own_not_an_earlier_ones(tmp_path):
    """The engine log is appended to by every engine process: the line a death is reported with
    is the last `adaspark: error:` line written since this process started, or none."""
    from adaspark_app.ui.engine_client import last_error_line

    log = tmp_path / "engine.log"
    log.write_text("adaspark: error: an earlier engine's check\n")
    since = log.stat().st_size
    assert last_error_line(str(log), since) is None
    with open(log, "a") as fh:
        fh.write("llama.cpp says something\nadaspark: error: first\nadaspark: error: this one\nmore\n")
    assert last_error_line(str(log), since) == "this one"
    assert last_error_line(str(tmp_path / "none.log"), 0) is None and last_error_line(None, 0) is None


async def test_an_engine_that_keeps_dying_is_not_restarted_forever(store, tmp_path):
    app = make_app(store, failing(SystemExit(3)), tmp_path)  # the engine process exits while loading
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.load_error is not None, timeout=60, what="the app to give up")
        assert app.deaths_in_a_row == MAX_RESTARTS + 1
        await notified(pilot, "not restarting")
        await type_and_send(pilot, "hello?")
        assert app.chat_screen.prompt.text == "hello?" and not app.chat_screen.generating
