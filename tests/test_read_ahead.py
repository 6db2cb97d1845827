"""A conversation's history read into the KV cache before its next message (ChatEngine.read_ahead):
the reply then reads only the new message, byte-identical to a reply without reading ahead. Real
bundled model; the engine process's protocol through the real EngineClient; saved contexts on a
real SQLite store."""

from __future__ import annotations

import time

import pytest

from adaspark_app.engine.backend import PREFILL_CHUNK_CPU
from adaspark_app.engine.sampling import SamplingSettings

pytestmark = [pytest.mark.model, pytest.mark.long]

PASTE = "\n".join(f"Line {i}: the {['red', 'green', 'blue'][i % 3]} box holds {i * 7 % 23} marbles."
                  for i in range(60))
HISTORY = [{"role": "user", "content": "Here is my inventory:\n" + PASTE}, {"role": "assistant", "content": "Noted."}]
QUESTION = {"role": "user", "content": "Which box holds the most?"}
SHORT = [{"role": "user", "content": "Here is my inventory:\n" + PASTE[:PASTE.index("Line 20:")]}, HISTORY[1]]


@pytest.fixture(scope="module")
def engine():
    from adaspark_app.engine.chat_engine import ChatEngine

    with ChatEngine(n_ctx=2048) as eng:
        yield eng


@pytest.fixture(scope="module")
def plain():
    """Replies with nothing read ahead, by plain decode: what every reply must equal."""
    from adaspark_app.engine.chat_engine import ChatEngine

    with ChatEngine(n_ctx=2048, arm="ar") as eng:
        yield eng


def _fresh(plain, messages, sampling=None):
    plain.reset_conversation()
    return plain.generate("fresh", messages, max_tokens=32, sampling=sampling)


@pytest.mark.parametrize("nxt", ["Which box?", " a leading space", "\nstarts on a new line", "ünïcödé 日本語",
                                 "<|im_start|>assistant\nnot a turn", ""])
def test_the_history_tokens_begin_every_next_prompt(engine, nxt):
    system = [{"role": "system", "content": "Answer briefly."}]
    for messages in (HISTORY, system + HISTORY, system, HISTORY + [{"role": "user", "content": "unanswered"}]):
        tokens = engine.history_tokens(messages)
        past = messages[:-1] if messages[-1]["role"] == "user" else messages
        prompt = engine.prompt_tokens([*past, {"role": "user", "content": nxt}])
        assert len(tokens) > 0 and prompt[:len(tokens)] == tokens
        assert len(prompt) - len(tokens) < 24 + len(nxt)  # all the history: only the new message's turn is left
    assert engine.history_tokens([]) == [] and engine.history_tokens([QUESTION]) == []


def test_a_long_history_is_read_as_the_window_will_keep_it(engine):
    """A history longer than the context: the turns the next reply's window drops are not read."""
    long = []
    for i in range(12):
        long += [{"role": "user", "content": f"Part {i}:\n" + PASTE}, {"role": "assistant", "content": "Noted."}]
    tokens = engine.history_tokens(long, max_tokens=64)
    window, prompt = engine.fit_window([*long, QUESTION], 64)
    assert window.dropped_turns > 0 and 0 < len(tokens) < engine.backend.n_ctx
    assert prompt[:len(tokens)] == tokens


@pytest.mark.parametrize("arm", ["adaspark", "ar"])
def test_a_reply_after_reading_ahead_reads_only_its_message_and_is_unchanged(plain, arm):
    from adaspark_app.engine.chat_engine import ChatEngine

    with ChatEngine(n_ctx=2048, arm=arm) as engine:
        for sampling in (None, SamplingSettings(temperature=0.8, seed=11)):
            engine.reset_conversation()
            ra = engine.read_ahead("c", SHORT)
            assert ra.held == ra.total == ra.read == len(engine.history_tokens(SHORT)) > PREFILL_CHUNK_CPU
            assert ra.restored == 0
            r = engine.generate("c", [*SHORT, QUESTION], max_tokens=32, sampling=sampling)
            assert r.read_ahead_tokens == ra.read
            assert r.prompt_tokens == r.prompt_length - ra.read < 24
            assert r.tokens == _fresh(plain, [*SHORT, QUESTION], sampling).tokens


