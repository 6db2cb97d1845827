"""A reasoning model's thinking split from its answer (adaspark_app/thinking.py), and the engine's
word on whether its template opens the thinking for each reply."""

from __future__ import annotations

import pytest

from adaspark_app.thinking import answer_of, split_thinking, thinking_title

R1_TEMPLATE = ("{% for m in messages %}{% if m['role'] == 'user' %}<｜User｜>{{ m['content'] }}"
               "{% else %}<｜Assistant｜>{{ m['content'].split('</think>')[-1] }}<｜end▁of▁sentence｜>{% endif %}"
               "{% endfor %}{% if add_generation_prompt %}<｜Assistant｜><think>\n{% endif %}")


def test_a_reply_that_opens_its_thinking_is_split_at_its_close():
    s = split_thinking("\n<think>\nThe user wants colours.\n\nThree will do.\n</think>\n\nRed, green, blue.")
    assert (s.thinking, s.answer, s.closed) == ("The user wants colours.\n\nThree will do.", "Red, green, blue.", True)
    assert answer_of("<think>x</think>\n\nAnswer") == "Answer"


def test_a_thinking_not_closed_yet_is_all_of_the_reply():
    s = split_thinking("<think>\nStill weighing it")
    assert (s.thinking, s.answer, s.closed) == ("Still weighing it", "", False)
    assert split_thinking("Starts inside", opened=True) == split_thinking("<think>Starts inside")


def test_a_prompt_that_opened_the_thinking_leaves_the_reply_only_its_close():
    text = "Okay, so the user asks for colours.\n</think>\n\nRed, green, blue."
    opened = split_thinking(text, opened=True)
    assert (opened.thinking, opened.answer) == ("Okay, so the user asks for colours.", "Red, green, blue.")
    assert split_thinking(text) == opened  # stored: a close on its own line, nothing opened before it


@pytest.mark.parametrize("text", [
    "Plain answer, no tags.",
    "The tag is written `</think>` in the template.",  # mid-line: a mention, not a close
    "```\n</think>\n```\nThat closes a thinking block.",  # inside a code fence
    "First <think>, then\n</think>\nis the pair.",  # opened after the start: a mention
])
def test_a_reply_that_only_mentions_the_tags_has_no_thinking(text):
    s = split_thinking(text)
    assert s.thinking is None and s.answer == text
    assert answer_of(text) == text


def test_the_fold_says_how_long_the_thinking_was():
    assert thinking_title("one two three", True) == "Thought (3 words)"
    assert thinking_title("one", False) == "Thinking, stopped (1 word)"
    assert thinking_title("", False, streaming=True) == "Thinking…"


@pytest.mark.model
def test_the_engine_says_whether_its_template_opens_the_thinking():
    """The bundled model's template does not; a DeepSeek-R1 distill's (the generation prompt ends
    with <think>) does; a template that fails to render does not."""
    from adaspark_app.engine.chat_engine import ChatEngine
    from adaspark_app.engine.template import ChatTemplate

    with ChatEngine(n_ctx=256) as engine:
        assert engine.opens_thinking is False
        engine.template = ChatTemplate(R1_TEMPLATE)
        assert engine.opens_thinking is True
        engine.template = ChatTemplate("{{ raise_exception('no user turns here') }}")
        assert engine.opens_thinking is False
