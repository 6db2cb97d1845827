"""The long-copy rule (issue 19): where llama.cpp's ngram-mod would draft, AdaSpark follows the
anchor's copy to 63 tokens and, once the copy is confirmed, verifies at least that many rows.

Synthetic tests with known answers (seeded random texts), the replay's re-implementation of
ngram-mod's rule, and one test on the bundled model that the floor's wide verifies stay
byte-identical to `ar`.
"""

from __future__ import annotations

import random

import pytest

from adaspark_app.engine.ngram import NgramIndex, NgramStep, long_copy_rows
from adaspark_app.learn.constants import (LONG_COPY_CONFIRM, LONG_COPY_DEPTH, LONG_COPY_MATCH, LONG_COPY_MIN,
                                          NGRAM_MAX_DEPTH)
from adaspark_app.learn.width import long_copy_floor
from adaspark_app.learn.kinds import NgramKind


def _text(seed: int, n: int, vocab: int = 50_000) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(vocab) for _ in range(n)]


def _copies(evidence: int, n: int) -> list[NgramStep]:
    return [NgramStep(1000 + i, NgramKind.COPY, min(evidence + i, 32)) for i in range(n)]


def test_rule_fires_on_a_24_token_match_that_runs_48_more():
    assert long_copy_rows(_copies(LONG_COPY_MATCH, LONG_COPY_MIN)) == LONG_COPY_MIN + 1
    assert long_copy_rows(_copies(LONG_COPY_MATCH - 1, 63)) == 0  # matched on 23 tokens only
    assert long_copy_rows(_copies(32, LONG_COPY_MIN - 1)) == 0  # the copy runs 47: ngram-mod drafts nothing
    assert long_copy_rows([]) == 0


def test_rule_counts_only_leading_copy_steps_and_caps_at_the_widest_batch():
    steps = _copies(32, 50) + [NgramStep(7, NgramKind.FOLLOWER, 3)] + _copies(32, 20)
    assert long_copy_rows(steps) == 51
    short = _copies(32, 40) + [NgramStep(7, NgramKind.FOLLOWER, 3)] + _copies(32, 20)
    assert long_copy_rows(short) == 0
    assert long_copy_rows(_copies(32, 100)) == LONG_COPY_DEPTH + 1 == 64
    assert long_copy_rows([NgramStep(7, NgramKind.FOLLOWER, 9)] + _copies(32, 60)) == 0


def test_index_follows_a_long_copy_to_63_tokens_and_a_short_one_to_32():
    a = _text(19, 120)
    idx = NgramIndex(a + a[:30])  # the last 30 tokens repeat the text's start
    assert idx.long_copy() == 64
    assert idx.anchor_depth() == LONG_COPY_DEPTH
    chain = idx.chain((), idx.anchor_depth())
    assert [s.token for s in chain] == a[30:93]  # the rest of the passage, 63 tokens
    short = NgramIndex(a + a[:LONG_COPY_MATCH - 1])
    assert short.long_copy() == 0
    assert short.anchor_depth() == NGRAM_MAX_DEPTH


def test_long_copy_needs_the_passage_to_run_48_tokens_past_the_match():
    a = _text(7, 200)
    # the earlier passage (a[50:80]) is followed by 60 tokens, then unrelated text: the copy's
    # read-on still runs (it does not stop at passage ends), so the rule fires
    idx = NgramIndex(a[:140] + a[50:80])
    assert idx.long_copy() == 64
    # the cache follows extend: one token that breaks the match turns the rule off
    idx.extend([123_456])
    assert idx.long_copy() == 0


def test_floor_only_after_a_confirmed_copy():
    assert long_copy_floor(64, LONG_COPY_CONFIRM) == 64
    assert long_copy_floor(64, LONG_COPY_CONFIRM - 1) == 0
    assert long_copy_floor(0, 63) == 0
    assert long_copy_floor(49, 40) == 49


