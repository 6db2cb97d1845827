"""The n-gram index of §3.3: copies of earlier passages, follower fallback, depth limit, p_src."""

from __future__ import annotations

import random
import sys

import numpy as np
import pytest

from adaspark_app.engine.ngram import BACKOFF_CONTEXTS, BACKOFF_EVIDENCE, NgramIndex, NgramStep
from adaspark_app.learn.kinds import NgramKind
from adaspark_app.learn.precision import SourcePrecision
from adaspark_app.learn.constants import NGRAM_MAX_DEPTH


def _tokens(rng: random.Random, n: int, lo: int = 1000, hi: int = 50_000) -> list[int]:
    return [rng.randrange(lo, hi) for _ in range(n)]


def test_copy_proposes_the_rest_of_a_pasted_passage():
    """Guards the copy rule: when the reply starts repeating a passage of the prompt, the chain
    reads on along that passage, marked a copy with the matched context length as evidence."""
    rng = random.Random(1)
    passage = _tokens(rng, 120)
    text = _tokens(rng, 30) + passage + _tokens(rng, 40) + passage[:10]
    steps = NgramIndex(text).chain((), 20)
    assert [s.token for s in steps] == passage[10:30]
    assert all(s.kind == NgramKind.COPY for s in steps)
    assert [s.evidence for s in steps] == list(range(10, 30))  # the match grows as the copy reads on


def test_chain_stops_at_the_depth_limit_and_caps_evidence():
    """Guards "chains stop 32 tokens below the anchor": a passage that continues for hundreds of
    tokens still yields at most max_depth steps, and copy evidence is capped at 32."""
    rng = random.Random(2)
    passage = _tokens(rng, 400)
    idx = NgramIndex(passage + _tokens(rng, 5) + passage[:50])
    steps = idx.chain((), NGRAM_MAX_DEPTH)
    assert len(steps) == NGRAM_MAX_DEPTH == 32
    assert [s.token for s in steps] == passage[50:82]
    assert max(s.evidence for s in steps) == 32
    assert len(idx.chain()) == 32  # the default depth is the paper's limit
    # from a drafter pick at depth 5 the engine asks for 32 - 5 more
    assert len(idx.chain(passage[50:55], NGRAM_MAX_DEPTH - 5)) == 27


def test_copy_follows_the_most_recent_occurrence_of_the_longest_match():
    """Guards the choice of passage: the longest matching context wins over a more recent but
    shorter match; among equally long matches, the most recent occurrence wins."""
    a, b, c, d, e = 11, 12, 13, 14, 15
    # older: [a b c d e] -> 100 ; newer: [x b c d e] -> 200 ; now: [a b c d e]: 5 tokens match the older
    idx = NgramIndex([a, b, c, d, e, 100, 101, 9, 9, 9, 77, b, c, d, e, 200, 201, 8, 8, 8, a, b, c, d, e])
    assert idx.chain((), 2)[0] == NgramStep(100, NgramKind.COPY, 5)
    # two occurrences of the same 5 tokens: the newer one's continuation
    idx = NgramIndex([a, b, c, d, e, 100, 7, 7, 7, a, b, c, d, e, 300, 6, 6, 6, a, b, c, d, e])
    assert idx.chain((), 1)[0].token == 300


def test_follower_fallback_uses_the_most_frequent_follower_of_the_last_three_tokens():
    """Guards the fallback: with no earlier passage matching 4 or more tokens, the step is the
    most frequent follower of the last 3 tokens (its count as evidence), not the most recent."""
    x, y = 500, 600
    text = []
    for lead in (1, 2, 3):
        text += [lead, 7, 8, 9, x]
    text += [4, 7, 8, 9, y]  # the most recent follower is y, but x is the most frequent
    text += [5, 7, 8, 9]  # [5 7 8 9] never occurred: no copy
    steps = NgramIndex(text).chain((), 1)
    assert steps == [NgramStep(x, NgramKind.FOLLOWER, 3)]


