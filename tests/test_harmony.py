"""gpt-oss's harmony format: a reply's channels written as thinking and answer, and earlier
replies sent back as their answers.

No gpt-oss model can be had here (its smallest is 12 GB), so the vocabulary is real in another
way: the bundled model's own GGUF with six of its unused control tokens renamed to harmony's,
loaded by llama.cpp (vocabulary only), tokenising and rendering as a gpt-oss GGUF would. The
template is gpt-oss's own (tests/data/gpt-oss.jinja.gz).
"""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from adaspark_app.engine.detok import StreamDecoder, joined
from adaspark_app.engine.harmony import HarmonyText, HarmonyTokens, harmony_tokens, history_messages
from adaspark_app.thinking import split_thinking

DATA = Path(__file__).parent / "data"
GPT_OSS_TEMPLATE = gzip.decompress((DATA / "gpt-oss.jinja.gz").read_bytes()).decode()
# The bundled vocabulary's ids 3-8 (<repo_name> ... <gh_stars>, control tokens a chat never uses)
RENAMED = {3: "<|start|>", 4: "<|channel|>", 5: "<|message|>", 6: "<|end|>", 7: "<|return|>", 8: "<|call|>"}
REPLY = ("<|channel|>analysis<|message|>The user asks 2+2. Simple.<|end|>"
         "<|start|>assistant<|channel|>final<|message|>2 + 2 = 4.")


# -- the text of a reply, on a synthetic vocabulary: one token per marker, one per character


IDS = HarmonyTokens(start=1, channel=2, message=3, end=4)
MARKERS = {"<|start|>": 1, "<|channel|>": 2, "<|message|>": 3, "<|end|>": 4}


def tokens_of(text: str) -> list[int]:
    out, i = [], 0
    while i < len(text):
        for marker, t in MARKERS.items():
            if text.startswith(marker, i):
                out.append(t)
                i += len(marker)
                break
        else:
            out.append(1000 + ord(text[i]))
            i += 1
    return out


def piece(t: int) -> bytes:
    if t >= 1000:
        return chr(t - 1000).encode()
    return next(m for m, i in MARKERS.items() if i == t).encode()  # llama.cpp renders them (harmony.py)


def text_of(reply: str, batch: int = 1) -> str:
    toks = tokens_of(reply)
    stream = StreamDecoder(HarmonyText(IDS, piece).pieces)
    for i in range(0, len(toks), batch):
        stream.push(toks[i:i + batch])
    stream.flush()
    return stream.text


@pytest.mark.parametrize("batch", [1, 3, 1000])
def test_analysis_is_the_thinking_and_final_the_answer(batch):
    text = text_of(REPLY, batch)
    assert text == "<think>The user asks 2+2. Simple.</think>2 + 2 = 4."
    split = split_thinking(text)
    assert (split.thinking, split.answer, split.closed) == ("The user asks 2+2. Simple.", "2 + 2 = 4.", True)


def test_without_harmony_the_markers_show_raw():
    """What the chat showed before."""
    stream = StreamDecoder(joined(piece))
    stream.push(tokens_of(REPLY))
    assert stream.text == REPLY


def test_a_reply_cut_short_in_its_thinking_is_an_open_thinking():
    text = text_of("<|channel|>analysis<|message|>Let me see, the user")
    assert text == "<think>Let me see, the user"
    assert split_thinking(text).closed is False


def test_a_reply_with_no_analysis_is_all_answer():
    assert text_of("<|channel|>final<|message|>Hello!") == "Hello!"


def test_two_thinking_messages_are_one_thinking_with_a_blank_line():
    reply = ("<|channel|>analysis<|message|>First.<|end|><|start|>assistant<|channel|>commentary<|message|>"
             "Second.<|end|><|start|>assistant<|channel|>final<|message|>Done.")
    assert text_of(reply) == "<think>First.\n\nSecond.</think>Done."


def test_a_header_cut_short_is_dropped_and_headers_never_show():
    assert text_of("<|channel|>analysis<|message|>Hm.<|end|><|start|>assistant<|channel|>fin") == "<think>Hm."
    assert text_of("<|channel|>final json<|message|>{}") == "{}"


def test_text_outside_any_message_is_kept():
    """A model that writes without a channel (not harmony after all) loses nothing."""
    assert text_of("Plain words.") == "Plain words."


def test_earlier_replies_go_back_as_their_answers():
    messages = [{"role": "user", "content": "2+2?"},
                {"role": "assistant", "content": "<think>Add them.</think>4."},
                {"role": "user", "content": "<think> is a tag"}]
    out = history_messages(messages)
    assert out[1] == {"role": "assistant", "content": "4."}
    assert out[2] == messages[2]  # a user's text is the user's
    assert messages[1]["content"] == "<think>Add them.</think>4."  # the caller's list is left alone