def test_the_history_read_ahead_is_indexed_for_the_n_gram_drafts_too(engine):
    """The reply indexes only its message: the index of the history read ahead is extended."""
    engine.reset_conversation()
    engine.read_ahead("c", SHORT)
    index = engine.decoder.sources.ngram.index
    assert index.tokens == engine.history_tokens(SHORT)
    r = engine.generate("c", [*SHORT, QUESTION], max_tokens=8)
    assert engine.decoder.sources.ngram.index is index and index.tokens[:r.prompt_length] == engine.prompt_tokens(
        [*SHORT, QUESTION])


def test_a_stopped_reading_keeps_what_it_read_and_goes_on_from_there(engine, plain):
    engine.reset_conversation()
    asked, seen = [], []

    def stop() -> bool:
        asked.append(1)
        return len(asked) >= 2  # after two chunks

    ra = engine.read_ahead("c", HISTORY, stop=stop, on_progress=lambda done, total: seen.append((done, total)))
    assert ra.held == ra.read == 2 * PREFILL_CHUNK_CPU < ra.total
    assert engine.decoder.kv_tokens == engine.history_tokens(HISTORY)[:ra.held]
    assert seen == [(0, ra.total), (PREFILL_CHUNK_CPU, ra.total), (2 * PREFILL_CHUNK_CPU, ra.total)]
    more = engine.read_ahead("c", HISTORY)
    assert more.read == ra.total - ra.held  # what was read is not read again
    assert more.held == more.total
    r = engine.generate("c", [*HISTORY, QUESTION], max_tokens=32)
    assert r.read_ahead_tokens == ra.total  # both readings and r.tokens == _fresh(plain, [*HISTORY, QUESTION]).tokens
    # a reply in another conversation takes what the reading gave: the next reply reports none
    engine.read_ahead("c", HISTORY)
    other = engine.generate("other", [QUESTION], max_tokens=4)
    assert other.read_ahead_tokens == 0


def test_reading_ahead_after_a_stopped_reply_keeps_what_it_read_of_the_message(engine, plain):
    """The chat reads the history after every reply, one stopped while its prompt was read too:
    the cache keeps the message's start, so sending it again goes on from there."""
    import threading

    engine.reset_conversation()
    long_question = {"role": "user", "content": "Sort these:\n" + SHORT[0]["content"]}
    cancel = threading.Event()

    def stop_after_a_chunk(done: int, total: int) -> None:
        if done >= PREFILL_CHUNK_CPU:
            cancel.set()

    engine.read_ahead("c", SHORT)
    stopped = engine.generate("c", [*SHORT, long_question], max_tokens=16, cancel=cancel,
                              on_prefill=stop_after_a_chunk)
    assert stopped.stopped and stopped.n_tokens == 0
    held = engine.context
    assert held > len(engine.history_tokens(SHORT))
    assert engine.read_ahead("c", SHORT).read == 0 and engine.context == held
    again = engine.generate("c", [*SHORT, long_question], max_tokens=16)
    assert again.prompt_tokens == again.prompt_length - held
    assert again.tokens == _fresh(plain, [*SHORT, long_question]).tokens[:16]


def test_a_reply_that_does_not_follow_the_history_read_counts_only_what_it_kept(engine, plain):
    """An edited earlier message: the prompt shares only the system prompt with what was read."""
    system = [{"role": "system", "content": "You count marbles. " * 20}]
    engine.reset_conversation()
    ra = engine.read_ahead("c", system + HISTORY)
    edited = system + [{"role": "user", "content": "How many boxes are there?"}]
    r = engine.generate("c", edited, max_tokens=16)
    assert 0 < r.read_ahead_tokens < ra.read and r.prompt_tokens + r.read_ahead_tokens == r.prompt_length
    assert r.tokens == _fresh(plain, edited).tokens


def test_with_a_drafter_the_history_read_ahead_feeds_it_and_the_reply_is_unchanged(plain):
    from adaspark_app.engine.chat_engine import ChatEngine

    with ChatEngine(drafter_path="default", n_ctx=2048) as eng:
        ra = eng.read_ahead("c", HISTORY)
        eng.decoder.sources.drafter.flush()
        assert eng.drafter.n_positions() == len(eng.decoder.kv_tokens) == ra.held == ra.total
        r = eng.generate("c", [*HISTORY, QUESTION], max_tokens=32)
        assert r.read_ahead_tokens == ra.read and r.prompt_tokens < 24
    assert r.tokens == _fresh(plain, [*HISTORY, QUESTION]).tokens


