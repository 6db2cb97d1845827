"""Base models' turn formats: the mapping from general.architecture to llama.cpp's built-in
templates, checked against the vocabulary, and the strings llama.cpp renders for them.

No model is loaded: llama.cpp's template functions need none. The Gemma-3-270M base model end
to end is in tests/test_base_model_target.py (opt-in).
"""

from __future__ import annotations

import threading
import time

import pytest

from adaspark_app.engine.template import (
    FAMILY_FORMATS,
    FORMAT_MARKERS,
    PLAIN,
    BuiltinTemplate,
    ChatTemplate,
    PlainTemplate,
    TurnFormat,
    apply_builtin,
    builtin_template_names,
    chat_template_for,
    turn_format_for,
)
from adaspark_app.engine import template_sandbox
from adaspark_app.errors import ModelLoadError

GEMMA_TOKENS = {"<start_of_turn>", "<end_of_turn>"}
LLAMA3_TOKENS = {"<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"}
CHATML_TOKENS = {"<|im_start|>", "<|im_end|>"}
PHI3_TOKENS = {"<|user|>", "<|assistant|>", "<|end|>"}

CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "What is the capital of France?"},
]


def vocab(tokens: set[str]):
    return lambda marker: marker in tokens


@pytest.mark.parametrize("arch, tokens, expected", [
    ("gemma", GEMMA_TOKENS, "gemma"),
    ("gemma2", GEMMA_TOKENS, "gemma"),
    ("gemma3", GEMMA_TOKENS, "gemma"),
    ("llama", LLAMA3_TOKENS, "llama3"),
    ("llama", CHATML_TOKENS, "chatml"),  # SmolLM-style: llama architecture trained on ChatML
    ("llama", set(), "llama2"),  # Llama 2 / Mistral: [INST] is ordinary text
    ("qwen2", CHATML_TOKENS, "chatml"),
    ("qwen3", CHATML_TOKENS, "chatml"),
    ("phi3", PHI3_TOKENS, "phi3"),
])
def test_family_format_by_architecture(arch, tokens, expected):
    fmt = turn_format_for(None, arch, vocab(tokens))
    assert fmt == TurnFormat("builtin", expected)
    assert fmt.base_model and "base model" in fmt.label()


def test_llama3_preferred_over_chatml_when_both_exist():
    assert turn_format_for(None, "llama", vocab(LLAMA3_TOKENS | CHATML_TOKENS)).name == "llama3"


@pytest.mark.parametrize("arch, tokens", [
    ("gemma3", set()),  # a gemma whose vocabulary lacks the markers: they would be plain text
    ("qwen2", {"<|im_start|>"}),  # half the markers is not the format
    ("gpt2", CHATML_TOKENS),  # a family with no built-in turn format
    ("starcoder2", set()),
    (None, CHATML_TOKENS),
])
def test_plain_completion_where_no_format_fits(arch, tokens):
    fmt = turn_format_for(None, arch, vocab(tokens))
    assert fmt == TurnFormat(PLAIN)
    assert fmt.label() == "base model, plain completion"


def test_a_gguf_template_wins():
    fmt = turn_format_for("{{ messages }}", "gemma3", vocab(GEMMA_TOKENS))
    assert fmt == TurnFormat("gguf") and not fmt.base_model


def test_every_mapped_format_is_a_llama_cpp_builtin():
    names = set(builtin_template_names())
    assert {"gemma", "llama3", "chatml", "phi3"} <= names
    mapped = {name for names_ in FAMILY_FORMATS.values() for name in names_}
    assert mapped - names == set()
    assert set(FORMAT_MARKERS) - names == set()


