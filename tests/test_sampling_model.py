"""Sampling through the tree on the real model: exactness in distribution (the first token and a
token deep inside an accepted path), seeded identity with `ar`, seeds, greedy untouched."""

from __future__ import annotations

import collections
import json

import pytest

from adaspark_app.engine import sampling as sampling_mod
from adaspark_app.engine.chat_engine import ChatEngine
from adaspark_app.engine.decoder import Decoder
from adaspark_app.engine.sampling import SamplingSettings, processed_distribution
from adaspark_app.runner import Conversation, run_conversation

pytestmark = [pytest.mark.model, pytest.mark.long]

# A passage to copy: the n-gram index proposes its continuation, so tokens of the reply are drawn
# at rows deep inside a verified path, not only at the anchor.
COPY = ("Copy this sentence exactly, word for word: The old lighthouse keeper climbed the spiral stairs "
        "every evening to light the lamp for the ships at sea.")
FALSE_ALARM = 1e-3  # each chi-square test rejects a correct sampler with probability 1e-3


@pytest.fixture(scope="module")
def engines(model_path):
    made = {arm: ChatEngine(model_path, arm=arm, self_check=arm != "ar") for arm in ("ar", "pinned:8", "chain:4",
                                                                                    "adaspark")}
    yield made
    for e in made.values():
        e.close()


def _reference(engine: ChatEngine, prompt: list[int], s: SamplingSettings) -> dict[int, float]:
    """The target's processed distribution after `prompt`, computed directly: a fresh prefill."""
    engine.reset_conversation()
    b = engine.backend
    b.prefill(prompt, 0, argmax=False)
    d = processed_distribution(b.logits_view(1)[0].copy(), s, prompt[-s.repeat_last_n:])
    engine.reset_conversation()
    return d.as_dict()


def _chi_square_p(observed: collections.Counter, ref: dict[int, float]) -> float:
    """Chi-square goodness of fit; tokens expected fewer than 5 times pooled into one bin."""
    n = sum(observed.values())
    big = [t for t, p in ref.items() if p * n >= 5]
    exp = [ref[t] * n for t in big]
    obs = [observed.get(t, 0) for t in big]
    rest_exp = n - sum(exp)
    if rest_exp >= 1e-9:
        exp.append(rest_exp)
        obs.append(n - sum(obs))
    if len(exp) < 2:
        return 1.0
    from scipy import stats  # imported here: 0.7 s, else paid by every worker at collection
    return float(stats.chisquare(obs, exp).pvalue)


def test_sampled_tokens_follow_the_targets_distribution_deep_in_the_tree(engines):
    """Over many seeds with `pinned:8`: the first token (from the prefill) and a token drawn at a row
    deep inside a verified path (depth >= 1: its prefix holds accepted candidates of the same
    round) follow the target's processed distribution for their prefix, computed directly.

    The token at position k, among the seeds whose reply starts with the same k tokens, is a draw
    at that prefix: u for position k is independent of the earlier positions' u. The prefix and k
    are chosen from the prefixes alone, never from the tokens under test."""
    eng = engines["pinned:8"]
    s = SamplingSettings(temperature=1.0, seed=0)
    msgs = [{"role": "user", "content": COPY}]
    prompt = eng.prompt_tokens(msgs)
    n_seeds, cap = 150, 8  # the least certain prefix reached in the tree is 7 tokens long
    samples = []  # (reply tokens, depth of each token's row in its round)
    for seed in range(n_seeds):
        depth: list[int] = []  # the depth of each reply token's row in its round (0: the anchor's)

        def on_round(ev):
            if not ev.prefill:  # the prefill's event is sent only with visible text: counted below
                depth.extend(range(ev.committed))

        r = eng.generate("exact", msgs, max_tokens=cap, on_round=on_round,
                         sampling=SamplingSettings(temperature=1.0, seed=seed))
        depth.insert(0, 0)  # the first token: the prefill's row
        assert len(depth) == len(r.tokens)
        samples.append((r.tokens, depth))
    eng.reset_conversation()

    first = collections.Counter(t[0] for t, _ in samples)
    p_first = _chi_square_p(first, _reference(eng, prompt, s))
    assert p_first > FALSE_ALARM, f"first token: chi-square p = {p_first:.2e}, counts {first.most_common(5)}"

    # deep tokens: (k, prefix) -> tokens at k drawn at depth >= 1
    deep: dict[tuple[int, tuple[int, ...]], list[int]] = collections.defaultdict(list)
    for toks, depth in samples:
        for k in range(1, len(toks)):
            if depth[k] >= 1:
                deep[(k, tuple(toks[:k]))].append(toks[k])
    # among the prefixes reached often enough, the one whose next token is the least certain
    # (the n-gram proposes once the reply's last four tokens occur in the prompt, so the copy's
    # "... climbed the spiral" -> "stairs" / "stair" is drawn three rows deep in a round's tree)
    groups = [(kp, drawn) for kp, drawn in deep.items() if len(drawn) >= 30]
    refs = [(max(ref.values()), kp, drawn, ref) for kp, drawn in groups
            for ref in [_reference(eng, prompt + list(kp[1]), s)]]
    refs.sort(key=lambda r: r[0])
    assert refs and refs[0][0] <= 0.9, (
        "no prefix with an uncertain next token was reached inside the tree: "
        f"{[(k, len(d), round(m, 3)) for m, (k, _), d, _ in refs]}")
    _, (k, prefix), drawn, ref = refs[0]
    p = _chi_square_p(collections.Counter(drawn), ref)
    assert p > FALSE_ALARM, (f"token {k} after {eng.backend.detokenize(list(prefix))!r}: chi-square "
                             f"p = {p:.2e}, counts {collections.Counter(drawn).most_common(5)}, "
                             f"reference {sorted(ref.items(), key=lambda kv: -kv[1])[:5]}")