def test_backoff_proposes_the_last_two_tokens_follower_then_the_last_ones():
    """Guards the backoff (NgramIndex's ``backoff``): where no passage and no follower of the last
    3 tokens propose, the most frequent follower of the last 2 does, else of the last token, as a
    follower of evidence BACKOFF_EVIDENCE; the paper's index (the default) proposes nothing there."""
    two = [1, 2, 3, 50, 9, 2, 3, 60, 8, 2, 3, 50, 7, 2, 3]  # (7, 2, 3) is new; (2, 3) was followed by 50 twice
    assert NgramIndex(two, backoff=BACKOFF_CONTEXTS).chain((), 1) == [NgramStep(50, NgramKind.FOLLOWER, BACKOFF_EVIDENCE)]
    assert NgramIndex(two).chain((), 1) == []
    one = [4, 70, 5, 71, 6, 70, 9, 4]  # (9, 4) is new; 4 was followed by 70
    assert NgramIndex(one, backoff=BACKOFF_CONTEXTS).first_step() == NgramStep(70, NgramKind.FOLLOWER, BACKOFF_EVIDENCE)
    three = [1, 2, 3, 40, 7, 2, 3, 41, 1, 2, 3]  # the last 3 tokens' follower wins over the last 2's
    assert NgramIndex(three, backoff=BACKOFF_CONTEXTS).first_step() == NgramStep(40, NgramKind.FOLLOWER, 1)
    assert NgramIndex([1, 2, 3, 4], backoff=BACKOFF_CONTEXTS).first_step() is None  # the last token never recurred
    assert NgramIndex([1, 2, 3, 4], backoff=BACKOFF_CONTEXTS, stop={70}.__contains__).chain((), 3) == []
    assert NgramIndex(one, backoff=BACKOFF_CONTEXTS, stop={70}.__contains__).first_step() is None  # nor a stop token


def test_backoff_contexts_are_the_ones_given_and_shorter_than_the_followers():
    one = [4, 70, 5, 71, 6, 70, 9, 4]  # only the last token's follower proposes
    assert NgramIndex(one, backoff=(2,)).first_step() is None
    assert NgramIndex(one, backoff=(1,)).first_step() == NgramStep(70, NgramKind.FOLLOWER, BACKOFF_EVIDENCE)
    for bad in ((3,), (0,), (2, 5)):
        with pytest.raises(ValueError, match="shorter than 3"):
            NgramIndex(one, backoff=bad)


def test_backoff_followers_are_a_precision_class_of_their_own():
    """The source's precision learns the backoff's guesses apart (evidence 0 of the follower row,
    which no 3-token follower has): the bundled model's backoffs are right 24-65% of the time, the
    index's other first proposals ~90%."""
    rng = random.Random(7)
    text = [rng.randrange(30) for _ in range(400)]
    prec = SourcePrecision()
    NgramIndex(text[:10], backoff=BACKOFF_CONTEXTS).extend(text[10:], prec)
    assert prec.class_trials[int(NgramKind.FOLLOWER), BACKOFF_EVIDENCE] > 50
    off = SourcePrecision()
    NgramIndex(text[:10]).extend(text[10:], off)
    assert off.class_trials[int(NgramKind.FOLLOWER), BACKOFF_EVIDENCE] == 0


def test_chain_stops_when_nothing_is_proposed():
    """Guards the stop rule: text that never repeats proposes nothing."""
    idx = NgramIndex(list(range(100)))
    assert idx.chain((), 32) == []
    assert idx.predict_next() is None
    assert NgramIndex().chain((1, 2, 3), 5) == []


