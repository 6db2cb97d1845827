"""The shipped DSpark drafter (`--drafter default`): what it is, and that trees with it stay
lossless. Its logits against the training tool's torch forward: test_drafter_trained.py (needs
the `train` extra)."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from adaspark_app.engine.default_drafter import default_drafter_path
from adaspark_app.gguf_file import read_gguf_header

pytestmark = pytest.mark.long  # scheduled first (tests/conftest.py)


def test_shipped_drafter_is_small_and_names_its_training_set():
    path = Path(default_drafter_path())
    assert path.stat().st_size <= 30 * 2**20
    ids = [line.split()[1] for line in
           gzip.decompress(path.with_name("drafter-training-ids.txt.gz").read_bytes()).decode().splitlines()]
    assert len(ids) >= 100 and len(set(ids)) == len(ids)
    kv = read_gguf_header(str(path)).kv
    assert kv["general.architecture"] == "dflash" and kv["dflash.block_size"] >= 4


@pytest.mark.model
def test_drafter_trees_stay_identical_to_plain_decode(model_path, public_prompts):
    """Trees with the drafter's siblings: an accepted path through a later branch is cut where
    its rows stop being the batch's first rows, so KV cells stay in position order and replies
    stay byte-identical to `ar` (without the cut, 11 of 40 MT-Bench replies drifted here). Four prompts: cut paths run
    in each of them (7-11 cut rounds a reply here)."""
    from adaspark_app.engine.chat_engine import ChatEngine

    plain = ChatEngine(model_path, arm="ar", n_ctx=2048)
    tree = ChatEngine(model_path, drafter_path="default", arm="pinned:16", n_ctx=2048,
                      self_check=True)
    try:
        for conv in public_prompts[:4]:
            msgs = [{"role": "user", "content": conv["turns"][0]}]
            a = plain.generate(conv["id"], msgs, max_tokens=48)
            b = tree.generate(conv["id"], msgs, max_tokens=48)
            assert a.tokens == b.tokens, conv["id"]
        assert tree.decoder.counters.cut_rounds > 0, "no path was cut: the test did not exercise the cut"
    finally:
        plain.close()
        tree.close()
