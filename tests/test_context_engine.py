"""Long conversations on the real engine: the oldest turns leave the prompt, every turn answers,
the KV cache is reused where the kept prefix allows, and a message too long for the context is refused."""

from __future__ import annotations

import pytest

from adaspark_app.engine.context_window import MIN_REPLY_TOKENS
from adaspark_app.errors import MessageTooLongError

pytestmark = [pytest.mark.model, pytest.mark.long]

SYSTEM = ("You are a patient tutor. Answer in one or two short sentences, use plain words, and never "
          "repeat the question back to the student before answering it.")
QUESTIONS = [
    "What is the boiling point of water at sea level, and why does it change on a mountain?",
    "Name three planets of the solar system and say which one is the largest of them.",
    "Why do leaves change colour in autumn in many temperate forests around the world?",
    "How does a bicycle stay upright when it is moving forward at a steady speed?",
    "What is the difference between weather and climate, in a sentence a child understands?",
    "Explain what a prime number is and give the first five prime numbers in order.",
    "Why is the sky blue during the day but red and orange at sunset over the sea?",
    "What does a heart do in the human body, and how many chambers does it have?",
    "How do bees make honey from the nectar they collect from flowers in a garden?",
    "What is gravity, and why do objects fall towards the ground when you drop them?",
]

SHORT = ["Describe a colour.", "Describe a fruit.", "Describe a city.", "Describe an animal.",
         "Describe a tree.", "Describe a river.", "Describe a metal.", "Describe a bird."]


@pytest.fixture(scope="module")
def engine():
    from adaspark_app.engine.chat_engine import ChatEngine

    eng = ChatEngine(n_ctx=512)
    yield eng
    eng.close()


def system_prefix(eng) -> int:
    """Tokens of the rendered system prompt alone: the part every kept window starts with."""
    text = eng.template.render([{"role": "system", "content": SYSTEM}], add_generation_prompt=False)
    return len(eng.backend.tokenize(text, add_special=False, parse_special=True))


def test_conversation_past_the_context_answers_every_turn_and_reuses_the_cache(engine):
    eng = engine
    eng.reset_conversation()
    assert eng.backend.n_ctx == 512
    s_len = system_prefix(eng)
    assert s_len > 30
    msgs = [{"role": "system", "content": SYSTEM}]
    results = []
    # short turns (25-31 tokens, as long as the replies) against blocks of 512 // 8 = 64 tokens: once
    # the context fills (turn 15-18, by the replies' lengths on the machine's kernels) the window
    # moves about every other turn and stays still in between; the turns go on until it has moved
    # twice and stood still once after a move
    for turn in range(40):
        if len(results) >= 2 and results[-1].dropped_turns >= 2 and any(
                a.dropped_turns == b.dropped_turns > 0 for a, b in zip(results, results[1:])):
            break
        msgs.append({"role": "user", "content": SHORT[turn % len(SHORT)]})
        r = eng.generate("long", msgs, max_tokens=16, turn=turn)
        assert r.n_tokens > 0 and r.text.strip(), turn
        assert r.prompt_length + 16 <= eng.backend.n_ctx - 1
        assert r.capped_to is None
        # the kept window is what the rule gives for this history, and it is what was prefilled
        window, prompt = eng.fit_window(msgs, 16)
        assert (window.dropped_turns, len(prompt)) == (r.dropped_turns, r.prompt_length)
        results.append(r)
        msgs.append({"role": "assistant", "content": r.text})
    dropped = [r.dropped_turns for r in results]
    assert dropped == sorted(dropped) and dropped[-1] >= 2, dropped
    assert dropped[0] == 0
    for prev, r in zip(results, results[1:]):
        if r.dropped_turns == prev.dropped_turns:
            # the window did not move: only the new turn's tokens are prefilled
            assert r.prompt_tokens < 30, (r.turn, r.prompt_tokens)
            assert r.prompt_length - r.prompt_tokens >= prev.prompt_length
        else:
            # the window moved: the system prompt part stays cached, the rest is prefilled again
            assert r.prompt_tokens <= r.prompt_length - s_len, (r.turn, r.prompt_tokens, r.prompt_length)
            assert r.prompt_tokens > 50
    # blocks of history: at least one drop kept the window still for the next turn
    assert any(a.dropped_turns == b.dropped_turns > 0 for a, b in zip(results, results[1:])), dropped


def test_dropping_turns_keeps_replies_identical_to_ar(model_path):
    """Lossless with a moving window: both arms build the same prompt, so the same replies."""
    from adaspark_app.engine.chat_engine import ChatEngine

    texts = {}
    for arm in ("ar", "adaspark"):
        with ChatEngine(model_path, arm=arm, n_ctx=256) as eng:
            msgs: list[dict[str, str]] = []
            out = []
            for turn, q in enumerate(QUESTIONS[:7]):
                msgs.append({"role": "user", "content": q})
                r = eng.generate("ar-vs", msgs, max_tokens=16, turn=turn)
                out.append((r.text, r.dropped_turns))
                msgs.append({"role": "assistant", "content": r.text})
            texts[arm] = out
    assert texts["ar"] == texts["adaspark"]
    assert texts["ar"][-1][1] > 0  # the window did move


