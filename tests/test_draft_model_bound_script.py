"""benchmarks/oracle/draft_model_bound.py: the chain bound on agreement runs written by hand (known
answers), the vocabulary check, the error path, and one teacher-forced run on the bundled model
drafting for itself (its own greedy replies: every row must agree)."""

from __future__ import annotations

import json

import pytest

from benchmarks.oracle import draft_model_bound as bound


def test_a_round_emits_the_agreed_run_and_the_targets_own_token():
    # k = 2, draft step 0.5, verify of w rows costs w: round 1 at 0 accepts 2 (+1) for 1 + 3 steps;
    # round 2 at 3 accepts the last token (its bonus token falls past the end) for 4 more
    assert bound.chain_speed([True, True, False, True], 2, 0.5, float) == pytest.approx(4 / 8)
    # every row agrees, free drafts, a verify at the price of one step: k + 1 tokens a round
    assert bound.chain_speed([True] * 8, 3, 0.0, lambda w: 1.0) == pytest.approx(4.0)
    # nothing agrees: one token a round for a draft step and a 2-row verify
    assert bound.chain_speed([False] * 5, 1, 0.25, lambda w: 1.5) == pytest.approx(1 / 1.75)
    with pytest.raises(ValueError):
        bound.chain_speed([True], 0, 0.1, float)


def test_the_table_is_the_geometric_mean_over_replies_per_chain_length():
    runs = [[True] * 4, [False] * 4]
    table = dict(bound.bound_table(runs, 0.0, lambda w: 1.0, max_k=2))
    # k = 1: 2 tokens a round on the first reply, 1 on the second; k = 2: 3 (4 over 2 rounds) and 1
    assert table[1] == pytest.approx((2.0 * 1.0) ** 0.5)
    assert table[2] == pytest.approx((2.0 * 1.0) ** 0.5)
    assert list(table) == [1, 2]


class _Vocab:
    def __init__(self, texts):
        self._t = texts

    def vocab_texts(self):
        return list(self._t)


def test_vocabularies_must_match_in_size_and_every_text():
    a = _Vocab([b"a", b"b", b"c"])
    assert bound.same_vocabulary(a, _Vocab([b"a", b"b", b"c"]))
    assert not bound.same_vocabulary(a, _Vocab([b"a", b"b"]))
    assert not bound.same_vocabulary(a, _Vocab([b"a", b"x", b"c"]))


def test_a_missing_file_is_one_line_and_exit_2(tmp_path, capsys):
    code = bound.main(["--target", str(tmp_path / "none.gguf"), "--draft", str(tmp_path / "none.gguf"),
                       "--set", str(tmp_path / "s.jsonl"), "--replies", str(tmp_path / "r.jsonl")])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and "no such file" in err


def test_a_bad_chain_length_or_draft_cost_is_one_line_and_exit_2(tmp_path, capsys):
    for extra in (["--max-k", "0"], ["--draft-cost", "-0.5"]):
        code = bound.main(["--target", "t.gguf", "--draft", "d.gguf", "--set", "s.jsonl", "--replies", "r.jsonl", *extra])
        err = capsys.readouterr().err
        assert code == 2
        assert err.count("\n") == 1 and "--max-k" in err


@pytest.mark.model
def test_the_bundled_model_agrees_with_its_own_greedy_replies_on_every_row(tmp_path, capsys):
    """Teacher forcing rebuilds each prompt with the chat template and reads the draft's argmax on
    every reply row in batches; with the model drafting for itself on its own `ar` replies that
    must be the reply, row for row (a batched row equals a one-row step on AdaSpark's kernels)."""
    from adaspark_app import cli
    from adaspark_app.engine.backend import default_model_path

    script = tmp_path / "set.jsonl"
    script.write_text(json.dumps({"id": "c1", "turns": ["Name three colours.", "And three more?"]}) + "\n")
    report = tmp_path / "rep"
    assert cli.main(["bench", str(script), "--arms", "ar,pinned:2", "--max-tokens", "24", "--keep-capped",
                     "--report", str(report), "--no-progress"]) == 0
    model = default_model_path()
    code = bound.main(["--target", model, "--draft", model, "--set", str(script),
                       "--replies", str(report / "replies.jsonl"), "--draft-cost", "0.5", "--max-k", "2"])
    out = capsys.readouterr().out
    assert code == 0
    line = next(x for x in out.splitlines() if "agrees with the target's reply" in x)
    n = int(line.split(" replies, ")[1].split(" tokens")[0])
    assert n > 20
    assert f"on {n} (100.0%)" in line
    assert "2 replies" in line


@pytest.mark.model
def test_vocab_texts_are_the_gguf_token_texts_not_the_pieces(model_path):
    """same_vocabulary's rule is the engine's drafter check: the GGUF's token texts, in id order."""
    from adaspark_app.engine.backend import LlamaBackend
    from adaspark_app.gguf_file import read_gguf_header

    b = LlamaBackend.vocab_only(model_path)
    try:
        texts = b.vocab_texts()
        pieces = [b.token_bytes(t) for t in range(b.n_vocab)]
    finally:
        b.close()
    assert texts == read_gguf_header(model_path).tokens
    assert texts != pieces  # byte-level BPE: a text's "\u0120" is a piece's space
    assert bound.same_vocabulary(_Vocab(texts), _Vocab(texts))
    assert not bound.same_vocabulary(_Vocab(texts), _Vocab(texts[:-1]))
