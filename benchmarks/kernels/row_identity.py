"""Is a row's logits the same whether it is verified alone or in a batch? (a diagnostic)

Loads a model through adaspark_app.engine.backend.LlamaBackend, prefills the first CONTEXT tokens
of a corpus prompt, then decodes ROWS tokens greedily one row at a time (LlamaBackend.verify with
one row, logits_rows(1) after each), removes those cells and verifies the same ROWS tokens as one
chain batch (logits_rows(ROWS)). Prints, per row, the largest absolute logit difference and
whether the argmax agrees; exit 0 if every row is bit-identical, 1 if not.

    python -m benchmarks.kernels.row_identity MODEL.gguf [--context 300,700] [--rows 8]

Environment variables LlamaBackend reads (ADASPARK_FA, ADASPARK_KVT) and ADASPARK_STOCK_KERNELS
work as usual, so the attention kernel and cache types can be varied.
"""

from __future__ import annotations

import argparse
import sys

from benchmarks.common import CORPORA, read_jsonl

CORPUS = CORPORA / "longpaste.jsonl.gz"


def compare(backend, prompt: list[int], rows: int) -> list[dict]:
    """Per row: max |logit difference| between one-row and batched verify, and argmax of each."""
    import numpy as np

    n = len(prompt) - 1
    backend.seq_rm(0, -1, -1)
    backend.prefill(prompt[:-1], 0, argmax=False)
    tokens = [prompt[-1]]
    alone = []
    for i in range(rows):
        out = backend.verify([tokens[-1]], [n + i], [(0,)])
        alone.append(backend.logits_rows(1)[0])
        tokens.append(int(out.argmax[0]))
    backend.seq_rm(0, n, -1)
    backend.verify(tokens[:rows], list(range(n, n + rows)), [(0,)] * rows)
    batched = backend.logits_rows(rows)
    backend.seq_rm(0, n, -1)
    res = []
    for i in range(rows):
        diff = np.abs(alone[i] - batched[i])
        res.append({"row": i, "identical": bool(np.array_equal(alone[i], batched[i])),
                    "max_abs_diff": float(diff.max()), "argmax_alone": int(alone[i].argmax()),
                    "argmax_batched": int(batched[i].argmax())})
    return res


def main(argv: list[str] | None = None) -> int:
    """CLI entry point: 0 when every row of every context is bit-identical, else 1."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--context", default="300,700", help="comma-separated prefill lengths")
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)

    from adaspark_app import native

    native.activate()
    from adaspark_app.engine.backend import LlamaBackend

    backend = LlamaBackend(args.model, n_ctx=4096, n_threads=args.threads)
    text = "\n\n".join(c["turns"][0] for c in read_jsonl(CORPUS)[:3])
    all_tokens = backend.tokenize(text)
    ok = True
    for ctx in (int(c) for c in args.context.split(",")):
        res = compare(backend, all_tokens[:ctx + 1], args.rows)
        same = sum(r["identical"] for r in res)
        ok &= same == len(res)
        print(f"context {ctx}: {same}/{len(res)} rows bit-identical; max |diff| per row "
              + " ".join(f"{r['max_abs_diff']:.3g}" for r in res)
              + f"; argmax agree {sum(r['argmax_alone'] == r['argmax_batched'] for r in res)}/{len(res)}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
