"""The learned state on disk: how each learner's state is read, and the one migration.

The learned state is ``{"scheduler": ..., "acceptance": ..., "precision": ...}``, with sampled
decoding's scheduler and acceptance model per temperature band under ``"by_temperature"``
(``engine.decoder.Decoder.state_dict``). Each learner's part carries its own ``"version"``, and
each learner's ``load_state`` is a strict validator: a wrong version, a missing or unknown field,
a wrong type, a non-finite number, a list of the wrong length or a value out of the range the
learner's computations need raises ``StateError``, whose message names the learner and the field
(``scheduler.cost.classes[2].law.scale: ...``). A load validates into locals and assigns only at
the end, so a failed load leaves the learner as it was (fresh, in the engine).

``migrate`` turns the previous layout, the one written by commit b9fbe7f and read by every
store in use before per-learner versions, into this one; ``validate`` is what the engine and
``adaspark store import`` call: migrate, then load every part into fresh learners.

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


def _show(v: Any) -> str:
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
        raise StateError(f"{where}: must be an object, got {_show(state)}")
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
            raise StateError(f"{where}.version: this AdaSpark reads version {version}, got {_show(v)}")
    return fields(state, where, ("version", *keys), optional)


def integer(v: Any, where: str, lo: int = 0, hi: int = MAX_INT) -> int:
    """An int (not a bool, not a float) in [lo, hi]."""
    if isinstance(v, bool) or not isinstance(v, int):
        raise StateError(f"{where}: must be an integer, got {_show(v)}")
    if not lo <= v <= hi:
        raise StateError(f"{where}: must be in [{lo}, {hi}], got {v}")
    return int(v)


def number(v: Any, where: str, lo: float = -MAX_ABS, hi: float = MAX_ABS, above: float | None = None) -> float:
    """A finite number in [lo, hi] (and > ``above`` when given); ints are accepted as floats."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise StateError(f"{where}: must be a number, got {_show(v)}")
    x = float(v) if abs(v) <= MAX_ABS else math.inf  # a huge int would overflow float()
    if not math.isfinite(x):
        raise StateError(f"{where}: must be a finite number, got {_show(v)}")
    if not lo <= x <= hi or (above is not None and not x > above):
        bound = f"> {above:g}" if above is not None and x <= above else f"in [{lo:g}, {hi:g}]"
        raise StateError(f"{where}: must be {bound}, got {x!r}")
    return x


def seconds(v: Any, where: str) -> float:
    """A measured time in seconds: divided by, so it must be a real, positive time."""
    return number(v, where, lo=MIN_SECONDS, hi=MAX_SECONDS)


def boolean(v: Any, where: str) -> bool:
    if not isinstance(v, bool):
        raise StateError(f"{where}: must be true or false, got {_show(v)}")
    return v


def text(v: Any, where: str, choices: Sequence[str]) -> str:
    if not isinstance(v, str) or v not in choices:
        raise StateError(f"{where}: must be one of {', '.join(choices)}, got {_show(v)}")
    return v


def sequence(v: Any, where: str, length: int | None = None) -> list:
    """A list (a tuple from an in-memory state_dict too), of ``length`` items when given."""
    if not isinstance(v, (list, tuple)):
        raise StateError(f"{where}: must be a list, got {_show(v)}")
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


# --- the whole learned state --------------------------------------------------------------------

PARTS = ("scheduler", "acceptance", "precision")
# Optional: sampled decoding's learners per temperature band, {"1": {"scheduler", "acceptance"}, ...}
# (engine.decoder.Decoder.state_dict); greedy's are the parts above.
BY_TEMPERATURE = "by_temperature"


