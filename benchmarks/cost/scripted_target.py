"""A target whose forward is replayed: the host's side of a round as a GPU host runs it, on the CPU.

On the CPU the target's forward streams the weights through the caches, so the round's host code
(the n-gram index, the tree, the acceptance model, the scheduler) runs cold after every verify,
and its time there is about twice what a GPU host pays (`round_host_time.py --cache`). A
`ScriptedTarget` keeps a real engine, with its real model's tokenizer, template, batch and KV cache
bookkeeping, and replaces only what llama.cpp computes:

- every row's argmax is the reference reply's token after the row's position (`expect` sets the
  reply, a real `ar` reply of the same conversation). Rows off the reference path are never
  accepted (their parent's argmax is another token), so what they return does not matter, and
  the engine commits the reference reply exactly, a check the caller makes;
- a forward of n rows waits `curve` milliseconds, spinning on the host, as llama.cpp's CUDA
  backend waits on the GPU (a sleeping core may lose its caches). The default curve is the RTX
  4090 one of issue 41: an 8B Q4_0 at 1, 16, 32 and 64 rows; between the points it is linear.
- with ``overlap`` the forward runs as on a GPU: llama_decode returns at once and the wait is
  when the logits are read, so host work in between (``LlamaBackend.verify``'s
  ``while_computing``) is hidden; the backend says so (``forward_overlaps``) and the decoder
  defers its acceptance learning there. Without it, as on the CPU, llama_decode itself waits.
- with ``graphs`` the curve is what a forward costs replayed as a CUDA graph, and a forward run
  without one (launched node by node, the host busy all along, so nothing overlaps it) costs
  ``ungraphed_ms`` more. ``"stock"`` keeps llama.cpp 0.3.36's one graph per context: a forward of
  another shape than the last one runs without it, and the next one of the same shape captures it
  (also without), so a verify between one-row steps costs three such forwards; ``"width"`` keeps
  a graph per width (``ADASPARK_CUDA_GRAPHS=1``): each width's first two forwards go without. A
  prefill changes the shape too, and so does the context each time it crosses 256 cells (every
  graph then warms again).
- with ``host_argmax`` (vocabulary, GB/s) the tokens are taken the host way (ARGMAX_ENV=host): after
  the forward every row's logits cross to the host at that rate (modeled: a spin) and numpy scans
  them (real: an argmax over rows of that vocabulary read cold from a pool larger than the caches).
  Without it the tokens come as the device way brings them, at no cost past the forward.

So the host code runs with warm caches, at the round mix a GPU's cheap wide verifies make.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np

from adaspark_app.engine.backend import LlamaBackend
from adaspark_app.engine.chat_engine import ChatEngine
from adaspark_app.engine.events import ReplyResult, RoundEvent
from adaspark_app.runner import Conversation, run_conversation


class Reference(NamedTuple):
    """One turn of a real `ar` run: what a scripted target replays, and what an oracle prices."""

    prompt: list[int]  # the turn's prompt tokens (the conversation so far, templated)
    reply: list[int]  # the reply's tokens: the prefill's first token, then the rounds' (eog included)
    text: str
    capped: bool  # the reply reached max_tokens without ending


def reference_replies(convs: Sequence[Conversation], max_tokens: int, n_ctx: int = 4096,
                      model: str | None = None) -> list[list[Reference]]:
    """Per conversation, per turn: the reply of a real `ar` run on ``model`` (default the bundled
    model; CPU), each turn's history the replies before it (``runner.run_conversation``)."""
    eng = ChatEngine(model, arm="ar", n_ctx=n_ctx, n_threads=2)
    prompts: list[list[int]] = []
    start = eng.decoder.start_reply

    def start_reply(prompt: list[int], **kw: Any) -> tuple[int | None, int, float]:
        prompts.append(list(prompt))
        return start(prompt, **kw)

    eng.decoder.start_reply = start_reply
    refs = []
    try:
        for c in convs:
            turns: list[Reference] = []
            run_conversation(eng, c, max_tokens, on_reply=lambda r: turns.append(
                Reference(prompts[-1], eng.decoder.committed()[len(prompts[-1]):], r.text, r.looped)))
            eng.reset_conversation()
            refs.append(turns)
    finally:
        eng.close()
    return refs


def replay_conversation(engine: ChatEngine, target: "ScriptedTarget", conv: Conversation, refs: Sequence[Reference],
                        max_tokens: int, on_round: Callable[[RoundEvent], None] | None = None,
                        on_reply: Callable[[ReplyResult], None] | None = None) -> list[ReplyResult]:
    """Every turn of ``conv`` through ``engine`` (``runner.run_conversation``, ``on_round`` and
    ``on_reply`` as there), ``target`` expecting each turn's reference reply (``reference_replies``)
    before the turn runs."""
    ahead = iter(refs[1:])
    if refs:
        target.expect(refs[0].reply)

    def next_turn(res: ReplyResult) -> None:
        if on_reply is not None:
            on_reply(res)
        ref = next(ahead, None)
        if ref is not None:
            target.expect(ref.reply)

    return run_conversation(engine, conv, max_tokens, on_round=on_round, on_reply=next_turn)


