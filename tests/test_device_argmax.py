"""Greedy tokens taken on the device (ADASPARK_ARGMAX=device, the default where layers are on a GPU):
llama.cpp's backend sampling puts a greedy argmax per output row into the forward's graph, so no
logits leave the device. Here on the CPU backend, the same code path as on a GPU but for the kernel:
each row's token equals numpy's argmax of its logits (chains and branched trees, rows of leaf seqs
included), replies stay byte-identical to `ar`, and a sampled reply between greedy ones still reads
fresh logits."""

from __future__ import annotations

import random

import numpy as np
import pytest

from adaspark_app.engine.backend import ARGMAX_ENV, LlamaBackend, argmax_place
from adaspark_app.engine.chat_engine import ChatEngine
from adaspark_app.engine.sampling import SamplingSettings
from adaspark_app.engine.tree import KIND_NGRAM, Candidates, layout
from adaspark_app.errors import ConfigError
from adaspark_app.runner import Conversation, run_conversation


def test_argmax_place_defaults_to_the_device_on_a_gpu_only(monkeypatch):
    monkeypatch.delenv(ARGMAX_ENV, raising=False)
    assert (argmax_place(True), argmax_place(False)) == ("device", "host")
    monkeypatch.setenv(ARGMAX_ENV, " Host ")
    assert argmax_place(True) == "host"
    monkeypatch.setenv(ARGMAX_ENV, "gpu")
    with pytest.raises(ConfigError, match="ADASPARK_ARGMAX must be host or device, not 'gpu'"):
        argmax_place(False)


@pytest.fixture(scope="module")
def device_backend(model_path):
    mp = pytest.MonkeyPatch()
    mp.setenv(ARGMAX_ENV, "device")
    b = LlamaBackend(model_path, n_ctx=1024)
    mp.undo()
    yield b
    b.close()


def _unique_argmax(logits: np.ndarray) -> list[int | None]:
    """Each row's argmax, None where two logits tie for the maximum (the two ways may break a tie
    differently)."""
    out: list[int | None] = []
    for row in logits:
        top = row.max()
        out.append(int(row.argmax()) if int((row == top).sum()) == 1 else None)
    return out


def _both_ways(b: LlamaBackend, tokens: list[int], positions: list[int], seq_ids,
               leaf_seqs: list[int]) -> tuple[list[int], list]:
    """The same forward twice, its cells removed after each: tokens on the device, then logits on
    the host."""
    out = []
    for argmax in (True, False):
        b.open_leaf_seqs(leaf_seqs)
        out.append(b.verify(tokens, positions, seq_ids, argmax=argmax).argmax.tolist())
        logits = None if argmax else b.logits_rows(len(tokens))
        for s in leaf_seqs:
            b.seq_rm(s)
        b.seq_rm(0, positions[0], -1)
    assert out[1] == []
    return out[0], _unique_argmax(logits)


@pytest.mark.model
def test_device_tokens_equal_the_host_argmax_on_chains_and_trees(device_backend, public_prompts):
    b = device_backend
    assert b.argmax_on_device, "the CPU backend runs llama.cpp's greedy sampler"
    rng = random.Random(3)
    rows = compared = 0
    for conv in public_prompts[:2]:
        b.clear_kv()
        prompt = b.tokenize(conv["turns"][0])[:300]
        first = b.prefill(prompt, 0)
        kv = len(prompt)
        chain = [first] + [rng.randrange(200, 20000) for _ in range(23)]
        got, ref = _both_ways(b, chain, list(range(kv, kv + len(chain))), [(0,)] * len(chain), [])
        # a branched tree: its rows belong to leaf seqs (1..), each with a sampler of its own
        c = Candidates()
        par = -1
        for t in chain[1:5]:
            par = c.add(par, t, KIND_NGRAM)
        while len(c) < 14:
            p = rng.randrange(-1, len(c))
            tok = rng.randrange(200, 20000)
            if c.child(p, tok) is None:
                c.add(p, tok, KIND_NGRAM)
        lay = layout(list(range(len(c))), c)
        assert lay.leaf_seqs and max(lay.leaf_seqs) > 1
        tree_got, tree_ref = _both_ways(b, [first] + [c.token[j] for j in lay.nodes[1:]],
                                        [kv + d for d in lay.depth], lay.seq_ids, lay.leaf_seqs)
        for g, r in zip(got + tree_got, ref + tree_ref):
            rows += 1
            if r is not None:
                compared += 1
                assert g == r
    assert rows == 2 * (24 + 1 + 14) and compared >= rows - 2  # a tree: the anchor and 14 nodes


