"""Every arm on the real model: lossless by the engine's self-check, and byte-identical to plain
decode (the KV cache types keep one-row and multi-row attention on one kernel: backend.py)."""

from __future__ import annotations

import pytest

from adaspark_app.engine.chat_engine import ChatEngine
from engine_clock import deterministic_clock

pytestmark = [pytest.mark.model, pytest.mark.long]  # every test here loads the bundled model

ARMS = ["ar", "chain:4", "pinned:8", "adaspark"]
MAX_TOKENS = 40


@pytest.fixture(scope="module")
def replies(model_path, public_prompts):
    """First-turn replies of every public prompt under every arm, with the self-check on; on the
    deterministic clock, so what `adaspark` chose (and so whether it verified any rows) does not
    depend on the machine's load."""
    out: dict[str, list] = {}
    for arm in ARMS:
        with deterministic_clock():
            eng = ChatEngine(model_path, arm=arm, n_ctx=2048, self_check=True)
            try:
                res = []
                for conv in public_prompts[:6]:
                    r = eng.generate(conv["id"], [{"role": "user", "content": conv["turns"][0]}],
                                     max_tokens=MAX_TOKENS)
                    res.append(r)
                out[arm] = (res, eng.decoder.counters.checked_rows)
            finally:
                eng.close()
    return out


@pytest.mark.parametrize("arm", ARMS)
def test_every_arm_is_lossless_by_self_check(replies, arm):
    """The self-check asserted, row by row, that each emitted token is the argmax of the row whose
    prefix is exactly the emitted prefix; it ran on every verified round without an error."""
    res, checked = replies[arm]
    assert all(r.n_tokens > 0 and r.text.strip() for r in res)
    if arm != "ar":
        assert checked > 0


@pytest.mark.parametrize("arm", ["chain:4", "pinned:8", "adaspark"])
def test_replies_identical_to_plain_decode(replies, arm):
    base = [r.tokens for r in replies["ar"][0]]
    other = [r.tokens for r in replies[arm][0]]
    same = sum(a == b for a, b in zip(base, other))
    share = same / len(base)
    assert share == 1.0, f"{arm}: {same}/{len(base)} replies byte-identical to ar"


def test_speculative_arms_verify_wider_rows(replies):
    """chain:4 and pinned:8 really verify more than one row in some rounds (not plain decode in disguise)."""
    for arm in ("chain:4", "pinned:8"):
        widths = {}
        for r in replies[arm][0]:
            for w, n in r.widths.items():
                widths[w] = widths.get(w, 0) + n
        assert any(w > 1 for w in widths), (arm, widths)


@pytest.mark.parametrize("arm", ["pinned:8", "adaspark"])
def test_no_round_verifies_rows_past_the_token_cap(model_path, arm):
    """A round commits at most as many tokens as it verifies rows, so near the cap the rows are
    capped by what the reply may still emit. The reply copies a pasted passage, so wide rounds
    run right up to each cap tried."""
    passage = ("The committee met on Tuesday to review the budget, the hiring plan and the new "
               "office lease, and it agreed to publish the minutes by the end of the month.")
    msgs = [{"role": "user", "content": f"Repeat this text word for word: {passage}"}]
    widest = 0
    with deterministic_clock():  # `adaspark`'s widths, and so `widest`, follow the clock
        eng = ChatEngine(model_path, arm=arm, n_ctx=2048)
        try:
            for cap in range(12, 30, 3):
                events = []
                r = eng.generate(f"cap{cap}", msgs, max_tokens=cap, on_round=events.append)
                assert r.n_tokens <= cap
                for e in events:
                    if e.round_index:  # a verify round: reply_tokens counts what it emitted
                        before = e.reply_tokens - e.committed
                        assert e.width <= cap - before, (cap, before, e.width)
                        widest = max(widest, e.width)
                eng.reset_conversation()
        finally:
            eng.close()
    assert widest > 3  # the rounds were wide: the cap, not the tree, bounded the last ones


def test_adaspark_widths_follow_the_outputs_alone_on_the_deterministic_clock(model_path, public_prompts):
    """What makes the tests above deterministic: two fresh engines on the fake clock choose the
    same width in every round (on the real clock they differ with the machine's load)."""
    runs = []
    for _ in range(2):
        widths: list[int] = []
        with deterministic_clock():
            eng = ChatEngine(model_path, arm="adaspark", n_ctx=2048)
            try:
                for conv in public_prompts[8:11]:
                    eng.generate(conv["id"], [{"role": "user", "content": conv["turns"][0]}],
                                 max_tokens=MAX_TOKENS, on_round=lambda e: widths.append(e.width))
            finally:
                eng.close()
        runs.append(widths)
    assert len(runs[0]) > 10 and max(runs[0]) > 1  # it ran, and drafted
    assert runs[0] == runs[1]
