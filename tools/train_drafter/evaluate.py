"""Held-out figures of a trained drafter file: accepted picks per block at chain:4 and chain:7
(along the target's greedy text, so a pick counts while it and every pick before it are the
target's tokens) and the confidence head's calibration by bin.

    python tools/train_drafter/evaluate.py --data DATA_DIR --drafter drafter.gguf [--holdout 20]

The held-out conversations are the ones `train.py` held out (same shuffle and seed).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from model import Drafter, read_drafter, target_embeddings  # noqa: E402
from train import heldout, load, split  # noqa: E402

from adaspark_app.engine.drafter_init import bundled_target_path  # noqa: E402

BINS = (0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--drafter", required=True)
    ap.add_argument("--holdout", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    held, _ = split(load(a.data), a.holdout, a.seed)
    kv, w = read_drafter(a.drafter)
    model = Drafter(kv, w, target_embeddings(bundled_target_path()))
    acc, p, y = heldout(model, held)
    acc4, acc7 = acc[:, :4].sum(axis=1), acc[:, :7].sum(axis=1)
    print(f"# Drafter `{a.drafter}` on {len(held)} held-out conversations ({len(acc4)} blocks)\n")
    print(f"- mean accepted picks per block: chain:4 {np.mean(acc4):.3f}"
          + (f", chain:7 {np.mean(acc7):.3f}" if acc.shape[1] >= 7 else f" (block {acc.shape[1]})"))
    print("- share of blocks whose row i is still accepted: "
          + ", ".join(f"{i}: {v:.2f}" for i, v in enumerate(acc.mean(axis=0))))
    print(f"- confidence head: mean {p.mean():.3f} vs accepted rate {y.mean():.3f}, Brier {np.mean((p - y) ** 2):.4f}\n")
    print("| confidence bin | rows | mean confidence | accepted rate |\n|---|---|---|---|")
    for lo, hi in zip(BINS, BINS[1:]):
        m = (p >= lo) & (p < hi if hi < 1.0 else p <= hi)
        if m.any():
            print(f"| {lo:.1f}-{hi:.1f} | {int(m.sum())} | {p[m].mean():.3f} | {y[m].mean():.3f} |")


if __name__ == "__main__":
    main()