def test_chain_starts_after_an_uncommitted_suffix():
    """Guards chains from a drafter pick: the suffix (picks not yet committed) is part of the
    context, and the chain continues after it, not after the committed text."""
    rng = random.Random(3)
    passage = _tokens(rng, 60)
    idx = NgramIndex(passage + _tokens(rng, 10) + passage[:8])
    from_anchor = idx.chain((), 5)
    assert [s.token for s in from_anchor] == passage[8:13]
    after_picks = idx.chain(passage[8:12], 5)  # the drafter's first 4 picks agree with the passage
    assert [s.token for s in after_picks] == passage[12:17]
    assert after_picks[0].evidence == 12
    # picks that leave the passage: the chain follows the new context (here: nothing matches)
    assert idx.chain([1, 2, 3, 4], 5) == []
    assert len(idx) == 78  # the suffix is not committed


def test_copy_may_overlap_its_own_output():
    """Guards reading on past the end of the committed text: a repeating cycle is continued
    from the chain's own tokens (LZ77-style overlap)."""
    cycle = [21, 22, 23, 24, 25]
    steps = NgramIndex(cycle * 2 + cycle[:2]).chain((), 12)
    assert [s.token for s in steps] == (cycle * 4)[2:14]


@pytest.mark.parametrize("backoff", [(), BACKOFF_CONTEXTS])
def test_incremental_extend_equals_building_from_scratch(backoff):
    """Guards incremental updates: extending round by round gives the same index (tables and
    every proposal) as indexing the whole text at once."""
    rng = random.Random(4)
    base = _tokens(rng, 300, 1, 40)  # a small vocabulary: many repeats and follower counts
    text = base + base[50:180] + _tokens(rng, 200, 1, 40) + base[10:90]
    whole = NgramIndex(text, backoff=backoff)
    inc = NgramIndex(text[:100], backoff=backoff)
    pos = 100
    while pos < len(text):
        step = rng.randint(1, 9)
        inc.extend(text[pos : pos + step])
        pos += step
    assert len(inc) == len(whole) == len(text)
    assert inc._pos == whole._pos and inc._follow == whole._follow and inc._best == whole._best
    assert inc._short == whole._short and bool(whole._short) == bool(backoff)
    assert inc._ambiguous == whole._ambiguous and len(whole._ambiguous) > 0
    proposed = 0
    for k in range(60):
        start = rng.randrange(len(text) - 8)
        suffix = text[start : start + k % 7]
        a = inc.chain(suffix, 32)
        assert a == whole.chain(suffix, 32)
        proposed += bool(a)
    assert proposed > 30  # the comparison is not between empty chains
    assert inc.predict_next() == whole.predict_next()


def test_anchor_is_ambiguous_where_earlier_passages_part_ways():
    """A context of 4 tokens continued once by x and later by y is ambiguous at the anchor; a
    context that was always continued the same way, or never seen, is not. Checked against a
    direct scan of the text at every position of a repetitive random text."""
    a, b, c, d, x, y = 1, 2, 3, 4, 5, 6
    idx = NgramIndex([a, b, c, d, x, 9, 9, a, b, c, d, x, 8])
    idx.extend([a, b, c, d])
    assert not idx.anchor_ambiguous(), "continued by x both times"
    idx.extend([y, 7, a, b, c, d])
    assert idx.anchor_ambiguous(), "continued by x, then by y"
    idx.extend([7, 7, 7])
    assert not idx.anchor_ambiguous()

    rng = random.Random(9)
    text = _tokens(rng, 400, 1, 12)
    scan = NgramIndex(text[:4])
    for i in range(4, len(text)):
        tail = text[i - 4 : i]
        nexts = {text[k + 4] for k in range(i - 4) if text[k : k + 4] == tail}
        assert scan.anchor_ambiguous() == (len(nexts) >= 2), i
        scan.extend([text[i]])


