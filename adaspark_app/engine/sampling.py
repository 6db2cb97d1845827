"""Sampling without loss: the settings, the target's processed distribution, and the seeded draw.

The processed distribution follows llama.cpp's default sampler chain (common/sampling.cpp,
`common_params_sampling::samplers`) for the samplers AdaSpark exposes, in its order:

    penalties (repeat) -> top-k -> top-p -> min-p -> temperature -> dist

(typical-p, DRY, XTC and top-n-sigma are off in llama.cpp's defaults and are not offered). As in
llama.cpp, top-p and min-p read the untempered probabilities, and temperature scales only what
they kept. Temperature 0 is greedy decoding: the engine takes its argmax code path and never
computes a distribution.

The draw is a pure function of (seed, position of the token in the context, the processed
distribution): u = hash(seed, position) in [0, 1), then the inverse CDF over the kept tokens in a
canonical order (probability descending, then token id). A speculative round that draws at each
node of its accepted path therefore emits exactly the tokens plain decode (`ar`) draws with the
same seed, since the target's rows are bit-identical (backend.py, "KV cache types").
"""

from __future__ import annotations

import math
import secrets
from dataclasses import asdict, dataclass
from typing import Any, Sequence

import numpy as np

from ..errors import ArgumentError
from ..learn.constants import TEMPERATURE_BAND_EDGES

# llama.cpp's defaults (common/common.h, struct common_params_sampling)
LLAMA_TEMPERATURE = 0.8
LLAMA_TOP_K = 40
LLAMA_TOP_P = 0.95
LLAMA_MIN_P = 0.05
LLAMA_REPEAT_PENALTY = 1.0
LLAMA_REPEAT_LAST_N = 64

SEED_MASK = (1 << 64) - 1

# Temperature bands of the learned state (acceptance model, gains, long-run rate; edges in
# learn/constants.py): one band per regime keeps pricing calibrated without a temperature feature
# in every learner. Band 0 is greedy.


def temperature_band(temperature: float) -> int:
    """The learned-state band of a temperature: 0 greedy, 1 (0, 0.5], 2 (0.5, 0.9], 3 above 0.9."""
    if temperature <= 0.0:
        return 0
    for b, hi in enumerate(TEMPERATURE_BAND_EDGES[1:], start=1):
        if temperature <= hi:
            return b
    return len(TEMPERATURE_BAND_EDGES)


def _number(name: str, value: Any, kind: type) -> float | int:
    """`value` as an int or float, or one ArgumentError line naming the option."""
    if isinstance(value, bool):
        raise ArgumentError(f"--{name} must be a number, got {value!r}")
    try:
        if kind is int:
            if isinstance(value, float):
                if not value.is_integer():
                    raise ValueError
                return int(value)
            return int(str(value).strip(), 10)
        out = float(value)
    except (TypeError, ValueError):
        what = "a whole number" if kind is int else "a number"
        raise ArgumentError(f"--{name} must be {what}, got {value!r}") from None
    if not math.isfinite(out):
        raise ArgumentError(f"--{name} must be a finite number, got {value!r}")
    return out