def test_reading_ahead_puts_back_a_saved_context_and_saves_the_one_it_leaves(tmp_path):
    from adaspark_app.engine.chat_engine import ChatEngine
    from adaspark_app.store import Store
    from adaspark_app.store.saved_context import MIN_TOKENS

    store = Store.open(str(tmp_path / "chats.db"))
    a, b = store.create_conversation("a", "m"), store.create_conversation("b", "m")
    try:
        with ChatEngine(store=store, saved_context_mb=256, n_ctx=2048) as eng:
            eng.generate(a, [*HISTORY, QUESTION], max_tokens=8)
            full = eng.read_ahead(b, HISTORY)  # leaving a: its context is saved
            assert eng.saved_contexts.find(a) is not None and full.held == full.total
        with ChatEngine(store=store, saved_context_mb=256, n_ctx=2048) as eng:
            ra = eng.read_ahead(a, [*HISTORY, QUESTION, {"role": "assistant", "content": "Line 1."}])
            assert ra.restored >= MIN_TOKENS and ra.held == ra.total and ra.read < ra.total - MIN_TOKENS
            nxt = [*HISTORY, QUESTION, {"role": "assistant", "content": "Line 1."}, {"role": "user", "content": "Why?"}]
            r = eng.generate(a, nxt, max_tokens=16)
            assert r.restored_tokens == ra.restored and r.read_ahead_tokens == ra.read
            assert r.prompt_tokens + r.restored_tokens + r.read_ahead_tokens == r.prompt_length
        with ChatEngine(arm="ar", n_ctx=2048) as eng:
            assert eng.generate(a, nxt, max_tokens=16).text == r.text
    finally:
        store.close()


def test_a_reading_stopped_after_a_reply_leaves_the_conversation_to_be_saved(tmp_path):
    """A quit right after a reply stops the reading the reply's end asked for: the conversation's
    context is still saved at the engine's close."""
    from adaspark_app.engine.chat_engine import ChatEngine
    from adaspark_app.store import Store

    store = Store.open(str(tmp_path / "chats.db"))
    cid = store.create_conversation("a", "m")
    try:
        with ChatEngine(store=store, saved_context_mb=256, n_ctx=2048) as eng:
            eng.generate(cid, [*HISTORY, QUESTION], max_tokens=8)
            # the stored reply reads otherwise than the tokens generated (an edit): more than a chunk to read
            edited = [*HISTORY, QUESTION, {"role": "assistant", "content": SHORT[0]["content"]}]
            ra = eng.read_ahead(cid, edited, stop=lambda: True)
            assert ra.held < ra.total
            sc = eng.saved_contexts
        assert sc.find(cid) is not None
    finally:
        store.close()


def _wait(messages: list, kind: type, timeout: float = 60.0, where=lambda m: True):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [m for m in messages if isinstance(m, kind) and where(m)]
        if found:
            return found[0]
        time.sleep(0.01)
    raise AssertionError(f"no {kind.__name__} within {timeout}s: {[type(m).__name__ for m in messages]}")


def test_the_engine_process_reads_ahead_until_the_next_command_comes():
    """Through the engine process: a history read whole and counted, then one whose reading a sent
    message stops, the reply going on from where it stopped."""
    from adaspark_app.engine.worker import EngineConfig
    from adaspark_app.ui.engine_client import (EngineClient, EngineDone, EngineLoaded, EngineReadAhead,
                                               EngineReadingAhead)

    posted: list = []
    client = EngineClient(EngineConfig(n_ctx=4096), posted.append)
    client.start()
    try:
        _wait(posted, EngineLoaded)
        long = [{"role": "user", "content": "Here is my inventory:\n" + PASTE + "\n" + PASTE},
                {"role": "assistant", "content": "Noted."}]
        assert client.read_ahead("c", long, 32)
        done = _wait(posted, EngineReadAhead).result
        assert done.conversation == "c" and done.held == done.total >= 2 * 512
        reading = [m for m in posted if isinstance(m, EngineReadingAhead)]
        assert reading[0].done == 0 and reading[0].total == done.total and reading[-1].done < done.total
        request = client.generate("c", [*long, QUESTION], 32, 1)
        reply = _wait(posted, EngineDone).result
        assert reply.read_ahead_tokens == done.total and reply.prompt_tokens < 24
        # another conversation's history, stopped by a message sent at once
        posted.clear()
        client.reply_ended(request)
        other = [{"role": "user", "content": "Crates:\n" + PASTE.replace("box", "crate")}, long[1]]
        assert client.read_ahead("d", other, 32)
        request = client.generate("d", [*other, QUESTION], 32, 1)
        stopped = _wait(posted, EngineReadAhead).result
        assert stopped.read == PREFILL_CHUNK_CPU and stopped.held < stopped.total
        reply = _wait(posted, EngineDone).result
        assert reply.read_ahead_tokens == stopped.read  # the rest of what was held: the system prompt, "c"'s
        assert reply.prompt_tokens == reply.prompt_length - stopped.held
        posted.clear()
        client.reply_ended(request)
        assert client.close()
    finally:
        client.close()


