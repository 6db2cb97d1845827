"""The engine with a real SQLite store: what is learned persists, so a restart does not re-measure."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from adaspark_app.engine.chat_engine import ChatEngine
from adaspark_app.store import Store
from engine_clock import deterministic_clock

pytestmark = [pytest.mark.model, pytest.mark.long]  # every test here loads the bundled model


def _serve(model_path, store_path, prompts, max_tokens=48):
    """Serve `prompts` on the `adaspark` arm with a store, on the deterministic clock: which
    widths are measured follows the verify times the scheduler sees."""
    with deterministic_clock():
        return _serve_now(model_path, store_path, prompts, max_tokens)


def _serve_now(model_path, store_path, prompts, max_tokens):
    store = Store.open(store_path)
    eng = ChatEngine(model_path, arm="adaspark", store=store, n_ctx=2048)
    measured: dict[int, int] = {}

    def on_round(ev):
        if ev.measured:
            measured[ev.width] = measured.get(ev.width, 0) + 1

    try:
        for conv in prompts:
            msgs = []
            for turn, user in enumerate(conv["turns"]):
                msgs.append({"role": "user", "content": user})
                res = eng.generate(conv["id"], msgs, max_tokens=max_tokens, on_round=on_round, turn=turn)
                msgs.append({"role": "assistant", "content": res.text})
            eng.reset_conversation()
        return measured, eng.cold_start_progress()
    finally:
        eng.close()
        store.close()


def test_restarted_engine_does_not_remeasure_learned_widths(model_path, public_prompts, tmp_path):
    db = tmp_path / "learned.db"
    copy_heavy = [c for c in public_prompts if c["category"] in ("extraction", "coding", "writing")][:3]
    first, progress1 = _serve(model_path, db, copy_heavy)
    assert sum(first.values()) > 0, "an empty store must measure widths"
    second, progress2 = _serve(model_path, db, copy_heavy)
    # The second run may still measure new split widths (a split measures a width inside a class
    # only where it could change the choice), but never a width the first run already measured.
    assert set(second).isdisjoint(first), f"re-measured learned widths: {second} (first run {first})"
    assert progress2[0] >= progress1[0]


def test_run_cli_with_store_then_store_show(model_path, public_prompts, tmp_path):
    """`adaspark run --store` saves learned state that `adaspark store show` reads back."""
    script = tmp_path / "s.jsonl"
    script.write_text("\n".join(json.dumps({"id": c["id"], "turns": c["turns"][:1]}) for c in public_prompts[8:10]))
    db = tmp_path / "cli.db"
    out = tmp_path / "out.jsonl"
    p = subprocess.run([sys.executable, "-m", "adaspark_app.cli", "run", str(script), "--store", str(db),
                        "--max-tokens", "24", "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(rows) == 2 and all(r["n_tokens"] > 0 for r in rows)
    for key in ("conversation", "turn", "text", "n_tokens", "decode_s", "rounds", "widths", "measure_rounds",
                "rows_by_source", "accepted_by_source", "looped"):
        assert key in rows[0]
    s = subprocess.run([sys.executable, "-m", "adaspark_app.cli", "store", "show", "--store", str(db)],
                       capture_output=True, text=True, timeout=120)
    assert s.returncode == 0, s.stderr
    assert "SmolLM2-135M-Instruct (bundled, Q4_1)" in s.stdout  # the bundled model's name, read back from the store


def test_run_without_store_options_keeps_its_learning_in_the_default_store(public_prompts, tmp_path):
    """`adaspark run` with neither --store nor $ADASPARK_STORE learns into the default store, as the
    chat does (it learned in memory and kept nothing before); --fresh-store leaves that store alone."""
    import os

    script = tmp_path / "s.jsonl"
    script.write_text(json.dumps({"id": "a", "turns": public_prompts[8]["turns"][:1]}) + "\n")
    env = {k: v for k, v in os.environ.items() if k != "ADASPARK_STORE"}
    env["XDG_DATA_HOME"] = str(tmp_path / "data")  # where the default store is (platformdirs)
    default_db = tmp_path / "data" / "adaspark" / "adaspark.db"

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "adaspark_app.cli", *args], capture_output=True, text=True,
                              timeout=300, env=env)

    p = cli("run", str(script), "--fresh-store", "--max-tokens", "24", "--out", str(tmp_path / "fresh.jsonl"))
    assert p.returncode == 0, p.stderr
    assert not default_db.exists()
    shown = cli("store", "show")
    assert shown.returncode == 0 and f"no learned state in {default_db}" in shown.stdout, shown.stdout + shown.stderr
    p = cli("run", str(script), "--max-tokens", "24", "--out", str(tmp_path / "kept.jsonl"))
    assert p.returncode == 0, p.stderr
    shown = cli("store", "show")
    assert shown.returncode == 0, shown.stderr
    assert "SmolLM2-135M-Instruct (bundled, Q4_1)" in shown.stdout, shown.stdout


def test_a_reply_cut_short_keeps_what_it_had_taught(model_path, tmp_path, monkeypatch):
    """A process killed in a long reply keeps its learning: the learned state is saved every
    CHECKPOINT_S of a reply (every round here), without a request summary, and the next engine
    starts from it instead of measuring every width again."""
    import adaspark_app.engine.chat_engine as chat_engine

    monkeypatch.setattr(chat_engine, "CHECKPOINT_S", 0.0)
    rounds = []

    def on_round(ev):
        rounds.append(ev)
        if len(rounds) == 15:
            raise RuntimeError("the process ends here")

    with Store.open(tmp_path / "s.db") as store:
        eng = ChatEngine(model_path, arm="adaspark", store=store, n_ctx=1024)
        try:
            with pytest.raises(RuntimeError, match="the process ends here"):
                eng.generate("c", [{"role": "user", "content": "Write a long story about a dragon who bakes bread."}],
                             max_tokens=300, on_round=on_round)
        finally:
            eng.close()
        (row,) = store.list_learned()
        assert row["n_saves"] >= 10 and store.request_summaries() == []  # no reply ended
        again = ChatEngine(model_path, arm="adaspark", store=store, n_ctx=1024)
        try:
            assert again.cold_start_progress()[0] > 0  # widths measured in the cut reply
        finally:
            again.close()


def test_a_store_that_refuses_the_learning_costs_the_reply_nothing(model_path, tmp_path):
    """A full disk: the learned state's save at the reply's end raised, and the reply was lost
    (`run` stopped, the chat gave the message back). The reply stands now, the same text as with
    room, and says why its learning was not kept."""
    message = [{"role": "user", "content": "Name three colours."}]
    with Store.open(tmp_path / "roomy.db") as store:
        eng = ChatEngine(model_path, arm="adaspark", store=store, n_ctx=512)
        try:
            roomy = eng.generate("c", message, max_tokens=24)
        finally:
            eng.close()
    with Store.open(tmp_path / "full.db") as store:
        eng = ChatEngine(model_path, arm="adaspark", store=store, n_ctx=512)
        try:
            pages = store._conn.execute("PRAGMA page_count").fetchone()[0]
            store._conn.execute(f"PRAGMA max_page_count = {pages}")  # SQLite's 'database or disk is full'
            full = eng.generate("c", message, max_tokens=24)
        finally:
            eng.close()
        assert store.list_learned() == []
    assert roomy.learned_not_saved is None and "learned_not_saved" not in roomy.to_json()
    assert full.learned_not_saved and "full" in full.learned_not_saved
    assert full.text == roomy.text and full.n_tokens == roomy.n_tokens > 0