# -- llama.cpp's own vocabulary and gpt-oss's own template


@pytest.fixture(scope="module")
def harmony_vocab(tmp_path_factory, model_path):
    """The bundled GGUF's metadata (no tensors) with RENAMED and gpt-oss's template, eos <|return|>."""
    import gguf

    reader = gguf.GGUFReader(model_path)
    path = tmp_path_factory.mktemp("harmony") / "harmony-vocab.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        value = field.contents()
        if key == "tokenizer.ggml.tokens":
            value = [RENAMED.get(i, tok) for i, tok in enumerate(value)]
        elif key == "tokenizer.chat_template":
            value = GPT_OSS_TEMPLATE
        elif key == "tokenizer.ggml.eos_token_id":
            value = 7
        sub = field.types[1] if len(field.types) > 1 else None
        writer.add_key_value(key, value, field.types[0], sub_type=sub)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    return str(path)


@pytest.mark.model
def test_a_harmony_vocabulary_is_found_and_its_reply_written_as_thinking(harmony_vocab, model_path):
    from adaspark_app.engine.backend import LlamaBackend

    voc = LlamaBackend.vocab_only(harmony_vocab)
    plain = LlamaBackend.vocab_only(model_path)
    try:
        ids = harmony_tokens(lambda s: voc.tokenize(s, parse_special=True), voc.is_special)
        assert ids == HarmonyTokens(start=3, channel=4, message=5, end=6)
        assert harmony_tokens(lambda s: plain.tokenize(s, parse_special=True), plain.is_special) is None
        assert voc.is_eog(7) and not voc.is_eog(6)  # <|return|> ends a reply; <|end|> a message only
        word = voc.tokenize("hello", parse_special=True)[0]
        assert [voc.is_special(t) for t in (4, 1, word)] == [True, True, False]  # user-defined, control, text
        assert not voc.is_control(4) and voc.is_control(1)  # llama.cpp made <|channel|> user-defined
        toks = voc.tokenize(REPLY, parse_special=True)
        assert [t for t in toks if t < 9] == [4, 5, 6, 3, 4, 5]
        assert voc.detokenize(toks) == REPLY  # llama.cpp writes the markers into the text
        stream = StreamDecoder(HarmonyText(ids, voc.token_bytes).pieces)
        for t in toks:
            stream.push([t])
        stream.flush()
        assert stream.text == "<think>The user asks 2+2. Simple.</think>2 + 2 = 4."
    finally:
        voc.close()
        plain.close()


@pytest.mark.model
def test_gpt_oss_template_renders_a_conversation_with_an_earlier_thinking_reply(harmony_vocab):
    from adaspark_app.engine.backend import LlamaBackend
    from adaspark_app.engine.template import chat_template_for

    voc = LlamaBackend.vocab_only(harmony_vocab)
    try:
        template = chat_template_for(voc)
        assert template.harmony
        messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
                    {"role": "assistant", "content": "<think>The user asks 2+2.</think>4."},
                    {"role": "user", "content": "And 3+3?"}]
        prompt = template.render(messages)
    finally:
        voc.close()
    assert "<|start|>assistant<|channel|>final<|message|>4.<|end|>" in prompt
    assert "The user asks" not in prompt and "<think>" not in prompt
    assert prompt.endswith("<|start|>user<|message|>And 3+3?<|end|><|start|>assistant")
    assert "Current date: " in prompt  # strftime_now, which the template calls unguarded


@pytest.mark.model
def test_the_engine_answers_on_gpt_oss_template_after_a_thinking_reply():
    """The bundled model prompted with gpt-oss's template: a conversation whose earlier reply
    thought is answered (the template used to refuse it, or, before strftime_now, every prompt),
    and the prompt holds the earlier answer but not its thinking."""
    from adaspark_app.engine.chat_engine import ChatEngine
    from adaspark_app.engine.template import ChatTemplate

    messages = [{"role": "user", "content": "Name a colour."},
                {"role": "assistant", "content": "<think>Any colour will do here.</think>Blue."},
                {"role": "user", "content": "Another one?"}]
    with ChatEngine(n_ctx=1024) as engine:
        assert engine.harmony is None  # the bundled vocabulary has no harmony tokens
        engine.template = ChatTemplate(GPT_OSS_TEMPLATE)
        prompt = engine.backend.detokenize(engine.prompt_tokens(messages))
        reply = engine.generate("c", messages, max_tokens=8)
    assert "<|channel|>final<|message|>Blue.<|end|>" in prompt and "Any colour" not in prompt
    assert reply.n_tokens > 0 and not reply.text.startswith("<think>")
