"""Batch-invariant rows for llama.cpp's CUDA backend: ``cuda_exact.patch`` and what applies it.

On the CPU a row of a verify computes the same bits as the row alone (``build.py``'s kernels). On
an NVIDIA GPU stock llama.cpp changes kernels and launch shapes with the batch size (the
matrix-vector kernel's warp count at 5-8 columns, the tiled MMQ kernel at 9+, the one-column
fusions, flash attention's kernel and KV split), so rows round differently and replies can leave
plain decode's after a near tie. The patch (a unified diff against llama-cpp-python 0.3.36's
``vendor/llama.cpp``, read ``cuda_exact.patch`` itself for the why of each hunk) makes every batch
of up to ``EXACT_MAX_ROWS`` rows compute each row as a batch of one does, when the process has
``ADASPARK_CUDA_EXACT=1`` (``native.activate`` sets it unless ``ADASPARK_STOCK_KERNELS`` is set);
without it the patched library is stock llama.cpp (``ADASPARK_CUDA_EXACT=2``: exact with the stock
matrix-vector kernel's launches only, to tell its wide copy apart on a GPU). A library carrying the
patch exports ``adaspark_cuda_exact_rows()``: the widest such batch, 0 when the switch is off.

The patch's last hunk is a switch of its own, ``ADASPARK_CUDA_GRAPHS=1`` (``native.activate`` sets it
with the exact one): it changes no kernel, only which CUDA graph a forward replays. Stock llama.cpp
keeps one graph per context, so a verify between one-row steps costs the verify's graph and the next
step's (both launched node by node from the host, and the step after recaptures); with the switch
each batch shape keeps a graph of its own. The library exports ``adaspark_cuda_graphs()``: 1 when on.

A third switch, ``ADASPARK_CUDA_ARGMAX=1`` (``native.activate`` sets it with the others), changes no
token either: where greedy tokens are taken on the GPU (llama.cpp's backend sampling), a verify of W
rows ends in W argmax kernels of one block each, one after the other; with the switch a run of them
is one launch of a block per row, each row scanned by the stock kernel's code. It can be set at run
time (``set_library_argmax``: ``benchmarks/gpu/argmax_check.py`` times both ways in one process), and
keys the CUDA graphs. The library exports ``adaspark_cuda_argmax()``: 1 when on.

    python -m adaspark_app.native.cuda_exact SOURCE   # patch an unpacked llama-cpp-python source

Then build it as usual, e.g. ``CMAKE_ARGS="-DGGML_CUDA=on" pip install --no-build-isolation SOURCE``.
Not yet measured on a GPU: the README says what holds where.
"""

from __future__ import annotations

import ctypes
import os
import sys
from dataclasses import dataclass
from pathlib import Path

PATCH = Path(__file__).resolve().parent / "cuda_exact.patch"
#: The process switch the patched library reads once, at its first use.
SWITCH = "ADASPARK_CUDA_EXACT"
#: The patched library's other switch, read the same way: a CUDA graph per batch shape.
GRAPHS_SWITCH = "ADASPARK_CUDA_GRAPHS"
#: The third, which can also be set at run time (``set_library_argmax``): a verify's argmaxes in one launch.
ARGMAX_SWITCH = "ADASPARK_CUDA_ARGMAX"
#: The widest batch the patch keeps row for row (ADASPARK_EXACT_MAX_ROWS in the patch): the widest verify.
EXACT_MAX_ROWS = 64
#: Marks a patched file (each hunk's comments name AdaSpark).
MARK = "AdaSpark"


class PatchError(Exception):
    """The source is not the one the patch was written for (one line, for the user)."""


@dataclass(frozen=True)
class Hunk:
    path: str  # relative to vendor/llama.cpp
    old: str
    new: str


def hunks(text: str | None = None) -> list[Hunk]:
    """The patch's hunks, each as the exact text it replaces and its replacement (line numbers
    are not used: each old text must occur exactly once in its file)."""
    text = PATCH.read_text() if text is None else text
    out: list[Hunk] = []
    path: str | None = None
    old: list[str] = []
    new: list[str] = []
    in_hunk = False

    def flush() -> None:
        if in_hunk and path is not None:
            out.append(Hunk(path, "".join(old), "".join(new)))

    for line in text.splitlines(keepends=True):
        if line.startswith("diff ") or line.startswith("--- ") or line.startswith("index "):
            flush()
            in_hunk = False
        elif line.startswith("+++ "):
            path = line[4:].strip().removeprefix("b/")
        elif line.startswith("@@"):
            flush()
            in_hunk, old, new = True, [], []
        elif in_hunk:
            tag, body = line[:1], line[1:]
            if body == "" and tag not in " +-":  # an empty context line whose leading space was stripped
                tag, body = " ", line
            if tag in " -":
                old.append(body)
            if tag in " +":
                new.append(body)
    flush()
    return out