GPU_LIKE_CURVE: tuple[tuple[int, float], ...] = ((1, 6.6), (16, 8.3), (32, 9.3), (64, 11.8))  # rows, ms
#: ScriptedTarget's CUDA graph models: none (every forward costs the curve), llama.cpp's one graph
#: per context, a graph per width (ADASPARK_CUDA_GRAPHS=1).
GRAPH_MODES = (None, "stock", "width")


def add_run_arguments(ap: argparse.ArgumentParser, limit: int, curve_help: str) -> None:
    """The arguments the scripted runs share: the script, its first ``--limit`` conversations, the
    reply cap, and ``--curve`` (default GPU_LIKE_CURVE)."""
    ap.add_argument("script")
    ap.add_argument("--limit", type=int, default=limit, help="first N conversations" + (" (0: all)" if limit == 0 else ""))
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--curve", default=",".join(f"{r}:{ms}" for r, ms in GPU_LIKE_CURVE),
                    help=curve_help + " (default %(default)s)")


def parse_curve(text: str) -> tuple[tuple[int, float], ...]:
    """'1:6.6,16:8.3,...' -> ((1, 6.6), (16, 8.3), ...), rows increasing, times positive."""
    try:
        points = tuple((int(r), float(ms)) for r, ms in (p.split(":") for p in text.split(",")))
    except ValueError:
        raise ValueError(f"curve {text!r}: give ROWS:MS pairs separated by commas, e.g. 1:6.6,64:11.8") from None
    rows = [r for r, _ in points]
    if not points or rows != sorted(set(rows)) or rows[0] < 1 or any(ms <= 0 for _, ms in points):
        raise ValueError(f"curve {text!r}: rows must increase from 1 or more, and every time be positive")
    return points


def curve_ms(rows: int, curve: Sequence[tuple[int, float]]) -> float:
    """The modeled forward time of `rows` rows, linear between the curve's points, flat past its ends."""
    return float(np.interp(rows, [r for r, _ in curve], [ms for _, ms in curve]))


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


#: llama.cpp pads the KV cells a forward reads to a multiple of this (``llama_kv_cache::get_n_kv``),
#: so a graph's shapes change each time the context crosses one.
KV_PAD = 256


