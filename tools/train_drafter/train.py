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
import gzip
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
FFN = 2048  # backbone feed-forward width (F16 file, reduced vocabulary: about 26 MB)
TARGET_LAYERS = (1, 15, 29)
DRAFT_VOCAB = 8192  # the target tokens the drafter scores (llama.cpp's d2t), most frequent first
ROW_DECAY = 0.7  # weight of block row j in the loss: ROW_DECAY**j (early rows decide acceptance)
ANCHORS_PER_STEP = 64


class Seq:
    """One conversation: tokens, target features of positions 0..len(feats)-1, where the reply
    starts, its id, and the target's argmax at each position (``argmax[p]`` is the target's
    greedy token for position p+1; -1 where unknown)."""

    def __init__(self, tokens: np.ndarray, feats: np.ndarray, start: int, cid: str, argmax: np.ndarray | None):
        self.tokens, self.feats, self.start, self.id = tokens.astype(np.int64), feats, int(start), cid
        self.greedy = argmax is None
        if argmax is None:  # greedy data: the reply is the target's argmax chain
            argmax = np.full(len(feats), -1, dtype=np.int64)
            argmax[start - 1:] = self.tokens[start:len(feats) + 1]
        self.argmax = argmax.astype(np.int64)

    def anchors(self) -> np.ndarray:
        return np.arange(self.start, len(self.feats))


def load(data: str) -> list[Seq]:
    seqs = []
    for d in data.split(","):
        for f in sorted(glob.glob(os.path.join(d, "shard-*.npz"))):
            z = np.load(f, allow_pickle=True)
            ams = z["argmax"] if "argmax" in z.files else [None] * len(z["ids"])
            for t, fe, s, i, am in zip(z["tokens"], z["feats"], z["start"], z["ids"], ams):
                seqs.append(Seq(t, fe, int(s), str(i), am))
    return seqs


def draft_vocab(seqs: list[Seq], size: int, n_vocab: int) -> np.ndarray:
    """The `size` tokens the target picks most often in the replies (ties by id), sorted by id."""
    counts = np.zeros(n_vocab, dtype=np.int64)
    for q in seqs:
        am = q.argmax[q.start - 1:]
        np.add.at(counts, am[am >= 0], 1)
    order = np.lexsort((np.arange(len(counts)), -counts))
    return np.sort(order[:size])


def batch_of(seq: Seq, anchors: np.ndarray, block: int = BLOCK):
    """Labels (target ids, -100 where no label) and the Markov head's previous tokens per row.

    Row j at anchor n is labelled with the target's argmax at n+j while the text follows the
    target's greedy chain on rows 0..j-1 (always, on greedy data)."""
    tokens, am = seq.tokens, seq.argmax
    L, La = len(tokens), len(am)
    pos = anchors[:, None] + np.arange(block)[None, :]
    lab = np.where(pos < La, am[np.minimum(pos, La - 1)], -1)
    nxt = np.where(pos + 1 < L, tokens[np.minimum(pos + 1, L - 1)], -2)
    agree = (lab == nxt) & (lab >= 0)
    chain = np.concatenate([np.ones((len(anchors), 1), bool), np.cumprod(agree, axis=1)[:, :-1].astype(bool)], axis=1)
    labels = np.where(chain & (lab >= 0), lab, -100)
    prev = np.where(pos < L, tokens[np.minimum(pos, L - 1)], 0)
    return torch.tensor(labels), torch.tensor(prev)


def step_loss(model: Drafter, seq: Seq, anchors: np.ndarray):
    labels, prev = batch_of(seq, anchors, model.block)
    a = torch.tensor(anchors)
    logits, z = model(torch.tensor(seq.feats.astype(np.float32)), torch.tensor(seq.tokens), a, prev)
    valid = labels >= 0
    if model.d2t is not None:
        t2d = model.t2d
        dl = torch.where(valid, t2d[labels.clamp(min=0)], torch.full_like(labels, -100))
    else:
        dl = torch.where(valid, labels, torch.full_like(labels, -100))
    trainable = dl >= 0
    wrow = (ROW_DECAY ** torch.arange(model.block, dtype=torch.float32))[None, :].expand_as(labels)
    ce_all = torch.nn.functional.cross_entropy(logits[trainable], dl[trainable], reduction="none")
    ce = (ce_all * wrow[trainable]).sum() / wrow[trainable].sum().clamp(min=1e-6)
    r0 = trainable[:, 0]
    step_loss.row0 = float(torch.nn.functional.cross_entropy(logits[:, 0][r0].detach(), dl[:, 0][r0])) if r0.any() else 0.0
    with torch.no_grad():
        pick = logits.argmax(-1)
        if model.d2t is not None:
            pick = model.d2t[pick]
        ok = (pick == labels) & valid
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
            anchors = seq.anchors()
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


