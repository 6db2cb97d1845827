"""Where the AVX-512 Q4_K x 4-column tile's time goes, on one thread, by removing parts of it.

    python -m benchmarks.cost.q4k_tile [--out FILE.md]

Compiles ``q4k_tile.cpp`` against a copy of ``adaspark_app/native/tinyblas_k_quants.inc`` in
five builds: the tile as shipped, and timing-only variants without the per-superblock scalar
scale decode (``NO_DECODE``), without the per-superblock float steps (``NO_FLOAT``), without
both, and without the prefetch (``NO_PF``). The variants compute wrong numbers; only their time
means something. Each runs a tile that stays in L1 (4 weight rows, k = 1536), one of ffn_down's
length (k = 8960) and a whole 1.5B-sized matrix (1536 rows) at 8 batch columns; GMAC/s are int8
multiply-adds per second, against the peak of the integer core alone on this CPU. Needs g++
with AVX-512 (F, BW, VL, DQ, VNNI); random weights, no model.
"""

from __future__ import annotations

import argparse
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
INC = HERE.parent.parent / "adaspark_app" / "native" / "tinyblas_k_quants.inc"
FLAGS = ["-O3", "-std=c++17", "-mavx2", "-mfma", "-mf16c", "-mavx512f", "-mavx512bw", "-mavx512vl",
         "-mavx512dq", "-mavx512vnni"]
VARIANTS = {"as shipped": [], "no scale decode": ["-DNO_DECODE"], "no float steps": ["-DNO_FLOAT"],
            "integer core only": ["-DNO_DECODE", "-DNO_FLOAT"], "no prefetch": ["-DNO_PF"]}
SHAPES = [("in L1: 4 rows, k 1536, 4 cols", "4 6 4 200000"), ("4 rows, k 8960, 4 cols", "4 35 4 40000"),
          ("1536 rows, k 1536, 8 cols", "1536 6 8 40"), ("1536 rows, k 8960, 8 cols", "1536 35 8 10")]

DECODE = """                uint32_t utmp[4];
                memcpy(utmp, x[r]->scales, 12);
                utmp[3] = ((utmp[2] >> 4) & kmask2) | (((utmp[1] >> 6) & kmask3) << 4);
                const uint32_t uaux = utmp[1] & kmask1;
                utmp[1] = (utmp[2] & kmask2) | (((utmp[0] >> 6) & kmask3) << 4);
                utmp[2] = uaux;
                utmp[0] &= kmask1;
                ms[r] = _mm512_castsi256_si512(_mm256_cvtepu8_epi16(_mm_set_epi32(utmp[3], utmp[2], utmp[1], utmp[0])));"""
FLOAT_START = "            // the columns' d as floats: [d0 d1 d2 d3], then spread to the lanes"
FLOAT_END = "        for (int r = 0; r < RM; ++r)\n            for (int j = 0; j < RN; ++j) {\n                const __m512 a2"
PREFETCH = "                prefetch_ahead<RM>(x[r], l);\n"


def patched(src: str) -> str:
    """The .inc with the timing-only switches; ValueError if the tile no longer has the parts."""
    head, sep, rest = src.partition("inline void tile_q4_K_x4(")
    end = rest.find("\n    template <")
    tile, tail = (rest, "") if end < 0 else (rest[:end], rest[end:])
    if not sep or tile.count(DECODE) != 1 or tile.count(FLOAT_START) != 1 or tile.count(PREFETCH) != 1:
        raise ValueError("tile_q4_K_x4 changed: update q4k_tile.py's patterns")
    # only the 4-column tile is patched: the kernel's other tiles and the one-row path stay as shipped
    tile = tile.replace(DECODE, "#ifdef NO_DECODE\n                ms[r] = _mm512_castsi256_si512(_mm256_cvtepu8_epi16("
                        "_mm_loadu_si128((const __m128i *)x[r]->scales)));\n#else\n" + DECODE + "\n#endif")
    i = tile.index(FLOAT_START)
    k = tile.rindex("        }\n", i, tile.index(FLOAT_END, i))
    fold = ("            for (int r = 0; r < RM; ++r) acc[0][r] = _mm512_add_ps(acc[0][r], _mm512_cvtepi32_ps(_mm512_add_epi32("
            "_mm512_add_epi32(sumz[0][r], sumz[1][r]), _mm512_add_epi32(sumz[2][r], sumz[3][r]))));\n")
    tile = tile[:i] + "#ifndef NO_FLOAT\n" + tile[i:k] + "#else\n" + fold + "#endif\n" + tile[k:]
    tile = tile.replace(PREFETCH, "#ifndef NO_PF\n" + PREFETCH + "#endif\n")
    return head + sep + tile + tail


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if shutil.which("g++") is None:
        print("q4k_tile: g++ not found", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        (d / "tinyblas_k_quants.inc").write_text(patched(INC.read_text()))
        shutil.copy(HERE / "q4k_tile.cpp", d / "q4k_tile.cpp")
        rows: dict[str, list[float]] = {}
        peak = None
        for name, defs in VARIANTS.items():
            exe = d / f"t{len(rows)}"
            subprocess.run(["g++", *FLAGS, *defs, "-o", str(exe), str(d / "q4k_tile.cpp")], check=True)
            rows[name] = []
            for _, shape in SHAPES:
                extra = ["peak"] if peak is None else []
                out = subprocess.run([str(exe), *shape.split(), *extra], check=True, capture_output=True, text=True).stdout
                rows[name].append(float(re.search(r"([\d.]+) GMAC/s", out).group(1)))
                if peak is None:
                    peak = float(re.search(r"peak ([\d.]+) GMAC/s", out).group(1))
            print(name, rows[name], flush=True)
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), platform.processor())
    lines = [f"# Q4_K x 4-column tile, one thread, GMAC/s ({cpu})", "",
             f"Integer core's peak (independent vpmaddubsw + vpdpwssd zmm pairs): {peak:.1f} GMAC/s.", "",
             "| build | " + " | ".join(s for s, _ in SHAPES) + " |", "|---|" + "---|" * len(SHAPES)]
    for name, vals in rows.items():
        lines.append(f"| {name} | " + " | ".join(f"{v:.1f} ({v / peak:.0%})" for v in vals) + " |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
