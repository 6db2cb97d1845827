"""Export and import of learned state: byte-identical round trips, merge, validation."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
from learned_states import learned_state

from adaspark_app.errors import StoreError
from adaspark_app.store import EXPORT_FORMAT, EXPORT_VERSION, LearnedKey, Store
from adaspark_app.store.transfer import export_json, import_json

K1 = LearnedKey("1111111111111111", "dddddddddddddddd")
K2 = LearnedKey("2222222222222222", "dddddddddddddddd", "3333333333333333")
META = {
    "model": {"id": K1.model_id, "name": "SmolLM2 135M café ✓", "quantisation": "Q4_1"},
    "device": {"id": K1.device_id, "name": "cpu x2"},
    "drafter": None,
}


@pytest.fixture(autouse=True)
def _store_env(tmp_path, monkeypatch):
    monkeypatch.setenv("ADASPARK_STORE", str(tmp_path / "env-store.db"))


def summary(t: int) -> dict:
    return {
        "arm": "adaspark",
        "conversation": f"conv-{t // 2}",
        "turn": t % 2,
        "n_tokens": 120 + t,
        "decode_s": 1.0 / 3 + t,
        "rounds": 50,
        "widths": {1: 5, 8: 40, 16: 5},
        "measure_rounds": 3,
        "created": f"2025-06-01T10:00:0{t}.000000+00:00",
        "rows_by_source": {"drafter": 10, "ngram": 4},
    }


def fill(store: Store) -> None:
    for t in range(3):
        store.save_learned(K1, learned_state(t), summary(t), key_meta=META)
    store.save_learned(K2, learned_state(9), None)


def test_export_import_export_is_byte_identical(tmp_path):
    """Export -> import into a fresh store -> export gives the same bytes."""
    with Store.open(tmp_path / "a.db") as a:
        fill(a)
        first = export_json(a)
    with Store.open(tmp_path / "b.db") as b:
        msgs = import_json(b, first)
        assert len(msgs) == 2 and all(m.startswith("added") for m in msgs)
        second = export_json(b)
    assert second == first
    assert second.encode("utf-8") == first.encode("utf-8")


def test_reimport_into_same_store_is_byte_identical(tmp_path):
    """Replacing a store's keys with its own export changes nothing observable."""
    with Store.open(tmp_path / "a.db") as a:
        fill(a)
        first = export_json(a)
        msgs = import_json(a, first, mode="replace")
        assert all(m.startswith("replaced") for m in msgs)
        assert export_json(a) == first
        assert len(a.request_summaries(K1)) == 3  # replaced, not duplicated


def test_export_is_versioned_sorted_and_stable(tmp_path):
    """The document names its format and version, sorts keys and entries, and does not change
    between two exports (no export timestamp)."""
    with Store.open(tmp_path / "a.db") as a:
        a.save_learned(K2, learned_state(1))  # saved first, sorts second
        a.save_learned(K1, learned_state(2))
        text = export_json(a)
        assert export_json(a) == text
    doc = json.loads(text)
    assert doc["format"] == EXPORT_FORMAT == "adaspark-store"
    assert doc["version"] == EXPORT_VERSION == 1
    assert [e["key"]["model_id"] for e in doc["learned"]] == [K1.model_id, K2.model_id]
    assert text == json.dumps(doc, sort_keys=True, indent=2, ensure_ascii=False) + "\n"


def test_export_one_key(tmp_path):
    with Store.open(tmp_path / "a.db") as a:
        fill(a)
        doc = json.loads(export_json(a, K2))
        assert [e["key"] for e in doc["learned"]] == [
            {"model_id": K2.model_id, "device_id": K2.device_id, "drafter_id": K2.drafter_id}
        ]
        with pytest.raises(StoreError, match="no learned state"):
            export_json(a, LearnedKey("9999999999999999", "dddddddddddddddd"))


def test_imported_state_loads_for_the_engine(tmp_path):
    """After import a restarted engine finds the learned state under the same key."""
    with Store.open(tmp_path / "a.db") as a:
        fill(a)
        text = export_json(a)
        expected = a.load_learned(K1)
    with Store.open(tmp_path / "b.db") as b:
        import_json(b, text)
        assert b.load_learned(K1) == expected
        assert [r["turn"] for r in b.request_summaries(K1)] == [0, 1, 0]


