"""Host work during the forward: on a GPU llama_decode only queues the forward, and the decoder
learns the last round's acceptance labels before the logits are read (`Decoder.learn`). Checked on
the real model on the CPU by switching `forward_overlaps` on (the forward is then done before the
work, so only the order and the outcome can be checked), and through the scripted target of
`benchmarks/cost/round_host_time.py --scripted`, which replays a real reply at a modeled time."""

from __future__ import annotations

import pytest

from adaspark_app.engine.chat_engine import ChatEngine
from benchmarks.cost.scripted_target import GraphModel, ScriptedTarget, curve_ms, parse_curve
from engine_clock import deterministic_clock

MAX_TOKENS = 48


def _prompts(public_prompts: list[dict]) -> list[str]:
    return [c["turns"][0] for c in public_prompts[:4]]


def _replies(eng: ChatEngine, prompts: list[str]) -> list[list[int]]:
    return [eng.generate(f"c{i}", [{"role": "user", "content": p}], max_tokens=MAX_TOKENS).tokens
            for i, p in enumerate(prompts)]


@pytest.fixture(scope="module")
def ar_replies(model_path, public_prompts) -> list[list[int]]:
    """`ar`'s replies to the prompts: what every other run must reproduce."""
    ar = ChatEngine(model_path, arm="ar", n_ctx=2048)
    try:
        return _replies(ar, _prompts(public_prompts))
    finally:
        ar.close()


def _events(eng: ChatEngine, log: list[str]) -> None:
    """Log the forward's start and the logits' read (the backend), each acceptance learning, each
    plain step's lesson to the scheduler, and each tree round's to its gains and to its cost model."""
    b, acc, sched = eng.backend, eng.decoder.learners.acceptance, eng.decoder.learners.scheduler
    for obj, attr, name in ((b, "_decode", "decode"), (b, "_argmax_rows", "logits"), (acc, "learn", "learn"),
                            (sched, "observe_plain", "plain"), (sched.gains, "observe_round", "gains"),
                            (sched.cost, "note_fixed", "cost")):
        orig = getattr(obj, attr)

        def logged(*args, _orig=orig, _name=name, **kwargs):
            log.append(_name)
            return _orig(*args, **kwargs)

        setattr(obj, attr, logged)


def _learns_inside_forward(log: list[str], what: str) -> tuple[int, int]:
    """(`what` events between a forward's start and its logits' read, `what` events elsewhere)."""
    inside = outside = 0
    open_forward = False
    for e in log:
        if e == "decode":
            open_forward = True
        elif e == "logits":
            open_forward = False
        elif e == what and open_forward:
            inside += 1
        elif e == what:
            outside += 1
    return inside, outside


@pytest.mark.model
@pytest.mark.parametrize("overlaps", [False, True])
def test_acceptance_learns_during_the_next_forward_only_where_it_overlaps(model_path, public_prompts, ar_replies,
                                                                          overlaps):
    """Overlapping: every round's labels are learned inside a later forward, except the last
    round's of a reply (at the reply's end, before the state is read), and so are every plain
    step's lesson to the scheduler and every tree round's to its gains, while its cost model
    learns at once (the next round's plan counts its measurement); the model learns every round it
    would have, and the replies stay byte-identical to `ar`. Not overlapping (the CPU): nothing
    inside a forward."""
    prompts = _prompts(public_prompts)
    with deterministic_clock():
        eng = ChatEngine(model_path, arm="adaspark", n_ctx=2048)
        try:
            eng.backend.forward_overlaps = overlaps
            log: list[str] = []
            _events(eng, log)
            dec = eng.decoder
            learned_rounds = []
            orig_learn = dec.learn
            dec.learn = lambda *a, **k: (learned_rounds.append(1), orig_learn(*a, **k))[1]
            got = _replies(eng, prompts)
            state = dec.state_dict()
        finally:
            eng.close()
    assert got == ar_replies
    inside, outside = _learns_inside_forward(log, "learn")
    plain_inside, plain_outside = _learns_inside_forward(log, "plain")
    gains_inside, gains_outside = _learns_inside_forward(log, "gains")
    cost_inside, cost_outside = _learns_inside_forward(log, "cost")
    assert cost_inside == 0 and cost_outside > len(prompts)
    assert len(learned_rounds) > len(prompts) and plain_inside + plain_outside > len(prompts)  # both kinds ran
    assert state["acceptance"]["counters"]["rounds"] == len(learned_rounds)  # nothing left pending
    if overlaps:
        assert inside >= len(learned_rounds) - len(prompts) and outside <= len(prompts)
        assert plain_outside <= len(prompts) and gains_outside <= len(prompts) < gains_inside
    else:
        assert inside == 0 and outside == len(learned_rounds) and plain_inside == 0 and gains_inside == 0


