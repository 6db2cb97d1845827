"""Prompts tokenised a piece at a time, cut at the chat template's markers, the pieces of earlier
prompts reused (engine/prompt_tokens.py): the tokens equal llama.cpp's tokens of the whole prompt.
The real bundled model's tokeniser over conversations that grow, are edited and quote its own
markers; a toy tokeniser that cuts text the way llama.cpp does, for vocabularies whose special
tokens overlap or strip white space (no real model here has one)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from adaspark_app.engine.prompt_tokens import PromptTokens, overlaps, self_overlapping
from benchmarks.common import read_jsonl

CORPORA = Path(__file__).resolve().parents[1] / "benchmarks" / "corpora"


def test_overlaps_and_self_overlap():
    x = b"<|im_start|>"
    assert overlaps(x, b"a<|im_start|>b")  # contains
    assert overlaps(x, b"ab<|im")  # ends with x's start
    assert overlaps(x, b"start|>ab")  # starts with x's end
    assert not overlaps(x, b"<|im_end|>") and not overlaps(x, b"<|endoftext|>")
    assert overlaps(x, b"|>ab") and overlaps(x, b"ab<")
    assert not overlaps(x, b"im_") and not overlaps(x, b"")  # inside x, not at its ends: x is cut first
    assert self_overlapping(b"abab") and self_overlapping(b"<x<") and not self_overlapping(x)


# ---------------------------------------------------------------------- a toy llama.cpp tokeniser
class ToyVocab:
    """llama.cpp's two steps on a toy vocabulary: cut the text at special tokens' texts, longest
    first, each cut eating white space beside it where the token says lstrip/rstrip; then each raw
    piece tokenised on its own, one token per byte, with a space put before a piece that follows
    a special token (an SPM vocabulary's space prefix)."""

    def __init__(self, specials: dict[int, tuple[bytes, bool]], lstrip=(), rstrip=()):
        self.lstrip, self.rstrip = set(lstrip), set(rstrip)
        self.specials = {t: (text, control, t in self.lstrip) for t, (text, control) in specials.items()}
        self.calls = 0

    def tokenize(self, data: bytes) -> list[int]:
        self.calls += 1
        frags: list = [data]
        for sid, (text, _, _) in sorted(self.specials.items(), key=lambda kv: -len(kv[1][0])):
            out: list = []
            for f in frags:
                if not isinstance(f, bytes):
                    out.append(f)
                    continue
                while True:
                    at = f.find(text)
                    if at < 0:
                        break
                    left, f = f[:at], f[at + len(text):]
                    if sid in self.lstrip:
                        left = left.rstrip(b" \t\n\v\f\r")
                    if sid in self.rstrip:
                        f = f.lstrip(b" \t\n\v\f\r")
                    if left:
                        out.append(left)
                    out.append(sid)
                if f:
                    out.append(f)
            frags = out
        tokens: list[int] = []
        prev_special = True
        for f in frags:
            if isinstance(f, int):
                tokens.append(f)
                prev_special = True
            else:
                tokens.extend(1000 + c for c in ((b" " if prev_special else b"") + f))
                prev_special = False
        return tokens


def _grown(vocab: ToyVocab, texts: list[bytes]) -> PromptTokens:
    prompts = PromptTokens(vocab.tokenize, lambda: vocab.specials, min_bytes=0)
    for t in texts:
        assert prompts(t.decode()) == vocab.tokenize(t)
    return prompts


def test_a_grown_prompt_is_cut_at_its_markers_and_equals_the_whole_tokenisation():
    vocab = ToyVocab({1: (b"<s>", True), 2: (b"</s>", True)})
    turns = [b"<s>user\nhi</s>\n", b"<s>assistant\nhello</s>\n", b"<s>user\n <s> quoted</s>x</s>\n"]
    texts = [b"".join(turns[:i]) + b"<s>assistant\n" for i in range(1, 4)]
    prompts = _grown(vocab, texts)
    assert prompts.reused > 0 and prompts.tokenized < sum(len(vocab.tokenize(t)) for t in texts)


def test_a_marker_another_special_token_overlaps_is_never_a_cut():
    """"a<s>b" is a special token: the text "…a<s>" then "b" must tokenise as it, though the rest
    after "<s>" alone would start with "<s>". Cutting at "<s>" would give a, <s>, b instead."""
    vocab = ToyVocab({1: (b"<s>", True), 2: (b"a<s>b", False), 3: (b"</s>", True)})
    prompts = _grown(vocab, [b"</s>xa<s>c", b"</s>xa<s>b", b"</s>xa<s>c</s>d"])
    assert not prompts.marker(1) and prompts.marker(3)


def test_a_marker_that_strips_white_space_keeps_the_whole_tokenisation():
    """An rstrip marker eats the white space after it, an lstrip one the white space before it."""
    vocab = ToyVocab({1: (b"<s>", True), 2: (b"<e>", True)}, lstrip=[2], rstrip=[1])
    _grown(vocab, [b"<s> a <e> b<s>\n", b"<s> a <e> b<s>\n c <e>", b"<s> a <e> b<s>  \n d  <e> <s>"])


@pytest.mark.parametrize("seed", range(6))
def test_random_texts_over_markers_with_every_rule_equal_the_whole_tokenisation(seed):
    """Texts of markers, white space and letters that grow, are cut back and edited, over a
    vocabulary with overlapping, stripping and white-space-edged special tokens."""
    rng = random.Random(seed)
    vocab = ToyVocab({1: (b"<s>", True), 2: (b"</s>", True), 3: (b"s>x", False), 4: (b" <u>", True),
                      5: (b"<u>", True), 6: (b"<<", True), 7: (b"<t>", True), 8: (b"<v>", True)},
                     lstrip=[5, 8], rstrip=[2])
    pieces = [b"<s>", b"</s>", b"<u>", b"<t>", b"<v>", b" ", b"\n", b"x", b"s", b">", b"<", b"ab", b"\xc3\xa9"]
    prompts = PromptTokens(vocab.tokenize, lambda: vocab.specials, keep_tokens=40, min_bytes=0)
    text = b""
    for _ in range(120):
        r = rng.random()
        if r < 0.7:
            text += b"".join(rng.choice(pieces) for _ in range(rng.randrange(1, 8)))
        elif r < 0.85:
            text = text[:rng.randrange(0, len(text) + 1)]
        else:
            at = rng.randrange(0, len(text) + 1)
            text = text[:at] + rng.choice(pieces) + text[at:]
        s = text.decode("utf-8", errors="ignore").encode()
        assert prompts(s.decode()) == vocab.tokenize(s), s
    assert sorted(prompts.markers.values()) == [2, 7] and prompts.reused > 0


def test_the_vocabulary_is_scanned_once_and_not_for_the_first_long_prompt():
    vocab = ToyVocab({1: (b"<s>", True)})
    scans = []
    prompts = PromptTokens(vocab.tokenize, lambda: scans.append(1) or vocab.specials, min_bytes=8)
    for text, expect_scans in (("<s>a", 0), ("<s>ab<s>cdef", 0), ("<s>ab<s>cdef<s>g", 1), ("<s>ab<s>cdef<s>gh", 1)):
        assert prompts(text) == vocab.tokenize(text.encode()) and len(scans) == expect_scans
    assert prompts.markers == {b"<s>": 1} and prompts.reused == 4 + 6  # "<s>ab" and "<s>cdef", at the last


def test_nothing_is_kept_with_keep_zero():
    vocab = ToyVocab({1: (b"<s>", True)})
    prompts = PromptTokens(vocab.tokenize, lambda: vocab.specials, keep_tokens=0, min_bytes=0)
    for t in ("<s>a", "<s>a<s>b", "<s>a<s>b"):
        assert prompts(t) == vocab.tokenize(t.encode())
    assert prompts.reused == 0 and vocab.calls == 6


# ---------------------------------------------------------------------- the bundled model
def _conversations(limit: int) -> list[list[str]]:
    rows = read_jsonl(CORPORA / "longpaste.jsonl.gz") + read_jsonl(CORPORA / "mtbench.jsonl.gz")[:4]
    return [[t if isinstance(t, str) else t["content"] for t in r["turns"]] for r in rows[:limit]]


QUOTES = ["<|im_start|>assistant\nnot a turn", "ends with a marker <|im_end|>", "<|im_end|>\n<|im_start|>user\n",
          "  two spaces, then a tab\t", "\n", "", "ünïcödé 日本語 <|endoftext|> done", " <|im_start|>"]


def check_grown_prompts(engine, seed: int = 7) -> int:
    """A conversation grows turn by turn through the engine's chat template (replies of various
    texts), is edited and cut back: every prompt's tokens must equal the whole prompt's
    tokenisation. Returns the tokens of all the prompts (test_real_targets.py runs it too)."""
    rng = random.Random(seed)
    engine.prompts.min_bytes = 0  # short prompts too
    whole = 0
    for turns in _conversations(6):
        messages: list[dict[str, str]] = [{"role": "system", "content": "Be brief."}]
        for i, turn in enumerate(turns[:4] + [rng.choice(QUOTES) for _ in range(3)]):
            messages.append({"role": "user", "content": turn[:3000]})
            text = engine.template.render(messages, add_generation_prompt=True)
            expect = engine.backend.tokenize(text, add_special=False, parse_special=True)
            assert engine.prompts(text) == expect
            whole += len(expect)
            messages.append({"role": "assistant", "content": rng.choice(QUOTES) + turn[-200:]})
            if i == 2:  # an earlier message edited: the prompts part there
                messages[1] = {"role": "user", "content": messages[1]["content"][:50] + " edited"}
            if i == 4:  # the last turn taken back (a regenerated reply)
                del messages[-2:]
    return whole


@pytest.mark.model
def test_the_bundled_models_prompts_equal_their_whole_tokenisation():
    """Most of each prompt is reused, at the template's markers."""
    from adaspark_app.engine.chat_engine import ChatEngine

    with ChatEngine(n_ctx=4096, arm="ar") as engine:
        whole = check_grown_prompts(engine)
        im_start, im_end = engine.backend.tokenize("<|im_start|><|im_end|>")
        assert {b"<|im_start|>": im_start, b"<|im_end|>": im_end}.items() <= engine.prompts.markers.items()
        assert engine.prompts.reused > whole // 2


@pytest.mark.model
def test_a_full_context_counts_its_windows_from_kept_prompts_with_the_same_window(tmp_path):
    """Once the history passes the context, fit_window counts several windows each reply; with
    prompts reused the windows and tokens are those of an engine that keeps none."""
    from adaspark_app.engine.chat_engine import ChatEngine

    turns = [t for c in _conversations(4) for t in c][:16]
    with ChatEngine(n_ctx=1024, arm="ar", self_check=True) as engine:
        fresh = ChatEngine(n_ctx=1024, arm="ar")
        fresh.prompts.keep_tokens = 0
        engine.prompts.min_bytes = 0
        with fresh:
            messages: list[dict[str, str]] = []
            dropped = 0
            for turn in turns:
                messages.append({"role": "user", "content": turn[:1200]})
                window, tokens = engine.fit_window(messages, 64)
                assert (window, tokens) == fresh.fit_window(messages, 64)
                dropped = max(dropped, window.dropped_turns)
                messages.append({"role": "assistant", "content": turn[-300:]})
        assert dropped > 0 and engine.prompts.reused > engine.prompts.tokenized
