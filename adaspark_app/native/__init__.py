"""AdaSpark's Q4_1 multi-row kernels for llama.cpp (see ``build.py``), put in use by ``activate``.

Entry points call ``activate`` explicitly (the ``adaspark`` command, the benchmarks, the drafter
tools, the test suite's conftest), before anything imports ``llama_cpp``; importing the package
does nothing of the kind. A library user who wants the kernels calls it first too. If the
patched ``libggml-cpu`` was built for the installed llama-cpp-python, it copies llama-cpp-python's
libraries into a cache directory with that one in place of its own ``libggml-cpu`` and sets
``LLAMA_CPP_LIB_PATH`` there (copies, not links: each library finds its siblings through
``$ORIGIN``). Set ``ADASPARK_STOCK_KERNELS=1`` to keep the stock libraries; a
``LLAMA_CPP_LIB_PATH`` set by the user is left alone.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

from .build import LIB_DIR, LIB_NAME, STAMP

_status = "stock"
STALE_DAYS = 7
_MARK = "ADASPARK_KERNELS_DIR"  # the directory activate chose, inherited by child processes


def status() -> str:
    """Which kernels this process uses: ``q4_1-tinyblas`` or ``stock`` (with why, if known)."""
    return _status


def _stock_lib_dir() -> Path | None:
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or spec.origin is None:
        return None
    d = Path(spec.origin).parent / "lib"
    return d if d.is_dir() else None


def runtime_dir(stock: Path, ours: Path, cache_root: Path) -> Path:
    """A directory holding copies of ``stock``'s libraries with ``ours`` under every
    ``libggml-cpu.so*`` name; made once per (stock directory, our library), atomically. When
    one is made, those of other builds unused for STALE_DAYS are removed."""
    h = hashlib.sha256(str(stock.resolve()).encode())
    for f in sorted(stock.iterdir()) + [ours]:
        st = f.stat()
        h.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    target = cache_root / f"lib-{h.hexdigest()[:16]}"
    if (target / ".complete").exists():
        os.utime(target / ".complete")  # in use: not stale
        return target
    cache_root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".lib-", dir=cache_root))
    try:
        for f in sorted(stock.iterdir()):
            if f.is_file():
                shutil.copy2(ours if f.name.startswith(LIB_NAME) else f, tmp / f.name)
        (tmp / ".complete").write_text("")
        try:
            os.rename(tmp, target)
        except OSError:  # another process made it first
            if not (target / ".complete").exists():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    # Directories of other builds (24 MB each) unused for STALE_DAYS go. Another install's may be
    # in use right now (between its activate and its import of llama_cpp), hence the delay.
    cutoff = time.time() - STALE_DAYS * 86400
    for other in cache_root.glob("lib-*"):
        stamp = other / ".complete"
        if other != target and (stamp.stat().st_mtime if stamp.exists() else 0.0) < cutoff:
            shutil.rmtree(other, ignore_errors=True)
    return target


def activate() -> str:
    """Put the patched kernels in use for this process if they are built and usable; returns
    ``status()``. Never raises: any problem leaves the stock libraries in use."""
    global _status
    if "llama_cpp" in sys.modules:
        _status = "stock (llama_cpp was imported before native.activate())"
        return _status
    if os.environ.get("ADASPARK_STOCK_KERNELS"):
        _status = "stock (ADASPARK_STOCK_KERNELS)"
        return _status
    if os.environ.get("LLAMA_CPP_LIB_PATH"):
        if os.environ.get("LLAMA_CPP_LIB_PATH") == os.environ.get(_MARK):
            _status = "q4_1-tinyblas"  # set by activate in a parent process
        else:
            _status = "stock (LLAMA_CPP_LIB_PATH set by the user)"
        return _status
    ours = LIB_DIR / LIB_NAME
    try:
        stamp = json.loads(STAMP.read_text())
        if not ours.is_file():
            raise FileNotFoundError(ours)
    except (OSError, ValueError):
        _status = "stock (kernels not built: python -m adaspark_app.native.build)"
        return _status
    try:
        installed = metadata.version("llama-cpp-python")
    except metadata.PackageNotFoundError:
        installed = None
    stock = _stock_lib_dir()
    if installed != stamp.get("llama_cpp_python") or stock is None:
        _status = f"stock (kernels built for llama-cpp-python {stamp.get('llama_cpp_python')}, found {installed})"
        return _status
    try:
        from platformdirs import user_cache_dir

        target = runtime_dir(stock, ours, Path(user_cache_dir("adaspark")) / "native")
    except OSError as e:
        _status = f"stock (could not prepare the libraries: {e})"
        return _status
    os.environ["LLAMA_CPP_LIB_PATH"] = os.environ[_MARK] = str(target)
    _status = "q4_1-tinyblas"
    return _status
