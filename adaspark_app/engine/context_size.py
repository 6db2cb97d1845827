"""The chat's default context size: the model's training context, capped by free memory.

Read in the UI process before the engine starts, from the GGUF's header only (no llama.cpp):

    n_ctx = min(<arch>.context_length,                       # what the model was trained for
                (MEMORY_SHARE * MemAvailable) // KV bytes per token,
                MAX_CHAT_N_CTX)                              # a sane maximum for a chat

KV bytes per token = sum over layers of head_count_kv * (key_length * K bytes + value_length *
V bytes), with the cache types LlamaBackend creates (K in BF16, V in F16: 2 bytes each). One
unified KV cache holds every sequence of the verify tree, so this is the whole cache; a DSpark
drafter adds its own KV (F32, as long as the target's context) per token. A value
below 256 is kept as is; above, it is rounded down to a multiple of 256 (llama.cpp rounds a
context up to one, and the memory cap must still hold after that).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .limits import MIN_N_CTX, check_n_ctx

#: The share of MemAvailable the KV cache may take: the weights, llama.cpp's compute buffers,
#: the UI and everything else the user runs need the rest.
MEMORY_SHARE = 0.5
#: Past this a chat gains little (SmolLM2 trains at 8k) while every cached token costs attention
#: time and memory; pass --n-ctx for more.
MAX_CHAT_N_CTX = 32768
#: When the GGUF does not say its training context.
FALLBACK_N_CTX = 4096
#: Bytes per element of the ggml types a KV cache may use (F32, F16, Q8_0, BF16).
GGML_TYPE_BYTES = {0: 4.0, 1: 2.0, 8: 34 / 32, 30: 2.0}
MEMINFO = "/proc/meminfo"
#: The ggml type of the DSpark drafter's K and V cache (dspark.py: GGML_TYPE_F32, exact features).
DRAFTER_KV_TYPE = 0


@dataclass(frozen=True)
class ContextChoice:
    """The context the chat opens with, and why (shown in `adaspark chat --help`'s terms)."""

    n_ctx: int
    trained: int | None  # <arch>.context_length, if the GGUF has it
    memory_cap: int | None  # tokens whose KV cache fits MEMORY_SHARE of MemAvailable, if known
    kv_bytes_per_token: float | None
    reason: str  # "training context", "free memory", "the chat maximum" or "fallback"


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    return None


def kv_bytes_per_token(kv: dict[str, Any], k_type: int | None = None, v_type: int | None = None) -> float | None:
    """Bytes of KV cache one token takes, from a GGUF's metadata (None if the keys are missing).

    head_count_kv may be one number or one per layer (a list); key/value lengths default to
    embedding_length / head_count, as llama.cpp's loader does."""
    if k_type is None or v_type is None:
        from .backend import KV_TYPE_K, KV_TYPE_V  # the types the engine's context is created with

        k_type, v_type = KV_TYPE_K if k_type is None else k_type, KV_TYPE_V if v_type is None else v_type
    arch = kv.get("general.architecture")
    if not isinstance(arch, str):
        return None
    layers = _int(kv.get(f"{arch}.block_count"))
    heads = kv.get(f"{arch}.attention.head_count")
    heads_kv = kv.get(f"{arch}.attention.head_count_kv", heads)
    embd = _int(kv.get(f"{arch}.embedding_length"))
    if layers is None or layers <= 0:
        return None
    per_layer_heads = heads_kv if isinstance(heads_kv, list) else [heads_kv] * layers
    per_layer_heads = [_int(h) for h in per_layer_heads[:layers]]
    if not per_layer_heads or any(h is None or h < 0 for h in per_layer_heads):
        return None
    first_heads = heads[0] if isinstance(heads, list) and heads else heads
    default_dim = embd // first_heads if embd and _int(first_heads) else None
    k_len = _int(kv.get(f"{arch}.attention.key_length")) or default_dim
    v_len = _int(kv.get(f"{arch}.attention.value_length")) or default_dim
    if not k_len or not v_len:
        return None
    kb, vb = GGML_TYPE_BYTES.get(k_type, 2.0), GGML_TYPE_BYTES.get(v_type, 2.0)
    return float(sum(h * (k_len * kb + v_len * vb) for h in per_layer_heads))


def mem_available(path: str = MEMINFO) -> int | None:
    """MemAvailable in bytes from /proc/meminfo (None where there is none)."""
    try:
        text = Path(path).read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("MemAvailable:"):
            parts = line.split()
            try:
                return int(parts[1]) * (1024 if len(parts) > 2 and parts[2].lower() == "kb" else 1)
            except (IndexError, ValueError):
                return None
    return None


def choose_n_ctx(kv: dict[str, Any], available: int | None, maximum: int = MAX_CHAT_N_CTX,
                 extra_bytes_per_token: float = 0.0) -> ContextChoice:
    """The context for a model with GGUF metadata `kv` when `available` bytes are free.
    extra_bytes_per_token: other caches as long as the context (the DSpark drafter's KV)."""
    arch = kv.get("general.architecture")
    trained = _int(kv.get(f"{arch}.context_length")) if isinstance(arch, str) else None
    if trained is not None and trained < MIN_N_CTX:
        trained = None
    per_token = kv_bytes_per_token(kv)
    if per_token is not None:
        per_token += extra_bytes_per_token
    cap = int(available * MEMORY_SHARE // per_token) if available and per_token else None
    options = [(trained if trained is not None else FALLBACK_N_CTX,
                "training context" if trained is not None else "fallback"),
               (maximum, "the chat maximum")]
    if cap is not None:
        options.append((cap, "free memory"))
    n, reason = min(options, key=lambda o: o[0])
    if n >= 256:
        n -= n % 256
    n = max(MIN_N_CTX, n)
    return ContextChoice(check_n_ctx(n), trained, cap, per_token, reason)


def drafter_kv_bytes_per_token(drafter_path: str) -> float:
    """KV bytes a token takes in the DSpark drafter's own context (as long as the target's),
    with the cache types dspark.py creates it with (F32 K and V); 0 if the header lacks them."""
    from ..gguf_file import read_gguf_header

    header = read_gguf_header(drafter_path, skip_arrays=True)
    return kv_bytes_per_token(header.kv, k_type=DRAFTER_KV_TYPE, v_type=DRAFTER_KV_TYPE) or 0.0


def default_chat_n_ctx(model_path: str, drafter_path: str | None = None) -> ContextChoice:
    """The chat's context for the GGUF at `model_path` (its header read; GGUFError if
    unreadable), the drafter's KV (`drafter_path`: a GGUF, or "default") counted in the cap."""
    from ..gguf_file import read_gguf_header

    header = read_gguf_header(model_path, skip_arrays=True)
    extra = 0.0
    if drafter_path:
        if drafter_path == "default":
            from .default_drafter import default_drafter_path

            drafter_path = default_drafter_path()
        extra = drafter_kv_bytes_per_token(drafter_path)
    return choose_n_ctx(header.kv, mem_available(), extra_bytes_per_token=extra)
