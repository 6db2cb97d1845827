"""The message box's unsent text is kept per conversation in the store as it is typed: a quit,
a switch to another conversation or a kill loses none of it (a kill: at most the last second).
Through Pilot with the scripted engine in its own process (tests/ui_fakes.py) and a real SQLite
store; the real `adaspark chat` killed in a terminal is in tests/test_ui_signals.py."""

from __future__ import annotations

import pytest

from adaspark_app.ui.app import AdaSparkApp
from adaspark_app.ui.drafts import SAVE_INTERVAL_S
from ui_fakes import scripted, wait_until

pytestmark = pytest.mark.long

SIZE = (100, 30)


@pytest.fixture
def store(chat_store):
    return chat_store


def make_app(store, tmp_path, **kwargs) -> AdaSparkApp:
    return AdaSparkApp(scripted(["A reply."]), store, store_label="chat.db", export_dir=tmp_path,
                       exit_on_load_error=False, **kwargs)


async def type_text(pilot, text: str) -> None:
    pilot.app.chat_screen.prompt.focus()
    await pilot.press(*text)


async def send(pilot, text: str) -> None:
    chat = pilot.app.chat_screen
    chat.prompt.text = text
    await pilot.press("enter")
    await wait_until(pilot, lambda: chat.conversation.turns and not chat.generating, what="the reply")


async def quit_app(pilot) -> None:
    await pilot.press("ctrl+q")
    await wait_until(pilot, lambda: pilot.app.return_code is not None, what="the app to exit")


def test_a_draft_is_kept_per_conversation_and_forgotten_empty(store):
    cid = store.create_conversation("t", "m")
    store.save_draft(None, "for a new one")
    store.save_draft(cid, "for t")
    store.save_draft("no-such-conversation", "lost")  # nothing kept for what the store lacks
    assert (store.draft(None), store.draft(cid), store.draft("no-such-conversation")) == ("for a new one", "for t", "")
    store.save_draft(None, "")
    store.delete_conversation(cid)
    assert store.draft(None) == store.draft(cid) == ""


async def test_what_was_typed_comes_back_after_a_quit(store, tmp_path):
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await type_text(pilot, "half a thought")
        await quit_app(pilot)
    assert store.draft(None) == "half a thought"
    again = make_app(store, tmp_path)
    async with again.run_test(size=SIZE) as pilot:
        assert again.chat_screen.prompt.text == "half a thought"


async def test_a_draft_is_saved_while_typing_without_a_quit(store, tmp_path):
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await type_text(pilot, "typed")
        await wait_until(pilot, lambda: store.draft(None) == "typed", timeout=SAVE_INTERVAL_S + 5,
                         what="the draft in the store")


async def test_each_conversation_has_its_own_draft(store, tmp_path):
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        chat = app.chat_screen
        await send(pilot, "first question")
        first = chat.conversation.id
        await type_text(pilot, "for the first")
        await pilot.press("ctrl+n")
        assert chat.prompt.text == ""
        await type_text(pilot, "for a new one")
        await chat.open_conversation(first)
        assert chat.prompt.text == "for the first"
        await pilot.press("ctrl+n")
        assert chat.prompt.text == "for a new one"


