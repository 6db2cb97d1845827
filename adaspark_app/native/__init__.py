"""AdaSpark's Q4_1 multi-row kernels for llama.cpp (see ``build.py``), put in use by ``activate``.

Entry points call ``activate`` explicitly (the ``adaspark`` command, the benchmarks, the drafter
tools, the test suite's conftest), before anything imports ``llama_cpp``; importing the package
does nothing of the kind. A library user who wants the kernels calls it first too. The kernels are
built once per CPU variant (``build.VARIANTS``); ``activate`` reads this CPU's flags from
/proc/cpuinfo and takes the best built variant whose required flags (recorded in the stamp) are
all there, so a library directory that moved to another CPU never runs an instruction that CPU
lacks (SIGILL); when none fits, the stock libraries stay. If a variant was built for the installed
llama-cpp-python, it copies llama-cpp-python's libraries into a cache directory with that one in
place of its own ``libggml-cpu`` and sets ``LLAMA_CPP_LIB_PATH`` there (copies, not links: each
library finds its siblings through ``$ORIGIN``); when the install built the CUDA library too
(``cuda_exact.py``) and llama-cpp-python has one, ours takes its place the same way, and
``ADASPARK_CUDA_EXACT`` defaults to 1 (its batch-invariant rows). Set ``ADASPARK_STOCK_KERNELS=1`` to keep the
stock libraries, ``ADASPARK_KERNEL_VARIANT=NAME`` to force a built variant (refused, with the
stock libraries kept, if this CPU lacks its flags); a ``LLAMA_CPP_LIB_PATH`` set by the user is
left alone.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from . import build as _build
from .build import CUDA_LIB_NAME, LIB_DIR, LIB_NAME

_status = "stock"
_variant: str | None = None
STALE_DAYS = 7
_MARK = "ADASPARK_KERNELS_DIR"  # the directory activate chose, inherited by child processes
_VARIANT_MARK = "ADASPARK_KERNELS_VARIANT"  # and the variant in it
VARIANT_ENV = "ADASPARK_KERNEL_VARIANT"  # a user's (or a test's) choice of variant


def status() -> str:
    """Which kernels this process uses: ``q4_1-tinyblas`` or ``stock`` (with why, if known)."""
    return _status


def variant() -> str | None:
    """The CPU variant of the kernels in use (``build.VARIANTS``), None on the stock libraries."""
    return _variant


def choose_variant(built: dict[str, list[str]], flags: frozenset[str] | set[str],
                   forced: str | None = None) -> tuple[str | None, str]:
    """(variant, why): the best of `built` (variant -> the CPU flags its stamp says it needs) that
    this CPU's `flags` can run, or `forced` if it is built and runnable; (None, reason) if none."""
    if forced:
        if forced not in built:
            return None, f"{VARIANT_ENV}={forced} is not built (built: {', '.join(built) or 'none'})"
        missing = sorted(set(built[forced]) - set(flags))
        if missing:
            return None, f"{VARIANT_ENV}={forced} needs CPU flags this CPU lacks: {' '.join(missing)}"
        return forced, f"{VARIANT_ENV}={forced}"
    order = [v for v in _build.VARIANTS if v in built] + [v for v in built if v not in _build.VARIANTS]
    for v in order:
        if set(built[v]) <= set(flags):
            return v, "best built variant for this CPU"
    return None, f"no built kernel variant fits this CPU (built: {', '.join(built) or 'none'})"


def _stock_lib_dir() -> Path | None:
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or spec.origin is None:
        return None
    d = Path(spec.origin).parent / "lib"
    return d if d.is_dir() else None