@dataclass(frozen=True)
class SamplingSettings:
    """One reply's sampling settings, validated at construction (`ArgumentError` on a bad value).

    temperature 0 is greedy (the other fields are then recorded but unused); top_k 0 is off;
    top_p 1 is off; min_p 0 is off; repeat_penalty 1 is off; repeat_last_n 0 is off.
    seed: any integer (used modulo 2**64); None asks `resolved()` for a random one.
    """

    temperature: float = 0.0
    top_k: int = LLAMA_TOP_K
    top_p: float = LLAMA_TOP_P
    min_p: float = LLAMA_MIN_P
    repeat_penalty: float = LLAMA_REPEAT_PENALTY
    repeat_last_n: int = LLAMA_REPEAT_LAST_N
    seed: int | None = None

    def __post_init__(self) -> None:
        # The one place values are checked: CLI, library callers and the worker all come here.
        t = _number("temperature", self.temperature, float)
        k = _number("top-k", self.top_k, int)
        p = _number("top-p", self.top_p, float)
        mp = _number("min-p", self.min_p, float)
        rp = _number("repeat-penalty", self.repeat_penalty, float)
        n = _number("repeat-last-n", self.repeat_last_n, int)
        if t < 0:
            raise ArgumentError(f"--temperature must be >= 0 (0 is greedy), got {self.temperature!r}")
        if k < 0:
            raise ArgumentError(f"--top-k must be >= 0 (0 is off), got {self.top_k!r}")
        if not 0 < p <= 1:
            raise ArgumentError(f"--top-p must be in (0, 1], got {self.top_p!r}")
        if not 0 <= mp <= 1:
            raise ArgumentError(f"--min-p must be in [0, 1], got {self.min_p!r}")
        if rp <= 0:
            raise ArgumentError(f"--repeat-penalty must be > 0 (1 is off), got {self.repeat_penalty!r}")
        if n < 0:
            raise ArgumentError(f"--repeat-last-n must be >= 0 (0 is off), got {self.repeat_last_n!r}")
        seed = None if self.seed is None else _number("seed", self.seed, int)
        for name, val in (("temperature", float(t)), ("top_k", int(k)), ("top_p", float(p)),
                          ("min_p", float(mp)), ("repeat_penalty", float(rp)), ("repeat_last_n", int(n)),
                          ("seed", seed)):
            object.__setattr__(self, name, val)

    @property
    def greedy(self) -> bool:
        """Temperature 0: the argmax path, no distribution computed."""
        return self.temperature == 0.0

    @property
    def band(self) -> int:
        """The temperature band whose learned state prices this reply's rounds."""
        return temperature_band(self.temperature)

    def resolved(self) -> "SamplingSettings":
        """These settings with a seed: the given one, else a fresh random one (then recorded)."""
        if self.seed is not None:
            return self
        return SamplingSettings(**{**asdict(self), "seed": secrets.randbits(63)})

    def to_json(self) -> dict[str, Any]:
        """The settings as OUT.jsonl and ROUNDS.jsonl record them."""
        return asdict(self)

    def label(self) -> str:
        """A short human label (the TUI's subtitle)."""
        if self.greedy:
            return "greedy"
        parts = [f"T {self.temperature:g}", f"top-k {self.top_k}", f"top-p {self.top_p:g}",
                 f"min-p {self.min_p:g}"]
        if self.repeat_penalty != 1.0 and self.repeat_last_n:
            parts.append(f"rep {self.repeat_penalty:g}/{self.repeat_last_n}")
        if self.seed is not None:
            parts.append(f"seed {self.seed}")
        return " · ".join(parts)


GREEDY = SamplingSettings()

# GGUF keys a model may carry its recommended settings in (llama.cpp src/llama-arch.cpp)
GGUF_SAMPLING_KEYS = {"general.sampling.temp": "temperature", "general.sampling.top_k": "top_k",
                      "general.sampling.top_p": "top_p", "general.sampling.min_p": "min_p",
                      "general.sampling.penalty_repeat": "repeat_penalty",
                      "general.sampling.penalty_last_n": "repeat_last_n"}


def chat_defaults(model_path: str | None) -> dict[str, Any]:
    """`chat`'s defaults: llama.cpp's (temperature 0.8, ...), overridden by the GGUF's own
    recommended settings (general.sampling.*) where the file carries them."""
    out: dict[str, Any] = {"temperature": LLAMA_TEMPERATURE}
    try:
        from ..gguf_file import read_gguf_header
        from .backend import default_model_path

        kv = read_gguf_header(model_path or default_model_path(), skip_arrays=True).kv
    except Exception:  # an unreadable model fails later with its own message; defaults stay
        return out
    for key, field_name in GGUF_SAMPLING_KEYS.items():
        if key in kv and isinstance(kv[key], (int, float)) and not isinstance(kv[key], bool):
            out[field_name] = kv[key]
    return out


