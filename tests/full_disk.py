"""A real full disk for tests: a small tmpfs, where mounting one is allowed (root, as on CI;
skipped elsewhere), and a file that fills it."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest


@pytest.fixture
def small_disk(tmp_path):
    """A real 600 KiB file system (tmpfs), where mounting one is allowed (root, as on CI): a
    full disk is `fill_disk(small_disk)`."""
    where = tmp_path / "disk"
    where.mkdir()
    if shutil.which("mount") is None or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=600k", "tmpfs", str(where)], capture_output=True).returncode != 0:
        pytest.skip("cannot mount a small file system here")
    yield where
    subprocess.run(["umount", str(where)], check=True)


def fill_disk(where: Path) -> Path:
    """Fill the file system holding `where` with one file (returned: unlink it to make room)."""
    filler = where / "fill"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError:  # ENOSPC: full
        pass
    finally:
        os.close(fd)
    return filler