@pytest.mark.model
def test_a_backend_that_leaves_no_device_token_takes_tokens_on_the_host(model_path, monkeypatch):
    """llama.cpp accepts a sampler chain even where the device lacks one of its ops, and then
    returns no token: the probe forward at load finds that, and the host way serves instead."""
    import llama_cpp

    monkeypatch.setenv(ARGMAX_ENV, "device")
    monkeypatch.setattr(llama_cpp, "llama_get_sampled_token_ith", lambda ctx, i: -1)
    b = LlamaBackend(model_path, n_ctx=256)
    try:
        assert not b.argmax_on_device and not b._chains_attached
        toks = b.tokenize("The capital of France is")
        first = b.prefill(toks, 0)
        out = b.verify([first, 13], [len(toks), len(toks) + 1], [(0,), (0,)])
        assert out.argmax.tolist() == [int(r.argmax()) for r in b.logits_rows(2)]
    finally:
        b.close()


@pytest.mark.model
def test_logits_are_refused_after_a_forward_that_left_none(device_backend):
    b = device_backend
    b.clear_kv()
    b.prefill(b.tokenize("Hello there, how are you?"), 0)
    with pytest.raises(RuntimeError, match="pass argmax=False"):
        b.logits_rows(1)
    b.clear_kv()


CONV = Conversation("copy", ["Copy this sentence exactly, word for word: The old lighthouse keeper climbed the "
                             "spiral stairs every evening to light the lamp for the ships at sea.",
                             "Now copy it again, then add one sentence about the sea."])


def _replies(engine: ChatEngine, sampling=None) -> list[str]:
    out = [r.text for r in run_conversation(engine, CONV, 40, sampling=sampling)]
    engine.reset_conversation()
    return out


@pytest.mark.model
@pytest.mark.long
def test_replies_with_device_tokens_are_byte_identical_to_ar_and_to_host_tokens(model_path, monkeypatch):
    """adaspark with tokens on the device equals `ar` with them, and the host way's replies; a
    seeded sampled reply (its logits copied to the host) between two greedy ones on the same
    engine equals the host way's, and the greedy reply after it is unchanged."""
    monkeypatch.setenv(ARGMAX_ENV, "host")
    host = ChatEngine(model_path, arm="adaspark")
    try:
        assert not host.backend.argmax_on_device
        want = _replies(host)
        s = SamplingSettings(temperature=0.7, seed=7)
        want_sampled = _replies(host, s)
    finally:
        host.close()
    monkeypatch.setenv(ARGMAX_ENV, "device")
    engines = {arm: ChatEngine(model_path, arm=arm, self_check=arm != "ar") for arm in ("ar", "adaspark")}
    try:
        assert all(e.backend.argmax_on_device for e in engines.values())
        assert _replies(engines["ar"]) == want
        eng = engines["adaspark"]
        accepted = 0
        for r in run_conversation(eng, CONV, 40):
            accepted += sum(r.accepted_by_source.values())
        eng.reset_conversation()
        assert accepted > 0  # the equality went through verifies of several rows
        assert _replies(eng) == want
        assert _replies(eng, s) == want_sampled
        assert _replies(eng) == want
    finally:
        for e in engines.values():
            e.close()


@pytest.mark.model
def test_reading_ahead_keeps_the_way_tokens_are_taken(model_path, monkeypatch):
    """A history read ahead after a greedy reply leaves the device's samplers attached: a change of
    way makes a GPU reserve its graphs again, then again at the next reply. The next reply is
    unchanged."""
    monkeypatch.setenv(ARGMAX_ENV, "device")
    history = [{"role": "user", "content": "Name three colours."}]
    with ChatEngine(model_path, arm="adaspark") as eng:
        r = eng.generate("c", history, max_tokens=16)
        assert eng.backend._chains_attached
        history += [{"role": "assistant", "content": r.text + " And more."}]  # more than the reply to read
        assert eng.read_ahead("c", history).read > 0
        assert eng.backend._chains_attached
        follow = [*history, {"role": "user", "content": "And three more?"}]
        got = eng.generate("c", follow, max_tokens=16)
    monkeypatch.setenv(ARGMAX_ENV, "host")
    with ChatEngine(model_path, arm="ar") as eng:
        assert eng.generate("c", follow, max_tokens=16).tokens == got.tokens
