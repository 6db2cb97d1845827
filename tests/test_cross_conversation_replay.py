"""benchmarks/oracle/cross_conversation_replay.py on token streams written by hand, where the runs each
index has right are known."""

from __future__ import annotations


from benchmarks.oracle import cross_conversation_replay as replay


def test_an_earlier_reply_is_copied_only_by_the_cross_conversation_index():
    # the second prompt ends as the first did (2 3 4 5), and the model answers the same: only an
    # index holding the first conversation proposes the whole second reply
    got = replay.coverage([([1, 2, 3, 4, 5], [10, 11, 12, 13, 14, 15, 16, 17]),
                           ([9, 2, 3, 4, 5], [10, 11, 12, 13, 14, 15, 16, 17])])
    assert got == {"tokens": 16, "own": 0, "extra": 8}


def test_own_copies_count_as_own_and_a_cold_context_waits_for_a_match():
    # reply 1 copies its prompt (5 1 2 3 after "1 2 3 4" was followed by 5): 4 own tokens; reply 2
    # repeats reply 1's tail from a prompt that matches nothing: three plain steps, then the
    # earlier reply's follower of (10 11 12) and its copy give the last 5
    got = replay.coverage([([1, 2, 3, 4, 5, 1, 2, 3, 4], [5, 1, 2, 3, 77, 10, 11, 12, 13, 14, 15, 16, 17]),
                           ([9, 66, 67, 68, 69], [10, 11, 12, 13, 14, 15, 16, 17])])
    assert got == {"tokens": 21, "own": 4, "extra": 5}


def test_replies_in_order_builds_each_prompt_from_the_turns_and_earlier_replies():
    convs = [{"id": "b", "turns": ["7 8", "9"]}, {"id": "a", "turns": ["1 2"]}]
    rows = [{"arm": "adaspark:ar", "conversation": "a", "turn": 0, "text": "3"},
            {"arm": "adaspark:ar", "conversation": "b", "turn": 1, "text": "11"},
            {"arm": "adaspark", "conversation": "b", "turn": 0, "text": "99"},
            {"arm": "adaspark:ar", "conversation": "b", "turn": 0, "text": "10"}]
    pairs = replay.replies_in_order(rows, convs, lambda s: [int(x) for x in s.split()], "adaspark:ar")
    assert pairs == [([7, 8], [10]), ([7, 8, 10, 9], [11]), ([1, 2], [3])]
