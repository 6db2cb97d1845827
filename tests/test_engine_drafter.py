"""The engine with a generated DSpark drafter: drafter rows are verified, and it stays lossless."""

from __future__ import annotations

import pytest

from adaspark_app.engine.chat_engine import ChatEngine
from adaspark_app.engine.drafter_init import write_random_drafter
from engine_clock import deterministic_clock

pytestmark = [pytest.mark.model, pytest.mark.long]  # every test here loads the bundled model


@pytest.fixture(scope="module")
def drafter_file(tmp_path_factory, model_path):
    out = tmp_path_factory.mktemp("drafter") / "random-dspark.gguf"
    write_random_drafter(model_path, str(out), block_size=4, layers=1, seed=1)
    return str(out)


@pytest.mark.parametrize("arm", ["chain:4", "adaspark"])
def test_drafter_rows_verified_and_lossless(arm, drafter_file, model_path, public_prompts):
    with deterministic_clock():  # the `adaspark` arm's widths and drafter gate follow the clock
        _drafter_rows_verified_and_lossless(arm, drafter_file, model_path, public_prompts)


def _drafter_rows_verified_and_lossless(arm, drafter_file, model_path, public_prompts):
    base = ChatEngine(model_path, arm="ar", n_ctx=2048)
    eng = ChatEngine(model_path, drafter_path=drafter_file, arm=arm, n_ctx=2048, self_check=True)
    try:
        same = 0
        rows = 0
        convs = public_prompts[:3]
        for conv in convs:
            msgs = []
            for turn, user in enumerate(conv["turns"]):
                msgs.append({"role": "user", "content": user})
                a = base.generate(conv["id"], msgs, max_tokens=16, turn=turn)
                r = eng.generate(conv["id"], msgs, max_tokens=16, turn=turn)
                same += a.tokens == r.tokens
                rows += r.rows_by_source["drafter"] + r.rows_by_source["agreed"]
                msgs.append({"role": "assistant", "content": a.text})
            # the drafter's KV follows the target's committed positions
            assert eng.drafter.n_positions() <= len(eng.decoder.kv_tokens)
        assert eng.decoder.counters.checked_rows > 0
        if arm == "chain:4":
            assert rows > 0, "chain:4 with a drafter must verify drafter rows"
        assert same == 2 * len(convs), f"{same} of {2 * len(convs)} replies identical to ar"
    finally:
        eng.close()
        base.close()


def test_reduced_draft_vocabulary_drafts_only_its_tokens(tmp_path, model_path):
    """A drafter with a `d2t` table (F16 weights) loads in llama.cpp and drafts only its tokens,
    a shorter runtime block has that many rows (its logits against the torch reference: see
    test_drafter_trained); a bad table is refused before writing."""
    import numpy as np

    from adaspark_app.errors import ArgumentError

    vocab = np.arange(3, 49152, 11)  # every 11th token: no accident can make picks land inside
    out = tmp_path / "d2t.gguf"
    write_random_drafter(model_path, str(out), block_size=6, seed=2, draft_vocab=vocab, half=True)
    eng = ChatEngine(model_path, drafter_path=str(out), arm="chain:4", n_ctx=1024)
    try:
        d = eng.drafter
        assert d.d2t is not None and list(d.d2t) == list(vocab)
        toks = eng.prompt_tokens([{"role": "user", "content": "Name three rivers."}])
        anchor = eng.backend.prefill(toks, 0, on_chunk=d.feed)
        full = d.draft(anchor, len(toks), 8)
        short = d.draft(anchor, len(toks), 8, rows=3)
        assert full.tokens.shape == (6, 8) and short.tokens.shape == (3, 8)
        assert np.isin(full.tokens, vocab).all() and np.isin(short.tokens, vocab).all()
    finally:
        eng.close()
    with pytest.raises(ArgumentError):
        write_random_drafter(model_path, str(tmp_path / "bad.gguf"), draft_vocab=[5, 5, 7])
    assert not (tmp_path / "bad.gguf").exists()
