"""The DSpark block drafter (paper §2.1-§2.2) on llama.cpp 0.3.36's `dflash` architecture.

What the drafter is: a small backbone whose KV cache holds, for every committed position, a
projection of the target's hidden states at that position; one forward over the block
[anchor, mask x (B-1)] gives logits for B positions at once, a Markov head adds to each
position's logits a low-rank bias from the pick at the position before (in-graph, along the
greedy picks), and a confidence head scores each position. We keep the top K candidates per
position: the pick (top 1) forms the spine, the other K-1 are its siblings (§2.2).

Positions and rows -- the one thing to get right
------------------------------------------------
llama.cpp records, for every row of a target decode, the *input* of each target layer id in
`dflash.target_layers` (`llama_get_embeddings_layer_inp`, one `[n_batch, n_embd]` buffer per
layer, rows in batch order, for every row of the batch whatever its logits flag).
The feature of the token at position p is the concatenation over those layers of that input
at the row that held position p. It depends on the tokens at positions <= p only, so it is
final as soon as the target has decoded that row on the accepted path:

    committed x_0 .. x_{n-1}   decoded by the target -> features of positions 0 .. n-1
    anchor x_n                 the last committed token (the bonus token of the last round);
                               not yet decoded by the target, so it has no feature yet

The drafter's KV holds exactly positions 0 .. n-1 (seq 0). A draft decodes the block
[x_n @ n, mask @ n+1, ..., mask @ n+B-1] with non-causal attention over that KV and the block;
with `dflash.sample_from_anchor` (DSpark exports) block slot i predicts the token at position
n+1+i, so B positions are drafted; a bonus-anchor export (or plain DFlash) drafts from slots
1..B-1, i.e. B-1 positions. Either way row j of a `DraftBlock` is the token at n+1+j. The
block's own KV cells are removed right after the forward, so the KV again holds 0 .. n-1.

The verify then decodes x_n at row r0 (position n) and the tree nodes; if the accepted path
is x_n, c_1 .. c_a at rows r0, r_1 .. r_a (positions n .. n+a), the engine calls
`feed([r0, r_1, .., r_a], [n, .., n+a])` and the bonus token becomes the next anchor at n+a+1.
Rejected rows are never fed. This mirrors common/speculative.cpp (DFlash `process` / `draft`),
which feeds every row of every target batch and has the server remove the rejected cells.

Call sequence for the engine (target context created with kv_unified, n_seq_max >= leaves):
  1. drafter = DSparkDrafter(model, ctx, path, n_threads) right after creating the target
     context, before its first decode: it switches on the target's layer-input extraction
     (`enable_target_features`). Rows decoded before that carry no features, so a drafter
     opened mid-conversation needs the conversation prefilled again (feed refuses until the
     target has decoded once more, rather than letting llama.cpp abort the process).
  2. prefill: llama_decode(ctx, prompt rows at positions 0..P-1) -> feed(rows 0..P-1, positions
     0..P-1) after each llama_decode of the prefill (chunks of n_batch included). The anchor is
     the target's argmax on the last prompt row, at position P.
  3. each round: block = draft(anchor, anchor_pos); build the tree; llama_decode the verify
     (anchor row first, no extra output flags needed for features); on the accepted path
     feed(rows of anchor + accepted nodes, positions anchor_pos..anchor_pos+a).
  4. whenever the target's seq 0 is cut back to n positions (regenerate, edit, overflow
     handling), call truncate(n); a new turn's prefill is fed like step 2 from its position.
  5. close() before freeing the target context.
"""

from __future__ import annotations

import ctypes
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from adaspark_app.engine import ext_bindings
from adaspark_app.engine.backend import load_model_file, load_seq_state_into, seq_state_of, vocab_texts
from adaspark_app.errors import ContextOverflowError, DrafterError, ModelLoadError
from adaspark_app.learn.constants import MAX_WIDTH, TOP_K
from adaspark_app.gguf_file import GGML_NUMPY_TYPES, GGUFHeader, read_gguf_header, read_gguf_tensor


