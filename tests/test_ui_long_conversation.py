"""A long stored conversation opens with its last messages laid out, the earlier ones shown when
the reader scrolls to the top, clicks the line above, or edits one of them. Real Textual app and
SQLite store, the scripted engine (tests/ui_fakes.py) in its own process."""

from __future__ import annotations

import pytest

from adaspark_app.store import Store
from adaspark_app.ui.app import AdaSparkApp
from adaspark_app.ui.widgets.chat_view import SHOWN_AT_OPEN, EarlierMessages
from ui_fakes import read_log, scripted, wait_until

pytestmark = pytest.mark.long

SIZE = (100, 30)
N_TURNS = 75  # 150 messages: SHOWN_AT_OPEN shown, 90 waiting


@pytest.fixture
def store(tmp_path):
    s = Store.open(tmp_path / "ui.db")
    yield s
    s.close()


def long_conversation(store) -> str:
    cid = store.create_conversation("Long", "SmolLM2")
    for i in range(N_TURNS):
        store.add_message(cid, "user", f"question {i}")
        store.add_message(cid, "assistant", f"answer {i}")
    return cid


def shown(chat) -> list[str]:
    return [m.text.strip() for m in chat.chat_view.messages()]


def earlier_line(chat) -> str | None:
    lines = list(chat.chat_view.query(EarlierMessages))
    return str(lines[0].render()) if lines else None


async def opened(store, tmp_path, log, replies=("new answer",)):
    cid = long_conversation(store)
    app = AdaSparkApp(scripted(list(replies), log_path=log), store, store_label="ui.db", export_dir=tmp_path,
                      exit_on_load_error=False, resume_id=cid)
    return app, cid


async def test_a_long_conversation_opens_with_its_last_messages_and_shows_earlier_ones_from_the_top(store, tmp_path):
    app, cid = await opened(store, tmp_path, str(tmp_path / "log.jsonl"))
    async with app.run_test(size=SIZE) as pilot:
        chat = app.chat_screen
        await wait_until(pilot, lambda: chat.conversation.id == cid)
        await pilot.pause()
        view = chat.chat_view
        assert shown(chat)[0] == f"question {N_TURNS - SHOWN_AT_OPEN // 2}" and len(shown(chat)) == SHOWN_AT_OPEN
        assert earlier_line(chat).startswith(f"▲ {2 * N_TURNS - SHOWN_AT_OPEN} earlier messages")
        assert len(chat.conversation.turns) == 2 * N_TURNS  # the conversation is whole; only the view waits
        first = view.messages()[0]
        view.scroll_home(animate=False)  # the reader scrolls to the top
        await wait_until(pilot, lambda: len(shown(chat)) == 2 * SHOWN_AT_OPEN, what="60 more messages")
        assert earlier_line(chat).startswith(f"▲ {2 * N_TURNS - 2 * SHOWN_AT_OPEN} earlier messages")
        # the view stays on what the reader saw: the message that was first is still in sight
        await wait_until(pilot, lambda: view.scroll_y > 0, what="the view to move down by what came in above")
        await pilot.pause()
        assert view.region.overlaps(first.region), (view.region, first.region)
        await view.query_one(EarlierMessages).on_click()  # a click on the line shows the rest
        await wait_until(pilot, lambda: len(shown(chat)) == 2 * N_TURNS, what="every message")
        assert earlier_line(chat) is None
        assert shown(chat)[:2] == ["question 0", "answer 0"]


async def test_editing_a_message_that_waits_above_shows_it_and_resends_from_it(store, tmp_path):
    log = str(tmp_path / "log.jsonl")
    app, cid = await opened(store, tmp_path, log, replies=("edited answer",))
    async with app.run_test(size=SIZE) as pilot:
        chat = app.chat_screen
        await wait_until(pilot, lambda: chat.conversation.id == cid)
        chat.begin_editing(2)  # "question 1", not laid out at open
        await wait_until(pilot, lambda: len(shown(chat)) == 2 * N_TURNS, what="the earlier messages")
        await pilot.pause()
        assert chat.chat_view.messages()[2].has_class("editing")
        chat.prompt.text = "question 1, edited"
        await pilot.press("enter")
        await wait_until(pilot, lambda: not chat.generating, timeout=10, what="the reply")
        assert shown(chat) == ["question 0", "answer 0", "question 1, edited", "edited answer"]
        assert [m["content"] for m in store.get_messages(cid)] == shown(chat)
        assert read_log(log, "generate")[-1]["messages"][-1] == {"role": "user", "content": "question 1, edited"}


async def test_a_new_message_in_a_long_conversation_sends_the_whole_history(store, tmp_path):
    log = str(tmp_path / "log.jsonl")
    app, cid = await opened(store, tmp_path, log)
    async with app.run_test(size=SIZE) as pilot:
        chat = app.chat_screen
        await wait_until(pilot, lambda: chat.conversation.id == cid)
        chat.prompt.text = "one more"
        chat.prompt.focus()
        await pilot.press("enter")
        await wait_until(pilot, lambda: not chat.generating, timeout=10, what="the reply")
        assert shown(chat)[-2:] == ["one more", "new answer"] and len(shown(chat)) == SHOWN_AT_OPEN + 2
        assert len(read_log(log, "generate")[-1]["messages"]) == 2 * N_TURNS + 1
        assert len(store.get_messages(cid)) == 2 * N_TURNS + 2
