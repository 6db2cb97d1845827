"""The context window rule (engine/context_window.py) on synthetic conversations with known answers."""

from __future__ import annotations

import random

import pytest

from adaspark_app.engine.context_window import (MIN_REPLY_TOKENS, block_cuts, fit_messages, split_turns)
from adaspark_app.errors import ContextOverflowError, MessageTooLongError

GEN_PROMPT = 2  # tokens of the assistant header the counter adds to every prompt


def size(m: dict) -> int:
    """A message costs its words plus 3 (role header, end marker): a template-like counter."""
    return len(m["content"].split()) + 3


def count(messages: list[dict]) -> int:
    return sum(size(m) for m in messages) + GEN_PROMPT


def words(n: int, tag: str = "w") -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


def conversation(system: str | None, turns: list[tuple[int, int]], last: int) -> list[dict]:
    msgs = [{"role": "system", "content": system}] if system is not None else []
    for i, (u, a) in enumerate(turns):
        msgs.append({"role": "user", "content": words(u, f"u{i}_")})
        msgs.append({"role": "assistant", "content": words(a, f"a{i}_")})
    msgs.append({"role": "user", "content": words(last, "new")})
    return msgs


def test_split_turns_groups_replies_with_their_user_message():
    msgs = [{"role": "system", "content": "s"}, {"role": "assistant", "content": "hello"},
            {"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
            {"role": "user", "content": "c"}, {"role": "user", "content": "d"}]
    system, turns, last = split_turns(msgs)
    assert [m["content"] for m in system] == ["s"]
    assert [[m["content"] for m in t] for t in turns] == [["hello"], ["a", "b"], ["c"]]
    assert last["content"] == "d"
    with pytest.raises(ValueError):
        split_turns(msgs[:-1] + [{"role": "assistant", "content": "x"}])


def test_everything_fits_nothing_dropped():
    msgs = conversation("sys", [(5, 5), (5, 5)], 5)
    w = fit_messages(msgs, count, n_ctx=100, max_tokens=20)
    assert w.messages == msgs and w.dropped_turns == 0 and not w.capped
    assert w.prompt_tokens == count(msgs) == 4 + 4 * 8 + 8 + 2  # 46
    assert w.reply_tokens == 20


def test_the_exact_edge_fits_and_one_more_token_drops_a_turn():
    msgs = conversation("sys", [(5, 5), (5, 5)], 5)  # 46 tokens
    # fits when 46 + max_tokens <= n_ctx - 1
    assert fit_messages(msgs, count, n_ctx=67, max_tokens=20, block=1).dropped_turns == 0
    w = fit_messages(msgs, count, n_ctx=66, max_tokens=20, block=1)
    assert w.dropped_turns == 1
    assert w.messages == [msgs[0], *msgs[3:]]  # the system prompt, the second turn, the new message
    assert w.prompt_tokens == 46 - 16


def test_fewest_turns_dropped_with_unit_blocks():
    # system 4, five turns of 20 tokens (u 7+3=10, a 7+3=10), new message 8, generation 2
    msgs = conversation("sys", [(7, 7)] * 5, 5)
    assert count(msgs) == 4 + 100 + 8 + 2  # 114
    for n_ctx, max_tokens, dropped in [(200, 50, 0), (150, 50, 1), (141, 50, 2), (100, 30, 3),
                                       (80, 30, 4), (60, 30, 5), (130, 10, 0)]:
        w = fit_messages(msgs, count, n_ctx=n_ctx, max_tokens=max_tokens, block=1)
        assert w.dropped_turns == dropped, (n_ctx, max_tokens)
        assert w.prompt_tokens == 114 - 20 * dropped
        assert w.prompt_tokens + max_tokens <= n_ctx - 1
        assert w.messages[0]["role"] == "system" and w.messages[-1] == msgs[-1]
        assert not w.capped


def test_seeded_conversations_drop_the_fewest_turns_that_fit():
    rng = random.Random(20)
    for _ in range(200):
        turns = [(rng.randint(1, 30), rng.randint(1, 40)) for _ in range(rng.randint(0, 12))]
        system = words(rng.randint(0, 20)) if rng.random() < 0.7 else None
        msgs = conversation(system, turns, rng.randint(1, 30))
        n_ctx, max_tokens = rng.randint(64, 400), rng.randint(1, 64)
        sys_part = [msgs[0]] if system is not None else []
        try:
            w = fit_messages(msgs, count, n_ctx, max_tokens, block=1)
        except MessageTooLongError as err:
            alone = count([*sys_part, msgs[-1]])
            assert alone + min(max_tokens, MIN_REPLY_TOKENS) > n_ctx - 1
            assert err.tokens == alone
            continue
        # brute force: the fewest dropped turns whose prompt and reply fit
        best = None
        for k in range(len(turns) + 1):
            kept = [*sys_part, *msgs[len(sys_part) + 2 * k:]]
            if count(kept) + max_tokens <= n_ctx - 1:
                best = k
                break
        if best is None:
            assert w.capped and w.dropped_turns == len(turns)
            assert w.reply_tokens == n_ctx - 1 - w.prompt_tokens < max_tokens
        else:
            assert (w.dropped_turns, w.capped, w.reply_tokens) == (best, False, max_tokens)
        assert w.prompt_tokens == count(w.messages)


def test_blocks_keep_the_window_start_still_between_drops():
    """With blocks, the first kept turn moves only when a block's worth must go, so the prompt's
    prefix stays the same over the following turns (what lets the KV cache be reused)."""
    n_ctx, max_tokens = 1024, 24  # block = n_ctx // 8 = 128 tokens: about four 30-token turns

    def starts(block: int | None) -> list[int]:
        history: list[tuple[int, int]] = []
        out = []
        for _ in range(80):
            w = fit_messages(conversation("system prompt here", history, 9), count, n_ctx, max_tokens, block=block)
            assert w.prompt_tokens + max_tokens <= n_ctx - 1 and not w.capped
            out.append(w.dropped_turns)
            history.append((9, 15))  # user 12 tokens, reply 18: 30 a turn
        return out

    blocks, least = starts(None), starts(1)
    assert blocks == sorted(blocks) and least == sorted(least)
    assert all(b >= m for b, m in zip(blocks, least))
    assert all(b <= m + 128 // 30 + 1 for b, m in zip(blocks, least))  # one block and one turn more at most
    moves = lambda xs: sum(1 for a, b in zip(xs, xs[1:]) if a != b)  # noqa: E731
    assert least[-1] > 40 and moves(least) >= least[-1] - 1  # the least moves the window on every turn once full
    assert moves(blocks) <= moves(least) // 3  # blocks move it a third as often or less


def test_block_cuts_known_answers():
    assert block_cuts([10, 10, 10, 10], 20) == [0, 2, 4]
    assert block_cuts([10, 10, 10, 10], 15) == [0, 2, 3, 4]
    assert block_cuts([50, 1, 1], 20) == [0, 1, 3]
    assert block_cuts([5, 5], 100) == [0, 2]
    assert block_cuts([], 8) == [0]
    assert block_cuts([3, 3, 3], 1) == [0, 1, 2, 3]
    # appending turns keeps every earlier cut
    sizes = [7, 13, 2, 40, 9, 9, 30]
    full = block_cuts(sizes, 16)
    assert full == [0, 2, 4, 5, 6, 7]
    for n in range(len(sizes) + 1):
        # a prefix's cuts (its last one, "drop all", aside) are the full list's cuts below n
        assert block_cuts(sizes[:n], 16)[:-1] == [c for c in full if c < n][:len(block_cuts(sizes[:n], 16)) - 1]
        assert set(block_cuts(sizes[:n], 16)[:-1]) <= set(full)


def test_message_that_leaves_too_little_room_for_max_tokens_caps_the_reply():
    msgs = conversation("sys", [(5, 5)], 40)  # system 4, new message 43, generation 2: 49 alone
    w = fit_messages(msgs, count, n_ctx=80, max_tokens=64)
    assert w.capped and w.dropped_turns == 1
    assert w.prompt_tokens == 49
    assert w.reply_tokens == 80 - 1 - 49  # 30
    assert w.messages == [msgs[0], msgs[-1]]


def test_a_message_longer_than_the_context_is_refused():
    msgs = conversation("sys", [(5, 5)], 100)  # 4 + 103 + 2 = 109 alone
    with pytest.raises(MessageTooLongError) as info:
        fit_messages(msgs, count, n_ctx=100, max_tokens=32)
    err = info.value
    assert isinstance(err, ContextOverflowError)
    assert (err.tokens, err.n_ctx, err.reply_min) == (109, 100, MIN_REPLY_TOKENS)
    assert str(err).startswith("message is 109 tokens") and "the context holds 100" in str(err)
    # room for fewer than MIN_REPLY_TOKENS is refused too; a smaller max_tokens lowers that floor
    with pytest.raises(MessageTooLongError):
        fit_messages(msgs, count, n_ctx=109 + 1 + MIN_REPLY_TOKENS - 1, max_tokens=32)
    w = fit_messages(msgs, count, n_ctx=109 + 1 + MIN_REPLY_TOKENS, max_tokens=32)
    assert w.capped and w.reply_tokens == MIN_REPLY_TOKENS
    w = fit_messages(msgs, count, n_ctx=109 + 1 + 4, max_tokens=4)
    assert not w.capped and w.reply_tokens == 4


def test_no_system_prompt_and_no_history():
    msgs = [{"role": "user", "content": words(10)}]
    w = fit_messages(msgs, count, n_ctx=64, max_tokens=8)
    assert w.messages == msgs and w.dropped_turns == 0 and w.prompt_tokens == 15
    w = fit_messages(msgs, count, n_ctx=40, max_tokens=32)
    assert w.capped and w.reply_tokens == 40 - 1 - 15 and w.dropped_turns == 0


def test_the_refusal_crosses_a_process_boundary():
    import pickle

    err = pickle.loads(pickle.dumps(MessageTooLongError(300, 256, 16)))
    assert (err.tokens, err.n_ctx, err.reply_min) == (300, 256, 16)
    assert str(err) == str(MessageTooLongError(300, 256, 16))
