"""What llama.cpp and the verify tree need of the numeric options, checked before llama.cpp sees them.

One place for the CLI (cli.py checks the parsed options with these before anything loads) and
for library users (LlamaBackend checks its arguments first), so a bad value is an ArgumentError
with one line, never a native abort.
Widths (`pinned:N`, `chain:K`) are checked by engine/arms.py against learn/constants.MAX_WIDTH.
"""

from __future__ import annotations

import os

from ..errors import ArgumentError
from ..learn.constants import MAX_WIDTH

# One KV sequence per leaf of the widest tree: a verify of MAX_WIDTH rows can have that many leaves.
N_SEQ_MAX = MAX_WIDTH
# llama.cpp caps n_batch at n_ctx and reserves at least n_seq_max output rows per batch, so a
# context below N_SEQ_MAX aborts in GGML_ASSERT(n_outputs_max <= cparams.n_outputs_max)
# (llama-cpp-python 0.3.36: --n-ctx 63 aborts, 64 works). llama.cpp rounds n_ctx up to 256.
MIN_N_CTX = N_SEQ_MAX
# Far above any GGUF's training context; keeps llama.cpp's 32-bit context sizes from wrapping.
MAX_N_CTX = 1 << 24
# A batch must hold the widest verify (N_SEQ_MAX rows), for the same assertion as MIN_N_CTX.
MIN_N_BATCH = N_SEQ_MAX
# GGML_MAX_N_THREADS (ggml.h): ggml's per-thread tables hold this many.
MAX_THREADS = 512
# A reply cannot be longer than the largest context.
MAX_TOKENS = MAX_N_CTX
# The default thread count's ceiling: a decode step of the models people chat with stops gaining
# from more threads before this.
DEFAULT_THREADS_MAX = 8


def _whole(name: str, value: object) -> int:
    """An int, or a string of one (the CLI's text); anything else (a float, a bool) is refused."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass
    raise ArgumentError(f"{name} must be a whole number, got {value!r}")


def _within(name: str, value: object, lo: int, hi: int, why: str = "") -> int:
    v = _whole(name, value)
    if not lo <= v <= hi:
        raise ArgumentError(f"{name} must be from {lo} to {hi}{why}, got {v}")
    return v


def check_n_ctx(value: object) -> int:
    """The context size in tokens: MIN_N_CTX..MAX_N_CTX (llama.cpp needs room for the widest verify)."""
    return _within("--n-ctx", value, MIN_N_CTX, MAX_N_CTX,
                   f" (llama.cpp needs at least {N_SEQ_MAX} for a {N_SEQ_MAX}-row verify)")


def default_threads() -> int:
    """llama.cpp's threads when none are given: the cores this process may run on (its CPU
    affinity, which `taskset` and container cpusets narrow), at most DEFAULT_THREADS_MAX."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cores = os.cpu_count() or 1
    return max(1, min(cores, DEFAULT_THREADS_MAX))


def check_threads(value: object | None) -> int | None:
    """Threads for llama.cpp: None (the default) or 1..MAX_THREADS."""
    if value is None:
        return None
    return _within("--threads", value, 1, MAX_THREADS)


def check_max_tokens(value: object) -> int:
    """Tokens a reply may emit: 1..MAX_TOKENS."""
    return _within("--max-tokens", value, 1, MAX_TOKENS)


def check_n_batch(value: object) -> int:
    """Rows per llama.cpp batch: at least MIN_N_BATCH (the widest verify is one batch)."""
    return _within("n_batch", value, MIN_N_BATCH, MAX_N_CTX)