def test_replay_reimplements_ngram_mod_exactly_on_known_texts():
    from benchmarks.oracle.ngram_mod_replay import ModTable

    a = _text(3, 200)
    prompt = a[:150]
    # the reply restates a[10:...]: once the anchor's last 24 tokens are a[10:34], the table
    # (the whole prompt) chains a[34:98], 64 tokens, and the draft is all of them
    mod = ModTable(prompt)
    assert mod.draft(prompt + a[10:34]) == a[34:98]
    # a copy whose source has only 35 indexed 24-grams after it (the prompt's last 24 tokens
    # start none: they have no follower yet): the chain breaks at 35 < 48, so nothing is drafted
    short = a[:60] + a[20:39]
    assert ModTable(short).draft(short + a[39:44]) == []
    # the same copy with a longer source drafts 64 tokens
    longer = a[:150] + a[20:39]
    assert ModTable(longer).draft(longer + a[39:44]) == a[44:108]
    # 24 tokens never seen: no draft
    assert ModTable(prompt).draft(prompt + _text(4, 24)) == []
    # the reply's own text is added only in chunks, up to 24 tokens before the anchor: 30 fresh
    # tokens repeated right away chain into that unindexed tail before reaching 48: nothing
    fresh = _text(5, 30)
    assert ModTable(prompt).draft(prompt + fresh + fresh[:24]) == []


@pytest.mark.model
def test_long_copy_floor_stays_byte_identical_to_ar(model_path, monkeypatch):
    """The bundled model asked to repeat a passage verbatim, twice (the first request spends its
    copy on cold-start measurements). The floor is forced on every firing of the rule (confirmed
    or not, so it fires within a short reply): the wide verifies it forces give the same replies
    as `ar`."""
    from adaspark_app.learn import width as width_decision
    from adaspark_app.engine.chat_engine import ChatEngine
    from engine_clock import deterministic_clock

    passage = ("The committee met on Tuesday to review the annual budget, the new hiring plan, the "
               "schedule for the spring conference, and the proposal to move the archive to the "
               "north building before the end of the year. After a long discussion the members agreed "
               "to raise the travel allowance, to postpone the purchase of new laptops until March, and "
               "to ask the treasurer for a monthly report on the costs of the building work, which had "
               "run over the estimate twice since the summer.")
    msgs = [{"role": "user", "content": f"Repeat this text exactly:\n\n{passage}"}]
    fired: list[int] = []
    events: list[tuple[int, int]] = []  # (width, accepted) per round of the adaspark arm
    calls: list[tuple[int, int]] = []  # (rounds before the call, last_whole) per floor query
    starts: set[int] = set()  # round index at which each request began

    def floor_always(rows: int, last_whole: int) -> int:
        calls.append((len(events), last_whole))
        if rows:
            fired.append(rows)
        return rows

    monkeypatch.setattr(width_decision, "long_copy_floor", floor_always)
    replies: dict[str, list] = {}
    for arm in ("ar", "adaspark"):
        with deterministic_clock():
            eng = ChatEngine(model_path, arm=arm, n_ctx=1024)
            try:
                out = []
                for k in range(2):
                    if arm == "adaspark":
                        starts.add(len(events))
                    r = eng.generate(f"long-copy-{k}", msgs, max_tokens=96,
                                     on_round=lambda ev, arm=arm: arm == "adaspark" and events.append(
                                         (ev.width, ev.accepted)))
                    out.append(r.tokens)
                    eng.reset_conversation()
                replies[arm] = out
            finally:
                eng.close()
    assert replies["adaspark"] == replies["ar"]
    # the copy is verified whole: up to the end of the passage, and never on past it into the
    # chat template's end-of-turn marker (the chain stops before control tokens)
    assert fired and LONG_COPY_MIN + 1 <= max(fired) <= LONG_COPY_DEPTH + 1
    assert max(w for w, _ in events) >= LONG_COPY_MIN + 1  # a verify as wide as ngram-mod's draft ran
    # the confirmation the floor is given: the draft tokens accepted in a row by the rounds just
    # before, each accepted whole (all rows but at most an exploration row), else 0; nothing at a
    # request's first round
    assert calls
    streak, seen = 0, 0
    for k, last_whole in calls:
        for width, accepted in events[seen:k]:  # the rounds since the last query, plain ones too
            streak = streak + accepted if accepted >= max(width - 2, 1) else 0
        seen = k
        if k in starts:
            streak = 0
        assert last_whole == streak
    assert any(lw > 0 for _, lw in calls)
    assert any(lw > max((w for w, _ in events[:k]), default=0) for k, lw in calls), "a streak runs over rounds"


