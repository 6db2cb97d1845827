"""adaspark_app/gguf_types.py: its tables name every type as the installed gguf-py does."""

from __future__ import annotations

import subprocess
import sys

import gguf

from adaspark_app.gguf_types import FILE_TYPES, TENSOR_TYPES, file_type_name, tensor_type_name


def test_every_type_is_named_as_gguf_py_names_it():
    for t in gguf.LlamaFileType:
        assert file_type_name(int(t)) == t.name, t
    for t in gguf.GGMLQuantizationType:
        assert tensor_type_name(int(t)) == t.name, t
    # the tables hold nothing gguf-py does not (a value it dropped would be named wrongly)
    assert {v: n for v, n in FILE_TYPES.items() if v in set(map(int, gguf.LlamaFileType))} == FILE_TYPES
    assert {v: n for v, n in TENSOR_TYPES.items() if v in set(map(int, gguf.GGMLQuantizationType))} == TENSOR_TYPES


def test_values_without_a_name_and_bad_input_give_none():
    assert file_type_name(999_999) is None and tensor_type_name(999_999) is None
    assert file_type_name("x") is None and tensor_type_name(None) is None


def test_fingerprinting_the_bundled_model_does_not_import_gguf_py(model_path):
    code = ("import sys; from adaspark_app.store.fingerprint import model_fingerprint; "
            f"fp = model_fingerprint({model_path!r}); print(fp['quantisation'], 'gguf' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["Q4_1", "False"]