def runtime_dir(stock: Path, ours: Path, cache_root: Path, cuda: Path | None = None) -> Path:
    """A directory holding copies of ``stock``'s libraries with ``ours`` under every
    ``libggml-cpu.so*`` name (and ``cuda`` under every ``libggml-cuda.so*`` name, if given and
    ``stock`` has one); made once per (stock directory, our libraries), atomically. When one is
    made, those of other builds unused for STALE_DAYS are removed."""
    swap = {LIB_NAME: ours}
    if cuda is not None and any(f.name.startswith(CUDA_LIB_NAME) for f in stock.iterdir()):
        swap[CUDA_LIB_NAME] = cuda
    h = hashlib.sha256(str(stock.resolve()).encode())
    for f in sorted(stock.iterdir()) + list(swap.values()):
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
                mine = next((p for name, p in swap.items() if f.name.startswith(name)), f)
                shutil.copy2(mine, tmp / f.name)
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
    """Put the patched kernels in use for this process if a variant this CPU can run is built and
    usable; returns ``status()``. Never raises: any problem leaves the stock libraries in use."""
    global _status, _variant
    _variant = None
    # the CUDA library built with cuda_exact.patch reads these once, at its first use: batch-invariant
    # rows unless the stock kernels were asked for (a library without the patch ignores it), and a CUDA
    # graph per batch shape and a verify's argmaxes in one launch (its other switches), off too with the
    # stock kernels
    from .cuda_exact import ARGMAX_SWITCH, GRAPHS_SWITCH, SWITCH  # here: `python -m adaspark_app.native.cuda_exact` imports this package first

    for switch in (SWITCH, GRAPHS_SWITCH, ARGMAX_SWITCH):
        os.environ.setdefault(switch, "0" if os.environ.get("ADASPARK_STOCK_KERNELS") else "1")
    if "llama_cpp" in sys.modules:
        _status = "stock (llama_cpp was imported before native.activate())"
        return _status
    if os.environ.get("ADASPARK_STOCK_KERNELS"):
        _status = "stock (ADASPARK_STOCK_KERNELS)"
        return _status
    if os.environ.get("LLAMA_CPP_LIB_PATH"):
        if os.environ.get("LLAMA_CPP_LIB_PATH") == os.environ.get(_MARK):
            _status = "q4_1-tinyblas"  # set by activate in a parent process
            _variant = os.environ.get(_VARIANT_MARK) or None
        else:
            _status = "stock (LLAMA_CPP_LIB_PATH set by the user)"
        return _status
    stamp = _build.read_stamp()
    entries = {v: e for v, e in stamp.get("variants", {}).items()
               if isinstance(e, dict) and isinstance(e.get("flags"), list) and (LIB_DIR / str(e.get("file", ""))).is_file()}
    if not entries:
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
    chosen, why = choose_variant({v: e["flags"] for v, e in entries.items()}, _build.cpu_flags(),
                                 os.environ.get(VARIANT_ENV) or None)
    if chosen is None:
        _status = f"stock ({why})"
        return _status
    try:
        from platformdirs import user_cache_dir

        cuda = stamp.get("cuda")
        cuda_lib = LIB_DIR / str(cuda.get("file", "")) if isinstance(cuda, dict) else None
        target = runtime_dir(stock, LIB_DIR / entries[chosen]["file"], Path(user_cache_dir("adaspark")) / "native",
                             cuda_lib if cuda_lib is not None and cuda_lib.is_file() else None)
    except OSError as e:
        _status = f"stock (could not prepare the libraries: {e})"
        return _status
    os.environ["LLAMA_CPP_LIB_PATH"] = os.environ[_MARK] = str(target)
    os.environ[_VARIANT_MARK] = chosen
    _status = "q4_1-tinyblas"
    _variant = chosen
    return _status


#: The patched library's one-row switch (build._SWITCH): bit 1 Q4_1, 2 Q4_K/Q6_K, 4 Q4_0/Q5_0/Q8_0
#: take one-row products in AdaSpark's kernels; a clear bit leaves that family's to ggml's vec_dot.
#: The two compute the same bits (each kernel sums as vec_dot does), so the switch changes speed only.
ONE_ROW_SYMBOL = "adaspark_one_row_kernels"
ONE_ROW_ALL = 7
ONE_ROW_NONE = 0
ONE_ROW_WIDE = ONE_ROW_ALL | 8  # and the Q0 kernel's one-row products in tiles of 8 weight rows
_one_row: Any = None
_one_row_looked = False


def one_row_switch() -> Any:
    """The one-row switch (a ``ctypes.c_int``) in the libggml-cpu that llama.cpp has loaded, or None:
    the stock libraries, a library built before the switch, or llama_cpp not imported yet. Found
    through /proc/self/maps and opened with RTLD_NOLOAD, so it is the mapped library's own
    variable and never a second copy of the library (``mapped.py``). Set it only between decodes:
    every thread of a product must read one value."""
    global _one_row, _one_row_looked
    if _one_row_looked:
        return _one_row
    if "llama_cpp" not in sys.modules or _status != "q4_1-tinyblas":
        return None
    _one_row_looked = True
    import ctypes

    from .mapped import mapped_libraries

    for lib in mapped_libraries("libggml-cpu"):
        try:
            _one_row = ctypes.c_int.in_dll(lib, ONE_ROW_SYMBOL)
            return _one_row
        except ValueError:
            continue
    return None
