"""The batch-invariant CUDA kernels' patch (native/cuda_exact.patch), its build and its switch,
without a GPU: the patch applies to a tree holding its anchors (and to the pinned source where a
copy is at hand), all or nothing; the install builds the CUDA library only when CMAKE_ARGS asks
for CUDA; activate swaps it in beside the CPU kernels and sets ADASPARK_CUDA_EXACT; the switch is
read from a library the way the patched one exports it. Row identity itself needs a GPU:
benchmarks/gpu/run.sh measures it there."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from adaspark_app import native
from adaspark_app.native import build, cuda_exact
from test_native import _clean_env

ROOT = Path(__file__).resolve().parents[1]


def _tree_of_anchors(root: Path) -> dict[str, str]:
    """A llama.cpp tree whose patched files hold each hunk's old text between lines of their own."""
    files: dict[str, list[str]] = {}
    for h in cuda_exact.hunks():
        files.setdefault(h.path, ["// stock code before\n"]).extend([h.old, "// stock code between\n"])
    out = {}
    for rel, parts in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        out[rel] = "".join(parts)
        (root / rel).write_text(out[rel])
    return out


def test_every_hunk_applies_once_and_a_tree_patched_before_is_refused(tmp_path):
    before = _tree_of_anchors(tmp_path)
    hunks = cuda_exact.hunks()
    assert {h.path for h in hunks} == set(before) and len(hunks) >= 10
    changed = cuda_exact.apply(tmp_path)
    assert changed == sorted(before)
    for h in hunks:
        text = (tmp_path / h.path).read_text()
        assert h.new in text, h.path
        assert "// stock code between\n" in text
    with pytest.raises(cuda_exact.PatchError, match="patched already"):
        cuda_exact.apply(tmp_path)


def test_a_source_that_differs_is_refused_and_left_as_it_was(tmp_path):
    before = _tree_of_anchors(tmp_path)
    last = cuda_exact.hunks()[-1]
    f = tmp_path / last.path
    f.write_text(f.read_text().replace(last.old, last.old.replace("(", "( ", 1)))  # changed upstream
    edited = {rel: (tmp_path / rel).read_text() for rel in before}
    with pytest.raises(cuda_exact.PatchError, match="matches 0 times"):
        cuda_exact.apply(tmp_path)
    assert {rel: (tmp_path / rel).read_text() for rel in before} == edited, "nothing written"