def settings_from(values: dict[str, Any], defaults: dict[str, Any] | None = None) -> SamplingSettings:
    """SamplingSettings from option values (None = unset), unset ones from `defaults`, then llama.cpp's."""
    merged = dict(defaults or {})
    merged.update({k: v for k, v in values.items() if v is not None})
    return SamplingSettings(**merged)


# ---------------------------------------------------------------------- the seeded draw
def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & SEED_MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & SEED_MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & SEED_MASK
    return x ^ (x >> 31)


def uniform(seed: int, position: int) -> float:
    """u in [0, 1) for the token at `position` of the context: a hash of (seed, position)."""
    h = _splitmix64(_splitmix64(seed & SEED_MASK) ^ (position & SEED_MASK))
    return (h >> 11) * (1.0 / (1 << 53))


@dataclass
class Distribution:
    """A processed distribution: kept tokens in canonical order (probability desc, then id)."""

    tokens: np.ndarray  # int64
    probs: np.ndarray  # float64, sums to 1

    def draw(self, u: float) -> int:
        """The token at u on the inverse CDF (u in [0, 1))."""
        cdf = np.cumsum(self.probs)
        i = int(np.searchsorted(cdf, u * cdf[-1], side="right"))
        return int(self.tokens[min(i, len(self.tokens) - 1)])

    def as_dict(self) -> dict[int, float]:
        return {int(t): float(p) for t, p in zip(self.tokens, self.probs)}


def _top(logits: np.ndarray, ids: np.ndarray, m: int) -> np.ndarray:
    """Positions (into logits/ids) of the m largest logits, in canonical order (logit desc, id)."""
    if m < len(logits):
        part = np.argpartition(-logits, m - 1)[:m]
        # ties at the cut: argpartition keeps an arbitrary subset of equal logits; take them all
        cut = logits[part].min()
        part = np.flatnonzero(logits >= cut)
    else:
        part = np.arange(len(logits))
    return part[np.lexsort((ids[part], -logits[part]))]


# Gaps below the row's largest logit tried in turn for the top-k's candidates (_top_k_within). The
# bundled model's 40th largest logit lay 4-12 below its largest at T 0.8's defaults.
TOP_K_GAPS = (12.0, 24.0, 48.0)


def _top_k_within(logits: np.ndarray, k: int) -> np.ndarray | None:
    """Positions of the logits within a gap of the largest, for the first gap of TOP_K_GAPS that
    holds at least k of them, in id order; None where none does or the largest is not finite.

    At least k logits at or above a threshold put the k-th largest at or above it too, so these
    positions hold the top k and every logit tied with the k-th: selecting among them gives what
    selecting among the whole row gives, bit for bit. A compare over a 49,152-token row costs a
    few tens of microseconds, a partial selection over it about a millisecond (float64 here)."""
    mx = logits.max()
    if not np.isfinite(mx):
        return None
    for gap in TOP_K_GAPS:
        within = np.flatnonzero(logits >= mx - np.float32(gap))
        if len(within) >= k:
            return within
    return None


_acceptance: Any = None  # learn.acceptance, where the C pricing module in use is (_top_k_in_c)


def _top_k_in_c(logits: np.ndarray, k: int) -> np.ndarray | None:
    """The row's first k tokens in the canonical order, from the C module the round's pricing
    lives in (``native/pricing.c``, one pass and no temporaries, where the numpy way makes several
    and costs 0.4 ms a token with the caches cold after a forward); None where it is not in use
    (``ADASPARK_NUMPY_PRICING``, no build: the numpy way, the same tokens) or the row has a NaN."""
    global _acceptance
    if _acceptance is None:  # imported at the first draw: options.py reads this module for its checks alone
        from ..learn import acceptance as _acceptance
    C = _acceptance.PRICING
    if C is None:
        return None
    out = np.empty(k, dtype=np.int64)
    return out if C.top_k(np.ascontiguousarray(logits), k, out) else None