# The turn formats as each family's model card writes them (the strings the models were trained
# on); llama.cpp's built-in rendering must produce exactly these.
EXPECTED = {
    "gemma": ("<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n"
              "<start_of_turn>user\nWhat is the capital of France?<end_of_turn>\n<start_of_turn>model\n"),
    "llama3": ("<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
               "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
               "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
               "<|start_header_id|>user<|end_header_id|>\n\nWhat is the capital of France?<|eot_id|>"
               "<|start_header_id|>assistant<|end_header_id|>\n\n"),
    "chatml": ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
               "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nWhat is the capital of France?"
               "<|im_end|>\n<|im_start|>assistant\n"),
    "phi3": ("<|system|>\nBe brief.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\nHello!<|end|>\n"
             "<|user|>\nWhat is the capital of France?<|end|>\n<|assistant|>\n"),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_builtin_rendering_matches_the_family_format(name):
    assert apply_builtin(name, CONVERSATION) == EXPECTED[name]
    assert BuiltinTemplate(name, "<bos>").render(CONVERSATION) == "<bos>" + EXPECTED[name]


def test_builtin_rendering_without_generation_prompt_ends_after_the_last_turn():
    text = apply_builtin("gemma", CONVERSATION[:3], add_generation_prompt=False)
    assert text.endswith("Hello!<end_of_turn>\n")


def test_the_chatml_builtin_equals_the_old_chatml_jinja():
    """The engine's former fallback and llama.cpp's chatml agree (no change for ChatML models)."""
    assert ChatTemplate(None).render(CONVERSATION) == apply_builtin("chatml", CONVERSATION)


def test_unknown_builtin_is_a_clear_error():
    with pytest.raises(ModelLoadError, match="no built-in chat template"):
        apply_builtin("no-such-format", CONVERSATION)


def test_plain_completion_is_the_text_of_the_turns():
    assert PlainTemplate().render(CONVERSATION) == ("Be brief.\n\nHi\n\nHello!\n\n"
                                                    "What is the capital of France?\n\n")
    assert PlainTemplate("<s>").render(CONVERSATION[1:2], add_generation_prompt=False) == "<s>Hi"


class VocabBackend:
    """The few backend calls chat_template_for makes, over a stated vocabulary (no model here)."""

    vocab = None  # no llama.cpp vocabulary: the BOS rule comes from the metadata

    def __init__(self, meta: dict[str, str], specials: set[str]) -> None:
        self._meta, self._specials = meta, specials

    def meta(self, key: str) -> str | None:
        return self._meta.get(key)

    def bos_token(self) -> int:
        return 2

    def eos_token(self) -> int:
        return 1

    def token_bytes(self, token: int, special: bool = False) -> bytes:
        return {2: b"<bos>", 1: b"<eos>"}[token] if special else b""

    def detokenize(self, tokens) -> str:
        return ""

    def tokenize(self, text: str, add_special: bool = False, parse_special: bool = True) -> list[int]:
        return [7] if text in self._specials else [ord(c) for c in text]


def test_engine_template_for_a_gemma_base_model_is_the_gemma_builtin_with_bos():
    b = VocabBackend({"general.architecture": "gemma3", "tokenizer.ggml.add_bos_token": "true"}, GEMMA_TOKENS)
    tmpl = chat_template_for(b)
    assert isinstance(tmpl, BuiltinTemplate) and tmpl.turn_format.name == "gemma"
    text = tmpl.render(CONVERSATION[3:])
    assert text == "<bos><start_of_turn>user\nWhat is the capital of France?<end_of_turn>\n<start_of_turn>model\n"
    assert "<|im_start|>" not in text


def test_engine_template_for_an_unknown_base_model_is_plain():
    b = VocabBackend({"general.architecture": "gpt2", "tokenizer.ggml.add_bos_token": "false"}, set())
    tmpl = chat_template_for(b)
    assert isinstance(tmpl, PlainTemplate)
    assert tmpl.render(CONVERSATION[3:]) == "What is the capital of France?\n\n"


