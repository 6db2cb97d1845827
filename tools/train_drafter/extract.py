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
    python tools/train_drafter/extract.py --mode prefill --out DATA_DIR [--conversations 900] [--skip-ids IDS]

`--mode prefill` (teacher-forced, about five times faster per token) is described in
`prefill_conversation` and the README beside this file.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from adaspark_app import native
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


def reply_pairs(n: int, skip_ids: set[str]) -> list[tuple[str, str, str]]:
    """(id, first user turn, first assistant reply) of ShareGPT items the greedy mode does not use."""
    skip = benchmark_ids() | skip_ids
    out = []
    for i, item in enumerate(iter_sharegpt()):
        if i < SKIP_ITEMS or item.get("id") in skip:
            continue
        msgs = item.get("conversations") or []
        if len(msgs) < 2 or msgs[0].get("from") != "human" or msgs[1].get("from") != "gpt":
            continue
        q, r = msgs[0].get("value") or "", msgs[1].get("value") or ""
        if not (MIN_CHARS <= len(q.strip()) <= MAX_CHARS) or len(r.strip()) < MIN_CHARS:
            continue
        if _ascii_share([q, r]) < ASCII_MIN_SHARE:
            continue
        out.append((str(item["id"]), q, r))
        if len(out) >= n:
            break
    return out


class Shards:
    """Writes conversations to shard-NNN.npz files of `size` each and their ids to ids.txt, so an
    interrupted extraction keeps every shard it finished."""

    ARRAYS = ("tokens", "feats", "argmax")  # ragged per conversation: object arrays

    def __init__(self, out: Path, size: int) -> None:
        self.out, self.size, self.n = out, size, 0
        self.rows: dict[str, list] = {}
        self.tokens = 0
        (out / "ids.txt").write_text("")  # ids of the conversations written, shard by shard

    def add(self, **fields) -> None:
        for key, value in fields.items():
            self.rows.setdefault(key, []).append(value)
        self.tokens += len(fields["tokens"])
        if len(self.rows["ids"]) >= self.size:
            self.flush()

    def flush(self) -> None:
        if not self.rows.get("ids"):
            return
        np.savez(self.out / f"shard-{self.n:03d}.npz", allow_pickle=True,
                 **{k: np.array(v, dtype=object) if k in self.ARRAYS else np.array(v) for k, v in self.rows.items()})
        with open(self.out / "ids.txt", "a") as f:
            f.write("".join(f"{cid}\n" for cid in self.rows["ids"]))
        self.n += 1
        self.rows = {}


def open_engine(out: Path) -> ChatEngine:
    """The bundled target with a feature reader: any drafter file with these target layers
    switches llama.cpp's layer-input extraction on."""
    out.mkdir(parents=True, exist_ok=True)
    init = out / "feature-reader.gguf"
    write_random_drafter(bundled_target_path(), str(init), target_layers=list(TARGET_LAYERS))
    return ChatEngine(None, drafter_path=str(init), arm="chain:4", n_ctx=2048, n_threads=2)


def greedy_conversation(eng: ChatEngine, text: str, reply_tokens: int) -> dict | None:
    """The target's greedy reply to `text`, then prompt + reply prefilled for the features."""
    b, d = eng.backend, eng.drafter
    prompt = eng.prompt_tokens([{"role": "user", "content": text}])
    if len(prompt) + reply_tokens >= b.n_ctx - 1:
        return None
    b.clear_kv()
    reply = [b.prefill(prompt, 0)]
    while len(reply) < reply_tokens and not b.is_eog(reply[-1]):
        reply.append(int(b.verify([reply[-1]], [len(prompt) + len(reply) - 1], [(0,)]).argmax[0]))
    seq = prompt + reply
    b.clear_kv()
    feats: list[np.ndarray] = []
    b.prefill(seq[:-1], 0, on_chunk=lambda rows, pos: feats.append(d.target_features(rows)))
    f = np.concatenate(feats).astype(np.float16)
    assert len(f) == len(seq) - 1
    return {"tokens": np.array(seq, dtype=np.int32), "feats": f, "start": len(prompt)}


def prefill_conversation(eng: ChatEngine, question: str, answer: str, max_tokens: int) -> dict | None:
    """Teacher-forced: a prompt and its recorded assistant reply, decoded once with logits on
    every row. Besides tokens and features it keeps the target's argmax at every position
    (``argmax[p]`` predicts position p+1): a block row is a valid label wherever the text agrees
    with those argmaxes on the rows before it (train.py)."""
    b, d = eng.backend, eng.drafter
    prompt = eng.prompt_tokens([{"role": "user", "content": question}])
    seq = (prompt + b.tokenize(answer, add_special=False, parse_special=False))[:max_tokens]
    if len(seq) - len(prompt) < 8:
        return None
    b.clear_kv()
    feats, am = [], []
    for i in range(0, len(seq), b.n_batch):
        chunk = seq[i:i + b.n_batch]
        am.append(b.verify(chunk, list(range(i, i + len(chunk))), [(0,)] * len(chunk)).argmax)
        feats.append(d.target_features(range(len(chunk))))
    return {"tokens": np.array(seq, dtype=np.int32), "feats": np.concatenate(feats).astype(np.float16),
            "argmax": np.concatenate(am).astype(np.int32), "start": len(prompt)}


def main() -> None:
    native.activate()  # the Q4_1 kernels, if built, before anything imports llama_cpp
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--mode", choices=("greedy", "prefill"), default="greedy",
                    help="greedy: the target's own replies; prefill: recorded ShareGPT replies, teacher-forced")
    ap.add_argument("--conversations", type=int, default=400)
    ap.add_argument("--reply-tokens", type=int, default=96, help="greedy mode: reply length")
    ap.add_argument("--max-tokens", type=int, default=1024, help="prefill mode: tokens kept per conversation")
    ap.add_argument("--skip-ids", default=None, help="prefill mode: ids file of conversations to leave out")
    ap.add_argument("--shard", type=int, default=50, help="conversations per shard file")
    a = ap.parse_args()
    out = Path(a.out)
    eng = open_engine(out)
    shards = Shards(out, a.shard)
    if a.mode == "prefill":
        used: set[str] = set()
        if a.skip_ids:
            used = {line.split()[-1] for line in Path(a.skip_ids).read_text().splitlines() if line.strip()}
        todo = [(cid, lambda q=q, r=r: prefill_conversation(eng, q, r, a.max_tokens))
                for cid, q, r in reply_pairs(a.conversations, used)]
    else:
        todo = [(cid, lambda t=t: greedy_conversation(eng, t, a.reply_tokens)) for cid, t in prompts(a.conversations)]
    t0 = time.time()
    for k, (cid, make) in enumerate(todo):
        conv = make()
        if conv is not None:
            shards.add(ids=cid, **conv)
        if (k + 1) % 20 == 0:
            print(f"{k + 1}/{len(todo)} conversations, {shards.tokens} tokens, {time.time() - t0:.0f} s", flush=True)
    shards.flush()
    eng.close()
    print(f"done: {len(todo)} conversations, {shards.tokens} tokens in {time.time() - t0:.0f} s -> {out}")


if __name__ == "__main__":
    main()