def processed_distribution(row: np.ndarray, s: SamplingSettings, history: Sequence[int] = ()) -> Distribution:
    """The target's processed distribution for one row of logits (llama.cpp's chain, see the module).

    history: the tokens of the row's own prefix (committed tokens, then the tree path above the
    row); the repeat penalty reads its last `repeat_last_n`. No full-vocabulary sort: top-k is one
    pass in C (`_top_k_in_c`), else a partial selection among the logits near the largest
    (`_top_k_within`); min-p and top-p then keep prefixes of its canonical order (min-p commutes
    with top-p: both keep a prefix of the same order and neither changes the max). Where top-k is
    off, min-p filters before the survivors are sorted.
    """
    logits = np.asarray(row, dtype=np.float32)
    if s.repeat_penalty != 1.0 and s.repeat_last_n > 0 and len(history):
        last = np.unique(np.asarray(history[-s.repeat_last_n:], dtype=np.int64))
        last = last[(last >= 0) & (last < len(logits))]
        logits = logits.copy()
        v = logits[last]
        logits[last] = np.where(v <= 0, v * np.float32(s.repeat_penalty), v / np.float32(s.repeat_penalty))
    ordered = 0 < s.top_k < len(logits)  # top-k in canonical order: z below sums in it, min-p and top-p
    top = _top_k_in_c(logits, s.top_k) if ordered else None  # keep prefixes of it
    if top is not None:
        logits, ids = logits[top].astype(np.float64), top
    else:
        within = _top_k_within(logits, s.top_k) if ordered else None
        if within is not None:  # the few logits that hold the top k: the rest is never read again
            ids = within
            logits = logits[within].astype(np.float64)
        else:
            logits = logits.astype(np.float64)
            ids = np.arange(len(logits), dtype=np.int64)
        if ordered:
            keep = _top(logits, ids, s.top_k)[:s.top_k]
            logits, ids = logits[keep], ids[keep]
    # probabilities at temperature 1 over what top-k kept: top-p and min-p read these
    mx = float(logits.max())
    w = np.exp(logits - mx)
    z = float(w.sum())
    if s.min_p > 0.0:
        keep = np.flatnonzero(logits >= mx + math.log(s.min_p))
        logits, ids, w = logits[keep], ids[keep], w[keep]
    if ordered:
        if s.top_p < 1.0:  # the shortest prefix whose mass reaches p (a cumulative sum's prefix is its own)
            hit = np.flatnonzero(np.cumsum(w) / z >= s.top_p)
            n = int(hit[0]) + 1 if hit.size else len(logits)
            logits, ids = logits[:n], ids[:n]
    else:
        if s.top_p < 1.0:
            m = min(len(logits), 256)
            while True:  # adaptive partial sort, as llama.cpp's top-p: widen until the mass reaches p
                order = _top(logits, ids, m)
                cum = np.cumsum(w[order]) / z
                hit = np.flatnonzero(cum >= s.top_p)
                if hit.size or len(order) == len(logits):
                    n = int(hit[0]) + 1 if hit.size else len(order)
                    order = order[:n]
                    break
                m = min(len(logits), m * 4)
        else:
            order = _top(logits, ids, len(logits))
        logits, ids = logits[order], ids[order]
    p = np.exp((logits - logits[0]) / s.temperature)
    return Distribution(ids, p / p.sum())


class Sampler:
    """A reply's seeded draws: settings with a seed, and the distribution + draw of one row."""

    def __init__(self, settings: SamplingSettings) -> None:
        if settings.greedy:
            raise ValueError("Sampler is for temperature > 0; greedy decoding takes the argmax path")
        self.settings = settings.resolved()
        self.seed = int(self.settings.seed)  # type: ignore[arg-type]

    def history(self, committed: Sequence[int], path: Sequence[int] = ()) -> list[int]:
        """The last repeat_last_n tokens of a row's prefix: committed tokens, then its tree path."""
        n = self.settings.repeat_last_n
        if n <= 0 or self.settings.repeat_penalty == 1.0:
            return []
        tail = list(committed[-n:]) + list(path)
        return tail[-n:]

    def draw(self, row: np.ndarray, position: int, history: Sequence[int]) -> int:
        """The token at context `position` drawn from the row's processed distribution."""
        return processed_distribution(row, self.settings, history).draw(uniform(self.seed, position))
