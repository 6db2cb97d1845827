"""A chat driven past a small context keeps answering, with a marker above each reply whose prompt
left out earlier turns; a message too long for the context is refused with a notification."""

from __future__ import annotations

import pytest

from adaspark_app.engine.worker import EngineConfig
from adaspark_app.store import Store
from adaspark_app.ui.app import AdaSparkApp
from adaspark_app.ui.widgets.chat_view import ContextMarker, context_marker_text
from ui_fakes import wait_until

SIZE = (100, 30)
REPLY_TIMEOUT = 300.0  # seconds: a loaded 2-core machine, the model load included
QUESTIONS = ["Describe a colour.", "Describe a fruit.", "Describe a city.", "Describe an animal.",
             "Describe a tree.", "Describe a river.", "Describe a metal.", "Describe a bird."]


def test_marker_text():
    assert context_marker_text(0) == ""
    assert context_marker_text(1) == "1 earlier turn is out of the context window"
    assert context_marker_text(4) == "4 earlier turns are out of the context window"
    assert context_marker_text(2, 30) == ("2 earlier turns are out of the context window · "
                                          "the context had room for 30 tokens of this reply")
    assert context_marker_text(0, 12) == "the context had room for 12 tokens of this reply"


@pytest.mark.model
async def test_chat_past_a_small_context_keeps_answering_with_the_marker(tmp_path):
    store = Store.open(tmp_path / "chats.db")
    app = AdaSparkApp(EngineConfig(store_path=str(tmp_path / "learned.db"), n_ctx=256), store,
                      store_label="chats.db", export_dir=tmp_path, max_tokens=16, exit_on_load_error=False,
                      engine_log=str(tmp_path / "engine.log"))
    try:
        async with app.run_test(size=SIZE) as pilot:
            chat = app.chat_screen
            for q in QUESTIONS:
                before = len(chat.conversation.history)
                chat.prompt.text = q
                chat.prompt.focus()
                await pilot.press("enter")
                # the turn and its reply in the history, and the reply over (a 16-token reply on a
                # warm engine can start and end between two polls of `generating`)
                await wait_until(pilot, lambda: len(chat.conversation.history) >= before + 2 and not chat.generating,
                                 timeout=REPLY_TIMEOUT,
                                 what=lambda: f"a reply ({[n.message for n in app._notifications]})")
            errors = [n.message for n in app._notifications if n.severity == "error"]
            assert not errors, errors
            messages = chat.chat_view.messages()
            replies = [m for m in messages if m.role == "assistant"]
            assert len(replies) == len(QUESTIONS)
            assert all(r.text.strip() for r in replies)
            marked = [r for r in replies if r.query(ContextMarker)]
            assert marked, "no reply was marked, though the chat outgrew 256 tokens"
            assert not replies[0].query(ContextMarker)
            for r in marked:
                marker = r.query_one(ContextMarker)
                assert r.children[0] is marker  # above the reply's role line and text
                assert "out of the context window" in str(marker.render())
            assert len(chat.conversation.history) == 2 * len(QUESTIONS)  # the chat keeps every turn; only the prompt drops

            # reopened from the store, the replies carry their markers again
            n_marked = len(marked)
            await chat.open_conversation(chat.conversation.id)
            await pilot.pause()
            again = [m for m in chat.chat_view.messages() if m.role == "assistant"]
            assert sum(1 for r in again if r.query(ContextMarker)) == n_marked

            # a message longer than the whole context: refused, given back, nothing recorded
            huge = " ".join(f"word{i}" for i in range(400))
            before = len(chat.conversation.history)
            chat.prompt.text = huge
            await pilot.press("enter")
            await wait_until(pilot, lambda: any("message is" in n.message for n in app._notifications),
                             timeout=60, what="the too-long notification")
            await wait_until(pilot, lambda: not chat.generating, timeout=30, what="the refusal to end")
            assert len(chat.conversation.history) == before
            assert chat.prompt.text.strip() == huge
    finally:
        store.close()
