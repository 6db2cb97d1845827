"""The chat app with the real bundled model (SmolLM2-135M) at small token counts, through Pilot.

Marked `model`: they load llama.cpp and generate; deselect with `-m "not model"`. One engine is
shared by the module (loading costs about a second); the app's shutdown would close it, so each
app gets a proxy whose close() is a no-op and the fixture closes the engine at the end.
"""

from __future__ import annotations

import pytest

from adaspark_app.store import Store
from adaspark_app.ui.app import AdaSparkApp
from adaspark_app.ui.testing import wait_until

pytestmark = pytest.mark.model

SIZE = (160, 48)
MAX_TOKENS = 24
REPLY_TIMEOUT = 90.0  # seconds; generous for a loaded 2-core machine


class SharedEngine:
    """Forwards to the real engine; the app's close() does not close it."""

    def __init__(self, engine) -> None:
        self._engine = engine
        self.calls: list[list[dict[str, str]]] = []

    def generate(self, conversation_id, messages, *args, **kwargs):
        self.calls.append([dict(m) for m in messages])
        return self._engine.generate(conversation_id, messages, *args, **kwargs)

    def close(self) -> None:
        pass

    def __getattr__(self, name):
        return getattr(self._engine, name)


@pytest.fixture(scope="module")
def real_engine(tmp_path_factory):
    from adaspark_app.engine.chat_engine import ChatEngine

    store = Store.open(tmp_path_factory.mktemp("learned") / "learned.db")
    engine = ChatEngine(store=store)
    yield engine
    engine.close()
    store.close()


@pytest.fixture
def chats(tmp_path):
    store = Store.open(tmp_path / "chats.db")
    yield store
    store.close()


def make_app(engine, store, tmp_path, max_tokens: int = MAX_TOKENS) -> AdaSparkApp:
    return AdaSparkApp(lambda: engine, store, store_label="chats.db", export_dir=tmp_path,
                       max_tokens=max_tokens, exit_on_load_error=False)


async def send(pilot, text: str) -> None:
    chat = pilot.app.chat_screen
    chat.prompt.text = text
    chat.prompt.focus()
    await pilot.press("enter")


async def finished(pilot):
    chat = pilot.app.chat_screen
    await wait_until(pilot, lambda: not chat.generating, timeout=REPLY_TIMEOUT, what="the reply to finish")
    return chat


async def test_real_reply_streams_and_fills_the_panel(real_engine, chats, tmp_path):
    engine = SharedEngine(real_engine)
    app = make_app(engine, chats, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, "What is the capital of France?")
        chat = await finished(pilot)
        user, reply = chat.chat_view.messages()
        assert reply.text.strip(), "the model replied with nothing"
        stats = chat.stats
        assert 0 < stats.reply_tokens <= MAX_TOKENS
        assert stats.reply_rate and stats.reply_rate > 0
        assert stats.rounds > 0 and stats.width_now is not None and stats.width_now >= 1
        assert stats.gauges.plain_rate is None or stats.gauges.plain_rate > 0
        assert stats.gauges.prices_ms or stats.prices_ms() or stats.priced_by == "none"
        assert app.sub_title.startswith(f"model {real_engine.model_name}")
        (conv,) = chats.list_conversations()
        msgs = chats.get_messages(conv["id"])
        assert [m["role"] for m in msgs] == ["user", "assistant"]
        assert msgs[1]["content"] == reply.text and msgs[1]["meta"]["n_tokens"] == stats.reply_tokens


async def test_real_escape_keeps_the_partial_reply(real_engine, chats, tmp_path):
    engine = SharedEngine(real_engine)
    app = make_app(engine, chats, tmp_path, max_tokens=400)
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, "Write a long story about a dragon who learns to bake bread.")
        chat = app.chat_screen
        await wait_until(pilot, lambda: chat.stats.reply_tokens >= 4, timeout=REPLY_TIMEOUT,
                         what="a few streamed tokens")
        await pilot.press("escape")
        await finished(pilot)
        reply = chat.chat_view.messages()[1]
        assert reply.text.strip()
        (conv,) = chats.list_conversations()
        stored = chats.get_messages(conv["id"])[1]
        assert stored["meta"]["stopped"] is True and stored["meta"]["n_tokens"] < 400
        assert stored["content"] == reply.text


async def test_real_resume_sends_the_stored_history(real_engine, chats, tmp_path):
    cid = chats.create_conversation("Colours", "SmolLM2")
    chats.add_message(cid, "user", "Name a colour.")
    chats.add_message(cid, "assistant", "Blue.")
    engine = SharedEngine(real_engine)
    app = make_app(engine, chats, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        chat = app.chat_screen
        chat.sidebar.option_list.focus()
        await pilot.press("enter")
        await wait_until(pilot, lambda: chat.conversation_id == cid)
        assert [m.text for m in chat.chat_view.messages()] == ["Name a colour.", "Blue."]
        await send(pilot, "Name another one.")
        await finished(pilot)
        assert engine.calls[-1] == [
            {"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue."},
            {"role": "user", "content": "Name another one."}]
        assert chat.chat_view.messages()[-1].text.strip()
        assert chats.list_conversations()[0]["n_messages"] == 4


async def test_real_context_overflow_restores_the_prompt(chats, tmp_path):
    from adaspark_app.engine.chat_engine import ChatEngine

    small = ChatEngine(n_ctx=256)
    try:
        app = make_app(SharedEngine(small), chats, tmp_path)
        prompt = "Please summarise this: " + "the quick brown fox jumps over the lazy dog " * 60
        async with app.run_test(size=SIZE) as pilot:
            await send(pilot, prompt)
            chat = await finished(pilot)
            assert chat.prompt.text == prompt.strip()
            assert chat.chat_view.messages() == []
            assert any("context" in n.message for n in app._notifications)
            assert chats.list_conversations() == []
    finally:
        small.close()