def test_engine_template_with_a_gguf_template_is_jinja():
    b = VocabBackend({"general.architecture": "gemma3",
                      "tokenizer.chat_template": "{{ bos_token }}{{ messages[0]['content'] }}"}, GEMMA_TOKENS)
    tmpl = chat_template_for(b)
    assert isinstance(tmpl, ChatTemplate) and not tmpl.turn_format.base_model


@pytest.mark.parametrize("source, parses, needle", [
    ("{{ 1/0 }}", True, "ZeroDivisionError"),
    ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", True, "RecursionError"),
    ("{{ 'a' + 1 }}", True, "TypeError"),
    ("{{ " + "(" * 50000 + "1" + ")" * 50000 + " }}", False, "RecursionError"),
    ("{{ 'a' * 10**9 }}", True, "a repetition of over"),
    ("{{ 2 ** 100000000 }}", True, "an exponent over"),
    ("{{ range(10**7) | list }}", True, "Range too big"),
    ("{% for i in range(100000) %}{{ 'a' * 1000000 }}{% endfor %}", True, "a prompt of over"),
    ("{% set ns = namespace(s='x' * 1000000) %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}"
     "{% endfor %}", True, "a joined text of over"),
    ("{% set ns = namespace(s='x' * 1000000) %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}"
     "{% endfor %}", True, "a sum of over"),
    ("{{ 'x'.center(10**10) }}", True, "a count of over"),
    ("{{ 'x'|indent(10**10, true) }}", True, "a count of over"),
    ("{{ (['x' * 1000000] * 1000)|join(',') }}", True, "a joined text of over"),
    ("{{ raise_exception('no system role') }}", True, "no system role"),
    ("{% for %}", False, "Expected"),
], ids=["division", "recursion", "type", "nesting", "repeat", "power", "range", "output", "concat", "sum",
        "method-count", "filter-count", "join-filter", "raise", "syntax"])
def test_a_hostile_or_broken_gguf_template_is_a_one_line_model_error(source, parses, needle):
    """A GGUF's template is untrusted: whatever it raises, Jinja's error or Python's, is a
    ModelLoadError (one line at the CLI, a notice in the chat), and it cannot fill the memory."""
    with pytest.raises(ModelLoadError) as caught:
        ChatTemplate(source).render([{"role": "user", "content": "hi"}])
    message = str(caught.value)
    assert ("failed to render" if parses else "does not parse") in message
    assert needle in message and "\n" not in message


def test_a_template_may_still_repeat_and_raise_to_a_small_power():
    assert ChatTemplate("{{ 'ab' * 3 }}{{ [1] * 2 }}{{ 3 * 'x' }}{{ 2 ** 10 }}").render([]) == "ababab[1, 1]xxx1024"
    assert ChatTemplate("{{ 'a' ~ 1 ~ 'b' }}{{ 'c' + 'd' }}{{ [1] + [2] }}{{ 1 + 2 }}").render([]) == "a1bcd[1, 2]3"
    filters = ("{{ messages|map(attribute='content')|join('|') }}{{ range(3)|join }}{{ 'x'|center(5) }}"
               "{{ 'ab'.replace('a', 'c') }}{{ {'k': [1, 2]}|tojson }}")
    assert (ChatTemplate(filters).render([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}])
            == 'hi|yo012  x  cb{"k": [1, 2]}')


@pytest.mark.parametrize("source", [
    "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}",
    "{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(60) }}",
], ids=["loops", "macro-tree"])
def test_a_template_that_runs_without_end_is_stopped(source, monkeypatch):
    """A loop that writes nothing, or a macro calling itself twice, ran for ever: the engine hung
    before the reply's first token. The render is stopped at MAX_RENDER_S, and its thread with it."""
    monkeypatch.setattr(template_sandbox, "MAX_RENDER_S", 0.3)
    before = threading.active_count()
    started = time.monotonic()
    with pytest.raises(ModelLoadError, match=r"failed to render: a render of over 0\.3 s$"):
        ChatTemplate(source).render([{"role": "user", "content": "hi"}])
    assert time.monotonic() - started < 1.3
    deadline = time.monotonic() + 2.0
    while threading.active_count() > before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert threading.active_count() == before