def test_the_command_patches_an_unpacked_source_and_says_one_line_on_failure(tmp_path):
    _tree_of_anchors(tmp_path / "src" / "vendor" / "llama.cpp")
    run = [sys.executable, "-m", "adaspark_app.native.cuda_exact", str(tmp_path / "src")]
    ok = subprocess.run(run, capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert ok.returncode == 0 and "patched 8 files" in ok.stdout, ok.stderr
    again = subprocess.run(run, capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert again.returncode == 2 and again.stdout == ""
    assert again.stderr.count("\n") == 1 and "patched already" in again.stderr
    missing = subprocess.run(run[:-1] + [str(tmp_path / "nowhere")], capture_output=True, text=True, cwd=ROOT,
                             timeout=60)
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1 and "Traceback" not in missing.stderr


def _pinned_source() -> Path | None:
    """The pinned llama-cpp-python sdist, if one is at hand: ADASPARK_LLAMA_SDIST, or the trimmed
    copy the GPU run carries (.gpu/, see benchmarks/gpu/run.sh)."""
    for p in (os.environ.get("ADASPARK_LLAMA_SDIST"), ROOT / ".gpu" / "llama-cpp-python-0.3.36-src.tar.xz"):
        if p and Path(p).is_file():
            return Path(p)
    return None


@pytest.mark.skipif(_pinned_source() is None, reason="no copy of the pinned llama-cpp-python source here "
                    "(ADASPARK_LLAMA_SDIST, or .gpu/ as benchmarks/gpu/run.sh says)")
def test_the_patch_applies_to_the_pinned_source(tmp_path):
    with tarfile.open(_pinned_source()) as tf:
        members = [m for m in tf.getmembers() if "/ggml/src/ggml-cuda/" in m.name]
        tf.extractall(tmp_path, members=members, filter="data")
    cuda_dir = next(tmp_path.rglob("ggml-cuda"))
    root = cuda_dir.parents[2]  # .../vendor/llama.cpp
    stock = {p: p.read_text() for p in cuda_dir.iterdir() if p.is_file()}
    changed = cuda_exact.apply(root)
    assert len(changed) == 8
    for p, text in stock.items():
        now = p.read_text()
        assert (now != text) == (str(p.relative_to(root)) in changed)
        if now != text:
            assert now.count(cuda_exact.MARK) >= 1


def test_the_install_builds_the_cuda_library_only_when_cmake_args_ask_for_cuda():
    assert build.cuda_cmake_flags("-DLLAVA_BUILD=OFF") is None
    assert build.cuda_cmake_flags("") is None
    assert build.cuda_cmake_flags("-DGGML_CUDA=off") is None
    flags = build.cuda_cmake_flags('-DGGML_CUDA=on -DLLAVA_BUILD=OFF -DCMAKE_CUDA_ARCHITECTURES="86;90" '
                                   '-DGGML_CUDA_FA_ALL_QUANTS=ON')
    assert flags == ["-DGGML_CUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES=86;90", "-DGGML_CUDA_FA_ALL_QUANTS=ON"]
    assert build.cuda_key(flags) != build.cuda_key(["-DGGML_CUDA=ON"]), "other switches, another library"
    # setup.py loads build.py alone, outside its package: the CUDA part must work there too
    import importlib.util

    spec = importlib.util.spec_from_file_location("_setup_like_build", Path(build.__file__))
    alone = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(alone)
    assert alone.cuda_key(flags) == build.cuda_key(flags)


def test_runtime_dir_swaps_the_cuda_library_in_only_where_llama_cpp_has_one(tmp_path):
    ours, cuda = tmp_path / "ours.so", tmp_path / "cuda.so"
    ours.write_bytes(b"cpu kernels")
    cuda.write_bytes(b"cuda kernels")
    gpu = tmp_path / "gpu"
    gpu.mkdir()
    for name in ("libllama.so", "libggml-cpu.so", "libggml-cuda.so", "libggml-cuda.so.0"):
        (gpu / name).write_bytes(name.encode())
    d = native.runtime_dir(gpu, ours, tmp_path / "cache", cuda)
    assert (d / "libggml-cpu.so").read_bytes() == b"cpu kernels"
    assert (d / "libggml-cuda.so").read_bytes() == (d / "libggml-cuda.so.0").read_bytes() == b"cuda kernels"
    assert (d / "libllama.so").read_bytes() == b"libllama.so"
    assert native.runtime_dir(gpu, ours, tmp_path / "cache") != d, "with and without ours: two directories"
    cpu = tmp_path / "cpu"
    cpu.mkdir()
    for name in ("libllama.so", "libggml-cpu.so"):
        (cpu / name).write_bytes(name.encode())
    d = native.runtime_dir(cpu, ours, tmp_path / "cache", cuda)
    assert sorted(p.name for p in d.iterdir() if not p.name.startswith(".")) == ["libggml-cpu.so", "libllama.so"]


_SWITCH_PROBE = """
import os, sys
from adaspark_app import native
native.activate()
print(os.environ.get("ADASPARK_CUDA_EXACT"), os.environ.get("ADASPARK_CUDA_GRAPHS"),
      os.environ.get("ADASPARK_CUDA_ARGMAX"))
"""


@pytest.mark.parametrize("env,want", [({}, "1 1 1"), ({"ADASPARK_STOCK_KERNELS": "1"}, "0 0 0"),
                                      ({"ADASPARK_CUDA_EXACT": "0"}, "0 1 1"),
                                      ({"ADASPARK_CUDA_GRAPHS": "0"}, "1 0 1"),
                                      ({"ADASPARK_CUDA_ARGMAX": "0"}, "1 1 0")])
def test_activate_turns_the_cuda_switches_on_unless_stock_kernels_or_the_user_say_otherwise(env, want):
    base = {k: v for k, v in _clean_env().items()
            if k not in (cuda_exact.SWITCH, cuda_exact.GRAPHS_SWITCH, cuda_exact.ARGMAX_SWITCH)}
    out = subprocess.run([sys.executable, "-c", _SWITCH_PROBE], env={**base, **env}, capture_output=True,
                         text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == want


# What the patch adds to ggml-cuda.cu, around a stand-in for its switch (the GPU library itself
# cannot be loaded without a GPU's driver): the same reading of ADASPARK_CUDA_EXACT, once.
_FAKE_LIB = r"""
#include <stdlib.h>
static int on = -1;
int adaspark_cuda_exact_rows(void) {
    if (on < 0) { const char * e = getenv("ADASPARK_CUDA_EXACT"); on = e != NULL && atoi(e) != 0; }
    return on ? 64 : 0;
}
static int graphs = -1;
int adaspark_cuda_graphs(void) {
    if (graphs < 0) { const char * e = getenv("ADASPARK_CUDA_GRAPHS"); graphs = e != NULL && atoi(e) != 0; }
    return graphs;
}
static int argmax = -1;
int adaspark_cuda_argmax(void) {
    if (argmax < 0) { const char * e = getenv("ADASPARK_CUDA_ARGMAX"); argmax = e != NULL && atoi(e) != 0; }
    return argmax;
}
int adaspark_cuda_set_argmax(int value) {
    argmax = value != 0;
    return argmax;
}
"""


def _python(code: str, env: dict[str, str]) -> list[str]:
    """The lines a fresh Python prints running ``code`` with ``env`` added to this one's."""
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True,
                         cwd=ROOT, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_library_rows_reads_the_patched_librarys_switch_and_none_from_a_stock_one(tmp_path):
    src = tmp_path / "fake.c"
    src.write_text(_FAKE_LIB)
    lib = tmp_path / "libggml-cuda.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True, timeout=60)
    # each switch as the library reads it from the environment
    for reader, switch, on, off in (("library_rows", cuda_exact.SWITCH, "64", "0"),
                                    ("library_graphs", cuda_exact.GRAPHS_SWITCH, "True", "False"),
                                    ("library_argmax", cuda_exact.ARGMAX_SWITCH, "True", "False")):
        code = f"from adaspark_app.native import cuda_exact; print(cuda_exact.{reader}({str(lib)!r}))"
        assert [_python(code, {switch: value}) for value in ("1", "0")] == [[on], [off]], reader
        assert getattr(cuda_exact, reader)(tmp_path / "missing.so") is None
    # by default the library llama.cpp has mapped: none before it is loaded, then that very one
    mapped = ("import ctypes; from adaspark_app.native import cuda_exact\n"
              "print(cuda_exact.library_rows())\n"
              f"ctypes.CDLL({str(lib)!r})\n"
              "print(cuda_exact.library_rows())\n")
    assert _python(mapped, {cuda_exact.SWITCH: "1"}) == ["None", "64"]
    # the argmax switch is also set at run time, in the library llama.cpp has mapped
    setting = ("import ctypes; from adaspark_app.native import cuda_exact as c\n"
               "print(c.set_library_argmax(False), c.library_argmax())\n"
               f"ctypes.CDLL({str(lib)!r})\n"
               "print(c.library_argmax(), c.set_library_argmax(False), c.library_argmax(), "
               "c.set_library_argmax(True), c.library_argmax())\n")
    assert _python(setting, {cuda_exact.ARGMAX_SWITCH: "1"}) == ["None None", "True False False True True"]
    import llama_cpp

    stock_cpu = Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so"
    assert stock_cpu.is_file()
    assert cuda_exact.library_rows(stock_cpu) is None, "a library without the symbol is stock"
    assert cuda_exact.library_graphs(stock_cpu) is None
    assert cuda_exact.library_argmax(stock_cpu) is None


def test_the_install_builds_the_patched_cuda_library_and_keeps_the_cpu_kernels_stamped(tmp_path, monkeypatch):
    """build() with CUDA switches, every CPU variant already built: the CUDA compile (cmake stands
    in: no CUDA toolkit with cuBLAS here) runs on the patched source with GGML_CUDA on and the
    given switches, for the ggml-cuda target alone; the stamp then holds the library beside the
    CPU variants. A failed compile is one BuildError and leaves the stamp as it was."""
    from test_native import _sgemm_like

    lib = tmp_path / "lib"
    for v in build.VARIANTS:  # every CPU variant "built" from this source
        (lib / v).mkdir(parents=True)
        (lib / v / build.LIB_NAME).write_bytes(b"cpu")
    monkeypatch.setattr(build, "LIB_DIR", lib)
    monkeypatch.setattr(build, "STAMP", lib / "stamp.json")
    build._write_stamp({v: {"key": build.source_key(v), "flags": [], "file": f"{v}/{build.LIB_NAME}"}
                        for v in build.VARIANTS})
    src = tmp_path / "vendor" / "llama.cpp"
    _tree_of_anchors(src)
    for rel, text in ((build.SGEMM, _sgemm_like()), (build.OPS, build._FA_ANCHOR + "}\n")):
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(text)
    monkeypatch.setattr(build, "pip_source", lambda *a: src)
    monkeypatch.delenv("ADASPARK_LLAMA_SDIST", raising=False)
    calls: list[list[str]] = []

    def fake_run(cmd: list[str], log: Path) -> None:
        calls.append(cmd)
        if "--build" in cmd:  # after the configure call, whose -S is the source tree
            tree = Path(calls[-2][calls[-2].index("-S") + 1])
            assert "adaspark_cuda_exact" in (tree / "ggml/src/ggml-cuda/common.cuh").read_text(), "built unpatched"
            out = Path(cmd[cmd.index("--build") + 1])
            out.mkdir(parents=True, exist_ok=True)
            (out / build.CUDA_LIB_NAME).write_bytes(b"patched cuda")

    monkeypatch.setattr(build, "_run", fake_run)
    flags = build.cuda_cmake_flags("-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=90")
    build.build(variants=list(build.VARIANTS), cuda=flags, say=lambda m: None)
    configure, compile_ = calls
    assert "-DGGML_CUDA=ON" in configure and "-DCMAKE_CUDA_ARCHITECTURES=90" in configure
    assert compile_[compile_.index("--target") + 1] == "ggml-cuda"
    assert (lib / build.CUDA_FILE).read_bytes() == b"patched cuda"
    stamp = build.read_stamp()
    assert set(stamp["variants"]) == set(build.VARIANTS) and stamp["cuda"]["key"] == build.cuda_key(flags)
    assert build.built_cuda(flags) and not build.built_cuda(flags + ["-DGGML_CUDA_FA_ALL_QUANTS=ON"])
    calls.clear()
    build.build(variants=list(build.VARIANTS), cuda=flags, say=lambda m: None)
    assert calls == [], "built already: nothing runs"

    def failing(cmd: list[str], log: Path) -> None:
        raise build.BuildError("cmake ... failed (exit 1)")

    monkeypatch.setattr(build, "_run", failing)
    before = (lib / "stamp.json").read_text()
    with pytest.raises(build.BuildError):
        build.build(variants=list(build.VARIANTS), cuda=flags + ["-DGGML_CUDA_FA_ALL_QUANTS=ON"], say=lambda m: None)
    assert (lib / "stamp.json").read_text() == before