def test_source_precision_tracks_top1_hits_with_a_beta_prior():
    """Guards p_src: Beta(1,1)-smoothed top-1 precision over committed tokens where the index
    proposed something; positions with no proposal do not count."""
    p = SourcePrecision()
    assert p.value == 0.5
    p.observe(None, 5)
    assert p.trials == 0 and p.value == 0.5
    for predicted, actual in ((1, 1), (2, 2), (3, 4)):
        p.observe(NgramStep(predicted, NgramKind.COPY, 5), actual)
    # decayed counts (PRECISION_HALF_LIFE): three tokens fade them by well under a percent
    assert (p.hits, p.trials) == pytest.approx((2, 3), rel=1e-2)
    assert p.value == pytest.approx(3 / 5, rel=1e-2)
    assert (p.class_hits[1, 5], p.class_trials[1, 5]) == pytest.approx((2, 3), rel=1e-2)


def test_extend_with_precision_scores_each_token_before_indexing_it():
    """Guards the engine's one-call bookkeeping: extend(tokens, precision) equals predicting
    each token from the text before it, then indexing it; a repeated passage scores high."""
    rng = random.Random(5)
    passage = _tokens(rng, 80)
    prompt = passage + _tokens(rng, 20)
    reply = passage[:60]
    idx_a, p_a = NgramIndex(prompt), SourcePrecision()
    for t in reply:
        p_a.observe(idx_a.first_step(), t)
        idx_a.extend([t])
    idx_b, p_b = NgramIndex(prompt), SourcePrecision()
    idx_b.extend(reply[:25], p_b)
    idx_b.extend(reply[25:], p_b)
    assert (p_a.hits, p_a.trials) == (p_b.hits, p_b.trials)
    assert (p_a.class_hits == p_b.class_hits).all() and (p_a.class_trials == p_b.class_trials).all()
    assert p_b.value > 0.85  # once 4 tokens match, the copy is right every time


def _lines_run(fn) -> int:
    """Python lines executed by fn(): a measure of work that, unlike seconds, is the same on every
    machine under any load."""
    n = 0

    def trace(frame, event, arg):
        nonlocal n
        if event == "line":
            n += 1
        return trace

    sys.settrace(trace)
    try:
        fn()
    finally:
        sys.settrace(None)
    return n


def _round_work(text_tokens: int) -> float:
    """Lines run per round on a text of about `text_tokens` + 1,200 tokens that pastes a passage:
    extend by a round's 3 tokens and run 8 chains of depth up to 32 (the anchor and each pick)."""
    rng = random.Random(6)
    text = _tokens(rng, text_tokens, 1, 2000)
    text += text[300:1800]
    cut = len(text) - 300  # the reply copies the last 300 tokens of the passage, then new text
    idx = NgramIndex(text[:cut])
    rest = text[cut:] + _tokens(rng, 400, 1, 2000)
    rounds = 60

    def run() -> None:
        for r in range(rounds):
            picks = rest[r * 3 : r * 3 + 8]
            for depth in range(8):
                idx.chain(picks[:depth], NGRAM_MAX_DEPTH - depth)
            idx.extend(rest[r * 3 : r * 3 + 3])

    return _lines_run(run) / rounds


def test_chains_cost_per_round_does_not_grow_with_the_text():
    """Guards the per-round budget: a round's n-gram work is hash lookups bounded by the chain
    depth, not a scan of the text, so it stays far below a verify's time at any context. Counted
    in Python lines run (about 5,000 per round here, the same at 4,000 and at 26,000 tokens); one
    scan of a 4,000-token text for each of the 8 chains would be over 32,000."""
    short, long = _round_work(2_500), _round_work(25_000)
    assert short < 20_000, short
    assert long < 1.25 * short, (short, long)