def split(seqs: list[Seq], holdout: int, seed: int) -> tuple[list[Seq], list[Seq]]:
    """(held out, training): `holdout` greedy conversations, by a seeded shuffle, are held out."""
    greedy = [q for q in seqs if q.greedy]
    random.Random(seed).shuffle(greedy)
    held = greedy[:holdout]
    held_ids = {id(q) for q in held}
    return held, [q for q in seqs if id(q) not in held_ids]


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
    ap.add_argument("--data", required=True, help="extract.py output folder(s), comma-separated")
    ap.add_argument("--out", required=True)
    ap.add_argument("--minutes", type=float, default=30.0, help="training time budget")
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--holdout", type=int, default=20, help="greedy conversations kept out for evaluation")
    ap.add_argument("--draft-vocab", type=int, default=DRAFT_VOCAB, help="tokens the drafter scores")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    random.seed(a.seed)
    torch.set_num_threads(os.cpu_count() or 2)
    target = bundled_target_path()
    seqs = load(a.data)
    rng = random.Random(a.seed)
    held, train = split(seqs, a.holdout, a.seed)
    embed = target_embeddings(target)
    d2t = draft_vocab(train, a.draft_vocab, len(embed))
    n_lab = sum(len(q.anchors()) for q in train)
    print(f"{len(train)} training conversations ({sum(q.greedy for q in train)} greedy), {n_lab} anchors; "
          f"{len(held)} greedy held out; draft vocabulary {len(d2t)}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        init = os.path.join(tmp, "init.gguf")
        write_random_drafter(target, init, block_size=BLOCK, layers=1, seed=a.seed,
                             target_layers=list(TARGET_LAYERS), ffn_length=FFN, draft_vocab=d2t)
        kv, w = read_drafter(init)
    w["markov_w2.weight"][:] = 0.0  # the Markov bias starts neutral; training grows it
    w["output.weight"] = embed[d2t]  # the target's own head rows for the draft vocabulary (frozen)
    model = Drafter(kv, w, embed)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.0)
    t0 = time.time()
    budget = a.minutes * 60
    step = 0
    ema = ema0 = None
    pool = [(i, t) for i, q in enumerate(train) for t in q.anchors()]
    print(f"before training: {evaluate(model, held)}", flush=True)
    done = False
    while not done:
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
                    g["lr"] = a.lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * frac)))
                ce, bce, _, _, _ = step_loss(model, train[i], np.array(ts[k:k + ANCHORS_PER_STEP]))
                loss = ce + 0.1 * bce
                opt.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                step += 1
                ema = ce.item() if ema is None else 0.98 * ema + 0.02 * ce.item()
                ema0 = step_loss.row0 if ema0 is None else 0.98 * ema0 + 0.02 * step_loss.row0
                if step % 100 == 0:
                    print(f"step {step} {time.time() - t0:.0f}s ce {ema:.3f} (first row {ema0:.3f}) "
                          f"bce {bce.item():.3f}", flush=True)
                if step % 1000 == 0:
                    print(f"  held out: {evaluate(model, held)}", flush=True)
                if time.time() - t0 >= budget:
                    done = True
                    break
            if done:
                break
    print(f"after {step} steps: {evaluate(model, held)}", flush=True)
    write_random_drafter(target, a.out, block_size=BLOCK, layers=1, seed=a.seed,
                         target_layers=list(TARGET_LAYERS), ffn_length=FFN, weights=model.weights(),
                         draft_vocab=d2t, half=True,
                         description=f"AdaSpark DSpark drafter for SmolLM2-135M-Instruct: self-distilled, "
                                     f"{len(train)} ShareGPT conversations, {step} steps, "
                                     f"draft vocabulary {len(d2t)}")
    ids = sorted({q.id for q in seqs})  # every conversation read, held-out ones included
    listing = "".join(f"sharegpt {i}\n" for i in ids).encode()
    with gzip.GzipFile(Path(a.out).with_name("drafter-training-ids.txt.gz"), "wb", mtime=0) as fp:
        fp.write(listing)
    print(f"wrote {a.out} and the {len(ids)} ShareGPT ids beside it")


if __name__ == "__main__":
    main()
