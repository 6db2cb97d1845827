"""The chat app with the real bundled model (SmolLM2-135M) at small token counts, through Pilot.

Marked `model`: they load llama.cpp and generate; deselect with `-m "not model"`. As in
`adaspark chat`, each app runs the real engine in its own spawned process (`EngineConfig`); a
`recording` wrapper (tests/ui_fakes.py) logs what that process was asked.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import pytest

from adaspark_app.engine.sampling import SamplingSettings
from adaspark_app.engine.worker import EngineConfig
from adaspark_app.store import Store
from adaspark_app.ui.app import AdaSparkApp
from ui_fakes import (crashing_at_generate, notifications, notified, panel_text, read_log, recording, wait_until,
                      without_header_rules)

pytestmark = [pytest.mark.model, pytest.mark.long]

SIZE = (100, 30)
MAX_TOKENS = 24
REPLY_TIMEOUT = 300.0  # seconds; generous for a loaded 2-core machine (model load included)
STORY = "Write a long story about a dragon who learns to bake bread."


@pytest.fixture(scope="module")
def learned(tmp_path_factory) -> str:
    """One learned-state store for the module's engine processes (as a user's store would be)."""
    return str(tmp_path_factory.mktemp("learned") / "learned.db")


@pytest.fixture
def chats(tmp_path):
    store = Store.open(tmp_path / "chats.db")
    yield store
    store.close()


def make_app(factory, store, tmp_path, max_tokens: int = MAX_TOKENS, **kwargs) -> AdaSparkApp:
    return AdaSparkApp(factory, store, store_label="chats.db", export_dir=tmp_path, max_tokens=max_tokens,
                       exit_on_load_error=False, engine_log=str(tmp_path / "engine.log"), **kwargs)


async def send(pilot, text: str) -> None:
    chat = pilot.app.chat_screen
    chat.prompt.text = text
    chat.prompt.focus()
    await pilot.press("enter")


async def finished(pilot):
    chat = pilot.app.chat_screen
    await wait_until(pilot, lambda: not chat.generating, timeout=REPLY_TIMEOUT,
                     what=lambda: f"the reply to finish ({len(chat.replies.round_log)} rounds in, engine alive "
                                  f"{pilot.app.engine.alive}, notifications {notifications(pilot.app)})")
    return chat



async def test_real_reply_streams_and_fills_the_panel(learned, chats, tmp_path):
    log = tmp_path / "calls.jsonl"
    app = make_app(recording(EngineConfig(store_path=learned), log), chats, tmp_path)
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
        assert app.sub_title.lower().startswith("model smollm2")  # the name the engine process reported
        assert " · on CPU, " in app.sub_title and " threads · " in app.sub_title  # where it runs,
        assert chat.stats.device.startswith("CPU, ") and "on CPU, " in panel_text(chat.stats)  # here too
        (call,) = read_log(log, "generate")
        assert call["pid"] == app.engine.pid != os.getpid()
        (conv,) = chats.list_conversations()
        msgs = chats.get_messages(conv["id"])
        assert [m["role"] for m in msgs] == ["user", "assistant"]
        meta = msgs[1]["meta"]
        assert msgs[1]["content"] == reply.text and meta["n_tokens"] == stats.reply_tokens
        # The stored and shown speed is the engine's own n_tokens / decode_s (as `adaspark run`).
        assert meta["tokens_per_s"] == pytest.approx(meta["n_tokens"] / meta["decode_s"], rel=2e-3, abs=0.006)  # both are rounded (tokens_per_s to 0.01)
        assert stats.reply_rate == pytest.approx(meta["tokens_per_s"], abs=0.01)


async def test_real_escape_stops_within_one_round_and_keeps_the_partial_reply(learned, chats, tmp_path):
    app = make_app(EngineConfig(store_path=learned), chats, tmp_path, max_tokens=400)
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, STORY)
        chat = app.chat_screen
        await wait_until(pilot, lambda: chat.stats.rounds >= 4, timeout=REPLY_TIMEOUT, what="a few rounds")
        await pilot.press("escape")
        await finished(pilot)
        # Rounds are stamped with the time they ended in the engine process (one clock for every
        # process): at most the round in flight when Esc was pressed ends after it.
        asked = chat.replies.cancel_requested_at
        assert asked is not None
        after = [e for t, e in chat.replies.round_log if t > asked and e.verify_ms > 0]
        assert len(after) <= 1, f"{len(after)} rounds ran after the stop was asked for"
        reply = chat.chat_view.messages()[1]
        assert reply.text.strip()
        (conv,) = chats.list_conversations()
        stored = chats.get_messages(conv["id"])[1]
        assert stored["meta"]["stopped"] is True and stored["meta"]["n_tokens"] < 400
        assert stored["content"] == reply.text


async def test_real_escape_while_a_long_prompt_is_read_gives_it_back_and_keeps_what_was_read(learned, chats, tmp_path):
    """A pasted page takes seconds to read on the CPU: the status line counts it, Esc stops it
    between two chunks (the message goes back in the box, no reply is kept), and sending it again
    reads only the rest."""
    status = lambda app: str(app.chat_screen.query_one("#status").render())  # noqa: E731
    paste = " ".join(f"Item {i}: the box holds {i * 7 % 23} marbles and a note about the weather." for i in range(150))
    app = make_app(EngineConfig(store_path=learned), chats, tmp_path, max_tokens=8)
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, paste)
        chat = app.chat_screen
        await wait_until(pilot, lambda: status(app).startswith("Reading prompt: ") and "prompt: 0/" not in status(app),
                         timeout=REPLY_TIMEOUT, what=lambda: f"the prompt's reading to be counted ({status(app)!r})")
        await pilot.press("escape")
        await finished(pilot)
        assert chat.prompt.text == paste
        assert any("Stopped before the first token" in n for n in notifications(app))
        assert all(m["role"] != "assistant" for c in chats.list_conversations() for m in chats.get_messages(c["id"]))
        await pilot.press("enter")
        await finished(pilot)
        assert status(app) == "Ready."
    (conv,) = chats.list_conversations()
    meta = chats.get_messages(conv["id"])[-1]["meta"]
    assert 0 < meta["prompt_tokens"] < meta["prompt_length"] - 100  # the start was kept from the stopped reading


async def test_real_gpu_layers_on_a_cpu_build_notify_once_and_the_header_says_cpu(learned, chats, tmp_path):
    """`adaspark chat --gpu-layers all` on a CPU-only llama.cpp build: the engine runs on the CPU,
    the chat says so once, and its header names the CPU."""
    from adaspark_app.engine.offload import ALL_LAYERS

    app = make_app(EngineConfig(store_path=learned, gpu_layers=ALL_LAYERS), chats, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await notified(pilot, "cannot offload to a GPU", "running on the CPU")
        await wait_until(pilot, lambda: " · on CPU, " in app.sub_title, what="the header to name the CPU")
        await send(pilot, "Say hi.")
        await finished(pilot)
        assert sum("cannot offload" in n for n in notifications(app)) == 1


async def test_real_resume_sends_the_stored_history(learned, chats, tmp_path):
    cid = chats.create_conversation("Colours", "SmolLM2")
    chats.add_message(cid, "user", "Name a colour.")
    chats.add_message(cid, "assistant", "Blue.")
    log = tmp_path / "calls.jsonl"
    app = make_app(recording(EngineConfig(store_path=learned), log), chats, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        chat = app.chat_screen
        chat.sidebar.option_list.focus()
        await pilot.press("enter")
        await wait_until(pilot, lambda: chat.conversation.id == cid)
        assert [m.text for m in chat.chat_view.messages()] == ["Name a colour.", "Blue."]
        await send(pilot, "Name another one.")
        await finished(pilot)
        assert read_log(log, "generate")[-1]["messages"] == [
            {"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue."},
            {"role": "user", "content": "Name another one."}]
        assert chat.chat_view.messages()[-1].text.strip()
        assert chats.list_conversations()[0]["n_messages"] == 4


async def test_real_context_overflow_restores_the_prompt(chats, tmp_path):
    app = make_app(EngineConfig(n_ctx=256), chats, tmp_path)
    prompt = "Please summarise this: " + "the quick brown fox jumps over the lazy dog " * 60
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, prompt)
        chat = await finished(pilot)
        assert chat.prompt.text == prompt.strip()
        assert chat.chat_view.messages() == []
        await notified(pilot, "context")
        assert chats.list_conversations() == []
        assert app.engine.alive  # a user error does not end the engine process


async def test_real_engine_killed_mid_reply_then_the_next_message_works(learned, chats, tmp_path):
    app = make_app(EngineConfig(store_path=learned), chats, tmp_path, max_tokens=400)
    async with app.run_test(size=SIZE) as pilot:
        chat = app.chat_screen
        await send(pilot, STORY)
        await wait_until(pilot, lambda: chat.stats.reply_tokens >= 8, timeout=REPLY_TIMEOUT, what="streamed tokens")
        first_pid = app.engine.pid
        app.engine.kill()  # SIGKILL: what a llama.cpp crash looks like from the UI
        await notified(pilot, "engine process stopped", timeout=30)
        assert not chat.generating
        user, reply = chat.chat_view.messages()
        assert reply.text.strip()
        assert chat.conversation.history == [{"role": "user", "content": STORY}, {"role": "assistant", "content": reply.text}]
        (conv,) = chats.list_conversations()
        stored = chats.get_messages(conv["id"])
        assert [m["content"] for m in stored] == [STORY, reply.text]
        assert stored[1]["meta"]["engine_died"] is True
        await wait_until(pilot, lambda: app.engine.ready and app.engine.loads == 2, timeout=REPLY_TIMEOUT,
                         what="the restarted engine")
        assert app.engine.pid != first_pid
        chat.apply_settings(replace(chat.conversation.settings, max_tokens=MAX_TOKENS))  # the conversation's own cap
        await send(pilot, "Give the dragon a name.")
        await finished(pilot)
        texts = [m.text for m in chat.chat_view.messages()]
        assert texts[:3] == [STORY, reply.text, "Give the dragon a name."] and texts[3].strip()
        assert chats.list_conversations()[0]["n_messages"] == 4


# ---------------------------------------------------------------------------- per-conversation settings
SMOL_DEFAULT_SYSTEM = "named SmolLM"  # what SmolLM2's template says when no system prompt is given


async def test_real_system_prompt_from_the_settings_dialog_reaches_the_template(learned, chats, tmp_path):
    from adaspark_app.ui.screens import SettingsScreen

    log = tmp_path / "calls.jsonl"
    app = make_app(recording(EngineConfig(store_path=learned), log), chats, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f3")
        await wait_until(pilot, lambda: isinstance(app.screen, SettingsScreen))
        app.screen.query_one("#system").text = "You are a pirate. Always say arr."
        app.screen.query_one("#max_tokens").value = "12"
        app.screen.query_one("#max_tokens").focus()
        await pilot.press("enter")
        await wait_until(pilot, lambda: not isinstance(app.screen, SettingsScreen))
        assert "system prompt" in app.sub_title and "no system prompt" not in app.sub_title
        await send(pilot, "Who are you?")
        await finished(pilot)
        (call,) = read_log(log, "generate")
        assert call["messages"][0] == {"role": "system", "content": "You are a pirate. Always say arr."}
        # The GGUF's own template put it first, in place of the template's default system prompt.
        assert call["prompt_text"].startswith("<|im_start|>system\nYou are a pirate. Always say arr.<|im_end|>")
        assert SMOL_DEFAULT_SYSTEM not in call["prompt_text"]
        assert call["prompt_text"].endswith("<|im_start|>user\nWho are you?<|im_end|>\n<|im_start|>assistant\n")
        assert call["max_tokens"] == 12
        (conv,) = chats.list_conversations()
        row = chats.get_conversation(conv["id"])
        assert row["system"] == "You are a pirate. Always say arr." and row["settings"]["max_tokens"] == 12
        assert 0 < chats.get_messages(conv["id"])[1]["meta"]["n_tokens"] <= 12


async def test_real_regenerate_draws_a_new_seed_and_keeps_the_history(learned, chats, tmp_path):
    log = tmp_path / "calls.jsonl"
    app = make_app(recording(EngineConfig(store_path=learned), log), chats, tmp_path,
                   sampling=SamplingSettings(temperature=0.8, seed=11))
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, "Name a colour.")
        chat = await finished(pilot)
        await send(pilot, "Write a short poem about it.")
        await finished(pilot)
        before = [m.text for m in chat.chat_view.messages()]
        cid = chat.conversation.id
        first = chats.get_messages(cid)[-1]
        await pilot.press("f5")
        await finished(pilot)
        after = [m.text for m in chat.chat_view.messages()]
        assert after[:3] == before[:3] and len(after) == 4 and after[3].strip()
        assert after[3] != before[3]  # seed 12 instead of 11: another draw
        stored = chats.get_messages(cid)
        assert [m["content"] for m in stored] == after
        assert first["meta"]["seed"] == 11 and stored[-1]["meta"]["seed"] == 12
        calls = read_log(log, "generate")
        assert calls[-1]["messages"] == calls[-2]["messages"] and calls[-1]["sampling"]["seed"] == 12
        # The prompt was in the KV cache already: only its last token was decoded again.
        assert stored[-1]["meta"]["prompt_tokens"] == 1


async def test_real_edit_and_resend_rebuilds_from_the_edited_turn_reusing_the_cache(learned, chats, tmp_path):
    log = tmp_path / "calls.jsonl"
    app = make_app(recording(EngineConfig(store_path=learned), log), chats, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, "What is the capital of France?")
        chat = await finished(pilot)
        await send(pilot, "And of Spain?")
        await finished(pilot)
        a1 = chat.conversation.history[1]["content"]
        await pilot.press("ctrl+up")
        assert chat.prompt.text == "And of Spain?"
        chat.prompt.text = "Tell me about Italy."
        await pilot.press("enter")
        await finished(pilot)
        texts = [m.text for m in chat.chat_view.messages()]
        assert texts[:3] == ["What is the capital of France?", a1, "Tell me about Italy."] and len(texts) == 4
        stored = chats.get_messages(chat.conversation.id)
        assert [m["content"] for m in stored] == texts
        call = read_log(log, "generate")[-1]
        assert call["messages"] == [{"role": "user", "content": "What is the capital of France?"},
                                    {"role": "assistant", "content": a1},
                                    {"role": "user", "content": "Tell me about Italy."}]
        # The KV cache is reused up to the edited turn: only the edited message (and the
        # generation prompt) is prefilled, not the first turn again.
        prefilled = stored[-1]["meta"]["prompt_tokens"]
        assert 0 < prefilled <= call["n_prompt"] - call["n_before_last"]
        assert prefilled < call["n_prompt"] // 2


async def test_real_continue_resumes_with_the_stored_settings(learned, chats, tmp_path):
    from adaspark_app.ui.chat_settings import ChatSettings, resume_last

    cid = chats.create_conversation("Colours", "SmolLM2", system="Answer in one word.",
                                    settings=ChatSettings(max_tokens=8).to_json())
    chats.add_message(cid, "user", "Name a colour.")
    chats.add_message(cid, "assistant", "Blue.")
    resumed, settings, problems = resume_last(chats)  # what `adaspark chat --continue` does first
    assert resumed == cid and problems == [] and settings.max_tokens == 8
    log = tmp_path / "calls.jsonl"
    app = make_app(recording(EngineConfig(store_path=learned), log), chats, tmp_path, max_tokens=64,
                   resume_id=resumed)
    async with app.run_test(size=SIZE) as pilot:
        chat = app.chat_screen
        await wait_until(pilot, lambda: chat.conversation.id == cid)
        assert "max 8 tok" in app.sub_title
        await send(pilot, "Name another one.")
        await finished(pilot)
        (call,) = read_log(log, "generate")
        assert call["prompt_text"].startswith("<|im_start|>system\nAnswer in one word.<|im_end|>")
        assert call["max_tokens"] == 8
        assert [m["role"] for m in call["messages"]] == ["system", "user", "assistant", "user"]
        assert 0 < chats.get_messages(cid)[-1]["meta"]["n_tokens"] <= 8


async def test_real_reopened_conversation_reads_its_history_from_disk(chats, tmp_path):
    """The chat's engine keeps the conversation's KV cache beside the store when the chat ends (as
    `adaspark chat`, engine and chats in one file); reopened, the reply says it read the history
    from disk, and it is the reply a prefill of the whole history gives."""
    from adaspark_app.engine.chat_engine import ChatEngine
    from adaspark_app.store.saved_context import MIN_TOKENS, SUFFIX, folder_for

    paste = "\n".join(f"Line {i}: the {['red', 'green', 'blue'][i % 3]} box holds {i * 7 % 23} marbles."
                       for i in range(60))
    cid = chats.create_conversation("Inventory", "SmolLM2")
    chats.add_message(cid, "user", "Here is my inventory:\n" + paste)
    chats.add_message(cid, "assistant", "Noted.")
    config = EngineConfig(store_path=str(chats.path), saved_context_mb=256)
    for question in ("Which box holds the most?", "List the green boxes."):
        app = make_app(config, chats, tmp_path, resume_id=cid)
        async with app.run_test(size=SIZE) as pilot:
            chat = app.chat_screen
            await wait_until(pilot, lambda: chat.conversation.id == cid)
            await send(pilot, question)
            await finished(pilot)
            note = chat.chat_view.messages()[-1].query_one(".note").render()
        assert len(list(folder_for(chats.path).glob("*" + SUFFIX))) == 1  # written as the chat ended
    meta = chats.get_messages(cid)[-1]["meta"]
    assert meta["restored_tokens"] >= MIN_TOKENS and meta["prompt_tokens"] < meta["prompt_length"] - MIN_TOKENS
    assert f"{meta['restored_tokens']:,} history tokens from disk" in str(note)
    history = [{"role": m["role"], "content": m["content"]} for m in chats.get_messages(cid)[:-1]]
    with ChatEngine(arm="ar", n_ctx=4096) as eng:
        fresh = eng.generate("fresh", history, max_tokens=MAX_TOKENS)
    assert chats.get_messages(cid)[-1]["content"] == fresh.text


async def test_real_history_is_read_while_the_message_is_typed(learned, chats, tmp_path):
    """A long conversation reopened with no saved context: the engine reads its history as soon as
    it has loaded, the status line counting it; the reply then reads only the new message, says so,
    and is the reply a prefill of the whole history gives."""
    from adaspark_app.engine.chat_engine import ChatEngine

    paste = "\n".join(f"Item {i}: the {['red', 'green', 'blue'][i % 3]} crate holds {i * 5 % 17} apples."
                       for i in range(90))
    cid = chats.create_conversation("Crates", "SmolLM2")
    chats.add_message(cid, "user", "My crates:\n" + paste)
    chats.add_message(cid, "assistant", "Noted.")
    log = tmp_path / "calls.jsonl"
    shown: list[str] = []
    app = make_app(recording(EngineConfig(store_path=learned), log), chats, tmp_path, resume_id=cid)
    async with app.run_test(size=SIZE) as pilot:
        chat = app.chat_screen
        status = chat.query_one("#status")
        await wait_until(pilot, lambda: shown.append(str(status.render())) or (
            chat.history_read is not None and chat.history_read.result is not None
            and chat.history_read.result.held == chat.history_read.result.total),
            timeout=REPLY_TIMEOUT, what="the history read ahead")
        read = chat.history_read.result
        assert read.conversation == cid and read.read == read.total > 512 and read.restored == 0
        assert any(text.startswith("Reading history ahead: ") for text in shown)
        assert str(status.render()) == "Ready."
        await send(pilot, "Which crate holds the most apples?")
        await finished(pilot)
        note = str(chat.chat_view.messages()[-1].query_one(".note").render())
    meta = chats.get_messages(cid)[-1]["meta"]
    assert meta["read_ahead_tokens"] == read.read and meta["prompt_tokens"] == meta["prompt_length"] - read.read
    assert f"{read.read:,} tokens read ahead" in note
    asked = read_log(log, "read_ahead")[0]  # (another follows the reply)
    (call,) = read_log(log, "generate")
    assert asked["messages"] == call["messages"][:-1]
    with ChatEngine(arm="ar", n_ctx=4096) as eng:
        fresh = eng.generate("fresh", call["messages"], max_tokens=MAX_TOKENS)
    assert chats.get_messages(cid)[-1]["content"] == fresh.text


async def test_real_pasted_text_is_read_while_the_question_is_typed(learned, chats, tmp_path):
    """A new chat: a long text pasted into the message box is read by the engine once typing
    pauses, the status line counting it; the question typed after it is then all the reply
    reads, and the reply is the one a plain prefill gives."""
    from adaspark_app.engine.chat_engine import ChatEngine

    paste = "\n".join(f"Item {i}: the {['red', 'green', 'blue'][i % 3]} crate holds {i * 5 % 17} apples."
                      for i in range(80))
    log = tmp_path / "calls.jsonl"
    shown: list[str] = []
    app = make_app(recording(EngineConfig(store_path=learned), log), chats, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        chat = app.chat_screen
        status = chat.query_one("#status")
        await wait_until(pilot, lambda: app.engine.ready, timeout=REPLY_TIMEOUT)
        chat.prompt.text = paste
        await wait_until(pilot, lambda: shown.append(str(status.render())) or (
            chat.history_read is not None and chat.history_read.result is not None
            and chat.history_read.result.held == chat.history_read.result.total),
            timeout=REPLY_TIMEOUT, what="the pasted text read ahead")
        read = chat.history_read.result
        assert read.conversation is None and read.read == read.total > 512
        assert any(text.startswith("Reading your message ahead: ") for text in shown)
        await send(pilot, paste + "\nWhich crate holds the most apples?")
        await finished(pilot)
        note = str(chat.chat_view.messages()[-1].query_one(".note").render())
        cid = chat.conversation.id
    meta = chats.get_messages(cid)[-1]["meta"]
    assert meta["read_ahead_tokens"] == read.read and meta["prompt_tokens"] < 24
    assert f"{read.read:,} tokens read ahead" in note
    (asked,) = [c for c in read_log(log, "read_ahead") if c["draft"]][:1]
    assert asked["draft"] == paste and asked["conversation"] is None
    (call,) = read_log(log, "generate")
    with ChatEngine(arm="ar", n_ctx=4096) as eng:
        fresh = eng.generate("fresh", call["messages"], max_tokens=MAX_TOKENS)
    assert chats.get_messages(cid)[-1]["content"] == fresh.text


async def test_real_switching_conversations_keeps_each_ones_context_on_disk(chats, tmp_path):
    """In one chat: a reply in A, then in B (A's context is saved on leaving it), then in A again:
    A's history comes from disk, and B's too when the chat goes back to it."""
    from adaspark_app.store.saved_context import MIN_TOKENS

    def stored(title: str) -> str:
        cid = chats.create_conversation(title, "SmolLM2")
        chats.add_message(cid, "user", f"{title}: " + " ".join(f"line {i} of {title}." for i in range(120)))
        chats.add_message(cid, "assistant", "Noted.")
        return cid

    a, b = stored("alpha"), stored("beta")
    app = make_app(EngineConfig(store_path=str(chats.path), saved_context_mb=256), chats, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        chat = app.chat_screen
        for cid in (a, b, a, b):
            await chat.open_conversation(cid)
            await send(pilot, "Say one word.")
            await finished(pilot)
    restored = {cid: [(m["meta"] or {}).get("restored_tokens", 0) for m in chats.get_messages(cid) if m["role"] == "assistant"]
                for cid in (a, b)}
    assert restored[a][1] == 0 and restored[b][1] == 0  # the first reply of each read its history
    assert restored[a][2] >= MIN_TOKENS and restored[b][2] >= MIN_TOKENS, restored  # the second, from disk


UI_PROCESS_SCRIPT = textwrap.dedent("""
    import asyncio, json, os, sys
    from adaspark_app.engine.worker import EngineConfig
    from adaspark_app.store import Store
    from adaspark_app.ui.app import AdaSparkApp
    from ui_fakes import wait_until

    async def main():
        store = Store.open(sys.argv[1])
        app = AdaSparkApp(EngineConfig(store_path=sys.argv[1]), store, max_tokens=16, exit_on_load_error=False)
        async with app.run_test(size=(100, 30)) as pilot:
            chat = app.chat_screen
            chat.prompt.text = "What is the capital of France?"
            await pilot.press("enter")
            await wait_until(pilot, lambda: chat.conversation.history, timeout=120)
            out = {"llama_cpp_imported": "llama_cpp" in sys.modules, "reply": chat.conversation.history[-1]["content"],
                   "engine_pid": app.engine.pid, "ui_pid": os.getpid(),
                   "engine_modules": [m for m in sys.modules if m.startswith("adaspark_app.engine.")]}
        store.close()
        print("RESULT " + json.dumps(out))

    if __name__ == "__main__":  # the engine process is spawned: it re-imports this file
        asyncio.run(main())
""")


def test_the_ui_process_never_loads_llama_cpp(tmp_path):
    """A real reply through the app, in a fresh interpreter: llama_cpp must never be imported on
    the UI side (this test's own process may have imported it for other tests)."""
    script = tmp_path / "ui_process.py"
    script.write_text(UI_PROCESS_SCRIPT)
    # ui_fakes (and what the engine process unpickles from it) imports from the tests folder
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(Path(__file__).parent), os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "s.db")],
                          capture_output=True, text=True, timeout=300, env=env)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    out = json.loads(lines[-1][len("RESULT "):])
    assert out["reply"].strip()
    assert out["engine_pid"] != out["ui_pid"]
    assert out["llama_cpp_imported"] is False
    assert "adaspark_app.engine.chat_engine" not in out["engine_modules"]


