"""Building AdaSpark's small C libraries on the user's machine: the round's pricing
(``pricing.py``) and the crash line (``fatal_signal.py``).

Each is built once per source into its own folder under ``native/lib/`` (``pip install`` builds
them, and a process that finds its source's build missing builds it on first use); a build that
failed leaves ``failed.txt`` beside it, so not every process tries again, and the code that needs
the library takes its fallback, saying why.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable

FAILED = "failed.txt"


class BuildError(RuntimeError):
    """A library could not be built (one line: why)."""


def compiler() -> str | None:
    """The C compiler: $CC, else cc or gcc on the PATH."""
    cc = os.environ.get("CC", "").split()
    if cc and shutil.which(cc[0]):
        return cc[0]
    return shutil.which("cc") or shutil.which("gcc")


def compile_into(cc: str | None, args: list[str], out: Path) -> Path:
    """``cc ARGS -o OUT``, atomically (processes may race here: each writes its own file, then
    renames it in), removing the builds of earlier sources beside OUT's folder; BuildError with the
    compiler's first error line when it cannot."""
    if cc is None:
        raise BuildError("no C compiler (cc, gcc or $CC)")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}")
    try:
        res = subprocess.run([cc, *args, "-o", str(tmp)], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise BuildError(f"{cc} failed to run: {e}") from None
    if res.returncode != 0:
        tmp.unlink(missing_ok=True)
        first = next((ln for ln in res.stderr.splitlines() if "error" in ln), res.stderr.strip()[:200])
        raise BuildError(f"{cc} failed: {first}")
    os.replace(tmp, out)
    (out.parent / FAILED).unlink(missing_ok=True)
    for old in out.parent.parent.iterdir():  # builds of earlier sources (a process using one keeps its mapping)
        if old.is_dir() and old != out.parent:
            shutil.rmtree(old, ignore_errors=True)
    return out


def built_or_why(out: Path, build: Callable[[], Path]) -> tuple[Path | None, str]:
    """(OUT, '') when it exists or ``build`` makes it; (None, why) when a build of this source failed,
    now (recorded in ``failed.txt`` for the next process) or before."""
    if out.exists():
        return out, ""
    failed = out.parent / FAILED
    if failed.exists():  # a build of this source failed before: not again in every process
        return None, failed.read_text(encoding="utf-8").strip()
    try:
        return build(), ""
    except (BuildError, OSError) as e:
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        try:
            failed.parent.mkdir(parents=True, exist_ok=True)
            failed.write_text(why + "\n", encoding="utf-8")
        except OSError:
            pass
        return None, why


def build_command(argv: list[str] | None, what: str, build: Callable[..., Path], after: Callable[[], str]) -> int:
    """A library's ``python -m`` command: build it (``--force``: even if this source's build exists),
    print where and ``after()``; exit 2 with one line when it cannot be built."""
    import argparse

    ap = argparse.ArgumentParser(description=f"Build {what} for this machine.")
    ap.add_argument("--force", action="store_true", help="rebuild even if this source's build exists")
    a = ap.parse_args(argv)
    try:
        path = build(force=a.force)
    except (BuildError, OSError) as e:
        print(f"adaspark: {what} not built: {e}", file=sys.stderr)
        return 2
    print(f"{path}{after()}")
    return 0