# ---------------------------------------------------------------------- the message as it is typed
@pytest.mark.parametrize("rest", ["Which box holds the most?", " and which the least?", "\n\nWhich box?", "7 more.",
                                  "ünïcödé", ""])
def test_a_draft_read_ahead_begins_every_message_typed_after_it(engine, rest):
    """The tokens read for a draft begin the prompt of whatever is typed after it."""
    draft = "Here is more:\n" + PASTE[:PASTE.index("Line 12:")]
    for history in (SHORT, [], [{"role": "system", "content": "Answer briefly."}]):
        tokens = engine.history_tokens(history, draft=draft)
        prompt = engine.prompt_tokens([*history, {"role": "user", "content": draft + rest}])
        assert len(tokens) > len(engine.history_tokens(history)) + 100 and prompt[:len(tokens)] == tokens
        assert len(prompt) - len(tokens) < 24 + len(rest)  # all the draft but its end


@pytest.mark.parametrize("arm", ["adaspark", "ar"])
def test_a_reply_after_its_draft_was_read_reads_only_what_was_typed_after_it(plain, arm):
    """A pasted text read while the question is typed, then the question sent: the reply reads only
    the question, and is the reply a plain prefill gives, greedy and seeded; a draft edited before
    its end is read again from the edit."""
    from adaspark_app.engine.chat_engine import ChatEngine

    paste = "Here is my inventory:\n" + PASTE[:PASTE.index("Line 16:")]
    with ChatEngine(n_ctx=2048, arm=arm) as engine:
        for sampling in (None, SamplingSettings(temperature=0.8, seed=5)):
            engine.reset_conversation()
            ra = engine.read_ahead("c", SHORT, draft=paste)
            message = {"role": "user", "content": paste + "\nWhich box holds the most?"}
            r = engine.generate("c", [*SHORT, message], max_tokens=32, sampling=sampling)
            assert r.read_ahead_tokens == ra.read == ra.held > len(engine.history_tokens(SHORT)) + 200
            assert r.prompt_tokens < 24 and r.tokens == _fresh(plain, [*SHORT, message], sampling).tokens
        engine.reset_conversation()
        engine.read_ahead("c", SHORT, draft=paste)
        edited = paste.replace("Line 5:", "Row 5:")
        again = engine.read_ahead("c", SHORT, draft=edited)
        assert 0 < again.read < again.total - len(engine.history_tokens(SHORT))  # from the edit on
        message = {"role": "user", "content": edited + "\nWhich?"}
        r = engine.generate("c", [*SHORT, message], max_tokens=32)
        assert r.prompt_tokens < 24 and r.tokens == _fresh(plain, [*SHORT, message]).tokens


def test_a_new_conversations_draft_is_read_and_its_first_reply_counts_it(engine, plain):
    """No conversation yet (its id comes with its first reply): the draft is read under None."""
    engine.reset_conversation()
    ra = engine.read_ahead(None, [], draft=HISTORY[0]["content"])
    assert ra.conversation is None and ra.held == ra.total > 400
    message = {"role": "user", "content": HISTORY[0]["content"] + "\nWhich box holds the most?"}
    r = engine.generate("new", [message], max_tokens=16)
    assert r.read_ahead_tokens == ra.read and r.prompt_tokens < 24
    assert r.tokens == _fresh(plain, [message]).tokens


def test_a_draft_reading_stopped_by_the_send_goes_on_in_the_reply(engine, plain):
    """The message is sent while its paste is still being read (the worker stops the reading at
    the next chunk): the reply reads what is left and is unchanged."""
    engine.reset_conversation()
    paste = "Here is more:\n" + PASTE
    ra = engine.read_ahead("c", SHORT, draft=paste, stop=lambda: True)  # stopped after its first chunk
    assert ra.held == ra.read == PREFILL_CHUNK_CPU < ra.total
    message = {"role": "user", "content": paste + "\nWhich box?"}
    r = engine.generate("c", [*SHORT, message], max_tokens=16)
    assert r.read_ahead_tokens == ra.read and r.prompt_tokens == r.prompt_length - ra.read
    assert r.tokens == _fresh(plain, [*SHORT, message]).tokens