async def test_a_save_due_as_another_conversation_opens_saves_nothing_into_it(store, tmp_path):
    """The draft's save timer fired just before a switch, its call run in the middle of it (the
    opened conversation's id set, its draft not yet shown): the text typed for the conversation
    left is not saved as the opened one's draft (it was saved for the one left as the switch
    began)."""
    other = store.create_conversation("other", "m")
    store.add_message(other, "user", "hi")
    store.save_draft(other, "the other's own draft")
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        chat = app.chat_screen
        await wait_until(pilot, lambda: chat._draft_timer is None, what="no save pending")
        due: list = []
        set_timer = chat.set_timer

        def held(delay, callback, *args, **kwargs):
            if delay == SAVE_INTERVAL_S:  # the save's call kept for the test to make; its timer never fires
                due.append(callback)
                return set_timer(3600.0, lambda: None)
            return set_timer(delay, callback, *args, **kwargs)

        chat.set_timer = held
        await type_text(pilot, "typed here")
        await wait_until(pilot, lambda: due, what="the draft's save timer")
        show_turns = chat.chat_view.show_turns

        async def switching(turns):
            for callback in due:
                callback()  # the fired timer's call, mid-switch
            await show_turns(turns)

        chat.chat_view.show_turns = switching
        await chat.open_conversation(other)
        assert chat.prompt.text == "the other's own draft"
    assert store.draft(other) == "the other's own draft" and store.draft(None) == "typed here"


async def test_a_sent_message_is_no_longer_a_draft(store, tmp_path):
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        chat = app.chat_screen
        await type_text(pilot, "hello")
        await wait_until(pilot, lambda: store.draft(None) == "hello", timeout=SAVE_INTERVAL_S + 5)
        await pilot.press("enter")
        await wait_until(pilot, lambda: chat.conversation.turns and not chat.generating)
        cid = chat.conversation.id
        assert store.draft(None) == "" and store.draft(cid) == ""
        await quit_app(pilot)
    again = make_app(store, tmp_path, resume_id=cid)
    async with again.run_test(size=SIZE) as pilot:
        assert again.chat_screen.prompt.text == ""


async def test_while_a_message_is_edited_the_draft_is_what_the_box_held_before(store, tmp_path):
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        chat = app.chat_screen
        await send(pilot, "q1")
        cid = chat.conversation.id
        await type_text(pilot, "my draft")
        await pilot.press("ctrl+up")  # edit q1: the box holds it meanwhile
        assert chat.prompt.text == "q1" and chat.conversation.editing == 0
        await quit_app(pilot)
    assert store.draft(cid) == "my draft"
    again = make_app(store, tmp_path, resume_id=cid)
    async with again.run_test(size=SIZE) as pilot:
        assert again.chat_screen.prompt.text == "my draft"


async def test_continuing_a_conversation_keeps_a_new_ones_draft(store, tmp_path):
    """`chat --continue` used to save the empty box over the new conversation's draft."""
    cid = store.create_conversation("old", "m")
    store.save_draft(None, "for a new one")
    store.save_draft(cid, "for the old one")
    app = make_app(store, tmp_path, resume_id=cid)
    async with app.run_test(size=SIZE) as pilot:
        chat = app.chat_screen
        await wait_until(pilot, lambda: chat.conversation.id == cid)
        assert chat.prompt.text == "for the old one"
        await pilot.press("ctrl+n")
        assert chat.prompt.text == "for a new one"
    assert store.draft(None) == "for a new one"


async def test_a_draft_the_store_refuses_is_handed_back_when_the_chat_ends(store, tmp_path):
    """A full disk: the store refuses the draft, and the chat ended with the text gone. Now the
    app holds it as it closes (`run_chat` prints it to the terminal), with the store's reason."""
    pages = store._conn.execute("PRAGMA page_count").fetchone()[0]
    store._conn.execute(f"PRAGMA max_page_count = {pages}")  # SQLite's own 'database or disk is full'
    long_text = "a long thought that will not fit " * 400
    app = make_app(store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        app.chat_screen.prompt.text = long_text
        await quit_app(pilot)
    assert app.unsaved_drafts and app.unsaved_drafts[0][0] == long_text
    assert "full" in app.unsaved_drafts[0][1]
    store._conn.execute(f"PRAGMA max_page_count = {pages * 100}")  # room again: saved, nothing left over
    again = make_app(store, tmp_path)
    async with again.run_test(size=SIZE) as pilot:
        again.chat_screen.prompt.text = long_text + "!"
        await quit_app(pilot)
    assert store.draft(None) == long_text + "!" and again.unsaved_drafts == []
