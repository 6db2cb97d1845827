"""How each learner's stored state is read: strict field readers that name what is wrong.

Each learner's part of the learned state carries its own ``"version"``, and each learner's
``load_state`` is a strict validator: a wrong version, a missing or unknown field, a wrong type, a
non-finite number, a list of the wrong length or a value out of the range the learner's
computations need raises ``StateError``, whose message names the learner and the field
(``scheduler.cost.classes[2].law.scale: ...``). A load validates into locals and assigns only at
the end, so a failed load leaves the learner as it was (fresh, in the engine). The whole learned
state, its layout per temperature band and its one migration are ``learned_state.py``.

The helpers below read one field each; ``where`` is the field's path, used in messages.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

# Bounds no real state comes near (a verify takes milliseconds, counts grow by one per token or
# round): beyond them products and float conversions overflow, so a value past them is corrupt.
MAX_ABS = 1e15
MAX_INT = 2**53  # exactly representable as a float; numpy's int64 holds it
MIN_SECONDS = 1e-12  # below any timer's resolution: a measured time this small is corrupt (and divides)
MAX_SECONDS = 1e6


class StateError(ValueError):
    """A learned state that does not load: wrong version, missing, malformed or out-of-range field."""


def describe(v: Any) -> str:
    """A short description of a bad value for an error message (one line)."""
    if isinstance(v, dict):
        return "an object"
    if isinstance(v, (list, tuple)):
        return f"a list of {len(v)}"
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def fields(state: Any, where: str, required: Sequence[str], optional: Sequence[str] = ()) -> dict:
    """``state`` as a dict holding every ``required`` key and no key outside ``required`` and
    ``optional`` (an unknown key means another layout, which must not load half-understood)."""
    if not isinstance(state, dict):
        raise StateError(f"{where}: must be an object, got {describe(state)}")
    for k in required:
        if k not in state:
            raise StateError(f"{where}.{k}: missing")
    extra = sorted(str(k) for k in state if k not in required and k not in optional)
    if extra:
        raise StateError(f"{where}: unknown field {extra[0]!r}")
    return state


def versioned(state: Any, where: str, version: int, keys: Sequence[str], optional: Sequence[str] = ()) -> dict:
    """``fields`` of a learner's state whose ``"version"`` must be ``version``."""
    if isinstance(state, dict) and "version" in state:
        v = state["version"]
        if isinstance(v, bool) or not isinstance(v, int) or v != version:
            raise StateError(f"{where}.version: this AdaSpark reads version {version}, got {describe(v)}")
    return fields(state, where, ("version", *keys), optional)


def integer(v: Any, where: str, lo: int = 0, hi: int = MAX_INT) -> int:
    """An int (not a bool, not a float) in [lo, hi]."""
    if isinstance(v, bool) or not isinstance(v, int):
        raise StateError(f"{where}: must be an integer, got {describe(v)}")
    if not lo <= v <= hi:
        raise StateError(f"{where}: must be in [{lo}, {hi}], got {v}")
    return int(v)


def number(v: Any, where: str, lo: float = -MAX_ABS, hi: float = MAX_ABS, above: float | None = None) -> float:
    """A finite number in [lo, hi] (and > ``above`` when given); ints are accepted as floats."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise StateError(f"{where}: must be a number, got {describe(v)}")
    x = float(v) if abs(v) <= MAX_ABS else math.inf  # a huge int would overflow float()
    if not math.isfinite(x):
        raise StateError(f"{where}: must be a finite number, got {describe(v)}")
    if not lo <= x <= hi or (above is not None and not x > above):
        bound = f"> {above:g}" if above is not None and x <= above else f"in [{lo:g}, {hi:g}]"
        raise StateError(f"{where}: must be {bound}, got {x!r}")
    return x


def seconds(v: Any, where: str) -> float:
    """A measured time in seconds: divided by, so it must be a real, positive time."""
    return number(v, where, lo=MIN_SECONDS, hi=MAX_SECONDS)


def boolean(v: Any, where: str) -> bool:
    if not isinstance(v, bool):
        raise StateError(f"{where}: must be true or false, got {describe(v)}")
    return v


def text(v: Any, where: str, choices: Sequence[str]) -> str:
    if not isinstance(v, str) or v not in choices:
        raise StateError(f"{where}: must be one of {', '.join(choices)}, got {describe(v)}")
    return v


def sequence(v: Any, where: str, length: int | None = None) -> list:
    """A list (a tuple from an in-memory state_dict too), of ``length`` items when given."""
    if not isinstance(v, (list, tuple)):
        raise StateError(f"{where}: must be a list, got {describe(v)}")
    if length is not None and len(v) != length:
        raise StateError(f"{where}: must hold {length} items, got {len(v)}")
    return list(v)


def numbers(v: Any, where: str, length: int | None = None, **bounds: float) -> list[float]:
    """A list of ``number``s (same bounds for each)."""
    return [number(x, f"{where}[{i}]", **bounds) for i, x in enumerate(sequence(v, where, length))]


def integers(v: Any, where: str, length: int | None = None, **bounds: int) -> list[int]:
    return [integer(x, f"{where}[{i}]", **bounds) for i, x in enumerate(sequence(v, where, length))]


def optional(read: Callable[..., Any], v: Any, where: str, **kw: Any) -> Any:
    """None, or ``read(v, where, **kw)``."""
    return None if v is None else read(v, where, **kw)


def unique(keys: list, where: str) -> None:
    """Entries keyed by ``keys`` (widths, bands) must not repeat: a later one would silently win."""
    seen = set()
    for i, k in enumerate(keys):
        if k in seen:
            raise StateError(f"{where}[{i}]: repeats the key {k!r}")
        seen.add(k)
