"""The Q4_1 kernel at two revisions, one thread: bit-identical outputs, and the speed of each.

    python -m benchmarks.cost.q4_1_tile [--base REV] [--avx512] [--out FILE.md]

Compiles ``q4_1_tile.cpp`` with ``adaspark_app/native/tinyblas_q4_1.inc`` as this checkout has it
(head) and as commit REV has it (base, default ``HEAD``: the last commit against the working
tree), and runs both on the same random Q4_1 weights and Q8_1 activations: SmolLM2's shapes (576
and 1,536 weight rows of 18 blocks, 576 of 48) at 1-512 batch columns, tails of 1-3 rows and
columns included, and a one-row product as big as a whole model (memory-bound). Every output of
head must equal base's bit for bit (a row must compute alike in any tile); the table gives GMAC/s
(int8 multiply-adds per second) and head's time over base's, best of five. ``--avx512`` builds
with AVX-512 (the kernel's zen4-like path; this CPU must have it). Needs g++; no model.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.common import ROOT, cpu_model

HERE = Path(__file__).resolve().parent
INC = ROOT / "adaspark_app" / "native" / "tinyblas_q4_1.inc"
FLAGS = ["-O3", "-std=c++17", "-mavx2", "-mfma", "-mf16c", "-mbmi2"]
AVX512 = ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq"]
# (weight rows, blocks per row, batch columns)
SHAPES = [(576, 18, n) for n in (1, 2, 3, 4, 5, 8, 16, 64, 512)] + \
         [(579, 18, 7), (1536, 18, 8), (576, 48, 16), (100_000, 18, 1)]
LINE = re.compile(r"base ([\d.]+) head ([\d.]+) head/base ([\d.]+) mismatches (\d+)")


def base_source(rev: str) -> str:
    """tinyblas_q4_1.inc as commit `rev` has it."""
    rel = INC.relative_to(ROOT).as_posix()
    return subprocess.run(["git", "show", f"{rev}:{rel}"], cwd=ROOT, check=True, capture_output=True,
                          text=True).stdout


def parse(out: str) -> tuple[float, float, float, int]:
    """(base GMAC/s, head GMAC/s, head/base time, mismatches) from one run's line."""
    m = LINE.search(out)
    if m is None:
        raise ValueError(f"unexpected q4_1_tile output: {out!r}")
    return float(m.group(1)), float(m.group(2)), float(m.group(3)), int(m.group(4))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="HEAD", help="the reference commit (default HEAD)")
    ap.add_argument("--avx512", action="store_true")
    ap.add_argument("--seconds", type=float, default=0.3, help="timing per shape and kernel")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if shutil.which("g++") is None:
        print("q4_1_tile: g++ not found", file=sys.stderr)
        return 2
    try:
        base = base_source(args.base)
    except subprocess.CalledProcessError as e:
        print(f"q4_1_tile: no {INC.name} at {args.base}: {e.stderr.strip()}", file=sys.stderr)
        return 2
    rows, bad = [], 0
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        (d / "base.inc").write_text(base)
        shutil.copy(INC, d / "head.inc")
        shutil.copy(HERE / "q4_1_tile.cpp", d / "q4_1_tile.cpp")
        exe = d / "q4_1_tile"
        subprocess.run(["g++", *FLAGS, *(AVX512 if args.avx512 else []), "-o", str(exe), str(d / "q4_1_tile.cpp")],
                       check=True)
        for m, kb, n in SHAPES:
            p = subprocess.run([str(exe), str(m), str(kb), str(n), str(args.seconds)], capture_output=True, text=True)
            b, h, ratio, mismatches = parse(p.stdout)
            bad += mismatches
            rows.append(f"| {m} x {kb * 32} | {n} | {b:.1f} | {h:.1f} | {ratio:.3f} | {mismatches} |")
            print(rows[-1], flush=True)
    text = "\n".join([f"# Q4_1 kernel, {args.base} (base) against this checkout (head), one thread",
                      "", f"- CPU: {cpu_model()}; {'AVX-512' if args.avx512 else 'AVX2'} build", "",
                      "| weights | columns | base GMAC/s | head GMAC/s | head/base time | outputs differing |",
                      "|---|---|---|---|---|---|", *rows]) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
    if bad:
        print(f"q4_1_tile: {bad} outputs differ between base and head", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
