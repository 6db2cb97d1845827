"""Train the DSpark drafter for the bundled SmolLM2-135M-Instruct by self-distillation.

Starts from `adaspark drafter init` (a random drafter with the target layers the data was read
at), trains every drafter tensor on the data of `extract.py` (the target's greedy replies, so
every label is the target's argmax), and writes a drafter GGUF the engine loads. Objective, as
DSpark's: cross-entropy of every block row against the target's greedy tokens, the Markov head
following the true previous token (teacher forcing); the confidence head learns, by binary
cross-entropy, whether the row's pick would be accepted (the row and every row before it
argmax-correct). The target's embeddings/head stay frozen (they are the target's, shared).

    python tools/train_drafter/train.py --data DATA_DIR --out drafter.gguf [--minutes 30]
"""

from __future__ import annotations

import argparse
import glob
import math
import os
import random
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from model import Drafter, read_drafter, target_embeddings  # noqa: E402

from adaspark_app.engine.drafter_init import bundled_target_path, write_random_drafter  # noqa: E402

BLOCK = 8
FFN = 1024  # backbone feed-forward width: keeps the F32 file under 30 MB with the rank-32 Markov head
TARGET_LAYERS = (1, 15, 29)
ANCHORS_PER_STEP = 48


def load(data: str) -> list[tuple[np.ndarray, np.ndarray, int, str]]:
    seqs = []
    for f in sorted(glob.glob(os.path.join(data, "shard-*.npz"))):
        z = np.load(f, allow_pickle=True)
        for t, fe, s, i in zip(z["tokens"], z["feats"], z["start"], z["ids"]):
            seqs.append((t.astype(np.int64), fe.astype(np.float32), int(s), str(i)))
    return seqs


def batch_of(seq, anchors: np.ndarray):
    tokens, feats, start, _ = seq
    L = len(tokens)
    idx = anchors[:, None] + 1 + np.arange(BLOCK)[None, :]
    labels = np.where(idx < L, tokens[np.minimum(idx, L - 1)], -100)
    prev = np.concatenate([tokens[anchors][:, None], np.where(labels[:, :-1] >= 0, labels[:, :-1], 0)], axis=1)
    return torch.tensor(labels), torch.tensor(prev)


def step_loss(model: Drafter, seq, anchors: np.ndarray):
    tokens, feats, start, _ = seq
    labels, prev = batch_of(seq, anchors)
    a = torch.tensor(anchors)
    logits, z = model(torch.tensor(feats), torch.tensor(tokens), a, prev)
    valid = labels >= 0
    ce = torch.nn.functional.cross_entropy(logits[valid], labels[valid])
    step_loss.row0 = float(torch.nn.functional.cross_entropy(logits[:, 0][valid[:, 0]].detach(), labels[:, 0][valid[:, 0]]))
    with torch.no_grad():
        ok = (logits.argmax(-1) == labels) & valid
        accepted = torch.cumprod(ok.to(torch.int64), dim=1).bool()
    bce = torch.nn.functional.binary_cross_entropy_with_logits(z[valid], accepted[valid].float())
    return ce, bce, accepted, valid, z