def _proc_stat(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def _children(pid: int) -> list[int]:
    out = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                if int(_proc_stat(int(p))[1]) == pid:
                    out.append(int(p))
            except (OSError, IndexError, ValueError):
                pass
    return out


@pytest.mark.skipif(not sys.platform.startswith("linux") or not shutil.which("tmux"), reason="needs Linux and tmux")
def test_adaspark_chat_in_a_terminal_runs_llama_cpp_only_in_the_engine_process(tmp_path):
    """The real command in a real terminal (tmux, 160x48): after a reply, the UI process has not
    mapped llama.cpp's library while the engine process has, and with ADASPARK_UI_PRIORITY=low the
    UI runs at lowered priority while the engine keeps the priority the user started it with (the
    default, normal, leaves both alone: test_the_ui_keeps_normal_priority_by_default...)."""
    import sqlite3

    db = tmp_path / "chat.db"
    sock = str(tmp_path / "tmux.sock")  # a private tmux server, started with this test's environment
    env_cmd = ["env", "-u", "ADASPARK_FORBID_MODEL", "-u", "COLUMNS", "-u", "LINES", "ADASPARK_UI_PRIORITY=low", sys.executable, "-m", "adaspark_app.cli", "chat",
               "--temperature", "0", "--store", str(db), "--max-tokens", "16"]

    def tmux(*args: str) -> str:
        return subprocess.run(["tmux", "-S", sock, *args], capture_output=True, text=True).stdout

    tmux("new-session", "-d", "-s", "t", "-x", "160", "-y", "48", " ".join(env_cmd))
    try:
        deadline = time.monotonic() + REPLY_TIMEOUT
        while "Ready." not in tmux("capture-pane", "-p", "-t", "t"):
            assert time.monotonic() < deadline, tmux("capture-pane", "-p", "-t", "t")
            time.sleep(0.2)
        tmux("send-keys", "-t", "t", "-l", "What is the capital of France?")
        time.sleep(0.3)
        tmux("send-keys", "-t", "t", "Enter")
        rows: list = []
        while not rows:
            assert time.monotonic() < deadline, "no reply was stored"
            time.sleep(0.2)
            with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as conn:
                rows = conn.execute("select content, meta from messages where role = 'assistant'").fetchall()
        assert rows[0][0].strip() and json.loads(rows[0][1])["tokens_per_s"] > 0
        ui = int(tmux("display", "-p", "-t", "t", "#{pane_pid}").strip())
        if "adaspark_app.cli" not in Path(f"/proc/{ui}/cmdline").read_text():  # a shell ran it
            (ui,) = [p for p in _children(ui) if "adaspark_app.cli" in Path(f"/proc/{p}/cmdline").read_text()]
        engines = [p for p in _children(ui) if "spawn_main" in Path(f"/proc/{p}/cmdline").read_text()
                   and "resource_tracker" not in Path(f"/proc/{p}/cmdline").read_text()]
        assert len(engines) == 1, engines
        (engine,) = engines
        assert "libllama" not in Path(f"/proc/{ui}/maps").read_text()
        assert "libllama" in Path(f"/proc/{engine}/maps").read_text()
        assert int(_proc_stat(ui)[16]) == 19  # the UI's main thread (nice is per thread on Linux)
        assert int(_proc_stat(engine)[16]) == int(_proc_stat(os.getpid())[16])
        tmux("send-keys", "-t", "t", "C-q")
        while "t" in tmux("ls").split(":")[0:1]:
            assert time.monotonic() < deadline, "adaspark chat did not quit"
            time.sleep(0.2)
    finally:
        tmux("kill-server")


@pytest.mark.parametrize("case", ["assertion", "cxx-exception", "crash"])
async def test_a_llama_cpp_failure_in_the_engine_is_named_in_the_chat(chats, tmp_path, case):
    """assertion: the bundled model with layer 5's key-value head count changed, the header rule
    that refuses it off in the engine process: llama.cpp's assertion at the first forward ends the
    engine process. cxx-exception: its vocabulary relabeled SentencePiece, llama_tokenize throws a
    C++ exception llama.cpp does not catch (cxx_terminate.py). crash: llama.cpp reads address 8 at
    the first reply (native/fatal_signal.py; the engine's log keeps faulthandler's Python stack
    after the line, so the process still ends by the signal). Each way the chat names what failed
    and the file (not only "exit code 2" or "signal 11"), keeps the user's message, and restarts
    the engine."""
    from adaspark_app.engine.backend import default_model_path
    from test_cli_errors import _with_key

    if case == "assertion":
        model = _with_key(default_model_path(), tmp_path / "m.gguf", "llama", "llama.attention.head_count_kv", "arr",
                          [3] * 5 + [2] + [3] * 24)
        said, in_log = "exit code 2: llama.cpp failed one of its own checks (ggml.c:", "GGML_ASSERT"
    elif case == "cxx-exception":
        model = _with_key(default_model_path(), tmp_path / "m.gguf", "llama", "tokenizer.ggml.model", "str", "llama")
        said = "exit code 2: llama.cpp stopped on an error it does not handle (std::out_of_range)"
        in_log = "std::out_of_range"
    else:
        model = tmp_path / "m.gguf"
        shutil.copyfile(default_model_path(), model)
        said = "signal 11: llama.cpp crashed (a segmentation fault, SIGSEGV) with"
        in_log = "Fatal Python error: Segmentation fault"
    config = EngineConfig(model_path=str(model), store_path=str(tmp_path / "learned.db"))
    wrap = {"assertion": without_header_rules, "crash": crashing_at_generate}.get(case, lambda factory: factory)
    app = make_app(wrap(config), chats, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, "Hi")
        note = await notified(pilot, "engine process stopped", timeout=REPLY_TIMEOUT)
        assert said in note and "m.gguf" in note
        await wait_until(pilot, lambda: app.chat_screen.prompt.text == "Hi", what="the message given back")
    log = (tmp_path / "engine.log").read_text()
    assert in_log in log and "gdb" not in log  # one line in the engine's log, no backtrace
