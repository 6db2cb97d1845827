"""The engine a user talks to: a conversation in, a streamed greedy reply out, learning persisted.

Thread boundary: every method except the constructor's argument checks calls llama.cpp and must
run on one worker thread (the TUI's thread worker, or the main thread of a headless run). Events
are delivered on that same thread through `on_round`; consumers must hand them to their own
thread (the TUI posts Textual messages).
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any, Callable

from ..errors import AdaSparkError, ArgumentError, ModelLoadError, StoreError
from ..learn.constants import MAX_WIDTH
from .arms import Arm, parse_arm
from .backend import LlamaBackend, check_gguf_file, default_model_path
from .context_window import Window, fit_messages
from .decoder import Decoder, common_prefix, shared_prefix
from .reply import run_reply
from .rounds import RoundOutcome
from .detok import StreamDecoder, joined
from .harmony import HarmonyText, harmony_tokens
from .events import ReadAhead, ReplyResult, RoundEvent
from .prompt_tokens import PromptTokens
from .sampling import GREEDY, SamplingSettings
from .self_check import SelfCheckError
from .template import chat_template_for, turn_format_notice  # noqa: F401

VALID_ROLES = ("system", "user", "assistant")
# A long reply's learned state is saved every this many seconds too, not only at its end, so a
# process killed mid-reply keeps what the reply had taught (about 1 ms a save, during the next
# forward where it overlaps).
CHECKPOINT_S = 10.0
# A saved context is read only where it spares at least this many prompt tokens of prefill.
MIN_GAIN = 64
# Messages whose token counts are kept for the context window's block edges (_text_size).
TEXT_SIZES_KEPT = 4096


def _check_messages(messages: list[dict[str, str]]) -> None:
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in VALID_ROLES or not isinstance(m.get("content"), str):
            raise ArgumentError(f"message {i} must be {{'role': system|user|assistant, 'content': str}}")


class ChatEngine:
    """A target model with the AdaSpark round loop, its learners and (optionally) a store."""

    def __init__(self, model_path: str | None = None, drafter_path: str | None = None, store: Any = None,
                 arm: str | Arm = "adaspark", n_threads: int | None = None, n_ctx: int = 4096,
                 self_check: bool = False, gpu_layers: int | str | None = None,
                 saved_context_mb: int = 0) -> None:
        """saved_context_mb: with a store, keep conversations' KV caches on disk beside it, up to
        this many MiB (store/saved_context.py; 0: none kept, as `run` and `bench` do)."""
        self.arm = arm if isinstance(arm, Arm) else parse_arm(arm)
        path = model_path or default_model_path()
        check_gguf_file(path, "model")
        if drafter_path is not None and drafter_path != "default":
            check_gguf_file(drafter_path, "drafter")
        self.backend = LlamaBackend(path, n_ctx=n_ctx, n_threads=n_threads, gpu_layers=gpu_layers)
        b = self.backend
        self.notices: list[str] = [b.offload.notice] if b.offload.notice else []
        self.cuda_exact_rows: int | None = None  # on a GPU: native.cuda_exact.library_rows()
        self.cuda_graphs: bool | None = None  # on a GPU: native.cuda_exact.library_graphs()
        self.cuda_argmax: bool | None = None  # on a GPU: native.cuda_exact.library_argmax()
        if b.offload.on_gpu:
            from ..native.cuda_exact import library_argmax, library_graphs, library_rows

            from .offload import cuda_kernels_notice

            self.cuda_exact_rows = library_rows()
            self.cuda_graphs = library_graphs()
            self.cuda_argmax = library_argmax()
            note = cuda_kernels_notice(self.cuda_exact_rows, MAX_WIDTH)
            if note:
                self.notices.append(note)
        if b.recurrent:
            self.notices.append("this model is recurrent or hybrid: tree verification is off, "
                                "decoding plainly one token per step")
        self.drafter = None
        self.drafter_path = None
        if drafter_path is not None:
            self.drafter = self._load_drafter(drafter_path)
        self.decoder = Decoder(b, self.arm, drafter=self.drafter, self_check=self_check)
        self.prompts = PromptTokens(b.tokenize_bytes, b.special_tokens)
        self._sizes: dict[str, int] = {}  # a message's text -> its plain token count (_text_size)
        # The GGUF's template; a base model (none) gets its family's built-in turn format
        self.template = chat_template_for(b)
        self.turn_format = self.template.turn_format
        # gpt-oss: its replies' channels are written as thinking and answer (harmony.py)
        self.harmony = harmony_tokens(lambda s: b.tokenize(s, parse_special=True), b.is_special)
        note = turn_format_notice(self.turn_format, b.meta("general.architecture"))
        if note:
            self.notices.append(note)
        self.model_name = self._model_label() + (" · base model" if self.turn_format.base_model else "")
        self.drafter_name = Path(self.drafter_path).name if self.drafter_path else None
        self.store = store
        self.store_key = None
        self._key_meta = None
        self.saved_contexts = None  # store/saved_context.SavedContexts where they are kept
        self._held: str | None = None  # the conversation whose context the KV cache holds
        self._on_disk: tuple[str, list[int]] | None = None  # a conversation and its tokens as last saved or read
        self._ahead: ReadAhead | None = None  # what read_ahead put in the cache since the last reply
        if store is not None:
            self._attach_store(store)
            if saved_context_mb > 0:
                self._keep_contexts(store, saved_context_mb)
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ setup
    def _model_label(self) -> str:
        from ..store.fingerprint import model_fingerprint

        b = self.backend
        try:  # general.file_type's name (Q4_K_M); llama.cpp's description ends in "Q4_K - Medium"
            quant = model_fingerprint(b.model_path)["quantisation"] or ""
        except ModelLoadError:
            desc = b.description
            quant = desc.split()[-1] if desc else ""
        if _is_bundled(b.model_path):
            from ..models import BUNDLED_NAME, BUNDLED_TITLE  # as `adaspark models` names it

            return f"{BUNDLED_TITLE} (bundled, {quant})" if quant else BUNDLED_NAME
        return f"{b.name} ({quant})" if quant else b.name

    def _load_drafter(self, drafter_path: str):
        """Load a DSpark drafter on the target context (before the target's first decode)."""
        from .dspark import DSparkDrafter  # imported lazily: binds C++ ext symbols

        if drafter_path == "default":
            from .default_drafter import default_drafter_path

            drafter_path = default_drafter_path()
        self.drafter_path = drafter_path
        b = self.backend
        return DSparkDrafter(b.model, b.ctx, drafter_path, b.n_threads, b.offload.n_gpu_layers)

    def _attach_store(self, store: Any) -> None:
        from ..store import LearnedKey, device_fingerprint, model_fingerprint

        mfp = model_fingerprint(self.backend.model_path)
        dfp = device_fingerprint(self.backend.n_threads, self._backend_info(), **self._gpu())
        rfp = model_fingerprint(self.drafter_path) if self.drafter_path else None
        self.store_key = LearnedKey(mfp["id"], dfp["id"], rfp["id"] if rfp else None)
        self._key_meta = {"model": mfp, "device": dfp, "drafter": rfp, "model_name": self.model_name,
                          "drafter_name": self.drafter_name}
        self._restore_learned(store)

    def _keep_contexts(self, store: Any, limit_mb: int) -> None:
        """Keep conversations' contexts beside the store (a DSpark drafter's with the target's):
        not for a recurrent model (its state cannot be cut back to a prefix)."""
        from .. import native
        from ..store.saved_context import SavedContexts, folder_for

        path = getattr(store, "path", None)
        if path is None or self.backend.recurrent or self._key_meta is None:
            return
        b = self.backend
        drafter = self._key_meta.get("drafter")
        identity = {"model": self._key_meta["model"]["id"], "device": self._key_meta["device"]["id"],
                    "drafter": drafter["id"] if drafter else None, "kv_types": list(b.kv_types),
                    "flash_attn": os.environ.get("ADASPARK_FA"), "kernels": native.status(), "n_batch": b.n_batch}
        self.saved_contexts = SavedContexts(folder_for(path), identity, limit_mb << 20)
        self.saved_contexts.trim()  # a limit lowered since, and what a killed save left

    def _restore_learned(self, store: Any) -> None:
        """Load the key's learned state into the decoder (migrating the previous layout).

        A state that does not load (another version's layout, or corrupt) must not stop the
        engine: it is kept aside in the store under its key (``Store.quarantine_learned``; its
        bytes stay in the file) and the engine starts fresh, with one notice. Other store errors
        (a locked or damaged file) still raise StoreError.
        """
        from ..learn.learned_state import validate
        from ..learn.state import StateError
        from ..store.db import UnreadableState

        for _ in range(2):  # a second look if another process saved a new state meanwhile
            loaded = None
            try:
                loaded = store.load_learned(self.store_key)
                if loaded is None:
                    return
                state = validate(loaded)
            except (StateError, UnreadableState) as exc:
                reason = " ".join(str(exc).split())
                try:
                    moved = store.quarantine_learned(self.store_key, reason, loaded)
                except StoreError as err:
                    self.store_key = None  # learn, but never overwrite what could not be kept aside
                    self.notices.append(f"the learned state in the store does not load ({reason}) and could "
                                        f"not be kept aside ({err}): started fresh, learning is not saved")
                    return
                if not moved:
                    continue
                self.notices.append(f"the learned state in the store does not load ({reason}): "
                                    "kept it aside in the store and started fresh")
                return
            self.decoder.load_state(state)
            return
        self.notices.append("the learned state in the store kept changing while it was read: started fresh")

    @property
    def device_label(self) -> str:
        """Where the model runs, for the chat's header and `adaspark bench`'s report: `CPU, 2
        threads`, or the GPU's name and the layers on it."""
        off = self.backend.offload
        if not off.on_gpu:
            return f"CPU, {self.backend.n_threads} threads"
        return f"{self._gpu()['gpu']}, {off.describe()}"

    @property
    def cuda_kernels(self) -> str:
        """The CUDA kernels, graphs and token place a verify runs with (``offload.cuda_kernels``),
        for the fingerprint and reports; meaningful where layers are on a GPU."""
        from .offload import cuda_kernels

        return cuda_kernels(self.cuda_exact_rows, self.cuda_graphs, self.backend.argmax_on_device,
                            self.cuda_argmax)

    def _gpu(self) -> dict:
        """The GPU and layers the fingerprint names, when layers are offloaded (none on the CPU)."""
        off = self.backend.offload
        if not off.on_gpu:
            return {}
        from .offload import gpu_identity

        ident = gpu_identity() or {}
        # the kernels, the CUDA graphs and where greedy tokens are taken set the verify's cost curve: a
        # table learned with the stock kernels never prices the batch-invariant ones, nor one graph
        # per context a graph per width, nor logits copied to the host tokens taken on the GPU
        return {"gpu": ident.get("name") or "GPU", "gpu_layers": off.n_gpu_layers,
                "gpu_detail": {**{k: v for k, v in ident.items() if k != "name"},
                               "kernels": self.cuda_kernels}}

    @property
    def opens_thinking(self) -> bool:
        """Whether the chat template's prompt for a reply ends inside an opened `<think>` (the
        DeepSeek-R1 distills'): each reply then starts in its thinking and only closes it (the
        chat folds the thinking, thinking.py). False where the template refuses a message."""
        from ..thinking import OPEN

        try:
            text = self.template.render([{"role": "user", "content": "Hi"}], add_generation_prompt=True)
        except AdaSparkError:
            return False
        return text.rstrip().endswith(OPEN)

    def _backend_info(self) -> str:
        import llama_cpp

        return f"llama-cpp-python {llama_cpp.__version__}; {self.backend.system_info()}"

    # ------------------------------------------------------------------ public API
    @property
    def context(self) -> int:
        return self.decoder.context

    def prompt_tokens(self, messages: list[dict[str, str]]) -> list[int]:
        """The prompt for `messages` through the GGUF's chat template, tokenised."""
        _check_messages(messages)
        text = self.template.render(messages, add_generation_prompt=True)
        tokens = self.prompts(text)  # the pieces of earlier prompts reused (engine/prompt_tokens.py)
        if self.decoder.self_check:
            whole = self.backend.tokenize(text, add_special=False, parse_special=True)
            if tokens != whole:
                raise SelfCheckError(f"the prompt's tokens reused from an earlier prompt differ from its own at "
                                     f"token {common_prefix(tokens, whole)} of {len(whole)}")
        return tokens

    def fit_window(self, messages: list[dict[str, str]], max_tokens: int) -> tuple[Window, list[int]]:
        """The messages that fit the context with a reply of up to `max_tokens`, and their prompt
        tokens (engine/context_window.py: the oldest turns go first, the system prompt stays).

        Raises MessageTooLongError when the newest message alone leaves no room for a reply.
        A conversation that does not end with the user's message is taken whole."""
        prompts: dict[int, list[int]] = {}  # messages kept -> prompt tokens: each count is reused

        def count(kept: list[dict[str, str]]) -> int:
            toks = self.prompt_tokens(kept)
            prompts[len(kept)] = toks
            return len(toks)

        _check_messages(messages)  # every message, before any is left out
        if not messages or messages[-1]["role"] != "user":
            toks = self.prompt_tokens(messages)
            room = max(1, min(max_tokens, self.backend.n_ctx - 1 - len(toks)))
            return Window(list(messages), 0, len(toks), room, room < max_tokens), toks

        def turn_size(turn: list[dict[str, str]]) -> int:
            # the block edges only need a stable size: the turn's text, tokenised plainly
            return sum(self._text_size(m["content"]) + 4 for m in turn)

        window = fit_messages(messages, count, self.backend.n_ctx, max_tokens, turn_size=turn_size)
        return window, prompts[len(window.messages)]

    def _text_size(self, text: str) -> int:
        """Tokens of a message's text tokenised plainly, kept for the texts counted last (a full
        context sizes every turn for each reply)."""
        size = self._sizes.pop(text, None)
        if size is None:
            size = len(self.backend.tokenize(text, parse_special=False))
        self._sizes[text] = size  # newest last
        if len(self._sizes) > TEXT_SIZES_KEPT:
            del self._sizes[next(iter(self._sizes))]
        return size

    def generate(self, conversation_id: str, messages: list[dict[str, str]], max_tokens: int = 512,
                 on_round: Callable[[RoundEvent], None] | None = None,
                 cancel: threading.Event | None = None, turn: int = 0,
                 sampling: SamplingSettings | None = None,
                 on_prefill: Callable[[int, int], None] | None = None) -> ReplyResult:
        """Generate the assistant's reply to `messages` (ending with the user's message).

        sampling: None or temperature 0 decodes greedily; otherwise each token is drawn from the
        target's processed distribution with the settings' seed (a random one if unset, recorded
        in the result), so the reply is the same whatever the arm.

        Long conversations: when the history and a reply of `max_tokens` pass the context, the
        oldest turns are left out of the prompt (engine/context_window.py; the system prompt and
        the new message stay), counted in `dropped_turns`; if the new message alone leaves less
        than max_tokens, the reply is capped to what fits (`capped_to`). A message that leaves
        no room for a reply raises MessageTooLongError before anything is decoded.

        Reading the prompt: on_prefill(done, total) runs as it starts and after each chunk with the
        prompt tokens read so far and to read. `cancel` set while the prompt is read stops it
        between two chunks: the result has no token (`stopped`), and the cache keeps what was
        read, so asking again goes on from there.

        Blocking: run it on the engine's worker thread. The KV cache is reused for the longest
        prefix the new prompt shares with what is cached (after a drop: at least the system
        prompt); only the tokens after it are prefilled. Learned state is saved to the store
        at the end of the reply, and every CHECKPOINT_S of a long one; a store that refuses it
        (a full disk) costs the reply nothing: `learned_not_saved` says why.
        """
        if max_tokens < 1:
            raise ArgumentError("max_tokens must be at least 1")
        if sampling is not None and not isinstance(sampling, SamplingSettings):
            raise ArgumentError("sampling must be a SamplingSettings")
        with self._lock:
            return self._generate(conversation_id, messages, max_tokens, on_round, cancel, turn,
                                  sampling or GREEDY, on_prefill)

    def _generate(self, conversation_id, messages, max_tokens, on_round, cancel, turn,
                  sampling: SamplingSettings, on_prefill=None) -> ReplyResult:
        b = self.backend
        dec = self.decoder
        t_asked = time.perf_counter()
        window, prompt = self.fit_window(messages, max_tokens)
        max_tokens = window.reply_tokens  # below the asked cap only when the context is that full
        settings = dec.set_sampling(sampling)
        sjson, seed = settings.to_json(), settings.seed if not settings.greedy else None
        restored = self._enter(conversation_id, prompt)
        enter_s = time.perf_counter() - t_asked  # the prompt's rendering and tokens, a saved context's read
        cached = shared_prefix(dec.kv_tokens, prompt)
        ahead, self._ahead, read_ahead = self._ahead, None, 0
        if ahead is not None and ahead.conversation in (conversation_id, None) and not restored:
            restored = min(ahead.restored, cached)  # what the history's reading gave, as the prompt keeps it
            read_ahead = min(ahead.read, cached - restored)
        between = _reading(len(prompt) - cached, on_prefill, cancel.is_set if cancel is not None else None)
        first, n_prefill, prefill_s = dec.start_reply(prompt, between=between)
        prefill_s += enter_s  # part of the wait for the first token
        if first is None:  # stopped while the prompt was read: no token, the cache keeps what was read
            self._held = conversation_id
            return ReplyResult(
                conversation=conversation_id, turn=turn, text="", n_tokens=0, decode_s=0.0, prefill_s=prefill_s,
                prompt_tokens=n_prefill, context=dec.context, rounds=0, widths={}, measure_rounds=0,
                rows_by_source={}, accepted_by_source={}, looped=False, stopped=True, arm=str(self.arm),
                sampling=sjson, seed=seed, dropped_turns=window.dropped_turns, prompt_length=len(prompt),
                capped_to=window.reply_tokens if window.capped else None, restored_tokens=restored,
                read_ahead_tokens=read_ahead)
        to_bytes = HarmonyText(self.harmony, b.token_bytes).pieces if self.harmony else joined(b.token_bytes)
        stream = StreamDecoder(to_bytes)
        counters = {"tokens": 0, "t0": time.perf_counter(), "saved": time.perf_counter()}

        def handle(oc: RoundOutcome, new: list[int]) -> None:
            # the text and the event are made while the next forward runs where it overlaps the host
            # (Decoder.later: on a GPU the host would wait), from what the decoder says now
            at = (dec.round_index, dec.context, time.perf_counter())
            dec.later(lambda: emit(oc, new, *at))

        def emit(oc: RoundOutcome, new: list[int], round_index: int, context: int, now: float) -> None:
            visible = [t for t in new if not b.is_eog(t)]
            text = stream.push(visible)
            counters["tokens"] += len(new)
            if now - counters["saved"] >= CHECKPOINT_S:
                counters["saved"] = now
                self._checkpoint()
            if on_round is None:
                return
            if oc.prefill:
                if text:
                    on_round(RoundEvent(
                        conversation=conversation_id, turn=turn, round_index=0, context=context, width=1,
                        measured=False, verify_ms_predicted=None, verify_ms=0.0, fixed_ms=0.0,
                        expected_accepted=0.0, accepted=0, committed=1, priced_by="none", text=text,
                        reply_tokens=counters["tokens"], reply_seconds=0.0, prefill=True,
                        sampling=sjson, seed=seed))
                return
            tr = oc.trace
            on_round(RoundEvent(
                conversation=conversation_id, turn=turn, round_index=round_index, context=context,
                width=oc.width, measured=oc.measured,
                verify_ms_predicted=None if oc.predicted_s is None else oc.predicted_s * 1e3,
                verify_ms=oc.verify_s * 1e3, fixed_ms=oc.fixed_s * 1e3, expected_accepted=oc.expected_accepted,
                accepted=oc.accepted, committed=len(new), priced_by=oc.priced_by,
                rows_by_source=oc.rows_by_source, accepted_by_source=oc.accepted_by_source,
                offered={w: s * 1e3 for w, s in oc.offered.items()}, band_rate=oc.band_rate, text=text,
                reply_tokens=counters["tokens"], reply_seconds=now - counters["t0"],
                decided_by=oc.decided_by, incumbent=tr.get("incumbent"), argmax=tr.get("argmax"),
                mode=tr.get("mode"), values=tr.get("values", {}), rho=tr.get("rho"), D_ms=tr.get("D_ms"),
                gains=tr.get("gains"), draft_skipped=bool(tr.get("draft_skipped")),
                drafter_skipped=bool(tr.get("drafter_skipped")), probe=int(tr.get("probe", 0)),
                cut_tokens=int(tr.get("cut_tokens", 0)), bounded=bool(tr.get("bounded")),
                ends_at=int(tr.get("ends_at", 0)), sampling=sjson,
                seed=seed))

        reply, stats = run_reply(dec, max_tokens, b.is_eog, handle, cancel, first_token=first)
        stream.flush()
        text = stream.text
        result = ReplyResult(
            conversation=conversation_id, turn=turn, text=text, n_tokens=len(reply), decode_s=stats["decode_s"],
            prefill_s=prefill_s, prompt_tokens=n_prefill, context=dec.context, rounds=stats["rounds"],
            widths=stats["widths"], measure_rounds=stats["measure_rounds"],
            rows_by_source=stats["rows_by_source"], accepted_by_source=stats["accepted_by_source"],
            looped=stats["looped"], stopped=stats["stopped"], arm=str(self.arm), tokens=reply,
            ngram_rounds=stats["ngram_rounds"], drafter_rounds=stats["drafter_rounds"],
            decided_by=stats["decided_by"], sampling=sjson, seed=seed, dropped_turns=window.dropped_turns,
            prompt_length=len(prompt), capped_to=window.reply_tokens if window.capped else None,
            restored_tokens=restored, read_ahead_tokens=read_ahead)
        self._held = conversation_id  # a whole reply: the cache is this conversation's, worth keeping
        try:
            self._save(result)
        except StoreError as err:  # a full disk: the reply stands, its learning is what is lost
            result.learned_not_saved = str(err)
        return result

    # ------------------------------------------------------------------ reading ahead
    def history_tokens(self, messages: list[dict[str, str]], max_tokens: int = 512, draft: str = "") -> list[int]:
        """The tokens that begin the prompt of the next reply in a conversation of `messages`
        (system prompt and turns, before the user's next message; a trailing user message is left
        out), the start of that message too where `draft` gives it (the message box's text, to
        which more will be typed): the prompt of a next message, up to where what follows the
        draft starts, less one token (tokenisers may join the text to what precedes it). Found by
        rendering two next messages and keeping what their prompts share, so any template does.
        Empty where nothing can be known (a template that refuses, a history that leaves no room
        for a reply)."""
        _check_messages(messages)
        if not isinstance(draft, str):
            raise ArgumentError("draft must be a str")
        past = list(messages)
        while past and past[-1]["role"] == "user":
            past.pop()
        if not past and not draft:
            return []
        try:
            window, one = self.fit_window([*past, {"role": "user", "content": draft + "A"}], max_tokens)
            other = self.prompt_tokens([*window.messages[:-1], {"role": "user", "content": draft + "?"}])
        except AdaSparkError:
            return []
        return one[:max(0, common_prefix(one, other) - 1)]

    def read_ahead(self, conversation_id: str | None, messages: list[dict[str, str]], max_tokens: int = 512,
                   stop: Callable[[], bool] | None = None,
                   on_progress: Callable[[int, int], None] | None = None, draft: str = "") -> ReadAhead:
        """Put a conversation's history in the KV cache before its next reply is asked (the chat
        does it while the user types): from its saved context where one gives it, then a prefill of
        the rest. `stop()` is asked between two of the prefill's chunks; True stops there, the cache
        keeping what was read. on_progress(done, total) as `generate`'s on_prefill.

        draft: the next message as far as it is typed (a pasted text, say): read too, up to its
        last token or so (`history_tokens`). conversation_id None: a new conversation's first
        message, whose id comes with its reply (that reply counts the reading).

        The next `generate` in the conversation prefills only what the cache lacks, and its result
        counts what was read here (`restored_tokens`, `read_ahead_tokens`). Its reply is
        byte-identical to one without reading ahead: the cache holds the same tokens at the same
        positions. Another conversation the cache held is saved first (as `generate` does).
        Blocking: run it on the engine's thread, as `generate`."""
        with self._lock:
            tokens = self.history_tokens(messages, max_tokens, draft)
            dec = self.decoder
            if len(tokens) < 2 or self.backend.recurrent:  # a recurrent state cannot be cut back to a prefix
                return ReadAhead(conversation_id, 0, 0, 0, len(tokens))
            was_held = self._held == conversation_id
            restored = self._enter(conversation_id, tokens)
            read = dec.read_ahead(tokens, _reading(len(tokens) - common_prefix(dec.kv_tokens, tokens),
                                                   on_progress, stop))
            held = common_prefix(dec.kv_tokens, tokens)
            done = ReadAhead(conversation_id, restored, read, held, len(tokens))
            before = self._ahead if self._ahead is not None and self._ahead.conversation == conversation_id else None
            self._ahead = done if before is None else ReadAhead(  # what all readings since the last reply gave
                conversation_id, before.restored + restored, before.read + read, held, len(tokens))
            if held == len(tokens) or was_held:  # the whole history, or what a reply left of it (a
                self._held = conversation_id  # reading stopped by a quit): worth saving on leaving it
            return done

    # ------------------------------------------------------------------ saved contexts
    def _enter(self, conversation_id: str | None, prompt: list[int]) -> int:
        """Before a reply in `conversation_id`, or a reading of its history (`prompt`: the history's
        tokens): save the context of the conversation the cache holds if it is another, and put this
        conversation's saved context back where it gives more of the prompt than the cache does
        (None: a new conversation, none saved). Returns the prompt tokens the saved context gave
        (0: none)."""
        from ..store.saved_context import MIN_TOKENS

        sc = self.saved_contexts
        if sc is None:
            return 0
        if self._held is not None and self._held != conversation_id:
            self.save_context()
        self._held = None  # until this reply ends whole
        if conversation_id is None:
            return 0
        dec = self.decoder
        cached = shared_prefix(dec.kv_tokens, prompt)
        if len(prompt) - cached < MIN_GAIN:
            return 0
        saved = sc.find(conversation_id)
        if saved is None or len(saved.tokens) >= self.backend.n_ctx:
            return 0
        given = shared_prefix(saved.tokens, prompt)
        if given < max(cached + MIN_GAIN, MIN_TOKENS // 2):
            return 0
        states = sc.state(saved)
        if states is None:
            return 0
        target, drafter = states
        if not self.backend.load_seq_state(target) or (  # llama.cpp refused it: the history is prefilled
                self.drafter is not None and not self.drafter.load_seq_state(drafter)):
            self.backend.seq_rm(0)
            dec.adopt_cache([])
            if self.drafter is not None:
                self.drafter.truncate(0)
            sc.discard(saved)
            return 0
        dec.adopt_cache(saved.tokens)
        self._on_disk = (conversation_id, saved.tokens)
        return given

    def save_context(self) -> bool:
        """Save the context of the conversation the cache holds, where contexts are kept (not one
        deleted meanwhile, nor one already saved as it is): done on leaving it and at `close`.
        A disk that refuses costs a later prefill, nothing else. Returns whether a file was written."""
        from ..store.saved_context import MIN_TOKENS

        sc, cid = self.saved_contexts, self._held
        self._held = None
        tokens = self.decoder.kv_tokens
        if sc is None or cid is None or len(tokens) < MIN_TOKENS or self._on_disk == (cid, tokens):
            return False
        if not sc.takes(self.backend.seq_state_size(0)):
            return False
        try:
            if self.store.get_conversation(cid) is None:  # deleted: its saved contexts went with it
                return False
        except StoreError:
            return False
        drafter_state = b""
        if self.drafter is not None:  # its features of the same positions, or no file
            self.decoder.sources.drafter.flush()
            if self.drafter.n_positions() != len(tokens):
                return False
            drafter_state = self.drafter.seq_state()
        if not sc.save(cid, tokens, self.backend.seq_state(0), drafter_state):
            return False
        self._on_disk = (cid, list(tokens))
        return True

    def _checkpoint(self) -> None:
        """The learned state so far, mid-reply (every CHECKPOINT_S), without a request summary;
        a store that refuses is left to the reply's end."""
        try:
            self._save_learned(None)
        except StoreError:
            pass

    def _save(self, result: ReplyResult) -> None:
        summary = {"arm": result.arm, "conversation": result.conversation, "turn": result.turn,
                   "n_tokens": result.n_tokens, "decode_s": result.decode_s, "rounds": result.rounds,
                   "widths": {str(k): v for k, v in sorted(result.widths.items())},
                   "measure_rounds": result.measure_rounds, "tokens_per_s": result.tokens_per_s,
                   "temperature": result.sampling.get("temperature", 0.0), "created": time.time()}
        self._save_learned(summary)

    def _save_learned(self, summary: dict | None) -> None:
        """The learned state so far, with a request's summary (None: none), where there is a store."""
        if self.store is not None and self.store_key is not None:
            self.store.save_learned(self.store_key, self.decoder.state_dict(), summary, self._key_meta)

    def price_table(self, context: int) -> dict[int, float]:
        return self.decoder.learners.scheduler.price_table(context)

    def plain_rate(self, context: int) -> float | None:
        """The plain-decode rate the cost model prices at ``context`` (the panel's "plain" and
        its speedup's base); None where no plain step has run near this context: there its price
        is a clamped guess (`VerifyCostModel.measured_near`), and the panel read 0.55x while the
        reply ran twice as fast as plain decode.

        The plain step's own price (its class's), not the offered price of width 1: where a
        wider class is priced lower (two rows cost less than one, as on an Intel Xeon with
        Qwen2.5-Coder-0.5B's Q4_K, or one lucky early measurement), the offer takes that price
        (Proposition 2), but a plain step still runs one row at its own cost, and the panel said
        "plain 105.5" tok/s and a speedup of 0.48x where plain decode ran at about 55."""
        scheduler = self.decoder.learners.scheduler
        if not scheduler.plain_measured_near(context):
            return None
        t = scheduler.plain_price(context)
        return 1.0 / t if t else None

    def cold_start_progress(self) -> tuple[int, int]:
        return self.decoder.learners.scheduler.cold_start_progress()

    def reset_conversation(self) -> None:
        """Forget the cached conversation (the next reply prefills from scratch)."""
        self._held = None
        self._ahead = None
        self.decoder.end_reply(0)
        self.backend.clear_kv()

    def close(self) -> None:
        """Save the held conversation's context (where they are kept), then free the model."""
        if getattr(self, "backend", None) is not None and self.backend.ctx:
            try:
                self.save_context()
            except Exception:  # a cache: never a reason for close to fail
                pass
        if self.drafter is not None:
            self.drafter.close()
            self.drafter = None
        self.backend.close()

    def __enter__(self) -> "ChatEngine":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["ChatEngine", "ModelLoadError"]


def _reading(total: int, on_progress: Callable[[int, int], None] | None,
             stop: Callable[[], bool] | None) -> Callable[[int], bool]:
    """A prefill's between(done) (`LlamaBackend.prefill`) for reading `total` tokens: on_progress(done,
    total) now with 0 where there is anything to read, then after each chunk; True where stop()
    says the reading stops there."""
    if on_progress is not None and total:
        on_progress(0, total)

    def between(done: int) -> bool:
        if on_progress is not None:
            on_progress(done, total)
        return stop is not None and stop()

    return between


def _is_bundled(path: str) -> bool:
    """Whether `path` is the bundled model's file."""
    try:
        return os.path.realpath(path) == os.path.realpath(default_model_path())
    except ModelLoadError:  # no bundled model installed: nothing is it
        return False