def test_first_step_is_the_chain_head_and_follows_extend():
    idx = NgramIndex([5, 6, 7, 8, 9, 1, 2, 5, 6, 7, 8])
    first = idx.first_step()
    assert first is not None and first.kind == NgramKind.COPY and first.token == 9 and first.evidence == 4
    assert idx.predict_next() == 9
    idx.extend([9, 1])
    assert idx.first_step().token == 2 and idx.first_step().evidence == 6
    assert NgramIndex([1, 2, 3]).first_step() is None


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_cached_first_step_is_the_chains_first_step_at_every_length(seed):
    """Guards ``first_step``'s own lookup (it skips the chain's machinery): after every token of a
    text that copies itself, part-copies, loops and holds stop tokens, it equals ``chain((), 1)``'s
    step, the copy's matched length included."""
    rng = random.Random(seed)
    words = [rng.randrange(50) for _ in range(60)]
    text: list[int] = []
    while len(text) < 700:
        r = rng.random()
        if r < 0.4 and len(text) > 40:  # a copy of an earlier passage, a few tokens to 40
            start = rng.randrange(len(text) - 5)
            text += text[start:start + rng.randrange(3, 41)]
        elif r < 0.7:
            text += rng.sample(words, rng.randrange(1, 6))  # a small vocabulary: followers repeat
        else:
            text.append(rng.randrange(1000))
    stop = {words[0], 999}.__contains__
    for backoff in ((), BACKOFF_CONTEXTS):
        idx = NgramIndex(text[:5], stop=stop, backoff=backoff)
        seen_kinds = set()
        for t in text[5:]:
            chained = idx.chain((), 1)
            step = idx.first_step()
            assert step == (chained[0] if chained else None)
            if step is not None:
                seen_kinds.add((step.kind, min(step.evidence, 5)))
            idx.extend([t])
        assert {k for k, _ in seen_kinds} == {NgramKind.COPY, NgramKind.FOLLOWER} and len(seen_kinds) > 4
        assert ((NgramKind.FOLLOWER, BACKOFF_EVIDENCE) in seen_kinds) == bool(backoff)


def test_source_precision_per_class_recovers_known_rates():
    """Guards the class precisions that price chain nodes: from a seeded stream of first steps
    whose hit rates are known per (kind, evidence), for_class recovers each rate; a class never
    seen reads its evidence bin's value, a kind with no proposal the overall value."""
    rng = np.random.default_rng(3)
    rates = {(NgramKind.COPY, 4): 0.55, (NgramKind.COPY, 9): 0.85, (NgramKind.COPY, 32): 0.99,
             (NgramKind.FOLLOWER, 1): 0.35}
    p = SourcePrecision()
    for _ in range(4000):
        kind, ev = list(rates)[rng.integers(len(rates))]
        hit = rng.random() < rates[(kind, ev)]
        p.observe(NgramStep(7, kind, ev), 7 if hit else 8)
    got = p.for_class(np.array([1, 1, 1, 2]), np.array([4, 9, 32, 1]))
    np.testing.assert_allclose(got, list(rates.values()), atol=0.04)
    # evidence 10 was never seen: it reads its bin (8-15), where only evidence 9 was seen
    assert p.for_class(np.array([1]), np.array([10]))[0] == pytest.approx(got[1], abs=0.03)
    # evidence past the cap shares the capped class
    assert p.for_class(np.array([1]), np.array([500]))[0] == pytest.approx(got[2], abs=1e-12)
    assert p.for_class(np.array([0]), np.array([9]))[0] == pytest.approx(p.value)
    overall = sum(rates.values()) / len(rates)
    assert p.value == pytest.approx(overall, abs=0.03)


def test_source_precision_class_shrinks_a_sparse_class_toward_its_bin():
    """Two hits must not read as certainty: a class seen twice sits between its bin and 1."""
    p = SourcePrecision()
    for i in range(200):  # evidence 5: half right
        p.observe(NgramStep(1, NgramKind.COPY, 5), 1 if i % 2 else 2)
    for _ in range(2):
        p.observe(NgramStep(1, NgramKind.COPY, 6), 1)
    bin_value = p.for_class(np.array([1]), np.array([7]))[0]  # unseen, same bin (4-7)
    sparse = p.for_class(np.array([1]), np.array([6]))[0]
    assert 0.45 < bin_value < 0.56
    assert bin_value < sparse < 0.8