@pytest.mark.model
def test_a_reply_restating_the_message_is_not_copied_into_the_template(model_path):
    """A reply that restates the user's message matches the end of that message, and the copy read
    on from there runs into the chat template's end-of-turn and start-of-turn markers, which the
    target never writes inside a reply. With the vocabulary's control tokens as stops (what the
    decoder gives its index) the chain ends with the message."""
    from adaspark_app.engine.backend import LlamaBackend

    b = LlamaBackend(model_path, n_ctx=256, n_threads=1)
    try:
        message = "def largest_divisor(n: int) -> int:\n    return max(d for d in range(1, n) if n % d == 0)"
        text = f"<|im_start|>user\n{message}<|im_end|>\n<|im_start|>assistant\n{message}"
        tokens = b.tokenize(text, parse_special=True)
        end, start = b.tokenize("<|im_end|>", parse_special=True), b.tokenize("<|im_start|>", parse_special=True)
        assert len(end) == len(start) == 1 and b.is_control(end[0]) and b.is_control(start[0])
        body = b.tokenize(message, parse_special=True)
        assert not any(b.is_control(t) for t in body)
        cut = len(tokens) - 8  # the reply has restated all but the message's last 8 tokens
        free = [s.token for s in NgramIndex(tokens[:cut]).chain((), 16)]
        stopped = [s.token for s in NgramIndex(tokens[:cut], stop=b.is_control).chain((), 16)]
        assert free[:8] == tokens[cut:] and end[0] in free  # without stops: into the template
        assert stopped == tokens[cut:]  # with them: the message's end, and nothing after it
    finally:
        b.close()


@pytest.mark.model
def test_vocab_only_backend_tokenizes_and_templates_as_the_loaded_model(model_path):
    """`LlamaBackend.vocab_only` (what benchmarks/oracle/ngram_mod_replay.py replays with) loads no weights
    and no context, yet must tokenize, detokenize, classify tokens and render the chat template
    exactly as the fully loaded backend does: a difference would shift every replayed position."""
    from adaspark_app.engine.backend import LlamaBackend
    from adaspark_app.engine.template import chat_template_for

    full = LlamaBackend(model_path, n_ctx=256, n_threads=1)
    voc = LlamaBackend.vocab_only(model_path)
    try:
        assert voc.ctx is None and voc.n_vocab == full.n_vocab
        messages = [{"role": "user", "content": "Rename `x` to `count`:\n\n    x = len(items)\n    print(x)"}]
        prompt = chat_template_for(full).render(messages)
        assert chat_template_for(voc).render(messages) == prompt
        tokens = full.tokenize(prompt, parse_special=True)
        assert voc.tokenize(prompt, parse_special=True) == tokens and len(tokens) > 20
        assert voc.detokenize(tokens) == full.detokenize(tokens)
        assert [voc.is_control(t) for t in tokens] == [full.is_control(t) for t in tokens]
        assert any(full.is_control(t) for t in tokens)  # the template's markers are among them
        assert voc.eos_token() == full.eos_token() and voc.name == full.name
    finally:
        voc.close()
        full.close()


def test_vocab_only_backend_rejects_a_file_that_is_not_gguf(tmp_path):
    from adaspark_app.engine.backend import LlamaBackend
    from adaspark_app.errors import ModelLoadError

    bad = tmp_path / "notes.gguf"
    bad.write_bytes(b"not a model at all")
    with pytest.raises(ModelLoadError, match="not a GGUF file"):
        LlamaBackend.vocab_only(str(bad))


def test_replay_what_if_scales_only_the_cost_above_one_row():
    import pytest as _pytest
    from benchmarks.common import cost_fn
    from benchmarks.oracle.ngram_mod_replay import scale_extra

    table = {1: 1.0, 2: 1.5, 4: 2.0, 8: 4.2}
    half = scale_extra(table, 0.5)
    assert half == {1: 1.0, 2: 1.25, 4: 1.5, 8: 2.6}
    assert set(scale_extra(table, 0.0).values()) == {1.0}
    assert scale_extra(table, 1.0) == table
    assert cost_fn(half)(3) == _pytest.approx(1.375)  # between 2 and 4 rows
    with _pytest.raises(ValueError):
        scale_extra(table, -0.1)


def test_replay_groups_sharegpt_chats_with_chat_and_pastes_with_paste_and_ask():
    from benchmarks.oracle.ngram_mod_replay import group_of

    assert group_of("sharegpt-long") == "paste-and-ask"
    assert group_of("sharegpt-code") == "paste-and-ask"
    assert group_of("sharegpt") == "multi-turn chat"  # benchmarks/sets/heldout_sets.py's chats
    assert group_of("mt-bench/writing") == "multi-turn chat"