#: Target architectures whose llama.cpp 0.3.36 graph records layer inputs
#: (`res->t_layer_inp[il]`, src/models/*.cpp). Any other target aborts the process inside
#: llama.cpp when extraction is switched on, so it is refused here instead.
_ARCHS_WITH_LAYER_INPUTS = frozenset({
    "llama", "llama-embed", "nanbeige", "qwen3", "gemma4", "muse-glimmer", "deepseek4",
    "nemotron_h", "nemotron_h_moe", "bailingmoe3", "hunyuan_vl", "hunyuan-dense", "gpt-oss",
    "lfm2", "minimax-01", "minimax-m2", "mimo2",
})
#: ...of which these also record the input of layer n_layer (the final hidden state).
_ARCHS_WITH_FINAL_LAYER_INPUT = frozenset({"deepseek4", "nemotron_h", "nemotron_h_moe", "mimo2"})

#: What a drafter's header may ask for (a GGUF is untrusted: a block of 100,000 positions or a
#: backbone of 1,000 layers aborted llama.cpp, GGML_ASSERT(obj_new), instead of one line). No
#: verify is wider than MAX_WIDTH rows, so no block needs more positions; DSpark's drafters have
#: a few layers.
MAX_BLOCK_SIZE = MAX_WIDTH
MAX_DRAFTER_LAYERS = 32


@dataclass
class DraftBlock:
    """One drafter forward: the top-K candidates at each drafted position.

    Row j is the token at position anchor_pos + 1 + j. Column 0 is the pick (the spine);
    columns 1..K-1 are its siblings, best first.
    """

    tokens: np.ndarray  # [P, K] int32, P = B (anchor-sampling DSpark) or B-1
    share: np.ndarray  # [P, K] float64: softmax mass among the top K; share[:, 0] is sigma
    conf: np.ndarray | None  # [P] float64: confidence head h, None if the file has none
    logits: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.float32))  # [P, K]
    anchor_pos: int = -1

    @property
    def picks(self) -> np.ndarray:
        """The drafter's pick at each position (the Markov chain's greedy path)."""
        return self.tokens[:, 0]

    @property
    def sibling_share(self) -> np.ndarray:
        """r: each sibling's share of the siblings' mass, [P, K-1] (§3.3)."""
        rest = self.share[:, 1:]
        total = rest.sum(axis=1, keepdims=True)
        return np.divide(rest, total, out=np.zeros_like(rest), where=total > 0)


# ------------------------------------------------------------------------------ the drafter

# Target-layer extraction is per target context and shared by every drafter bound to it:
# reference counts per (context, layer), and, per context, the decode counters seen when a
# layer was last switched on. Until the target decodes again its buffer for that layer does
# not exist, and llama.cpp aborts the process if it is read (GGML_ASSERT), so `feed` refuses.
_feature_users: dict[tuple[int, int], int] = {}
_features_pending: dict[int, tuple[int, int]] = {}
_feature_lock = threading.Lock()


def _address(ptr: Any) -> int:
    return ptr if isinstance(ptr, int) else int(ctypes.cast(ptr, ctypes.c_void_p).value or 0)


def _decode_counters(low: Any, ctx: Any) -> tuple[int, int]:
    """(prompt-eval tokens, single-token evals) of a context; they move with every decode."""
    low.llama_synchronize(ctx)
    data = low.llama_perf_context(ctx)
    return int(data.n_p_eval), int(data.n_eval)


def _acquire_target_features(low: Any, ext: Any, target_ctx: Any, layer_ids: Sequence[int]) -> None:
    with _feature_lock:
        addr = _address(target_ctx)
        for lid in layer_ids:
            key = (addr, int(lid))
            if _feature_users.get(key, 0) == 0:
                ext.llama_set_embeddings_layer_inp(target_ctx, int(lid), True)
                _features_pending[addr] = _decode_counters(low, target_ctx)
            _feature_users[key] = _feature_users.get(key, 0) + 1


def _release_target_features(ext: Any, target_ctx: Any, layer_ids: Sequence[int]) -> None:
    with _feature_lock:
        addr = _address(target_ctx)
        for lid in layer_ids:
            key = (addr, int(lid))
            users = _feature_users.get(key, 0) - 1
            if users <= 0:
                _feature_users.pop(key, None)
                ext.llama_set_embeddings_layer_inp(target_ctx, int(lid), False)
            else:
                _feature_users[key] = users
        if not any(a == addr for a, _ in _feature_users):
            _features_pending.pop(addr, None)


