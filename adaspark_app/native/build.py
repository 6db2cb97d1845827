"""Build AdaSpark's libggml-cpu: llama-cpp-python's own llama.cpp with a Q4_1 multi-row kernel.

The bundled model's weights are Q4_1. Stock ggml multiplies them by a batch of rows one row at a
time (``ggml_vec_dot_q4_1_q8_1`` per row and column), so on this CPU a verify of 8 rows costs
about 4.7 one-row steps and 32 rows about 16.5. ``tinyblas_q4_1.inc`` adds Q4_1 to llamafile's
tinyBLAS (tiles of up to 4 weight rows x 4 batch rows, each weight block unpacked once per tile):
8 rows then cost about 3.4 steps and 32 rows about 11.2. One-row products keep the stock kernel,
and every output element is summed in the stock kernel's order (fma of d_a d_b times the block's
integer dot into a vector accumulator, fma of m_a s_b into a scalar, then the same horizontal
sum), so a row computes bit for bit alike in a one-row decode and a many-row verify; the test
``test_cells_written_by_a_verify_equal_plain_decode_cells`` checks it on the real model.

The source is llama-cpp-python's sdist from PyPI (the version this package pins, with the SHA-256
PyPI lists for it; ``ADASPARK_LLAMA_SDIST`` may name a local copy), under ``vendor/llama.cpp``; only the ``ggml-cpu`` library is built
(GGML_NATIVE, ~4 minutes on 2 cores) and copied to ``adaspark_app/native/lib/``. At run time
``adaspark_app.native.activate`` points llama-cpp-python at a copy of its own libraries with this
one in place of its ``libggml-cpu``. ``pip install -e .`` runs this build (setup.py); it is
skipped when the library is already built for this source, and if it fails the install goes on
with the stock kernels.

    python -m adaspark_app.native.build [--force] [--jobs N]
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

# argparse, shutil, subprocess, tarfile, tempfile and urllib are imported where a build needs
# them: every start-up of the `adaspark` command reads this module's paths (native.activate),
# and those imports would cost it ~20 ms for nothing.

LLAMA_CPP_PYTHON = "0.3.36"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"  # PyPI's
HERE = Path(__file__).resolve().parent
KERNEL = HERE / "tinyblas_q4_1.inc"
LIB_DIR = HERE / "lib"
LIB_NAME = "libggml-cpu.so"
STAMP = LIB_DIR / "stamp.json"
SGEMM = "ggml/src/ggml-cpu/llamafile/sgemm.cpp"

# (anchor in sgemm.cpp, text put in its place): the kernel class after the x86 tinyBLAS classes,
# and the Q4_1 case of llamafile_sgemm's dispatch.
_CLASS_ANCHOR = "#endif // __AVX__\n\n//PPC Implementation"
_CASE_ANCHOR = """    case GGML_TYPE_Q4_0: {
        if (Btype != GGML_TYPE_Q8_0)
            return false;"""
_CASE = """    case GGML_TYPE_Q4_1: {
#if defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
        if (Btype != GGML_TYPE_Q8_1)
            return false;
        tinyBLAS_Q4_1_AVX<float> tb{
            k, (const block_q4_1 *)A, lda,
            (const block_q8_1 *)B, ldb,
            (float *)C, ldc,
            params->ith, params->nth};
        tb.matmul(m, n);
        return true;
#else
        return false;
#endif
    }

"""


class BuildError(RuntimeError):
    """The patched library could not be built (the stock kernels stay in use)."""


def source_key() -> str:
    """Identifies what the library is built from: the pinned version and the kernel's text."""
    h = hashlib.sha256(LLAMA_CPP_PYTHON.encode())
    h.update(KERNEL.read_bytes())
    h.update((_CASE_ANCHOR + _CASE).encode())
    return h.hexdigest()[:16]


def is_built() -> bool:
    try:
        stamp = json.loads(STAMP.read_text())
    except (OSError, ValueError):
        return False
    return stamp.get("key") == source_key() and (LIB_DIR / LIB_NAME).is_file()


def patch_sgemm(text: str) -> str:
    """sgemm.cpp with the Q4_1 kernel class and its dispatch case added."""
    if text.count(_CLASS_ANCHOR) != 1 or text.count(_CASE_ANCHOR) != 1:
        raise BuildError("sgemm.cpp does not look like llama-cpp-python 0.3.36's: the patch does not apply")
    text = text.replace(_CLASS_ANCHOR, "#endif // __AVX__\n" + KERNEL.read_text() + "\n//PPC Implementation")
    return text.replace(_CASE_ANCHOR, _CASE + _CASE_ANCHOR)


def _sdist(dest: Path) -> Path:
    """llama-cpp-python's sdist: ``ADASPARK_LLAMA_SDIST`` if set, else downloaded from PyPI's
    simple index; its SHA-256 must be SDIST_SHA256 either way."""
    import urllib.request

    local = os.environ.get("ADASPARK_LLAMA_SDIST")
    if local:
        path = Path(local)
        if not path.is_file():
            raise BuildError(f"ADASPARK_LLAMA_SDIST={local} is not a file")
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
    else:
        name = f"llama_cpp_python-{LLAMA_CPP_PYTHON}.tar.gz"
        path = dest / name
        try:
            req = urllib.request.Request("https://pypi.org/simple/llama-cpp-python/",
                                         headers={"Accept": "application/vnd.pypi.simple.v1+json"})
            with urllib.request.urlopen(req, timeout=60) as r:
                files = json.load(r)["files"]
            url = next(f["url"] for f in files if f["filename"] == name)
            h = hashlib.sha256()
            with urllib.request.urlopen(url, timeout=600) as r, open(path, "wb") as out:
                for block in iter(lambda: r.read(1 << 20), b""):
                    h.update(block)
                    out.write(block)
        except (OSError, ValueError, KeyError, StopIteration) as e:
            raise BuildError(f"could not download llama-cpp-python {LLAMA_CPP_PYTHON}'s source: {e}") from None
        digest = h.hexdigest()
    if digest != SDIST_SHA256:
        raise BuildError(f"llama-cpp-python's sdist has SHA-256 {digest}, expected {SDIST_SHA256}")
    return path


def _run(cmd: list[str], log: Path) -> None:
    import subprocess

    with open(log, "ab") as fp:
        rc = subprocess.run(cmd, stdout=fp, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        raise BuildError(f"{' '.join(cmd[:3])} ... failed (exit {rc}); see {log}")


def build(force: bool = False, jobs: int | None = None, say=print) -> Path:
    """Build (or find already built) the patched libggml-cpu; returns its path."""
    import shutil
    import tarfile
    import tempfile

    if not force and is_built():
        return LIB_DIR / LIB_NAME
    if sys.platform != "linux":
        raise BuildError("the patched kernels are built on Linux only")
    cmake = shutil.which("cmake")
    if cmake is None:
        raise BuildError("cmake is not installed")
    jobs = jobs or os.cpu_count() or 2
    LIB_DIR.mkdir(parents=True, exist_ok=True)
    log = LIB_DIR / "build.log"
    log.write_text("")
    with tempfile.TemporaryDirectory(prefix="adaspark-kernels-") as tmp:
        tmp_path = Path(tmp)
        say(f"adaspark: downloading llama-cpp-python {LLAMA_CPP_PYTHON}'s source for the Q4_1 kernels")
        tar = _sdist(tmp_path)
        root = f"llama_cpp_python-{LLAMA_CPP_PYTHON}/vendor/llama.cpp/"
        with tarfile.open(tar) as tf:
            members = [m for m in tf.getmembers() if m.name.startswith(root)]
            tf.extractall(tmp_path, members=members, filter="data")
        src = tmp_path / root
        sgemm = src / SGEMM
        sgemm.write_text(patch_sgemm(sgemm.read_text()))
        out = tmp_path / "build"
        say(f"adaspark: building libggml-cpu with the Q4_1 kernels ({jobs} jobs, a few minutes)")
        _run([cmake, "-S", str(src), "-B", str(out), "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON",
              "-DBUILD_SHARED_LIBS=ON", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
              "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_TOOLS=OFF", "-DLLAMA_BUILD_SERVER=OFF"], log)
        _run([cmake, "--build", str(out), "--target", "ggml-cpu", "-j", str(jobs)], log)
        built = sorted(p for p in out.rglob("libggml-cpu.so*") if p.is_file() and not p.is_symlink())
        if not built:
            raise BuildError(f"the build made no libggml-cpu.so; see {log}")
        shutil.copy2(built[-1], LIB_DIR / (LIB_NAME + ".tmp"))
        os.replace(LIB_DIR / (LIB_NAME + ".tmp"), LIB_DIR / LIB_NAME)
    STAMP.write_text(json.dumps({"key": source_key(), "llama_cpp_python": LLAMA_CPP_PYTHON}) + "\n")
    return LIB_DIR / LIB_NAME


def main() -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--force", action="store_true", help="rebuild even if built")
    ap.add_argument("--jobs", type=int, default=None)
    a = ap.parse_args()
    try:
        path = build(force=a.force, jobs=a.jobs)
    except BuildError as e:
        print(f"adaspark: {e}", file=sys.stderr)
        return 1
    print(f"adaspark: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