def migrate(state: Any) -> Any:
    """The learned state in this version's layout: the previous layout is converted, the current
    one returned unchanged (a fresh copy either way); anything else is returned for ``validate``
    to refuse. Raises nothing but RecursionError (a structure nested past Python's limit).

    The previous layout is what commit b9fbe7f wrote and read (the scheduler's ``"version": 1``):
    no ``"version"`` in the cost, chooser, gains, rate or precision parts; each draft gate a list
    ``[adv, cost, rounds, skip_left, backoff]``, each drafter gate a list ``[sums, weights, counts,
    skip_left, probe_due, backoff, since_check, squares]``. b9fbe7f also read three older forms,
    converted here too: draft gate entries ``[band, state]`` from before probe classes (probe 0),
    no ``drafter_gates`` (none), and no ``precision`` part (a fresh one). The acceptance part's
    layout is unchanged (its ``"version": 1``); its ``counters`` and ``request``, which b9fbe7f
    read as optional, are filled with the fresh values when missing.
    """
    import copy

    if not isinstance(state, dict):
        return state
    out = copy.deepcopy(state)
    sched = out.get("scheduler")
    if not (isinstance(sched, dict) and type(sched.get("version")) is int and sched["version"] == 1):
        return out  # not the previous layout
    out["scheduler"] = _migrate_scheduler(sched)
    if "precision" not in out:
        from .precision import SourcePrecision

        out["precision"] = SourcePrecision().state_dict()
    elif isinstance(out["precision"], dict) and "version" not in out["precision"]:
        out["precision"] = {"version": 1, **out["precision"]}
    acc = out.get("acceptance")
    if isinstance(acc, dict) and type(acc.get("version")) is int and acc["version"] == 1:
        from .acceptance import AcceptanceModel

        fresh = AcceptanceModel().state_dict()
        for k in ("counters", "request"):
            acc.setdefault(k, fresh[k])
    return out


def _migrate_scheduler(s: dict) -> dict:
    """b9fbe7f's scheduler part (version 1) in the layout of scheduler version 2, gates version 2
    and cost, chooser, gains and rate version 1. A later layout adds its own step after this."""
    from .gates import PROBE_NONE

    s = dict(s, version=2)
    for part in ("cost", "chooser", "gains", "rate"):
        if isinstance(s.get(part), dict) and "version" not in s[part]:
            s[part] = {"version": 1, **s[part]}
    cost = s.get("cost")
    if isinstance(cost, dict) and isinstance(cost.get("classes"), list):
        for c in cost["classes"]:
            if isinstance(c, dict) and isinstance(c.get("law"), dict):
                c["law"].setdefault("dirty", False)
    gates = s.get("gates")
    if isinstance(gates, list):
        s["gates"] = [[e[0], PROBE_NONE, e[1]] if isinstance(e, list) and len(e) == 2 else e for e in gates]
        for e in s["gates"]:
            if isinstance(e, list) and len(e) == 3 and isinstance(e[2], list) and len(e[2]) == 5:
                e[2] = dict(zip(("adv", "cost", "rounds", "skip_left", "backoff"), e[2]), version=2)
    s.setdefault("drafter_gates", [])
    if isinstance(s["drafter_gates"], list):
        for e in s["drafter_gates"]:
            if isinstance(e, list) and len(e) == 3 and isinstance(e[2], list) and len(e[2]) == 8:
                e[2] = dict(zip(("sums", "weights", "counts", "skip_left", "probe_due", "backoff",
                                 "since_check", "squares"), e[2]), version=2)
    return s


def validate(state: Any) -> dict:
    """The learned state, migrated to this layout, after loading every part into fresh learners;
    StateError (naming the learner and field) if it does not load. The engine and
    ``store import`` both call this, so what import accepts is what the engine can load."""
    from .acceptance import AcceptanceModel
    from .precision import SourcePrecision
    from .scheduler import WidthScheduler

    try:
        migrated = migrate(state)
    except RecursionError:  # a state nested deeper than any learner's
        raise StateError("learned state: nested too deeply") from None
    if not isinstance(migrated, dict):
        raise StateError(f"learned state: must be an object, got {_show(migrated)}")
    # the parts first: a foreign layout is best named by its version
    for part, learner in zip(PARTS, (WidthScheduler, AcceptanceModel, SourcePrecision)):
        if part in migrated:
            learner().load_state(migrated[part])
    fields(migrated, "learned state", PARTS, optional=(BY_TEMPERATURE,))
    bands = migrated.get(BY_TEMPERATURE, {})
    if not isinstance(bands, dict):
        raise StateError(f"{BY_TEMPERATURE}: must be an object, got {_show(bands)}")
    for band, sub in bands.items():
        where = f"{BY_TEMPERATURE}.{band}"
        if not (isinstance(band, str) and band.isdigit() and str(int(band)) == band and 1 <= int(band) <= 64):
            raise StateError(f"{where}: not a temperature band (a positive integer)")
        fields(sub, where, ("scheduler", "acceptance"))
        WidthScheduler().load_state(sub["scheduler"], f"{where}.scheduler")
        AcceptanceModel().load_state(sub["acceptance"], f"{where}.acceptance")
    return migrated