def _check_target_decoded(low: Any, target_ctx: Any) -> None:
    """DrafterError unless the target decoded since extraction was last switched on."""
    with _feature_lock:
        addr = _address(target_ctx)
        seen = _features_pending.get(addr)
        if seen is None:
            return
        if _decode_counters(low, target_ctx) == seen:
            raise DrafterError(
                "the target has not decoded since the drafter switched on feature extraction: "
                "create the drafter before the target decodes the rows it will be fed"
            )
        del _features_pending[addr]


def _meta_str(low: Any, model: Any, key: str) -> str | None:
    buf = ctypes.create_string_buffer(256)
    n = low.llama_model_meta_val_str(model, key.encode(), buf, ctypes.sizeof(buf))
    return None if n < 0 else buf.value.decode("utf-8", errors="replace")


def _header_int(header: GGUFHeader, key: str, default: int, path: str) -> int:
    """A whole-number header value (DrafterError naming it if it is not one)."""
    value = header.kv.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise DrafterError(f"{path}: {key} is {value!r}, not a whole number")
    return value


class DSparkDrafter:
    """A DSpark drafter bound to one target context (see the module docstring for positions).

    Not thread-safe: call it from the engine's worker thread only, like the target context.
    """

    def __init__(self, target_model: Any, target_ctx: Any, path: str, n_threads: int, n_gpu_layers: int = 0) -> None:
        """Load the drafter at `path` against the target's raw llama_cpp model/context pointers,
        with `n_gpu_layers` of its layers on the GPU (the target's: 0 on the CPU).

        Raises DrafterError (not a DSpark file, vocabulary differs from the target's, target
        layers the target does not have), ModelLoadError (unreadable file), BindingError
        (llama-cpp-python without the ext symbols). Switches on the target's layer-input
        extraction for the drafter's target layers.
        """
        import llama_cpp.llama_cpp as low

        self._low = low
        self._ext = ext_bindings.load()
        self._target_model = target_model
        self._target_ctx = target_ctx
        self._model = None
        self._ctx = None
        self._batch = None
        self._features_on = False
        self.path = str(path)
        if not os.path.isfile(self.path):
            raise ModelLoadError(f"{self.path}: no such drafter file")

        header = read_gguf_header(self.path)
        arch = header.kv.get("general.architecture")
        if arch != "dflash":
            raise DrafterError(
                f"{self.path} is not a DSpark drafter: its architecture is {arch!r}, "
                "expected 'dflash' (a plain model cannot draft blocks)"
            )
        if "selector_hidden.weight" in header.tensors:
            raise DrafterError(f"{self.path} is a DFlash2 (selector) drafter; only DSpark/DFlash are supported")
        if header.kv.get("dflash.hyper_connection.count") or "output_hc_fn.weight" in header.tensors:
            # its KV is a sliding-window ring, which cannot follow the target back reliably
            raise DrafterError(f"{self.path} is a DeepSeek-V4 DSpark drafter; not supported here")
        self.d2t = self._read_d2t(header)
        self.has_markov = "markov_w1.weight" in header.tensors
        self.has_confidence = self.has_markov and "conf_proj.weight" in header.tensors
        self.sample_from_anchor = bool(header.kv.get("dflash.sample_from_anchor", True))
        self.block_size = _header_int(header, "dflash.block_size", 16, self.path)
        if not 2 <= self.block_size <= MAX_BLOCK_SIZE:
            raise DrafterError(f"{self.path}: dflash.block_size {self.block_size} is not from 2 to {MAX_BLOCK_SIZE}")
        layers = _header_int(header, "dflash.block_count", 1, self.path)
        if not 1 <= layers <= MAX_DRAFTER_LAYERS:
            raise DrafterError(f"{self.path}: dflash.block_count {layers} is not from 1 to {MAX_DRAFTER_LAYERS}")
        # first block slot whose logits are a draft (common/speculative.cpp, draft())
        self._first_slot = 0 if (self.has_markov and self.sample_from_anchor) else 1
        self.n_draft = self.block_size - self._first_slot
        self.name = str(header.kv.get("general.name") or Path(self.path).stem)

        self._check_vocab(header)
        mask = header.kv.get("tokenizer.ggml.mask_token_id")
        if mask is None or not 0 <= int(mask) < self.n_vocab:
            raise DrafterError(f"{self.path}: no valid tokenizer.ggml.mask_token_id (got {mask!r})")
        self.mask_token_id = int(mask)

        self.n_embd = low.llama_model_n_embd(target_model)
        drafter_embd = header.kv.get("dflash.embedding_length")
        if drafter_embd != self.n_embd:
            raise DrafterError(
                f"{self.path} was built for a target with hidden size {drafter_embd}; "
                f"this target's is {self.n_embd}"
            )
        self.target_layer_ids = [int(i) for i in header.kv.get("dflash.target_layers", [])]
        self._check_target_layers()

        try:
            self._load(n_threads, n_gpu_layers)
        except BaseException:
            self.close()
            raise

    # -- load-time checks ------------------------------------------------------------

    def _read_d2t(self, header: GGUFHeader) -> np.ndarray | None:
        """A reduced draft vocabulary's target ids (`d2t`, I64), or None for a full-vocabulary drafter.

        Its logits are -inf on every other token, so only these columns are read back."""
        info = header.tensors.get("d2t")
        if info is None:
            return None
        if GGML_NUMPY_TYPES.get(info.ggml_type) is not np.int64 or len(info.shape) != 1:
            raise DrafterError(f"{self.path}: d2t must be a 1-d I64 tensor")
        return read_gguf_tensor(self.path, header, "d2t")

    def _check_vocab(self, header: GGUFHeader) -> None:
        target_texts = vocab_texts(self._low, self._target_model)
        self.n_vocab = len(target_texts)
        mine = header.tokens
        if mine is None:
            raise DrafterError(f"{self.path} has no tokenizer; a drafter must carry its target's vocabulary")
        if len(mine) != len(target_texts):
            raise DrafterError(
                f"{self.path} has a vocabulary of {len(mine)} tokens, the target has "
                f"{len(target_texts)}: it was built for another model"
            )
        for i, (a, b) in enumerate(zip(mine, target_texts)):
            if a != b:
                raise DrafterError(
                    f"{self.path}: vocabulary differs from the target's at token {i} "
                    f"({a!r} vs {b!r}): it was built for another model"
                )

    def _check_target_layers(self) -> None:
        low = self._low
        if not self.target_layer_ids:
            raise DrafterError(f"{self.path} names no target layers (dflash.target_layers)")
        n_layer = low.llama_model_n_layer(self._target_model)
        arch = _meta_str(low, self._target_model, "general.architecture") or "?"
        if arch not in _ARCHS_WITH_LAYER_INPUTS:
            raise DrafterError(
                f"the target's architecture {arch!r} does not expose layer inputs in "
                f"llama-cpp-python=={ext_bindings.PINNED_VERSION}; DSpark drafting needs them"
            )
        top = n_layer if arch in _ARCHS_WITH_FINAL_LAYER_INPUT else n_layer - 1
        bad = [i for i in self.target_layer_ids if not 0 <= i <= top]
        if bad:
            raise DrafterError(
                f"{self.path} reads target layer(s) {bad}, but the target ({arch}, {n_layer} "
                f"layers) has layer inputs 0..{top} only: it was built for another model"
            )

    def _load(self, n_threads: int, n_gpu_layers: int) -> None:
        low, ext = self._low, self._ext
        mparams = low.llama_model_default_params()
        mparams.n_gpu_layers = n_gpu_layers  # with the target: on a GPU, llama-server's -ngld does the same
        mparams.use_extra_bufts = False  # as the target's (backend.py): no AMX / repack buffers
        self._model, why = load_model_file(low, self.path, mparams)
        if not self._model:
            raise DrafterError(f"llama.cpp could not load the DSpark drafter {self.path}" + (f": {why}" if why else ""))
        if ext.target_layer_ids(self._model) != self.target_layer_ids:
            raise DrafterError(f"{self.path}: llama.cpp read other target layers than the header names")
        if ext.llama_model_dflash_selector_top_k(self._model) > 0:
            raise DrafterError(f"{self.path} is a DFlash2 (selector) drafter; not supported")

        cparams = low.llama_context_default_params()
        cparams.n_ctx = low.llama_n_ctx(self._target_ctx)
        self.n_batch = max(int(low.llama_n_batch(self._target_ctx)), self.block_size)
        cparams.n_batch = self.n_batch
        cparams.n_ubatch = max(int(low.llama_n_ubatch(self._target_ctx)), self.block_size)
        cparams.n_seq_max = 1
        cparams.n_rs_seq = 0
        cparams.n_threads = n_threads
        cparams.n_threads_batch = n_threads
        # A drafter's KV is tiny (one to a few layers): F32 keeps the injected features exact
        # and costs a few MB even at 8k positions. Flash attention off for the same reason.
        cparams.type_k = ext_bindings.GGML_TYPE_F32
        cparams.type_v = ext_bindings.GGML_TYPE_F32
        cparams.flash_attn_type = ext_bindings.LLAMA_FLASH_ATTN_TYPE_DISABLED
        cparams.embeddings = False
        cparams.ctx_other = self._target_ctx
        self._ctx = low.llama_init_from_model(self._model, cparams)
        if not self._ctx:
            raise DrafterError(f"llama.cpp could not create a context for the drafter {self.path}")
        self.n_ctx = int(low.llama_n_ctx(self._ctx))

        # confidence arrives through the nextn output, one row per output row (masked)
        ext.llama_set_embeddings_nextn(self._ctx, self.has_confidence, True)
        causal = (_meta_str(low, self._model, "dflash.attention.causal") or "false") == "true"
        low.llama_set_causal_attn(self._ctx, causal)  # DFlash attends over the whole block
        self._mem = low.llama_get_memory(self._ctx)
        self._batch = ext.llama_batch_ext_init(self._ctx)
        if not self._batch:
            raise DrafterError("llama_batch_ext_init failed for the drafter context")
        self.enable_target_features()

    # -- target side -----------------------------------------------------------------

    def enable_target_features(self) -> None:
        """Switch on extraction of the drafter's target-layer inputs in the target context.

        Done by the constructor; idempotent. Every later target llama_decode then copies, per
        target layer, the input of every batch row (n_embd floats each): a small cost on each
        decode. Extraction is reference-counted per (context, layer), so a second drafter on
        the same target (e.g. while swapping drafters) keeps its layers when the first closes.
        """
        if not self._features_on:
            _acquire_target_features(self._low, self._ext, self._target_ctx, self.target_layer_ids)
            self._features_on = True

    # -- KV bookkeeping --------------------------------------------------------------

    def n_positions(self) -> int:
        """Positions held in the drafter's KV (seq 0): they are always 0 .. n-1."""
        return int(self._low.llama_memory_seq_pos_max(self._mem, 0)) + 1

    def seq_state(self) -> memoryview:
        """The drafter's KV (its features of positions 0 .. n_positions()-1), serialised: saved with
        the target's in a conversation's saved context (ChatEngine.save_context)."""
        return seq_state_of(self._low, self._ctx, 0)

    def load_seq_state(self, state: memoryview) -> bool:
        """Put a `seq_state` back (the KV emptied first); False where llama.cpp refuses it."""
        return load_seq_state_into(self._low, self._ctx, self._mem, state, 0)

    def truncate(self, n_pos: int) -> None:
        """Drop the drafter's KV at positions >= n_pos (follow the target's seq 0)."""
        if n_pos < 0:
            raise ValueError(f"truncate: negative position {n_pos}")
        self._low.llama_memory_seq_rm(self._mem, 0, n_pos, -1)

    def feed(self, rows: Sequence[int], positions: Sequence[int]) -> None:
        """Inject the target features of `rows` of the last target llama_decode at `positions`.

        rows index that decode's batch (all rows carry features, whatever their logits flag);
        positions must continue the drafter's KV: n_positions(), n_positions() + 1, ...
        Call right after the decode, before the target context decodes again.
        """
        rows = [int(r) for r in rows]
        positions = [int(p) for p in positions]
        if len(rows) != len(positions):
            raise ValueError(f"feed: {len(rows)} rows but {len(positions)} positions")
        if not rows:
            return
        n_batch_target = int(self._low.llama_n_batch(self._target_ctx))
        if min(rows) < 0 or max(rows) >= n_batch_target:
            raise ValueError(f"feed: rows must be in 0..{n_batch_target - 1}, got {min(rows)}..{max(rows)}")
        self.feed_features(self._gather_features(rows, n_batch_target), positions)

    def feed_features(self, features: np.ndarray, positions: Sequence[int]) -> None:
        """Inject given target features ([n, n_target_layers * n_embd]) at `positions`.

        The lower half of `feed`, for replaying features kept elsewhere (tests, training).
        positions must continue the drafter's KV consecutively from n_positions().
        """
        positions = [int(p) for p in positions]
        features = np.ascontiguousarray(features, dtype=np.float32)
        width = len(self.target_layer_ids) * self.n_embd
        if features.ndim != 2 or features.shape != (len(positions), width):
            raise ValueError(f"feed: features must be [{len(positions)}, {width}], got {features.shape}")
        if not positions:
            return
        start = self.n_positions()
        if positions != list(range(start, start + len(positions))):
            raise ValueError(
                f"feed: positions must continue the drafter's KV at {start} consecutively, got "
                f"{positions[0]}..{positions[-1]} (truncate first to follow the target)"
            )
        if positions[-1] >= self.n_ctx:
            raise ContextOverflowError(f"the drafter's context of {self.n_ctx} positions is full")
        ext = self._ext
        pos4 = ext_bindings.LlamaPos4()
        float_p = ctypes.POINTER(ctypes.c_float)
        for begin in range(0, len(positions), self.n_batch):
            ext.llama_batch_ext_clear(self._batch)
            for i in range(begin, min(begin + self.n_batch, len(positions))):
                embd = ext_bindings.LlamaEmbd(features[i].ctypes.data_as(float_p), 1, width)
                idx = ext.llama_batch_ext_add_embd(self._batch, 0, embd)  # copies the row
                if idx < 0:
                    raise DrafterError(f"llama_batch_ext_add_embd failed ({idx}) feeding position {positions[i]}")
                p = positions[i]
                pos4[0], pos4[1], pos4[2], pos4[3] = p, p, p, 0  # M-RoPE slots, as llama.cpp does
                ext.llama_batch_ext_set_pos(self._batch, idx, pos4)
            rc = ext.llama_process(self._ctx, ext_bindings.LLAMA_PROCESS_TYPE_DECODE, self._batch)
            if rc != 0:
                self.truncate(start)
                raise DrafterError(f"the drafter failed to take target features (llama_process returned {rc})")

    def _gather_features(self, rows: list[int], n_batch_target: int) -> np.ndarray:
        """[len(rows), n_target_layers * n_embd] float32: per row, the layers' inputs side by side."""
        _check_target_decoded(self._low, self._target_ctx)
        self._low.llama_synchronize(self._target_ctx)
        out = np.empty((len(rows), len(self.target_layer_ids) * self.n_embd), dtype=np.float32)
        idx = np.asarray(rows)
        for k, lid in enumerate(self.target_layer_ids):
            ptr = self._ext.llama_get_embeddings_layer_inp(self._target_ctx, lid)
            if not ptr:
                raise DrafterError(f"the target context holds no input of layer {lid}; was it decoded?")
            layer = np.ctypeslib.as_array(ptr, shape=(n_batch_target, self.n_embd))
            out[:, k * self.n_embd:(k + 1) * self.n_embd] = layer[idx]
        return out

    def target_features(self, rows: Sequence[int]) -> np.ndarray:
        """The features `feed` would inject for these rows of the last target decode (tests)."""
        return self._gather_features([int(r) for r in rows], int(self._low.llama_n_batch(self._target_ctx)))

    # -- drafting --------------------------------------------------------------------

    def rows_for(self, n_draft: int) -> int:
        """Block rows that draft `n_draft` positions (one more for a bonus-anchor export)."""
        return min(self.block_size, int(n_draft) + self._first_slot)

    def draft(self, anchor_token: int, anchor_pos: int, k: int = TOP_K, rows: int | None = None) -> DraftBlock:
        """Decode one block [anchor, mask x (B-1)] at anchor_pos..anchor_pos+B-1.

        rows: a shorter runtime block of that many rows (llama.cpp bounds it by the trained
        block size); each row costs about as much as the next, so callers that use only the
        first few drafted positions ask for only those.

        The drafter's KV must hold positions 0..anchor_pos-1 (it is cut back if it holds more).
        Returns the top-k candidates per drafted position with their shares among the top k and
        the confidence; the block's KV cells are removed again before returning.
        """
        low, ext = self._low, self._ext
        held = self.n_positions()
        if held > anchor_pos:
            self.truncate(anchor_pos)
        elif held < anchor_pos:
            raise ValueError(
                f"draft at anchor position {anchor_pos}, but the drafter holds features of "
                f"positions 0..{held - 1} only; feed the accepted rows first"
            )
        if anchor_pos + self.block_size > self.n_ctx:
            raise ContextOverflowError(
                f"a drafter block at position {anchor_pos} does not fit the context of {self.n_ctx}")
        cols = self.d2t
        k = max(1, min(int(k), self.n_vocab if cols is None else len(cols)))
        n_rows = self.block_size if rows is None else max(self._first_slot + 1, min(int(rows), self.block_size))

        ext.llama_batch_ext_clear(self._batch)
        pos1 = ext_bindings.LlamaPos4()
        for i in range(n_rows):
            token = int(anchor_token) if i == 0 else self.mask_token_id
            idx = ext.llama_batch_ext_add_token(self._batch, 0, token)
            if idx < 0:
                raise DrafterError(f"llama_batch_ext_add_token failed ({idx}) for token {token}")
            pos1[0] = anchor_pos + i
            ext.llama_batch_ext_set_pos(self._batch, idx, pos1)
            ext.llama_batch_ext_set_output_logits(self._batch, idx, True)
        try:
            rc = ext.llama_process(self._ctx, ext_bindings.LLAMA_PROCESS_TYPE_DECODE, self._batch)
            if rc != 0:
                raise DrafterError(f"the drafter's block decode failed (llama_process returned {rc})")
            slots = range(self._first_slot, n_rows)
            logits = np.empty((len(slots), self.n_vocab if cols is None else len(cols)), dtype=np.float32)
            conf = np.empty(len(slots), dtype=np.float64) if self.has_confidence else None
            for j, slot in enumerate(slots):
                ptr = low.llama_get_logits_ith(self._ctx, slot)
                row = np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))
                logits[j] = row if cols is None else row[cols]
                if conf is not None:
                    # the confidence is broadcast over an n_embd-wide nextn row; read element 0
                    conf[j] = ext.llama_get_embeddings_nextn_ith(self._ctx, slot)[0]
        finally:
            self.truncate(anchor_pos)
        return self._top_k(logits, conf, k, anchor_pos, cols)

    @staticmethod
    def _top_k(logits: np.ndarray, conf: np.ndarray | None, k: int, anchor_pos: int,
               cols: np.ndarray | None = None) -> DraftBlock:
        """Top k per row; `cols` maps logit columns to token ids (a reduced draft vocabulary)."""
        part = np.argpartition(-logits, k - 1, axis=1)[:, :k]
        vals = np.take_along_axis(logits, part, axis=1)
        if cols is not None:
            part = cols[part]
        # best first; equal logits by lower token id, as argmax (the in-graph pick) breaks ties
        order = np.lexsort((part, -vals), axis=1)
        tokens = np.take_along_axis(part, order, axis=1).astype(np.int32)
        top = np.take_along_axis(vals, order, axis=1)
        z = np.exp(top.astype(np.float64) - top[:, :1])
        share = z / z.sum(axis=1, keepdims=True)
        return DraftBlock(tokens=tokens, share=share, conf=conf, logits=top, anchor_pos=anchor_pos)

    # -- lifetime --------------------------------------------------------------------

    def close(self) -> None:
        """Free the drafter and switch the target's extraction off. Call before freeing the target."""
        low = self._low
        if self._features_on:
            self._features_on = False
            _release_target_features(self._ext, self._target_ctx, self.target_layer_ids)
        if self._batch:
            self._ext.llama_batch_ext_free(self._batch)
            self._batch = None
        if self._ctx:
            low.llama_free(self._ctx)
            self._ctx = None
        if self._model:
            low.llama_model_free(self._model)
            self._model = None

    def __enter__(self) -> "DSparkDrafter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