def apply(root: Path) -> list[str]:
    """Patch the llama.cpp tree at ``root`` (a ``vendor/llama.cpp``, or an unpacked llama-cpp-python
    source holding one) in place; returns the files changed. Nothing is written unless every hunk
    applies; a tree patched before is refused."""
    root = Path(root)
    if (root / "vendor" / "llama.cpp").is_dir():
        root = root / "vendor" / "llama.cpp"
    texts: dict[str, str] = {}
    for h in hunks():
        f = root / h.path
        if h.path not in texts:
            if not f.is_file():
                raise PatchError(f"{f} is missing: not a llama.cpp source with the CUDA backend")
            texts[h.path] = f.read_text()
            if MARK in texts[h.path]:
                raise PatchError(f"{f} is patched already")
        n = texts[h.path].count(h.old)
        if n != 1:
            raise PatchError(f"{f} does not look like llama-cpp-python 0.3.36's: a hunk of the patch "
                             f"matches {n} times")
        texts[h.path] = texts[h.path].replace(h.old, h.new)
    for rel, text in texts.items():
        (root / rel).write_text(text)
    return sorted(texts)


def _library_value(symbol: str, lib: str | os.PathLike | None) -> int | None:
    """``symbol()`` (an int) of the libggml-cuda at ``lib`` (default: the one llama.cpp has mapped,
    never a second copy: ``mapped.py``), or None if there is none or it lacks the symbol."""
    if lib is None:
        from .mapped import mapped_libraries

        handles = mapped_libraries("libggml-cuda")
    elif Path(lib).is_file():
        try:
            handles = [ctypes.CDLL(str(lib))]
        except OSError:
            return None
    else:
        return None
    for h in handles:
        fn = getattr(h, symbol, None)
        if fn is not None:
            fn.restype = ctypes.c_int
            fn.argtypes = []
            return int(fn())
    return None


def library_rows(lib: str | os.PathLike | None = None) -> int | None:
    """``adaspark_cuda_exact_rows()`` of the libggml-cuda at ``lib`` (default: the one llama.cpp
    has mapped), or None if there is none or it is stock."""
    return _library_value("adaspark_cuda_exact_rows", lib)


def library_graphs(lib: str | os.PathLike | None = None) -> bool | None:
    """Whether the libggml-cuda at ``lib`` (default: the one llama.cpp has mapped) replays a CUDA
    graph per batch shape (``adaspark_cuda_graphs()``); None if there is none, it is stock, or it
    was built without CUDA graphs."""
    value = _library_value("adaspark_cuda_graphs", lib)
    return None if value is None else bool(value)


def library_argmax(lib: str | os.PathLike | None = None) -> bool | None:
    """Whether the libggml-cuda at ``lib`` (default: the one llama.cpp has mapped) takes a run of
    one-row argmaxes in one launch (``adaspark_cuda_argmax()``); None if there is none or it is stock."""
    value = _library_value("adaspark_cuda_argmax", lib)
    return None if value is None else bool(value)


def set_library_argmax(on: bool) -> bool | None:
    """Set the mapped patched library's argmax switch for the forwards from now on
    (``adaspark_cuda_set_argmax``); returns it, or None where no mapped library has the switch."""
    from .mapped import mapped_libraries

    for h in mapped_libraries("libggml-cuda"):
        fn = getattr(h, "adaspark_cuda_set_argmax", None)
        if fn is not None:
            fn.restype = ctypes.c_int
            fn.argtypes = [ctypes.c_int]
            return bool(fn(1 if on else 0))
    return None


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m adaspark_app.native.cuda_exact",
                                 description="Patch an unpacked llama-cpp-python 0.3.36 source with "
                                             "AdaSpark's batch-invariant CUDA kernels.")
    ap.add_argument("source", type=Path, help="the unpacked source (or its vendor/llama.cpp)")
    args = ap.parse_args(argv)
    try:
        changed = apply(args.source)
    except (PatchError, OSError) as e:
        print(f"adaspark: {e}", file=sys.stderr)
        return 2
    print(f"patched {len(changed)} files: {', '.join(changed)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
