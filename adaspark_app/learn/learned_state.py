"""Everything the `adaspark` arm learns, as one object, and its layout on disk.

Acceptance, gains, gates and the long-run rate differ between greedy and sampled decoding, so
each temperature band (``engine.sampling.temperature_band``: 0 greedy, then by temperature) has
its own ``WidthScheduler`` and ``AcceptanceModel``. The verify-cost model is one, shared by every
band's scheduler (a forward costs the same whatever is drawn from it, and cold-start
measurements need not be repeated), and so is the n-gram source's precision (it reads the
committed text, not the draws). ``Learners`` holds them and switches band per reply.

The layout: greedy's learners at the top level, ``{"scheduler", "acceptance", "precision"}`` (as
before sampling existed), each sampled band's under ``"by_temperature"`` -> str(band) ->
``{"scheduler", "acceptance"}``. ``migrate`` turns the previous layout, the one written by commit
b9fbe7f and read by every store in use before per-learner versions, into this one; ``validate``
is what the engine and ``adaspark store import`` call: migrate, then load every part into fresh
learners, so what import accepts is what the engine can load.
"""

from __future__ import annotations

import copy
from typing import Any

from .acceptance import AcceptanceModel
from .cost import VerifyCostModel
from .gates import PROBE_NONE
from .precision import SourcePrecision
from .scheduler import WidthScheduler
from .state import StateError, describe, fields

GREEDY_BAND = 0  # the band whose learners sit at the top level of the layout


class Learners:
    """The learners of every temperature band, the shared cost model and precision; pure state."""

    def __init__(self) -> None:
        self.precision = SourcePrecision()
        self._bands: dict[int, tuple[WidthScheduler, AcceptanceModel]] = {
            GREEDY_BAND: (WidthScheduler(), AcceptanceModel())}
        self.band = GREEDY_BAND
        self.scheduler, self.acceptance = self._bands[GREEDY_BAND]

    @property
    def cost(self) -> VerifyCostModel:
        """The one verify-cost model every band's scheduler prices with."""
        return self._bands[GREEDY_BAND][0].cost

    def use_band(self, band: int) -> None:
        """Price and learn the next replies with `band`'s scheduler and acceptance model (created
        empty on first use, sharing the cost model)."""
        self.band = band
        self.scheduler, self.acceptance = self._learners_of(band)

    def _learners_of(self, band: int) -> tuple[WidthScheduler, AcceptanceModel]:
        if band not in self._bands:
            sc = WidthScheduler()
            sc.cost = self.cost
            self._bands[band] = (sc, AcceptanceModel())
        return self._bands[band]

    def state_dict(self) -> dict:
        """The layout above: greedy's learners at the top level, sampled bands under by_temperature."""
        sched0, acc0 = self._bands[GREEDY_BAND]
        out = {"scheduler": sched0.state_dict(), "acceptance": acc0.state_dict(),
               "precision": self.precision.state_dict()}
        extra = {str(b): {"scheduler": sc.state_dict(), "acceptance": ac.state_dict()}
                 for b, (sc, ac) in sorted(self._bands.items()) if b != GREEDY_BAND}
        if extra:
            out[BY_TEMPERATURE] = extra
        return out

    def load_state(self, state: dict) -> None:
        """Restore a state that passed ``validate`` (so no part fails to load)."""
        sched0, acc0 = self._bands[GREEDY_BAND]
        if state.get("scheduler"):
            sched0.load_state(state["scheduler"])
        if state.get("acceptance"):
            acc0.load_state(state["acceptance"])
        if state.get("precision"):
            self.precision.load_state(state["precision"])
        for key, sub in (state.get(BY_TEMPERATURE) or {}).items():
            sc, ac = self._learners_of(int(key))
            if sub.get("scheduler"):
                sc.load_state(sub["scheduler"])
            if sub.get("acceptance"):
                ac.load_state(sub["acceptance"])
        for sc, _ in self._bands.values():
            sc.cost = sched0.cost  # one verify-cost model (load_state replaces the object)


PARTS = ("scheduler", "acceptance", "precision")
# Optional: sampled decoding's learners per temperature band, {"1": {"scheduler", "acceptance"}, ...}
# (Learners.state_dict); greedy's are the parts above.
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
    if not isinstance(state, dict):
        return state
    out = copy.deepcopy(state)
    sched = out.get("scheduler")
    if not (isinstance(sched, dict) and type(sched.get("version")) is int and sched["version"] == 1):
        return out  # not the previous layout
    out["scheduler"] = _migrate_scheduler(sched)
    if "precision" not in out:
        out["precision"] = SourcePrecision().state_dict()
    elif isinstance(out["precision"], dict) and "version" not in out["precision"]:
        out["precision"] = {"version": 1, **out["precision"]}
    acc = out.get("acceptance")
    if isinstance(acc, dict) and type(acc.get("version")) is int and acc["version"] == 1:
        fresh = AcceptanceModel().state_dict()
        for k in ("counters", "request"):
            acc.setdefault(k, fresh[k])
    return out


def _migrate_scheduler(s: dict) -> dict:
    """b9fbe7f's scheduler part (version 1) in the layout of scheduler version 2, gates version 2
    and cost, chooser, gains and rate version 1. A later layout adds its own step after this."""
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
    try:
        migrated = migrate(state)
    except RecursionError:  # a state nested deeper than any learner's
        raise StateError("learned state: nested too deeply") from None
    if not isinstance(migrated, dict):
        raise StateError(f"learned state: must be an object, got {describe(migrated)}")
    # the parts first: a foreign layout is best named by its version
    for part, learner in zip(PARTS, (WidthScheduler, AcceptanceModel, SourcePrecision)):
        if part in migrated:
            learner().load_state(migrated[part])
    fields(migrated, "learned state", PARTS, optional=(BY_TEMPERATURE,))
    bands = migrated.get(BY_TEMPERATURE, {})
    if not isinstance(bands, dict):
        raise StateError(f"{BY_TEMPERATURE}: must be an object, got {describe(bands)}")
    for band, sub in bands.items():
        where = f"{BY_TEMPERATURE}.{band}"
        if not (isinstance(band, str) and band.isdigit() and str(int(band)) == band and 1 <= int(band) <= 64):
            raise StateError(f"{where}: not a temperature band (a positive integer)")
        fields(sub, where, ("scheduler", "acceptance"))
        WidthScheduler().load_state(sub["scheduler"], f"{where}.scheduler")
        AcceptanceModel().load_state(sub["acceptance"], f"{where}.acceptance")
    return migrated