def test_source_precision_state_round_trips_and_rejects_bad_counts():
    p = SourcePrecision()
    idx = NgramIndex(list(range(100, 160)))
    idx.extend(list(range(100, 140)), p)
    q = SourcePrecision()
    q.load_state(p.state_dict())
    ks, es = np.array([1, 1, 2, 0]), np.array([4, 32, 1, 3])
    np.testing.assert_array_equal(q.for_class(ks, es), p.for_class(ks, es))
    assert (q.hits, q.trials) == (p.hits, p.trials)
    bad = p.state_dict()
    bad["class_hits"][1][32] = bad["class_trials"][1][32] + 1
    with pytest.raises(ValueError):
        SourcePrecision().load_state(bad)
    with pytest.raises(ValueError):
        SourcePrecision().load_state({"hits": 1})


def test_extend_feeds_the_class_of_each_first_step():
    """On a pasted passage being copied, the long-match copy class is right every time while a
    short match is not: the classes separate what one p_src averages."""
    rng = random.Random(11)
    passage = _tokens(rng, 120)
    prompt = passage + _tokens(rng, 30) + passage[:6] + _tokens(rng, 10)
    p = SourcePrecision()
    idx = NgramIndex(prompt)
    idx.extend(passage[:100], p)
    long_copy = p.for_class(np.array([1]), np.array([32]))[0]
    assert p.class_trials[1, 32] > 50
    assert long_copy > 0.95
    assert long_copy > p.value


def test_chain_ends_before_a_stop_token():
    """Guards ``stop`` (the vocabulary's control tokens in the engine): a copy reads on along its
    passage up to, not into, a stop token, and a follower that is one is not proposed."""
    rng = random.Random(5)
    passage = _tokens(rng, 60)
    stop_token = 7
    passage[25] = stop_token
    text = _tokens(rng, 30) + passage + _tokens(rng, 40) + passage[:10]
    stops = {stop_token}.__contains__
    assert [s.token for s in NgramIndex(text).chain((), 20)] == passage[10:30]  # without: runs on
    assert [s.token for s in NgramIndex(text, stop=stops).chain((), 20)] == passage[10:25]
    follow = [1, 7, 8, 9, 500, 2, 7, 8, 9, 500, 3, 7, 8, 9]
    assert NgramIndex(follow).chain((), 1) == [NgramStep(500, NgramKind.FOLLOWER, 2)]
    assert NgramIndex(follow, stop={500}.__contains__).chain((), 1) == []
    assert NgramIndex(follow, stop={500}.__contains__).first_step() is None


def _state(index: NgramIndex) -> tuple:
    return tuple(getattr(index, slot) for slot in ("_tokens", "_pos", "_follow", "_best", "_ambiguous"))


def test_an_index_extended_is_the_index_built_over_the_whole_text():
    import random

    rng = random.Random(5)
    text = [rng.randrange(40) for _ in range(3000)]  # a small vocabulary: repeats, ambiguous contexts
    for cut in (0, 1, 2, 17, 1500, 2999, 3000):
        grown = NgramIndex(text[:cut])
        grown.chain()  # its caches filled at the shorter text
        grown.extend(text[cut:])
        whole = NgramIndex(text)
        assert _state(grown) == _state(whole)
        assert grown.chain() == whole.chain() and grown.long_copy() == whole.long_copy()


def test_a_reply_in_the_same_conversation_extends_the_index_and_another_rebuilds_it():
    from adaspark_app.engine.proposers import NgramSource
    from adaspark_app.learn.precision import SourcePrecision

    src = NgramSource(lambda t: False, SourcePrecision())
    history = list(range(100)) * 3
    src.begin(history)
    first = src.index
    src.begin(history + [7, 8, 9])  # the next prompt holds the history: the same index, grown
    assert src.index is first and first.tokens == history + [7, 8, 9]
    src.begin([1, 2, 3] + history)  # another conversation's prompt: a new index
    assert src.index is not first and src.index.tokens == [1, 2, 3] + history
    src.begin([1, 2])  # shorter than what is indexed: a new one
    assert src.index.tokens == [1, 2]