def test_a_message_too_long_is_refused_and_the_engine_goes_on(engine):
    eng = engine
    eng.reset_conversation()
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTIONS[0]}]
    first = eng.generate("refuse", msgs, max_tokens=8)
    msgs.append({"role": "assistant", "content": first.text})
    huge = " ".join(f"word{i}" for i in range(600))
    with pytest.raises(MessageTooLongError) as info:
        eng.generate("refuse", [*msgs, {"role": "user", "content": huge}], max_tokens=8)
    assert info.value.tokens > eng.backend.n_ctx and "the context holds 512" in str(info.value)
    # nothing was sent: the cache still holds the conversation, the next turn prefills only itself
    r = eng.generate("refuse", [*msgs, {"role": "user", "content": QUESTIONS[1]}], max_tokens=8, turn=1)
    assert r.n_tokens > 0 and r.dropped_turns == 0
    assert r.prompt_tokens < 40


def test_a_message_that_leaves_less_than_max_tokens_gets_a_capped_reply(engine):
    eng = engine
    eng.reset_conversation()
    n = len(eng.prompt_tokens([{"role": "user", "content": QUESTIONS[2]}]))
    # a message that leaves 16..200 tokens, and a reply asked for more: capped to the room, no error
    long_text = " ".join(["and so on"] * ((eng.backend.n_ctx - n - MIN_REPLY_TOKENS - 40) // 3))
    msgs = [{"role": "user", "content": QUESTIONS[2] + " " + long_text}]
    n = len(eng.prompt_tokens(msgs))
    room = eng.backend.n_ctx - 1 - n
    assert MIN_REPLY_TOKENS <= room < 200
    r = eng.generate("capped", msgs, max_tokens=400)
    assert r.capped_to == room
    assert 0 < r.n_tokens <= room
    assert r.prompt_length == n and r.context <= eng.backend.n_ctx - 1


def test_a_reply_with_the_drafter_runs_to_the_end_of_the_context(model_path):
    """Replies now run to the context's last cell; the drafter's block must not pass it there
    (its last positions draft from the n-gram index), and the text stays the `ar` text."""
    from adaspark_app.engine.chat_engine import ChatEngine

    text = "Repeat after me: " + " ".join(["one two three"] * 50)
    msgs = [{"role": "user", "content": text}]
    out = {}
    for arm, drafter in (("ar", None), ("adaspark", "default")):
        with ChatEngine(model_path, drafter_path=drafter, arm=arm, n_ctx=256) as eng:
            r = eng.generate("end", msgs, max_tokens=400)
            assert r.capped_to is not None and r.context == eng.backend.n_ctx - 1
            out[arm] = r
    assert out["adaspark"].drafter_rounds > 0
    assert out["adaspark"].text == out["ar"].text


def test_the_plain_rate_is_given_only_near_the_contexts_plain_steps_ran_at(model_path):
    """The panel's "plain" and its speedup's base: past the contexts plain steps ran at, the price
    is a clamped guess (on a 2-core Xeon half the true time at 5,000-7,600 tokens), so none."""
    from adaspark_app.engine.chat_engine import ChatEngine

    eng = ChatEngine(model_path, arm="adaspark", n_ctx=512)  # `ar` learns no prices
    try:
        assert eng.plain_rate(40) is None  # no plain step timed yet
        r = eng.generate("c", [{"role": "user", "content": "Describe a colour."}], max_tokens=24)
        rate = eng.plain_rate(r.context)
        assert rate is not None and 0.3 * r.tokens_per_s < rate < 3.0 * r.tokens_per_s
        assert eng.plain_rate(4 * r.context) is None
    finally:
        eng.close()


def test_the_plain_rate_is_the_plain_steps_own_price_where_two_rows_cost_less(model_path, monkeypatch):
    """Where a 2-row verify costs less than a one-row step (Qwen2.5-Coder-0.5B's Q4_K on an Intel
    Xeon: 13.9 against 15.9 ms), the offered price of width 1 is the cheaper class's, but a plain
    step runs at its own: the panel's "plain" rate is the plain step's, not the offer's (it said
    105.5 tok/s where plain decode ran at about 55)."""
    import engine_clock
    from adaspark_app.engine.chat_engine import ChatEngine

    def two_rows_cheaper(rows: int, context: int) -> float:
        return 0.020 if rows == 1 else 0.012 * (1.0 + 0.05 * (rows - 2))

    monkeypatch.setattr(engine_clock, "verify_seconds", two_rows_cheaper)
    eng = ChatEngine(model_path, arm="adaspark", n_ctx=1024)
    paste = "\n".join(f"Item {i}: a box of {i * 7 % 23} marbles." for i in range(30))
    try:
        with engine_clock.deterministic_clock():
            msgs = [{"role": "user", "content": paste + "\nRepeat the list exactly."}]
            r = eng.generate("c", msgs, max_tokens=96)
        scheduler = eng.decoder.learners.scheduler
        assert scheduler.cost.classes[2].priced  # the cheaper wider class was measured
        offered = eng.price_table(r.context)[1]
        rate = eng.plain_rate(r.context)
        assert rate is not None and offered < 0.8 * (1.0 / rate)  # the offer took the 2-row class's price
        assert 0.85 < rate * 0.020 < 1.15  # a plain step's own 20 ms
    finally:
        eng.close()
