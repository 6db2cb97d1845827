"""A store whose learned state does not load (another layout, or corrupt) must not stop the
engine: the state is kept aside in the file under its key, the engine starts fresh with one
notice, and its next save works. The previous layout (b9fbe7f) loads without a notice."""

from __future__ import annotations

import gzip
import json
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from adaspark_app.engine.chat_engine import ChatEngine
from adaspark_app.learn.learned_state import validate
from adaspark_app.store import Store

pytestmark = pytest.mark.model  # every test here loads the bundled model

DATA = Path(__file__).parent / "data"
FOREIGN = json.dumps({"scheduler": {"version": 7, "layers": [[1, 2]]}, "acceptance": {"weights": "v9"}})
MESSAGES = [{"role": "user", "content": "Name three colours."}]
# Nothing here depends on the widths chosen (only on whether a state loads), so the real clock.


def _engine(model_path: str, store: Store) -> ChatEngine:
    return ChatEngine(model_path, arm="adaspark", store=store, n_ctx=1024)


def _set_state(path: Path, key_id: str, text: str) -> None:
    """Replace the key's stored state with ``text``, as another program (or version) would."""
    conn = sqlite3.connect(path)
    with conn:
        assert conn.execute("update learned set state = ? where key_id = ?", (text, key_id)).rowcount == 1
    conn.close()


def _rows(path: Path, sql: str, params: tuple = ()) -> list[tuple]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


@pytest.fixture(scope="module")
def keyed_store(model_path, tmp_path_factory) -> tuple[Path, str]:
    """A store holding the engine's key, saved by one real reply: (path, key id)."""
    path = tmp_path_factory.mktemp("keyed") / "s.db"
    with Store.open(path) as store:
        eng = _engine(model_path, store)
        try:
            eng.generate("c", MESSAGES, max_tokens=6)
            key_id = eng.store_key.key_id
        finally:
            eng.close()
    return path, key_id


@pytest.mark.parametrize("bad", [FOREIGN, '{"scheduler": {"version": 2, '], ids=["foreign layout", "broken JSON"])
def test_a_state_that_does_not_load_is_kept_aside_and_the_engine_starts_fresh(keyed_store, model_path, tmp_path, bad):
    """One notice, a reply, the bad state's bytes kept in the file under the key, a next save
    that loads, and a restart that loads it without a notice."""
    src, key_id = keyed_store
    path = tmp_path / "s.db"
    shutil.copy(src, path)
    _set_state(path, key_id, bad)
    with Store.open(path) as store:
        eng = _engine(model_path, store)
        try:
            assert len(eng.notices) == 1, eng.notices
            note = eng.notices[0]
            assert "does not load" in note and "kept it aside" in note and "\n" not in note
            assert eng.cold_start_progress()[0] == 0  # fresh: no width priced
            assert eng.generate("c", MESSAGES, max_tokens=6).n_tokens > 0
        finally:
            eng.close()
    kept = _rows(path, "select state, reason from learned_quarantine where key_id = ?", (key_id,))
    assert [k[0] for k in kept] == [bad]  # exactly as it was stored
    assert kept[0][1] and kept[0][1] in note
    (saved,) = _rows(path, "select state from learned where key_id = ?", (key_id,))[0]
    validate(json.loads(saved))
    with Store.open(path) as store:
        eng = _engine(model_path, store)
        try:
            assert eng.notices == []
        finally:
            eng.close()


def test_a_state_of_the_previous_layout_loads_without_a_notice(keyed_store, model_path, tmp_path):
    """A store in use before per-learner versions (b9fbe7f's layout) is migrated on load: no
    notice, nothing kept aside, and what it learned is there."""
    src, key_id = keyed_store
    path = tmp_path / "s.db"
    shutil.copy(src, path)
    old = json.loads(gzip.decompress((DATA / "learned_state_b9fbe7f.json.gz").read_bytes()))
    _set_state(path, key_id, json.dumps(old))
    # priced as the cost model rules (learn/constants.py): three measurements for the plain step,
    # CONDITIONAL_MEASUREMENTS for every wider width (each measured only where it could win)
    from adaspark_app.learn.constants import CONDITIONAL_MEASUREMENTS, MEASUREMENTS_BEFORE_PRICED

    def need(c: dict) -> int:
        return CONDITIONAL_MEASUREMENTS if c["width"] > 1 else MEASUREMENTS_BEFORE_PRICED

    priced = sum(1 for c in old["scheduler"]["cost"]["classes"] if c["count"] >= need(c))
    with Store.open(path) as store:
        eng = _engine(model_path, store)
        try:
            assert eng.notices == []
            assert eng.cold_start_progress()[0] == priced > 0
        finally:
            eng.close()
    assert _rows(path, "select count(*) from learned_quarantine") == [(0,)]


def test_run_cli_on_a_store_with_a_foreign_state_exits_0_with_one_note(model_path, public_prompts, tmp_path):
    """`adaspark run --store` on a store whose state was replaced by a foreign layout: exit 0, the
    note once on stderr, no traceback, and the foreign state still in the file."""
    script = tmp_path / "s.jsonl"
    script.write_text(json.dumps({"id": "c", "turns": public_prompts[0]["turns"][:1]}) + "\n")
    db = tmp_path / "cli.db"
    cmd = [sys.executable, "-m", "adaspark_app.cli", "run", str(script), "--store", str(db), "--max-tokens", "6",
           "--out", str(tmp_path / "out.jsonl")]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    ((key_id,),) = _rows(db, "select key_id from learned")
    _set_state(db, key_id, FOREIGN)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr
    notes = [ln for ln in p.stderr.splitlines() if ln.startswith("adaspark: note: ")]
    assert len(notes) == 1 and "does not load" in notes[0], p.stderr
    assert _rows(db, "select state from learned_quarantine") == [(FOREIGN,)]
    assert json.loads((tmp_path / "out.jsonl").read_text().splitlines()[0])["n_tokens"] > 0