# What Hugging Face's apply_chat_template gives a template (template_sandbox.py): templates that
# failed here before (gpt-oss, Mistral Small 3.2, Command R7B, Kimi, LFM2.5 among llama.cpp's own)


def test_a_template_may_break_and_continue_a_loop():
    """Command R7B and Kimi find the last user message with `{% break %}`."""
    source = ("{% for m in messages|reverse %}{% if m.role == 'user' %}{{ m.content }}{% break %}{% endif %}"
              "{% endfor %}|{% for m in messages %}{% if m.role != 'user' %}{% continue %}{% endif %}{{ m.content }}"
              "{% endfor %}")
    assert ChatTemplate(source).render(CONVERSATION) == "What is the capital of France?|HiWhat is the capital of France?"


def test_a_generation_block_renders_its_body():
    """LFM2.5 wraps the assistant's turn in `{% generation %}` (transformers marks the assistant's
    tokens with it); the prompt is the body, as rendered."""
    source = ("{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}<a>{{ m.content }}</a>"
              "{% endgeneration %}{% else %}<{{ m.role[0] }}>{{ m.content }}{% endif %}{% endfor %}")
    assert ChatTemplate(source).render(CONVERSATION[1:]) == "<u>Hi<a>Hello!</a><u>What is the capital of France?"


def test_a_template_may_write_the_date():
    """gpt-oss, Mistral Small 3.2 and Solar call strftime_now unguarded; Llama 3.x checks for it."""
    import datetime

    before = datetime.date.today().isoformat()
    text = ChatTemplate("{{ strftime_now('%Y-%m-%d') }}|{{ strftime_now is defined }}").render([])
    assert text.split("|")[0] in {before, datetime.date.today().isoformat()} and text.endswith("|True")


def test_tojson_writes_json_as_python_does_not_html_safe():
    """transformers' tojson: `<` stays `<` (Jinja's own writes \\u003c), non-ASCII stays itself,
    and indent is honoured."""
    messages = [{"role": "user", "content": "<b>café</b>"}]
    assert ChatTemplate("{{ messages[0]|tojson }}").render(messages) == '{"role": "user", "content": "<b>café</b>"}'
    assert ChatTemplate("{{ messages[0]|tojson(indent=1) }}").render(messages) == (
        '{\n "role": "user",\n "content": "<b>café</b>"\n}')
    with pytest.raises(ModelLoadError, match="a count of over"):
        ChatTemplate("{{ messages[0]|tojson(indent=10**10) }}").render(messages)


GEMMA2_LIKE = ("{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
               "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}")


def test_a_template_that_refuses_a_system_prompt_gets_it_in_the_first_user_message():
    """Gemma 2's template raises on a system message; the system prompt goes at the head of the
    first user message, as Gemma 3's own template puts it."""
    tmpl = ChatTemplate(GEMMA2_LIKE)
    assert tmpl.render(CONVERSATION) == ("<user>Be brief.\n\nHi<assistant>Hello!"
                                         "<user>What is the capital of France?")
    assert tmpl.folds_system
    assert tmpl.render(CONVERSATION[1:]) == "<user>Hi<assistant>Hello!<user>What is the capital of France?"
    assert CONVERSATION[1]["content"] == "Hi"  # the caller's messages are left alone


def test_a_template_that_fails_otherwise_still_fails_with_its_own_reason():
    """The fold is tried (the messages have a system prompt), fails too, and is not kept."""
    tmpl = ChatTemplate("{{ raise_exception('Conversation roles must alternate') }}")
    with pytest.raises(ModelLoadError, match="Conversation roles must alternate"):
        tmpl.render(CONVERSATION)
    assert not tmpl.folds_system