class GraphModel:
    """Which forwards replay a CUDA graph, as llama.cpp 0.3.36's CUDA backend decides (its
    ``ggml_backend_cuda_graph_compute`` warm-up): a graph whose last forward had another shape (its
    rows, or the KV cells it reads, padded to KV_PAD) is run without one; the next forward of the
    same shape captures it (launched as it is recorded, so also without); later ones replay it.
    ``"stock"``: one graph per context; ``"width"``: one per row count (``ADASPARK_CUDA_GRAPHS=1``)."""

    def __init__(self, mode: str) -> None:
        if mode not in GRAPH_MODES or mode is None:
            raise ValueError(f"graphs {mode!r}: one of {', '.join(m for m in GRAPH_MODES if m)}")
        self.mode = mode
        self._state: dict[int, tuple[tuple[int, int], bool]] = {}  # graph key -> (last shape, captured since)

    def replays(self, rows: int, kv_cells: int = 0) -> bool:
        """Whether a forward of ``rows`` rows over ``kv_cells`` cells (the last row's position + 1)
        replays a graph; updates the state."""
        key = rows if self.mode == "width" else 0
        shape = (rows, -(-max(kv_cells, 1) // KV_PAD))
        last, captured = self._state.get(key, (None, False))
        if last != shape:  # another shape than the graph's last: launched node by node
            self._state[key] = (shape, False)
            return False
        if not captured:  # the same shape again: captured now
            self._state[key] = (shape, True)
            return False
        return True


class ColdRows:
    """Rows of logits over a vocabulary, read cold as a device's copy leaves them: a pool larger than
    the CPU's caches, taken in turn."""

    POOL_BYTES = 256 << 20

    def __init__(self, vocab: int, min_rows: int = 64) -> None:
        rows = max(min_rows, self.POOL_BYTES // (4 * vocab))
        self._pool = np.random.default_rng(5).standard_normal((rows, vocab), dtype=np.float32)
        self._at = 0

    def argmax(self, n: int) -> np.ndarray:
        """numpy's argmax of the next ``n`` rows."""
        if self._at + n > len(self._pool):
            self._at = 0
        out = self._pool[self._at:self._at + n].argmax(axis=1)
        self._at += n
        return out


class HostArgmax:
    """The host way's cost of a forward's tokens: the rows' logits copied at ``gbps`` (a spin) and
    scanned by numpy (a real argmax over rows of ``vocab`` read cold)."""

    def __init__(self, vocab: int, gbps: float) -> None:
        self.vocab, self.gbps = int(vocab), float(gbps)
        self._rows = ColdRows(self.vocab)

    def take(self, n_out: int) -> None:
        _spin(n_out * self.vocab * 4 / (self.gbps * 1e9))
        self._rows.argmax(n_out)


def parse_host_argmax(text: str) -> tuple[int, float]:
    """'151936:25' -> (151936, 25.0): a vocabulary and the device-to-host copy rate in GB/s."""
    try:
        vocab, gbps = text.split(":")
        parsed = int(vocab), float(gbps)
    except ValueError:
        raise ValueError(f"host argmax {text!r}: give VOCAB:GBPS, e.g. 151936:25") from None
    if parsed[0] < 2 or not parsed[1] > 0:
        raise ValueError(f"host argmax {text!r}: a vocabulary of 2 or more and a positive rate")
    return parsed


class ScriptedTarget:
    """Replaces `backend`'s forward (``_decode``, ``_argmax_rows``) by the replay described above."""

    def __init__(self, backend: LlamaBackend, curve: Sequence[tuple[int, float]] = GPU_LIKE_CURVE,
                 overlap: bool = False, graphs: str | None = None, ungraphed_ms: float = 0.0,
                 host_argmax: tuple[int, float] | None = None) -> None:
        self.backend = backend
        self.host_argmax = HostArgmax(*host_argmax) if host_argmax is not None else None
        self.overlap = overlap
        self.graphs = GraphModel(graphs) if graphs is not None else None
        self.ungraphed_ms = float(ungraphed_ms)
        self.ungraphed = 0  # forwards run without a graph (prefill chunks not counted)
        backend.forward_overlaps = overlap
        self._ready = 0.0  # perf_counter time the queued forward is done
        self.curve = tuple(curve)
        self.ref: list[int] = []  # the committed text and the expected reply, by position
        self.reply: list[int] = []
        self.forwards: list[int] = []  # rows of every modeled forward (prefill chunks not counted)
        self._out_pos: list[int] = []
        self._in_prefill = False
        fill, prefill = backend._fill_batch, backend.prefill

        def fill_batch(tokens: Sequence[int], positions: Sequence[int], seq_ids: Sequence[Sequence[int]],
                       logits: Sequence[bool]) -> None:
            fill(tokens, positions, seq_ids, logits)
            self._out_pos = [p for p, out in zip(positions, logits) if out]

        def scripted_prefill(tokens: Sequence[int], start: int,
                             on_chunk: Callable[[list[int], list[int]], None] | None = None,
                             argmax: bool = True, between: Callable[[int], bool] | None = None) -> int | None:
            self.ref = self.ref[:start] + list(tokens) + self.reply + [backend.eos_token()]
            self._in_prefill = True
            try:
                return prefill(tokens, start, on_chunk=on_chunk, argmax=argmax, between=between)
            finally:
                self._in_prefill = False

        backend._fill_batch = fill_batch
        backend.prefill = scripted_prefill
        backend._decode = self._decode
        backend._argmax_rows = self._argmax_rows

    def expect(self, reply: Sequence[int]) -> None:
        """The next reply's tokens (after the prompt the next prefill completes)."""
        self.reply = list(reply)

    def _decode(self) -> None:
        now = time.perf_counter()
        rows = int(self.backend._batch.n_tokens)
        if self._in_prefill:  # a prefill's cost is outside the rounds
            if self.graphs is not None:
                self.graphs.replays(-rows)  # its shape is none of the rounds'
            self._ready = now
            return
        self.forwards.append(rows)
        ms = curve_ms(rows, self.curve)
        if self.graphs is not None and not self.graphs.replays(rows, max(self._out_pos, default=0) + 1):
            self.ungraphed += 1
            self._ready = now + (ms + self.ungraphed_ms) / 1e3
            _spin(self._ready - now)  # the host launches every node: nothing overlaps it
            return
        self._ready = now + ms / 1e3
        if not self.overlap:
            _spin(self._ready - now)

    def _argmax_rows(self, n_out: int) -> np.ndarray:
        _spin(self._ready - time.perf_counter())  # llama_get_logits waits for the forward
        if self.host_argmax is not None:
            self.host_argmax.take(n_out)
        ref, eos = self.ref, self.backend.eos_token()
        return np.array([ref[p + 1] if p + 1 < len(ref) else eos for p in self._out_pos[:n_out]], dtype=np.int32)
