"""Self-distillation data for the DSpark drafter: the target's own greedy replies to public
ShareGPT prompts, with the target features the engine feeds the drafter.

For each prompt (a ShareGPT first user turn, in the bundled chat template) the bundled target
decodes greedily up to --reply-tokens tokens; then prompt + reply is decoded once more in
prefill chunks and, after each chunk, the target's layer inputs at the drafter's target layers
are read exactly as the engine reads them (`DSparkDrafter.target_features`, the rows of that
llama_decode). Written per shard: tokens, features (float16), where the reply starts, and the
ShareGPT id. Conversations used by the committed benchmark corpora (and MT-Bench, not ShareGPT)
are never taken; the ids of the conversations written go to `--out/ids.txt` with each shard.

    python tools/train_drafter/extract.py --out DATA_DIR [--conversations 400] [--reply-tokens 96]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from adaspark_app.bench.corpus import ASCII_MIN_SHARE, _ascii_share, _human_turns, iter_sharegpt
from adaspark_app.engine.chat_engine import ChatEngine
from adaspark_app.engine.drafter_init import bundled_target_path, write_random_drafter

ROOT = Path(__file__).resolve().parents[2]
SKIP_ITEMS = 1000  # the corpora take their conversations from the file's first items
MIN_CHARS, MAX_CHARS = 20, 1500
TARGET_LAYERS = (1, 15, 29)


def benchmark_ids() -> set[str]:
    """ShareGPT ids of every committed benchmark conversation (left out of training)."""
    ids = set()
    for f in (ROOT / "benchmarks" / "corpora").glob("*.jsonl"):
        for line in f.read_text().splitlines():
            cid = json.loads(line).get("id", "")
            if "-" in cid:
                ids.add(cid.split("-", 1)[1])
    return ids


def prompts(n: int) -> list[tuple[str, str]]:
    skip = benchmark_ids()
    out = []
    for i, item in enumerate(iter_sharegpt()):
        if i < SKIP_ITEMS or item.get("id") in skip:
            continue
        humans = _human_turns(item)
        if not humans:
            continue
        text = humans[0]
        if not (MIN_CHARS <= len(text.strip()) <= MAX_CHARS) or _ascii_share([text]) < ASCII_MIN_SHARE:
            continue
        out.append((str(item["id"]), text))
        if len(out) >= n:
            break
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--conversations", type=int, default=400)
    ap.add_argument("--reply-tokens", type=int, default=96)
    ap.add_argument("--shard", type=int, default=50, help="conversations per shard file")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    init = out / "feature-reader.gguf"  # any drafter file with these target layers switches the features on
    write_random_drafter(bundled_target_path(), str(init), target_layers=list(TARGET_LAYERS))
    eng = ChatEngine(None, drafter_path=str(init), arm="chain:4", n_ctx=2048, n_threads=2)
    b, d = eng.backend, eng.drafter
    todo = prompts(a.conversations)
    (out / "ids.txt").write_text("")  # ids of the conversations written, shard by shard
    shard: dict[str, list] = {"tokens": [], "feats": [], "start": [], "ids": []}
    t0 = time.time()
    n_shard = 0

    def flush() -> None:
        nonlocal n_shard
        if not shard["ids"]:
            return
        np.savez(out / f"shard-{n_shard:03d}.npz", tokens=np.array(shard["tokens"], dtype=object),
                 feats=np.array(shard["feats"], dtype=object), start=np.array(shard["start"]),
                 ids=np.array(shard["ids"]), allow_pickle=True)
        with open(out / "ids.txt", "a") as f:
            f.write("".join(f"{cid}\n" for cid in shard["ids"]))
        n_shard += 1
        for v in shard.values():
            v.clear()

    for k, (cid, text) in enumerate(todo):
        prompt = eng.prompt_tokens([{"role": "user", "content": text}])
        if len(prompt) + a.reply_tokens >= b.n_ctx - 1:
            continue
        b.clear_kv()
        tok = b.prefill(prompt, 0)
        reply = [tok]
        while len(reply) < a.reply_tokens and not b.is_eog(reply[-1]):
            reply.append(int(b.verify([reply[-1]], [len(prompt) + len(reply) - 1], [(0,)]).argmax[0]))
        seq = prompt + reply
        b.clear_kv()
        feats: list[np.ndarray] = []
        b.prefill(seq[:-1], 0, on_chunk=lambda rows, pos: feats.append(d.target_features(rows)))
        f = np.concatenate(feats).astype(np.float16)
        assert len(f) == len(seq) - 1
        shard["tokens"].append(np.array(seq, dtype=np.int32))
        shard["feats"].append(f)
        shard["start"].append(len(prompt))
        shard["ids"].append(cid)
        if len(shard["ids"]) >= a.shard:
            flush()
        if (k + 1) % 20 == 0:
            print(f"{k + 1}/{len(todo)} conversations, {time.time() - t0:.0f} s", flush=True)
    flush()
    eng.close()
    print(f"done: {len(todo)} conversations in {time.time() - t0:.0f} s -> {out}")


if __name__ == "__main__":
    main()