@pytest.mark.model
def test_a_round_left_for_the_next_forward_is_learned_before_the_state_is_read(model_path):
    """Overlapping, a tree round's labels wait for the next forward; reading the learned state (to
    save it) or ending the reply learns them first."""
    text = "Copy this list twice: alpha beta gamma delta epsilon zeta eta theta iota kappa. " * 3
    with deterministic_clock():
        eng = ChatEngine(model_path, arm="adaspark", n_ctx=2048)
        try:
            eng.backend.forward_overlaps = True
            dec = eng.decoder
            learned = []
            orig_learn = dec.learn
            dec.learn = lambda *a, **k: (learned.append(1), orig_learn(*a, **k))[1]
            for _ in range(2):  # the second time the tree rounds run on a learned cost table
                dec.start_reply(eng.backend.tokenize(text))
                for _ in range(96):
                    before = len(learned)
                    dec.round()
                    if len(learned) > before:
                        break
                waiting = dec.learners.acceptance.state_dict()["counters"]["rounds"]
                assert dec.state_dict()["acceptance"]["counters"]["rounds"] == len(learned) == waiting + 1
                dec.end_reply(dec.context)
            assert len(learned) == 2
        finally:
            eng.close()


@pytest.mark.model
@pytest.mark.parametrize("overlap,graphs", [(False, None), (True, None), (True, "stock")])
def test_scripted_target_commits_the_reference_reply_at_the_modeled_widths(model_path, public_prompts, ar_replies,
                                                                           overlap, graphs):
    """The scripted target answers each row with the reference reply's next token: `adaspark`
    through it commits exactly `ar`'s real reply, one modeled forward per round; with CUDA graphs
    modeled, the forwards after a change of width run without one."""
    prompts, base = _prompts(public_prompts)[:2], ar_replies[:2]
    eng = ChatEngine(model_path, arm="adaspark", n_ctx=2048)
    try:
        st = ScriptedTarget(eng.backend, parse_curve("1:0.2,64:0.4"), overlap=overlap, graphs=graphs,
                            ungraphed_ms=0.1)
        assert eng.backend.forward_overlaps is overlap
        got, rounds = [], 0
        for i, p in enumerate(prompts):
            st.expect(base[i])
            r = eng.generate(f"s{i}", [{"role": "user", "content": p}], max_tokens=MAX_TOKENS)
            got.append(r.tokens)
            rounds += r.rounds
        # D without the drafter is the host's alone where the forward overlaps it (a GPU): the
        # decoder keeps it from scaling the verify prices there, and only there
        host_clock = eng.decoder.learners.cost.host_clock
    finally:
        eng.close()
    assert got == base
    assert len(st.forwards) == rounds
    assert host_clock is (not overlap)
    changes = sum(a != b for a, b in zip(st.forwards, st.forwards[1:]))
    assert st.ungraphed == 0 if graphs is None else st.ungraphed >= changes > 0


