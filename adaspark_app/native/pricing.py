"""The round's pricing in C (``pricing.c``): built once per source, loaded in the numpy code's place.

A round prices its tree before it can choose a width: the candidates' columns and their class
precision, Eq. (6)'s design and both estimates, then Q, the committable Q, the best-first order
and S(n). In numpy that is ~40 array operations on a few dozen nodes, each microseconds of
dispatch, and several times that with the CPU's caches cold between rounds: the largest part of
a tree round's host time, which a GPU's short step cannot hide (issue 41). ``pricing.c`` computes
the same values in three calls, and a fourth folds a round's committed tokens into the n-gram class
counts (``learn/precision.py``: every token decays two tables, four numpy operations a token). The
numpy code stays the reference and the fallback (``engine/candidates.py``, ``learn/acceptance.py``,
``engine/tree.py``, ``learn/precision.py``); the callers choose.

The module is built against Python's stable ABI (3.11), so one build serves every later Python
too. ``pip install`` builds it (setup.py, with the kernels; ``c_compile.py``); ``load`` builds it on first use if
the installed one is missing or was built from another source (a checkout that moved on, the GPU
run's copy of the tree), into ``native/lib/pricing/<digest>/``. Where it cannot be built (no C
compiler, no Python headers, a read-only install) the numpy code runs, and ``status`` says why.
``ADASPARK_NUMPY_PRICING=1`` keeps the numpy code.

    python -m adaspark_app.native.pricing [--force]   # build; print where and the status
"""

from __future__ import annotations

import hashlib
import os
import sys
import sysconfig
from pathlib import Path
from types import ModuleType

from .build import LIB_DIR
from .c_compile import BuildError, build_command, built_or_why, compile_into, compiler

SOURCE = Path(__file__).resolve().parent / "pricing.c"
SWITCH = "ADASPARK_NUMPY_PRICING"
# no -ffast-math: the same libm as numpy's fallback; no contraction of a * b + c into one rounding
# (an FMA), which numpy's separate operations never make
FLAGS = ("-O2", "-shared", "-fPIC", "-std=c11", "-Wall", "-ffp-contract=off")

_loaded: ModuleType | None = None
_status = "not loaded"


def digest() -> str:
    """The build's key: the source and the flags."""
    h = hashlib.sha256(SOURCE.read_bytes())
    h.update(" ".join(FLAGS).encode())
    return h.hexdigest()[:16]


def target() -> Path:
    """Where this source's build lives."""
    return LIB_DIR / "pricing" / digest() / "_pricing.abi3.so"


def build(force: bool = False) -> Path:
    """Compile ``pricing.c`` into ``target()``, removing the builds of earlier sources; BuildError
    with the compiler's first error line when it cannot."""
    out = target()
    if out.exists() and not force:
        return out
    include = sysconfig.get_paths().get("include") or ""
    if not Path(include, "Python.h").exists():
        raise BuildError(f"no Python headers (Python.h) in {include or 'an unknown folder'}")
    return compile_into(compiler(), [*FLAGS, f"-I{include}", str(SOURCE), "-lm"], out)


def _import(path: Path) -> ModuleType:
    import importlib.machinery
    import importlib.util

    loader = importlib.machinery.ExtensionFileLoader("adaspark_app.native._pricing", str(path))
    spec = importlib.util.spec_from_file_location("adaspark_app.native._pricing", str(path), loader=loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def load() -> ModuleType | None:
    """The C module (built first if need be), or None where the numpy code runs (``status``
    says why). Once per process."""
    global _loaded, _status
    if _status != "not loaded":
        return _loaded
    if os.environ.get(SWITCH, "") not in ("", "0"):
        _status = f"numpy ({SWITCH}={os.environ[SWITCH]})"
        return None
    path, why = built_or_why(target(), build)
    if path is None:
        _status = f"numpy (C pricing not built: {why})"
        return None
    try:
        _loaded = _import(path)
    except (ImportError, OSError) as e:
        _status = f"numpy (C pricing failed to load: {str(e).splitlines()[0]})"
        return None
    _status = "C"
    return _loaded


def status() -> str:
    """``C``, or ``numpy (why)``; loads the module if no one has yet."""
    load()
    return _status


def main(argv: list[str] | None = None) -> int:
    return build_command(argv, "AdaSpark's round pricing in C", build, lambda: f" ({status()})")


if __name__ == "__main__":
    sys.exit(main())
