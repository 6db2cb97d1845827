"""Reading a long prompt (the prefill): progress reported by chunk, and a stop between chunks that
keeps what was read. Real bundled model."""

from __future__ import annotations

import threading

import pytest

from adaspark_app.engine.backend import PREFILL_CHUNK_CPU

pytestmark = pytest.mark.model

PASTE = " ".join(f"Item {i}: the box holds {i * 7 % 23} marbles and a note about the weather." for i in range(60))
MESSAGES = [{"role": "user", "content": PASTE + "\nWhich item holds the most?"}]


@pytest.fixture(scope="module")
def engine():
    from adaspark_app.engine.chat_engine import ChatEngine

    with ChatEngine(n_ctx=2048) as eng:
        yield eng


def test_a_long_prompt_reports_its_reading_chunk_by_chunk(engine):
    engine.reset_conversation()
    seen: list[tuple[int, int]] = []
    r = engine.generate("c", MESSAGES, max_tokens=4, on_prefill=lambda done, total: seen.append((done, total)))
    total = r.prompt_length
    assert r.prompt_tokens == total > 3 * PREFILL_CHUNK_CPU
    assert seen[0] == (0, total)
    assert [d for d, _ in seen] == list(range(0, total, PREFILL_CHUNK_CPU))  # every chunk but the last
    assert {t for _, t in seen} == {total}
    # the next turn reads only its new tokens, and says so
    seen.clear()
    follow = MESSAGES + [{"role": "assistant", "content": r.text}, {"role": "user", "content": "Why?"}]
    r2 = engine.generate("c", follow, max_tokens=4, on_prefill=lambda done, total: seen.append((done, total)))
    assert seen == [(0, r2.prompt_tokens)] and r2.prompt_tokens < 40


def test_a_stop_while_the_prompt_is_read_keeps_what_was_read_and_the_reply_is_unchanged(engine):
    from adaspark_app.engine.chat_engine import ChatEngine

    engine.reset_conversation()
    cancel = threading.Event()

    def stop_after_two_chunks(done: int, total: int) -> None:
        if done >= 2 * PREFILL_CHUNK_CPU:
            cancel.set()

    stopped = engine.generate("c", MESSAGES, max_tokens=24, cancel=cancel, on_prefill=stop_after_two_chunks)
    assert stopped.stopped and stopped.n_tokens == 0 and stopped.text == ""
    assert stopped.prompt_tokens == 2 * PREFILL_CHUNK_CPU < stopped.prompt_length
    assert engine.context == 2 * PREFILL_CHUNK_CPU  # the cache holds what was read
    cancel.clear()
    again = engine.generate("c", MESSAGES, max_tokens=24, cancel=cancel)
    assert again.prompt_tokens == again.prompt_length - 2 * PREFILL_CHUNK_CPU  # goes on from there
    with ChatEngine(n_ctx=2048, arm="ar") as fresh:
        assert again.text == fresh.generate("c", MESSAGES, max_tokens=24).text