def test_graph_model_replays_as_llama_cpp_warms_its_cuda_graphs():
    """One graph per context (stock): a verify between one-row steps runs without a graph, and so do
    the step after it and the capture after that; a graph per width keeps each shape's own."""
    pattern = [1, 1, 1, 8, 1, 1, 1, 8, 1, 1, 8, 8, 8]
    stock, width = GraphModel("stock"), GraphModel("width")
    assert [stock.replays(r) for r in pattern] == [False, False, True, False, False, False, True,
                                                   False, False, False, False, False, True]
    assert [width.replays(r) for r in pattern] == [False, False, True, False, True, True, True,
                                                   False, True, True, True, True, True]
    assert not width.replays(-512) and width.replays(1)  # a prefill's shape is a key of its own
    assert not stock.replays(-512) and not stock.replays(1) and not stock.replays(1) and stock.replays(1)
    # the KV cells a forward reads, padded to 256: crossing a multiple changes every graph's shape
    assert stock.replays(1, 256) and not stock.replays(1, 257) and not stock.replays(1, 300) and stock.replays(1, 511)
    assert width.replays(8, 200) and not width.replays(8, 300) and width.replays(1, 200)
    with pytest.raises(ValueError, match="graphs"):
        GraphModel("per-width")


def test_curve_is_read_and_refused_with_one_line():
    curve = parse_curve("1:6.6,16:8.3,64:11.8")
    assert curve_ms(1, curve) == 6.6 and curve_ms(64, curve) == 11.8
    assert curve_ms(8, curve) == pytest.approx(6.6 + (8.3 - 6.6) * 7 / 15)
    assert curve_ms(100, curve) == 11.8  # flat past the last point
    for bad in ("", "1:6,1:7", "0:5", "1:-2", "4:x", "16:8,1:6"):
        with pytest.raises(ValueError, match="curve"):
            parse_curve(bad)


@pytest.mark.model
def test_work_left_for_a_forward_that_fails_is_raised_once_the_round_is_whole(model_path):
    """Work left for the next forward runs inside a verify, before the logits are read; if it
    raises, the round still commits its path and drops its tree rows, and only then raises: the
    KV cache holds exactly the committed tokens, never half a round, and the next reply runs."""
    text = "Copy this list twice: alpha beta gamma delta epsilon zeta eta theta iota kappa. " * 3
    with deterministic_clock():
        eng = ChatEngine(model_path, arm="pinned:8", n_ctx=2048)
        try:
            b, dec = eng.backend, eng.decoder
            b.forward_overlaps = True
            dec.start_reply(b.tokenize(text))
            dec.round()

            def fails() -> None:
                raise RuntimeError("deferred work failed")

            dec.later(fails)
            with pytest.raises(RuntimeError, match="deferred work failed"):
                dec.round()
            assert b.seq_pos_max(0) == len(dec.kv_tokens) - 1  # the round's path committed, in seq 0 only
            assert all(b.seq_pos_max(s) == -1 for s in range(1, 8))  # no tree row left in a leaf seq
            dec.round()  # and the decoder goes on
            dec.end_reply(dec.context)
            r = eng.generate("after", [{"role": "user", "content": "Say hello."}], max_tokens=8)
            assert r.n_tokens > 0
        finally:
            eng.close()


@pytest.mark.model
def test_another_revisions_engine_imports_beside_this_one_and_decodes_the_same_reply():
    """Guards ``round_host_time --against``: HEAD's package, renamed and imported beside the
    working tree's, is its own code (its modules load from its folder, none names adaspark_app) and
    decodes the same greedy reply on the bundled model; a revision git does not know is one line."""
    import importlib
    from pathlib import Path

    from adaspark_app.engine.decoder import Decoder
    from benchmarks.cost.round_host_time import _base_of, _engine_at, _package_at

    assert _base_of("adaspark, overlapped, at HEAD") == "adaspark, overlapped"
    with pytest.raises(ValueError, match="--against no-such-rev"):
        _package_at("no-such-rev")
    name = _package_at("HEAD")
    other = _engine_at(name)
    decoder = importlib.import_module(f"{name}.engine.decoder")
    root = Path(decoder.__file__).parents[1]
    assert decoder.Decoder is not Decoder and root.name == name
    assert not any("adaspark_app" in f.read_text(encoding="utf-8") for f in root.rglob("*.py"))
    ours = ChatEngine(None, arm="adaspark", n_ctx=1024, n_threads=2)
    messages = [{"role": "user", "content": "Name three colours, then name them again."}]
    a = ours.generate("c", messages, max_tokens=32).text
    b = other.generate("c", messages, max_tokens=32).text
    assert a and a == b
    ours.close()
    other.close()