def test_replace_keeps_keys_not_in_file(tmp_path):
    """Replace overwrites the imported keys only; other local keys stay."""
    with Store.open(tmp_path / "a.db") as a:
        a.save_learned(K1, learned_state(1))
        text = export_json(a)
    with Store.open(tmp_path / "b.db") as b:
        b.save_learned(K1, learned_state(5), summary(0))
        b.save_learned(K2, learned_state(6))
        import_json(b, text)
        assert b.load_learned(K1) == json.loads(json.dumps(learned_state(1)))
        assert b.request_summaries(K1) == []
        assert b.load_learned(K2) is not None


def test_merge_keeps_newer_state_and_unions_summaries(tmp_path):
    """Merge: per key the later-updated state wins; request summaries are unioned, no duplicates."""
    with Store.open(tmp_path / "a.db") as a:
        a.save_learned(K1, learned_state(1), summary(0))
        a.save_learned(K1, learned_state(2), summary(1))
        older = export_json(a)
        a.save_learned(K1, learned_state(3), summary(2))
        newer = export_json(a)
    with Store.open(tmp_path / "b.db") as b:
        import_json(b, older)
        msgs = import_json(b, newer, mode="merge")
        assert "took the imported state" in msgs[0] and "1 new request" in msgs[0]
        assert b.load_learned(K1) == learned_state(3)
        assert len(b.request_summaries(K1)) == 3
        msgs = import_json(b, older, mode="merge")
        assert "kept the local state" in msgs[0] and "0 new request" in msgs[0]
        assert b.load_learned(K1) == learned_state(3)
        assert len(b.request_summaries(K1)) == 3
        assert export_json(b) == newer


@pytest.mark.parametrize(
    "text, match",
    [
        ("{not json", "not valid JSON"),
        ("[]", "not an AdaSpark store export"),
        ('{"format": "other", "version": 1, "learned": []}', "not an AdaSpark store export"),
        ('{"format": "adaspark-store", "version": 2, "learned": []}', "newer"),
        ('{"format": "adaspark-store", "version": "1", "learned": []}', "version"),
        ('{"format": "adaspark-store", "version": 1, "learned": {}}', "must be a list"),
        ('{"format": "adaspark-store", "version": 1, "learned": [{"key": {"model_id": "a/b", '
         '"device_id": "d"}, "state": @}]}', r"learned\[0\]\.key"),
        ('{"format": "adaspark-store", "version": 1, "learned": [{"key": {"model_id": "a", '
         '"device_id": "d"}, "state": []}]}', "state"),
        ('{"format": "adaspark-store", "version": 1, "learned": [{"key": {"model_id": "a", '
         '"device_id": "d"}, "state": @, "requests": [{"turn": "x"}]}]}', r"requests\[0\]"),
        ('{"format": "adaspark-store", "version": 1, "learned": ['
         '{"key": {"model_id": "a", "device_id": "d"}, "state": @},'
         '{"key": {"model_id": "a", "device_id": "d"}, "state": @}]}', "twice"),
    ],
)
def test_bad_import_is_refused_and_changes_nothing(tmp_path, text, match):
    """Every malformed export is a one-line StoreError naming the problem; the store is unchanged
    (validation happens before anything is written). @ stands for a learned state that loads."""
    text = text.replace("@", json.dumps(learned_state(0)))
    with Store.open(tmp_path / "a.db") as a:
        fill(a)
        before = export_json(a)
        with pytest.raises(StoreError, match=match) as info:
            import_json(a, text)
        assert "\n" not in str(info.value)
        assert export_json(a) == before


def test_bad_entry_after_good_one_imports_nothing(tmp_path):
    """A file whose second entry is bad does not import its first entry either."""
    good = {"key": {"model_id": "aaaa", "device_id": "dddd", "drafter_id": None}, "state": learned_state(0)}
    bad = {"key": {"model_id": "bbbb", "device_id": "dddd"}, "state": "oops"}
    text = json.dumps({"format": "adaspark-store", "version": 1, "learned": [good, bad]})
    with Store.open(tmp_path / "a.db") as a:
        with pytest.raises(StoreError):
            import_json(a, text)
        assert a.list_learned() == []


