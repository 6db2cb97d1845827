"""The files and folders commands write: checked before the long work, failures as one line.

`adaspark run --out`, `--log-rounds`, `adaspark bench --report` and `--store-dir`, `drafter init
--out` and `bench-corpus --out` name paths a user types. A path that cannot be written (a missing
folder, a folder where a file was meant, no permission, a full disk) is an ``OutputError``: the
CLI prints one line and exits 2. Where the work is long (a model to load, a benchmark to run) the
path is checked first, without touching a file that is already there, so that a typo costs
seconds and an earlier result is not truncated by a run that then fails to start.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import TextIO

from .errors import OutputError


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc)


def check_writable(path: str | os.PathLike[str], what: str) -> Path:
    """``path`` can be created or overwritten as a file: its folder exists and takes new files,
    it is not a folder, and if it exists it may be written. Changes nothing; OutputError if not."""
    p = Path(path).expanduser()
    folder = p.parent
    if p.is_dir():
        raise OutputError(f"cannot write {what} {p}: it is a folder")
    if not folder.is_dir():
        raise OutputError(f"cannot write {what} {p}: no folder {folder}")
    if p.exists() and not os.access(p, os.W_OK):
        raise OutputError(f"cannot write {what} {p}: permission denied")
    if not p.exists() and not os.access(folder, os.W_OK | os.X_OK):
        raise OutputError(f"cannot write {what} {p}: the folder {folder} does not take new files")
    return p


def open_output(path: str | os.PathLike[str], what: str) -> TextIO:
    """``path`` opened for writing text (truncated); OutputError instead of an OSError."""
    p = Path(path).expanduser()
    try:
        return open(p, "w", encoding="utf-8")
    except OSError as exc:
        raise OutputError(f"cannot write {what} {p}: {_reason(exc)}") from None


def make_output_dir(path: str | os.PathLike[str], what: str) -> Path:
    """The folder ``path``, made with its parents where missing, that takes new files;
    OutputError if it cannot be."""
    p = Path(path).expanduser()
    for q in (p, *p.parents):  # the nearest that exists must be a folder
        if q.exists():
            if not q.is_dir():
                raise OutputError(f"cannot make {what} {p}: {q} is a file")
            break
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"cannot make {what} {p}: {_reason(exc)}") from None
    if not os.access(p, os.W_OK | os.X_OK):
        raise OutputError(f"cannot write into {what} {p}: permission denied")
    return p


def is_special(path: str | os.PathLike[str]) -> bool:
    """``path`` exists (its link followed) and is neither a regular file nor a folder: a device
    (`/dev/null`, `/dev/stdout`), a pipe or a socket."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def temp_for(path: str | os.PathLike[str], prefix: str, suffix: str = "") -> tuple[int, str]:
    """A new temporary file (descriptor, name) that `put_in_place` will move to ``path``: beside
    it, so the rename stays on one file system, or in the system's temp folder where ``path`` is a
    device or a pipe (its folder, /dev, takes no files). OSError as mkstemp raises it."""
    folder = Path(path).parent
    return tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=None if is_special(path) else folder)


def put_in_place(tmp: str | os.PathLike[str], path: str | os.PathLike[str]) -> None:
    """A file written whole at ``tmp`` becomes ``path``: renamed over it, or, where ``path`` is a
    device or a pipe, copied into it and removed. A rename replaced the device itself: as root,
    `drafter init --out /dev/null` left /dev/null a regular file, and every later writer to it
    (tmux's daemon among them) failed. OSError as the rename or the copy raise it."""
    if is_special(path):
        with open(tmp, "rb") as src, open(path, "wb") as dst:
            shutil.copyfileobj(src, dst)
        os.unlink(tmp)
    else:
        os.replace(tmp, path)