def heldout(model: Drafter, seqs, sample: int | None = None,
            max_anchors: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Blocks at held-out anchors (every anchor, or `sample` random ones per conversation, until
    `max_anchors`): per complete block the accepted flags of its rows [blocks, B] (greedy picks
    along the true text, so a row counts while it and every row before it are right), and per
    labelled row the confidence and whether the row was accepted."""
    rng = np.random.default_rng(0)
    acc, conf_p, conf_y = [], [], []
    n = 0
    with torch.no_grad():
        for seq in seqs:
            tokens, _, start, _ = seq
            anchors = np.arange(start, len(tokens) - 1)
            if sample is not None:
                anchors = anchors[rng.permutation(len(anchors))[:sample]]
            for k in range(0, len(anchors), ANCHORS_PER_STEP):
                chunk = anchors[k:k + ANCHORS_PER_STEP]
                _, _, accepted, valid, z = step_loss(model, seq, chunk)
                acc.append(accepted[valid.all(dim=1)].numpy())
                conf_p.append(torch.sigmoid(z[valid]).numpy())
                conf_y.append(accepted[valid].numpy())
                n += len(chunk)
            if max_anchors is not None and n >= max_anchors:
                break
    return np.concatenate(acc), np.concatenate(conf_p), np.concatenate(conf_y).astype(np.float64)


def evaluate(model: Drafter, seqs, max_anchors: int = 2000) -> dict[str, float]:
    """Held-out summary: mean accepted picks per block at chain:4 and chain:7, and the
    confidence head's calibration (a sample of anchors: cheap enough to print while training)."""
    acc, p, y = heldout(model, seqs, sample=ANCHORS_PER_STEP, max_anchors=max_anchors)
    return {"accepted_chain4": float(acc[:, :4].sum(axis=1).mean()),
            "accepted_chain7": float(acc[:, :7].sum(axis=1).mean()),
            "conf_mean": float(p.mean()), "accept_rate": float(y.mean()),
            "conf_brier": float(np.mean((p - y) ** 2))}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--minutes", type=float, default=30.0, help="training time budget")
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--holdout", type=int, default=20, help="conversations kept out for evaluation")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--init", default=None, help="continue from this drafter file instead of a random one")
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    random.seed(a.seed)
    target = bundled_target_path()
    seqs = load(a.data)
    rng = random.Random(a.seed)
    rng.shuffle(seqs)
    held, train = seqs[: a.holdout], seqs[a.holdout:]
    print(f"{len(train)} training conversations, {sum(len(s[0]) - s[2] for s in train)} reply tokens; "
          f"{len(held)} held out", flush=True)
    if a.init:
        kv, w = read_drafter(a.init)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            init = os.path.join(tmp, "init.gguf")
            write_random_drafter(target, init, block_size=BLOCK, layers=1, seed=a.seed,
                                 target_layers=list(TARGET_LAYERS), ffn_length=FFN)
            kv, w = read_drafter(init)
        w["markov_w2.weight"][:] = 0.0  # the Markov bias starts neutral; training grows it
    model = Drafter(kv, w, target_embeddings(target))
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.0)
    t0 = time.time()
    budget = a.minutes * 60
    step = 0
    ema = ema0 = None
    pool = [(i, t) for i, s in enumerate(train) for t in range(s[2], len(s[0]) - 1)]
    print(f"before training: {evaluate(model, held)}", flush=True)
    while time.time() - t0 < budget:
        rng.shuffle(pool)
        by_seq: dict[int, list[int]] = {}
        for i, t in pool:
            by_seq.setdefault(i, []).append(t)
        order = list(by_seq.items())
        rng.shuffle(order)
        for i, ts in order:
            for k in range(0, len(ts), ANCHORS_PER_STEP):
                frac = min(1.0, (time.time() - t0) / budget)
                for g in opt.param_groups:
                    g["lr"] = a.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
                ce, bce, _, _, _ = step_loss(model, train[i], np.array(ts[k:k + ANCHORS_PER_STEP]))
                loss = ce + 0.1 * bce
                opt.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                step += 1
                ema = ce.item() if ema is None else 0.98 * ema + 0.02 * ce.item()
                ema0 = step_loss.row0 if ema0 is None else 0.98 * ema0 + 0.02 * step_loss.row0
                if step % 50 == 0:
                    print(f"step {step} {time.time() - t0:.0f}s ce {ema:.3f} (first row {ema0:.3f}) "
                          f"bce {bce.item():.3f}", flush=True)
                if time.time() - t0 >= budget:
                    break
            if time.time() - t0 >= budget:
                break
    print(f"after {step} steps: {evaluate(model, held)}", flush=True)
    write_random_drafter(target, a.out, block_size=BLOCK, layers=1, seed=a.seed,
                         target_layers=list(TARGET_LAYERS), ffn_length=FFN, weights=model.weights(),
                         description=f"AdaSpark DSpark drafter for SmolLM2-135M-Instruct: self-distilled, "
                                     f"{len(train)} ShareGPT conversations, {step} steps")
    ids = sorted(s[3] for s in seqs)  # every conversation read, held-out ones included
    Path(a.out).with_name("drafter-training-ids.txt").write_text("".join(f"sharegpt {i}\n" for i in ids))
    print(f"wrote {a.out} and the {len(ids)} ShareGPT ids beside it")


if __name__ == "__main__":
    main()