def _conversation_replies(engine: ChatEngine, conv: Conversation, s: SamplingSettings) -> list[str]:
    out = [r.text for r in run_conversation(engine, conv, 32, sampling=s)]
    engine.reset_conversation()
    return out


CONVS = [Conversation("copy", [COPY, "Now copy it again, then add one sentence about the sea."]),
         Conversation("chat", ["Write a short poem about a cat who likes the rain.", "Make it funnier."])]


@pytest.mark.parametrize("temperature,seed", [(0.3, 11), (1.0, 13)])
def test_seeded_replies_are_byte_identical_to_ar(engines, temperature, seed):
    """Two-turn conversations, a seed per temperature: every speculative arm's reply equals
    `ar`'s, and the speculative arms did accept drafted tokens (so the equality went through the
    tree)."""
    accepted = 0
    s = SamplingSettings(temperature=temperature, seed=seed)
    for conv in CONVS:
        base = _conversation_replies(engines["ar"], conv, s)
        for arm in ("pinned:8", "adaspark"):  # a chain is a tree of one branch: pinned:8 covers its walk
            got = [r for r in run_conversation(engines[arm], conv, 32, sampling=s)]
            engines[arm].reset_conversation()
            accepted += sum(sum(r.accepted_by_source.values()) for r in got)
            assert [r.text for r in got] == base, f"{arm} T={temperature} seed={seed} {conv.id}"
    assert accepted > 0


def test_repeat_penalty_in_the_tree_matches_ar(engines):
    """A strong repeat penalty on a copy task: each tree row must be penalised for its own path,
    else the walk draws differently from plain decode and the replies part."""
    s = SamplingSettings(temperature=0.7, repeat_penalty=1.5, repeat_last_n=16, seed=3)
    conv = CONVS[0]
    base = _conversation_replies(engines["ar"], conv, s)
    for arm in ("pinned:8", "chain:4"):
        assert _conversation_replies(engines[arm], conv, s) == base, arm


def test_seeds_give_different_replies_and_the_same_seed_the_same(engines):
    msgs = [{"role": "user", "content": "Tell me about your favourite season."}]
    eng = engines["pinned:8"]

    def reply(seed):
        r = eng.generate("seeds", msgs, max_tokens=24, sampling=SamplingSettings(temperature=0.7, seed=seed))
        return r

    a, b, c = reply(11), reply(12), reply(11)
    eng.reset_conversation()
    assert a.text == c.text
    assert a.text != b.text
    assert (a.seed, b.seed) == (11, 12) and a.sampling["temperature"] == 0.7
    assert json.loads(json.dumps(a.to_json()))["sampling"]["seed"] == 11


def test_temperature_zero_is_the_greedy_path_without_distributions(engines, monkeypatch):
    """temperature 0 decodes exactly as before sampling existed and never computes a distribution."""
    eng = engines["pinned:8"]
    msgs = [{"role": "user", "content": COPY}]
    before = eng.generate("g", msgs, max_tokens=24).text
    eng.reset_conversation()

    def boom(*a, **k):
        raise AssertionError("a distribution was computed at temperature 0")

    monkeypatch.setattr(sampling_mod, "processed_distribution", boom)
    assert eng.generate("g", msgs, max_tokens=24, sampling=SamplingSettings(temperature=0.0, seed=5)).text == before
    eng.reset_conversation()


def test_sampled_rounds_learn_in_their_own_temperature_band(engines):
    """adaspark at T=0.7: the learned state gains band 2 ("by_temperature"), greedy's acceptance
    model is left as it was, and the state survives a save/load through JSON."""
    eng = engines["adaspark"]
    dec = eng.decoder
    greedy_before = json.dumps(dec.learners._bands[0][1].state_dict(), sort_keys=True)
    conv = CONVS[0]
    run_conversation(eng, conv, 32, sampling=SamplingSettings(temperature=0.7, seed=1))
    eng.reset_conversation()
    state = json.loads(json.dumps(dec.state_dict()))
    assert "2" in state["by_temperature"]
    assert json.dumps(dec.learners._bands[0][1].state_dict(), sort_keys=True) == greedy_before
    assert dec.learners._bands[2][0].cost is dec.learners._bands[0][0].cost  # one verify-cost model
    fresh = Decoder(eng.backend, eng.arm)
    fresh.load_state(state)
    assert json.loads(json.dumps(fresh.state_dict())) == state
    assert fresh.learners._bands[2][0].cost is fresh.learners._bands[0][0].cost


def test_sampled_reply_records_settings_in_out_and_rounds(engines, tmp_path):
    rounds = tmp_path / "rounds.jsonl"
    s = SamplingSettings(temperature=0.7, top_k=20, seed=42)
    with open(rounds, "w") as fh:
        res = run_conversation(engines["pinned:8"], Conversation("log", [COPY]), 16, log_rounds=fh, sampling=s)
    engines["pinned:8"].reset_conversation()
    out = res[0].to_json()
    assert out["sampling"] == s.to_json() and out["seed"] == 42
    rows = [json.loads(line) for line in rounds.read_text().splitlines()]
    assert rows and all(r["sampling"]["top_k"] == 20 and r["seed"] == 42 for r in rows)