def test_unknown_mode_refused(tmp_path):
    with Store.open(tmp_path / "a.db") as a:
        with pytest.raises(StoreError, match="mode"):
            import_json(a, '{"format": "adaspark-store", "version": 1, "learned": []}', mode="append")


def test_import_migrates_an_export_of_the_previous_layout(tmp_path):
    """An export made by a store in use before per-learner versions (b9fbe7f's layout) imports,
    and the store then holds it in this layout, as the engine loads it."""
    from adaspark_app.learn.learned_state import validate

    old = json.loads(gzip.decompress((Path(__file__).parent / "data" / "learned_state_b9fbe7f.json.gz").read_bytes()))
    doc = {"format": EXPORT_FORMAT, "version": EXPORT_VERSION,
           "learned": [{"key": {"model_id": K1.model_id, "device_id": K1.device_id, "drafter_id": None},
                        "state": old}]}
    with Store.open(tmp_path / "a.db") as a:
        assert import_json(a, json.dumps(doc))[0].startswith("added")
        stored = a.load_learned(K1)
    assert stored["scheduler"]["version"] == 2 and stored == validate(old)


def test_one_field_corruptions_of_an_export_are_refused_or_load(tmp_path):
    """Random one-field corruptions of an export's learned state: the import either refuses it
    (one line, nothing written) or stores a state the engine's loader accepts."""
    from test_learn_state import MUTATIONS, corrupted, field_paths

    from adaspark_app.learn.learned_state import validate

    with Store.open(tmp_path / "a.db") as a:
        a.save_learned(K1, learned_state(0))
        doc = json.loads(export_json(a))
    rng = np.random.default_rng(7)
    paths = [p for ps in field_paths(doc["learned"][0]["state"]).values() for p in ps]
    refused = 0
    with Store.open(tmp_path / "b.db") as b:
        for _ in range(60):
            path = paths[int(rng.integers(len(paths)))]
            entry = dict(doc["learned"][0], state=corrupted(doc["learned"][0]["state"], path,
                                                            str(rng.choice(MUTATIONS))))
            try:
                import_json(b, json.dumps(dict(doc, learned=[entry])))
            except StoreError as exc:
                assert "\n" not in str(exc) and "learned[0].state" in str(exc)
                assert b.list_learned() == []
                refused += 1
                continue
            validate(b.load_learned(K1))
            b.reset()
    assert refused > 30


def test_export_and_import_keep_a_gpu_devices_fingerprint_apart_from_the_cpus(tmp_path):
    """State learned on a GPU travels with its device's whole fingerprint (the GPU, its compute
    capability and driver, the layers offloaded): imported into a fresh store it keeps the same
    key, device id and fingerprint, and it stays apart from the same model's state on the CPU."""
    from adaspark_app.store.fingerprint import device_fingerprint, key_meta

    info = "llama-cpp-python 0.3.36 | CUDA : ARCHS = 900"
    gpu = device_fingerprint(8, info, backend="cuda", gpu="NVIDIA H200", gpu_layers=-1,
                             gpu_detail={"compute_capability": "9.0", "driver": "580.159.03"})
    cpu = device_fingerprint(8, info, backend="cuda")
    assert gpu["id"] != cpu["id"]
    model = META["model"]
    on_gpu, on_cpu = LearnedKey(K1.model_id, gpu["id"]), LearnedKey(K1.model_id, cpu["id"])
    src = Store.open(tmp_path / "src.db")
    src.save_learned(on_gpu, learned_state(1), summary(1), key_meta=key_meta(model, gpu))
    src.save_learned(on_cpu, learned_state(2), summary(2), key_meta=key_meta(model, cpu))
    text = export_json(src)
    src.close()
    dst = Store.open(tmp_path / "dst.db")
    import_json(dst, text)
    rows = {r["device_id"]: r for r in dst.list_learned()}
    assert set(rows) == {gpu["id"], cpu["id"]}
    assert rows[gpu["id"]]["key_meta"]["device"] == gpu and rows[cpu["id"]]["key_meta"]["device"] == cpu
    assert "NVIDIA H200" in rows[gpu["id"]]["key_meta"]["device"]["name"]
    assert dst.load_learned(on_gpu) == learned_state(1) and dst.load_learned(on_cpu) == learned_state(2)
    dst.close()
