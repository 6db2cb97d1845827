"""adaspark_app.native: the Q4_1 kernel patch, the runtime library directory, and that an engine
process really runs on the patched library when it is built.

The kernel's numerics are checked on the real model by test_engine_tree's
test_cells_written_by_a_verify_equal_plain_decode_cells (cells written by 2-, 3- and 9-row
verifies give bit-identical logits to cells written one row at a time), which runs on whatever
library the process loaded: the patched one after a normal install.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from adaspark_app import native
from adaspark_app.native import build


def test_patch_adds_the_kernel_class_and_its_dispatch_case_once():
    text = ("// before\n" + build._CLASS_ANCHOR + "\n// middle\n" + build._CASE_ANCHOR + "\n// after\n")
    out = build.patch_sgemm(text)
    assert out.count("class tinyBLAS_Q4_1_AVX") == 1
    assert out.count("case GGML_TYPE_Q4_1:") == 1
    assert out.index("class tinyBLAS_Q4_1_AVX") < out.index("//PPC Implementation")
    assert out.index("case GGML_TYPE_Q4_1:") < out.index("case GGML_TYPE_Q4_0:")
    for missing in (build._CLASS_ANCHOR, build._CASE_ANCHOR):
        with pytest.raises(build.BuildError):
            build.patch_sgemm(text.replace(missing, "// changed upstream"))


def test_runtime_dir_copies_stock_libraries_with_ours_under_every_ggml_cpu_name(tmp_path):
    stock = tmp_path / "stock"
    stock.mkdir()
    for name in ("libllama.so", "libggml.so.0", "libggml-cpu.so", "libggml-cpu.so.0", "libggml-cpu.so.0.25.3"):
        (stock / name).write_bytes(name.encode())
    ours = tmp_path / "ours.so"
    ours.write_bytes(b"patched")
    cache = tmp_path / "cache"
    d = native.runtime_dir(stock, ours, cache)
    assert sorted(p.name for p in d.iterdir() if not p.name.startswith(".")) == sorted(p.name for p in stock.iterdir())
    assert (d / "libllama.so").read_bytes() == b"libllama.so"
    assert all((d / n).read_bytes() == b"patched" for n in ("libggml-cpu.so", "libggml-cpu.so.0", "libggml-cpu.so.0.25.3"))
    assert not (d / "libggml-cpu.so").is_symlink()  # $ORIGIN must resolve to this directory
    assert native.runtime_dir(stock, ours, cache) == d  # made once
    ours.write_bytes(b"patched again")  # a rebuilt library gets a new directory
    d2 = native.runtime_dir(stock, ours, cache)
    assert d2 != d and (d2 / "libggml-cpu.so").read_bytes() == b"patched again"
    assert d.exists(), "a directory used within STALE_DAYS stays (another install may be about to load it)"
    old = os.stat(d / ".complete").st_mtime - (native.STALE_DAYS + 1) * 86400
    os.utime(d / ".complete", (old, old))
    ours.write_bytes(b"patched a third time")
    d3 = native.runtime_dir(stock, ours, cache)
    assert not d.exists() and d2.exists() and d3.exists(), "only the directory unused for STALE_DAYS goes"
    assert not [p for p in cache.iterdir() if p.name.startswith(".lib-")], "no half-made directory left"


_PROBE = """
import json, sys
from adaspark_app import native
native.activate()
from adaspark_app.engine.backend import LlamaBackend, default_model_path
b = LlamaBackend(default_model_path(), n_ctx=256, n_threads=1)
maps = open("/proc/self/maps").read()
libs = sorted({line.split()[-1] for line in maps.splitlines() if "libggml-cpu" in line})
print(json.dumps({"status": native.status(), "libs": libs}))
"""


def _clean_env() -> dict:
    """This environment without what an activate in this process (conftest) or the user set."""
    drop = ("LLAMA_CPP_LIB_PATH", native._MARK, "ADASPARK_STOCK_KERNELS")
    return {k: v for k, v in os.environ.items() if k not in drop}


@pytest.mark.skipif(not build.is_built(), reason="Q4_1 kernels not built (python -m adaspark_app.native.build)")
def test_importing_the_package_changes_no_environment():
    """`import adaspark_app` (and its CLI and engine modules) has no side effects: the kernels are
    put in use by native.activate(), which the entry points call, not by an import."""
    code = ("import os, adaspark_app, adaspark_app.cli, adaspark_app.engine.chat_engine\n"
            "print(os.environ.get('LLAMA_CPP_LIB_PATH'))\n"
            "from adaspark_app import native\n"
            "print(native.activate(), os.environ.get('LLAMA_CPP_LIB_PATH'))\n")
    out = subprocess.run([sys.executable, "-c", code], env=_clean_env(), capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    on_import, after = out.stdout.splitlines()
    assert on_import == "None"
    status, lib_path = after.split()
    assert status == "q4_1-tinyblas" and "/native/lib-" in lib_path  # what the import did not do


def _probe(env: dict) -> dict:
    out = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.model
@pytest.mark.skipif(not build.is_built(), reason="Q4_1 kernels not built (python -m adaspark_app.native.build)")
def test_an_engine_process_loads_the_patched_library_and_can_opt_out():
    env = _clean_env()
    got = _probe(env)
    assert got["status"] == "q4_1-tinyblas"
    assert len(got["libs"]) == 1 and "/native/lib-" in got["libs"][0]
    with open(got["libs"][0], "rb") as a, open(build.LIB_DIR / build.LIB_NAME, "rb") as b:
        assert a.read() == b.read(), "the mapped libggml-cpu is not the patched build"
    stock = _probe({**env, "ADASPARK_STOCK_KERNELS": "1"})
    assert stock["status"].startswith("stock") and stock["libs"] != got["libs"]
