"""The facade the engine calls each round (Algorithm 1, lines 7-10 and 15-16).

``WidthScheduler`` joins the verify-cost model (§3.2), the gains and long-run rate (§3.4) and the
width chooser (Eq. 7), and adds the draft gate: width 1 (a plain one-token step) is an offered
width, and when the plain step is expected to win the round should not pay for drafting at all.

Draft gate. By Proposition 5 a round is worth drafting when E[A - rho C | draft] exceeds
E[A - rho C | plain]. With D sunk, the chooser's pick n* is worth V(n*) - V(1) tokens over a
plain step (its advantage); drafting costs rho D. Per context band the gate keeps decayed sums
of the advantage and of rho D over drafted rounds and, while the advantage does not pay for D,
skips drafting for 2^j rounds, then probes with one drafted round (j grows by one with each
probe that did not pay for its own D, up to GATE_MAX_BACKOFF, and shrinks by one with each probe
that did; it resets once the sums say drafting pays, e.g. when probes meet a copy-heavy passage).
A skip is also at most 2^GATE_MAX_BACKOFF x (1 - advantage / rho D) rounds: a probe costs rho D
less its advantage, so where drafting nearly pays, probes are nearly free and come often. Skipped rounds still teach
width 1's cost and the band rate.

Drafter gate. With a DSpark drafter, a round that drafts may still leave the drafter out and
verify the n-gram chains alone (or, with no n-gram proposal, run a plain step): the drafter's
forward costs about as much as target steps on a CPU, and whether its candidates pay for it is a
fact of the drafter, the text and the machine. Per context band and probe class the
`DrafterGate` keeps decayed means of the realized round value, tokens - rho x seconds, of rounds
with and without the drafter; unless the drafter's mean clears the other by a standard error
(it costs time in every round, so it must show it pays beyond noise) it is left out for 2^j rounds
and then tried once (j grows by one with each losing probe and halves with each probe that beat
the rounds without it), and while it wins every DRAFTER_RECHECK-th
round runs without it so both means stay current. Realized values, not the acceptance model's
prices, decide, so a miscalibrated drafter cannot talk its way into rounds.

Gates are kept per context band and per *probe*: what the n-gram index proposes at the anchor
before anything is drafted (nothing, a follower, or a copy by the length of its matched context;
`probe_class`; a copy whose last tokens earlier passages continued differently counts as a
short one). The probe costs a few dictionary lookups, and it separates the rounds where
drafting pays (the reply is copying an earlier passage) from those where it does not: one gate
for all rounds would learn the average and skip the copies with the rest.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .chooser import Scored, WidthChooser, s_at
from .constants import HOLD_ROUNDS_BEFORE_SPLIT, LADDER
from .cost import VerifyCostModel, context_band
from .gains import Gains
from .rate import LongRunRate

STATE_VERSION = 1
GATE_HALF_LIFE = 16.0  # drafted rounds: memory of the gate's advantage and D sums
GATE_MIN_ROUNDS = 4  # drafted rounds seen before the gate may skip drafting
GATE_MAX_BACKOFF = 7  # longest skip: 2^7 = 128 plain rounds between probes
COLD_ALWAYS_BELOW = 16  # ladder widths below this are measured unconditionally (cold start)
PENDING_STALL = 64  # rounds a width may wait for a tree wide enough before it stops forcing drafting
_GATE_DECAY = 0.5 ** (1.0 / GATE_HALF_LIFE)
DRAFTER_MIN_ROUNDS = 4  # rounds of each kind (with / without the drafter) before the gate compares them
DRAFTER_HALF_LIFE = 32.0  # rounds of each kind: memory of the drafter gate's means
DRAFTER_RECHECK = 16  # while the drafter wins, every 16th round runs without it
DRAFTER_MAX_BACKOFF = 8  # longest stretch without the drafter between its probes: 2^8 rounds
DRAFTER_SE_MARGIN = 1.0  # standard errors the drafter's mean must clear (DrafterGate.drafter_wins)
_DRAFTER_DECAY = 0.5 ** (1.0 / DRAFTER_HALF_LIFE)
# Probe classes: 0 no proposal, 1 a follower, 2.. a copy by matched-context bin (4-7, 8-15, 16-31, 32+).
PROBE_NONE, PROBE_FOLLOWER, PROBE_SHORT_COPY = 0, 1, 2  # PROBE_SHORT_COPY: a copy matched on 4-7
PROBE_COPY_EDGES = (4, 8, 16, 32)


def probe_class(kind: str | None, evidence: int, ambiguous: bool = False) -> int:
    """The gate's probe class of the n-gram proposal at the anchor (kind None: no proposal).

    ``ambiguous``: the anchor's last tokens were continued differently by earlier passages
    (``NgramIndex.anchor_ambiguous``); such a copy counts with the shortest copies unless it
    matched PROBE_COPY_EDGES[-1] tokens or more."""
    if kind is None:
        return PROBE_NONE
    if kind != "copy":
        return PROBE_FOLLOWER
    if ambiguous and evidence < PROBE_COPY_EDGES[-1]:
        return PROBE_SHORT_COPY
    c = PROBE_SHORT_COPY
    for edge in PROBE_COPY_EDGES[1:]:
        if evidence >= edge:
            c += 1
    return c


@dataclass
class WidthPlan:
    """The width decision for one round (Algorithm 1 lines 7-10)."""

    width: int  # rows to verify (1 = plain one-token step)
    measured: bool  # cold-start / split measurement round
    predicted_verify_s: float | None
    expected_accepted: float  # S(width) total
    offered: dict[int, float]  # offered width -> priced verify seconds at this context
    band_rate: float | None  # long-run tokens/s of the band, if known
    draft: bool = True  # False: width 1 was chosen, no tree needs building for this verify


class DraftGate:
    """The draft gate of one context band (module docstring)."""

    __slots__ = ("adv", "cost", "rounds", "skip_left", "backoff")

    def __init__(self) -> None:
        self.adv = 0.0  # decayed sum of advantages V(n*) - V(1), in tokens
        self.cost = 0.0  # decayed sum of rho * D, in tokens
        self.rounds = 0
        self.skip_left = 0
        self.backoff = 0

    def observe(self, advantage: float, draft_cost: float) -> None:
        """One drafted round's advantage over a plain step and its rho D."""
        self.adv = self.adv * _GATE_DECAY + advantage
        self.cost = self.cost * _GATE_DECAY + draft_cost
        self.rounds += 1
        if self.adv >= self.cost:
            self.backoff = 0
            self.skip_left = 0  # a skip set before rounds drafted anyway (cold start) is stale
        elif self.rounds >= GATE_MIN_ROUNDS:
            # A probe costs rho D minus its advantage: nearly nothing when drafting almost pays,
            # so the skip is also capped in proportion to how clearly drafting loses.
            shortfall = 1.0 - max(self.adv, 0.0) / self.cost
            self.skip_left = max(1, min(2**self.backoff, math.ceil(2**GATE_MAX_BACKOFF * shortfall)))
            if advantage > draft_cost:  # a probe that paid for its own D: probe much sooner
                self.backoff //= 2
            else:
                self.backoff = min(self.backoff + 1, GATE_MAX_BACKOFF)

    def copy(self) -> "DraftGate":
        g = DraftGate()
        g.load_state(self.state_dict())
        return g

    def take_skip(self) -> bool:
        if self.skip_left > 0:
            self.skip_left -= 1
            return True
        return False

    def state_dict(self) -> list:
        return [float(self.adv), float(self.cost), int(self.rounds), int(self.skip_left), int(self.backoff)]

    def load_state(self, state: list) -> None:
        self.adv, self.cost = float(state[0]), float(state[1])
        self.rounds, self.skip_left, self.backoff = int(state[2]), int(state[3]), int(state[4])


class DrafterGate:
    """Whether drafting rounds of one (band, probe) run the drafter (module docstring)."""

    __slots__ = ("sums", "squares", "weights", "counts", "skip_left", "probe_due", "backoff", "since_check")

    def __init__(self) -> None:
        self.sums = [0.0, 0.0]  # decayed sums of round values: [without, with] the drafter
        self.squares = [0.0, 0.0]  # decayed sums of squared round values
        self.weights = [0.0, 0.0]
        self.counts = [0, 0]
        self.skip_left = 0
        self.probe_due = False
        self.backoff = 0
        self.since_check = 0

    def mean(self, with_drafter: bool) -> float | None:
        w = self.weights[int(with_drafter)]
        return self.sums[int(with_drafter)] / w if w > 0.0 else None

    def drafter_wins(self) -> bool:
        """The drafter's mean, less DRAFTER_SE_MARGIN standard errors, is at least the mean without
        it: the drafter costs time in every round, so it has to show it pays beyond noise."""
        m1, m0 = self.mean(True), self.mean(False)
        if m1 is None or m0 is None:
            return False
        w = self.weights[1]
        var = max(self.squares[1] / w - m1 * m1, 0.0)
        return m1 - DRAFTER_SE_MARGIN * math.sqrt(var / w) >= m0

    def wants(self) -> bool:
        if self.skip_left > 0:
            self.skip_left -= 1
            self.probe_due = self.skip_left == 0
            return False
        if self.probe_due:
            self.probe_due = False
            return True
        if self.counts[1] < DRAFTER_MIN_ROUNDS:
            return True
        if self.counts[0] < DRAFTER_MIN_ROUNDS:
            return False
        if self.drafter_wins():
            self.since_check += 1
            if self.since_check >= DRAFTER_RECHECK:
                self.since_check = 0
                return False
            return True
        self.skip_left = 2**self.backoff - 1
        self.probe_due = self.skip_left == 0
        self.backoff = min(self.backoff + 1, DRAFTER_MAX_BACKOFF)
        return False

    def observe(self, with_drafter: bool, value: float) -> None:
        """One round's realized value, tokens - rho x seconds."""
        i = int(with_drafter)
        self.sums[i] = self.sums[i] * _DRAFTER_DECAY + float(value)
        self.squares[i] = self.squares[i] * _DRAFTER_DECAY + float(value) ** 2
        self.weights[i] = self.weights[i] * _DRAFTER_DECAY + 1.0
        self.counts[i] += 1
        if with_drafter and self.counts[0] >= DRAFTER_MIN_ROUNDS:
            if self.drafter_wins():
                self.backoff = 0
                self.skip_left = 0
            elif value > self.mean(False):  # a probe that beat the rounds without it: probe sooner
                self.backoff //= 2

    def copy(self) -> "DrafterGate":
        g = DrafterGate()
        g.load_state(self.state_dict())
        return g

    def state_dict(self) -> list:
        return [list(map(float, self.sums)), list(map(float, self.weights)), list(map(int, self.counts)),
                int(self.skip_left), bool(self.probe_due), int(self.backoff), int(self.since_check),
                list(map(float, self.squares))]

    def load_state(self, state: list) -> None:
        self.sums, self.weights = [float(x) for x in state[0]], [float(x) for x in state[1]]
        self.counts = [int(x) for x in state[2]]
        self.skip_left, self.probe_due = int(state[3]), bool(state[4])
        self.backoff, self.since_check = int(state[5]), int(state[6])
        self.squares = [float(x) for x in state[7]]


class WidthScheduler:
    """Chooses each round's verify width and learns from its outcome. Pure: no I/O, no timing."""

    def __init__(self, ladder: tuple[int, ...] = LADDER, max_width: int = 64) -> None:
        self.cost = VerifyCostModel(ladder, max_width)
        self.chooser = WidthChooser()
        self.gains = Gains()
        self.rate = LongRunRate()
        self.max_rows = 0  # widest verify run so far
        self.stall = 0  # rounds a pending width could not be measured
        self.gates: dict[tuple[int, int], DraftGate] = {}  # (context band, probe class) -> draft gate
        self.drafter_gates: dict[tuple[int, int], DrafterGate] = {}  # same keys -> drafter gate
        self.last_band: int | None = None  # band of the latest round: a new band's gate starts from it
        self.probe = PROBE_NONE  # probe class of the current round (wants_draft)
        self._last: tuple[WidthPlan, float | None, float | None, int, float] | None = None

    # --- helpers -------------------------------------------------------------------------
    def _plain_rate(self, context: int) -> float | None:
        if not self.cost.is_priced(1):
            return None
        return 1.0 / max(self.cost.raw_price(1, context), 1e-12)

    def _rho(self, context: int) -> float | None:
        """The price of time for the gate: the band's rate, else the plain step's rate."""
        rho = self.rate.rate(context)
        return rho if rho is not None else self._plain_rate(context)

    def _gate(self, context: int) -> DraftGate:
        """The draft gate of the band and the round's probe class; one met for the first time
        starts from the previous band's gate of the same probe class."""
        band = context_band(context)
        gate = self.gates.get((band, self.probe))
        if gate is None:
            prev = self.gates.get((self.last_band, self.probe)) if self.last_band is not None else None
            gate = prev.copy() if prev is not None else DraftGate()
            self.gates[(band, self.probe)] = gate
        self.last_band = band
        return gate

    def _drafter_gate(self, context: int, probe: int) -> DrafterGate:
        band = context_band(context)
        gate = self.drafter_gates.get((band, probe))
        if gate is None:
            # A new key starts from what is known of the drafter: the nearest band with this probe,
            # else this band's nearest probe class, else the nearest key at all. The drafter is
            # one model: where it lost on one kind of round it starts there as losing, and
            # probes (with backoff) find where it pays, rather than exploring every key afresh.
            prev = None
            if self.drafter_gates:
                prev = self.drafter_gates[min(self.drafter_gates, key=lambda k: (
                    k[1] != probe, k[0] != band, abs(k[0] - band), abs(k[1] - probe)))]
            gate = prev.copy() if prev is not None else DrafterGate()
            self.drafter_gates[(band, probe)] = gate
        return gate

    def wants_drafter(self, context: int, probe: int = PROBE_NONE) -> bool:
        """Called in a round that drafts: False means leave the drafter out (n-gram chains only,
        or a plain step when the n-gram proposes nothing); report the round to observe_drafter.
        The cold start gets no exception: its widths are measured on whatever trees the gate
        lets the round build, as without a drafter."""
        return self._drafter_gate(context, probe).wants()

    def observe_drafter(self, context: int, probe: int, with_drafter: bool, committed: int,
                        seconds: float) -> None:
        """A drafting round's outcome for the drafter gate: committed tokens in `seconds` (D + T)."""
        rho = self._rho(context)
        if rho is None:
            return
        self._drafter_gate(context, probe).observe(with_drafter, committed - rho * seconds)

    # --- the round -----------------------------------------------------------------------
    def wants_draft(self, context: int, probe: int = PROBE_NONE) -> bool:
        """Called before drafting: False means run this round as a plain step (observe_plain).

        ``probe`` is the round's probe class (module docstring). Always True while a ladder or
        reach width still needs measuring (cold start), unless no tree has been wide enough to
        measure it for PENDING_STALL rounds.
        """
        self.probe = int(probe)
        if self.cost.cold_pending() and self.stall < PENDING_STALL:
            return True
        gate = self._gate(context)
        if not self.cost.is_priced(1):
            return True
        return not gate.take_skip()

    def plan(self, context: int, s_drafter: np.ndarray, s_ngram: np.ndarray, fixed_s: float) -> WidthPlan:
        """Choose this round's width (Algorithm 1 lines 7-10).

        s_drafter[n], s_ngram[n] (n = 0..N) are the expected accepted tokens among the first n-1
        nodes of the best-first order from each source; the widest verify is N = len - 1.
        fixed_s is this round's D so far.
        """
        s_d = np.asarray(s_drafter, dtype=float).tolist()  # indexed a few dozen times: plain floats
        s_n = np.asarray(s_ngram, dtype=float).tolist()
        available = max(len(s_d) - 1, 1)
        measure = self.cost.next_measurement(available)
        offered = self.cost.prices(context, limit=available)
        rho_band = self.rate.rate(context)
        gains = self.gains.at(context)
        rate_mode = rho_band is not None
        scored = self.chooser.score(offered, s_d, s_n, fixed_s, gains, rho_band) if offered else {}
        if measure is not None and not self._cold_could_win(measure, scored, s_d, s_n, gains, rho_band):
            measure = next((w for w in self.cost.cold_pending() if measure < w <= available
                            and self._cold_could_win(w, scored, s_d, s_n, gains, rho_band)), None)

        if measure is not None:
            width, measured = measure, True
            self.stall = 0
        else:
            measured = False
            if self.cost.cold_pending():
                self.stall += 1
            width = self.chooser.choose(scored, rate_mode) if scored else 1
            split_width = self._split_to_measure(width, scored, s_d, s_n, gains, rho_band, available)
            if split_width is not None:
                width, measured = split_width, True
            elif scored and self.chooser.held >= HOLD_ROUNDS_BEFORE_SPLIT and not self.cost.split_pending():
                self._maybe_split(context, scored, s_d, s_n, fixed_s, gains, rho_band, available)

        adv = None
        rho = self._rho(context)
        if not measured and rho is not None and 1 in scored and width in scored:
            a, b = scored[width], scored[1]
            adv = (a.tokens - b.tokens) - rho * (a.seconds - b.seconds)
        plan = WidthPlan(
            width=int(width),
            measured=measured,
            predicted_verify_s=offered.get(width),
            expected_accepted=s_at(s_d, width) + s_at(s_n, width),
            offered=offered,
            band_rate=rho_band,
            draft=width > 1,
        )
        narrowest = min(offered) if offered else 1
        self._last = (plan, adv, rho, narrowest, self.cost.d_clock())
        return plan

    def _optimistic(
        self, a: int, n: int, scored: dict[int, Scored], s_d: list[float], s_n: list[float],
        gains: tuple[float, float, float, float], rho: float | None,
    ) -> Scored:
        """Width n scored at the price of its lower neighbour a: a width inside a class costs at
        least T(a) and accepts at most what n rows accept (§3.2)."""
        e = self.chooser.expected_tokens(n, s_d, s_n, gains)
        sec = scored[a].seconds  # D + T(a)
        return Scored(n, e, sec, e - rho * sec if rho is not None else e / max(sec, 1e-12))

    def _cold_could_win(
        self, w: int, scored: dict[int, Scored], s_d: list[float], s_n: list[float],
        gains: tuple[float, float, float, float], rho: float | None,
    ) -> bool:
        """Whether a cold width is worth measuring in this round (a deviation from §3.2).

        The paper measures every ladder width unconditionally. On a CPU, where every row costs,
        three verifies each of 16, 32 and 64 rows cost about a hundred plain steps, and most rounds'
        trees could not use them. So a cold width of COLD_ALWAYS_BELOW rows or more is measured only in
        a round where it could win: at its priced lower neighbour's price (a lower bound on its
        own) it must clear the switching margin against the best priced width, the split rule of
        §3.2 applied to the ladder. A width never measured stays unoffered.
        """
        below = [a for a in scored if a < w]
        if w < COLD_ALWAYS_BELOW or not below:
            return True
        best = max(scored.values(), key=lambda x: x.score)
        alt = self._optimistic(below[-1], w, scored, s_d, s_n, gains, rho)
        return self.chooser.beats(alt, best, rho is not None) > 0.0

    def _split_to_measure(
        self, chosen: int, scored: dict[int, Scored], s_d: list[float], s_n: list[float],
        gains: tuple[float, float, float, float], rho: float | None, available: int,
    ) -> int | None:
        """A split width still being measured, if this round is one where it could win.

        The split test of §3.2 applied to the new width in this round: at its lower neighbour's
        price it must clear the switching margin against this round's choice. Measuring it
        in a round where it cannot win would spend a verify no round of that kind would run.
        """
        if chosen not in scored:
            return None
        for w in self.cost.split_pending():
            if w > available:
                continue
            below = [a for a in scored if a < w]
            if not below:
                continue
            alt = self._optimistic(below[-1], w, scored, s_d, s_n, gains, rho)
            if self.chooser.beats(alt, scored[chosen], rho is not None) > 0.0:
                return w
        return None

    def _maybe_split(
        self,
        context: int,
        scored: dict[int, Scored],
        s_d: list[float],
        s_n: list[float],
        fixed_s: float,
        gains: tuple[float, float, float, float],
        rho: float | None,
        available: int,
    ) -> None:
        """Split a class where a width inside could change the choice (§3.2)."""
        held = self.chooser.incumbent
        if held is None or held not in scored:
            return
        inc = scored[held]

        def could_win(a: int, b: int) -> float:
            if a >= available or a not in scored:
                return -1.0  # no width inside this class can be filled by this round's tree
            alt = self._optimistic(a, b - 1, scored, s_d, s_n, gains, rho)
            return self.chooser.beats(alt, inc, rho is not None)

        if self.cost.split(held, context, could_win) is not None:
            self.chooser.held = 0

    def observe(
        self,
        plan: WidthPlan,
        context: int,
        verify_s: float,
        fixed_s: float,
        committed: int,
        first_round: bool,
        q_order: np.ndarray,
        src_order: np.ndarray,
        accepted_order: np.ndarray,
    ) -> None:
        """Learn from a verified round (Algorithm 1 lines 15-16).

        q_order[i], src_order[i] (0 drafter, 1 n-gram), accepted_order[i] describe the placed
        nodes in best-first order; the verify had len(q_order) + 1 rows. The cost model does
        not learn from a request's first round, which runs cold.
        """
        rows = len(q_order) + 1
        last = self._last if self._last is not None and self._last[0] is plan else None
        if not first_round:
            self.cost.note_fixed(fixed_s)
            if rows == plan.width:
                self.cost.observe(rows, context, verify_s)
            elif rows < plan.width and plan.measured:
                self.cost.note_short(plan.width, rows, self.max_rows)  # does not count; teaches reach
            elif rows in self.cost.classes and self.cost.classes[rows].priced:
                self.cost.observe(rows, context, verify_s)
        self.max_rows = max(self.max_rows, rows)
        d_priced = last[4] if last is not None and last[4] > 0.0 else fixed_s
        if not plan.measured:
            t_priced = plan.predicted_verify_s if rows == plan.width else None
            priced = None if t_priced is None else d_priced + t_priced
            self.rate.observe(context, committed, fixed_s + verify_s, priced)
        narrowest = last[3] if last is not None else 1
        self.gains.fade()
        self.gains.observe_round(context, narrowest, q_order, src_order, accepted_order)
        if last is not None and last[1] is not None and last[2] is not None:
            self._gate(context).observe(last[1], last[2] * d_priced)

    def observe_plain(self, context: int, step_s: float, first_round: bool) -> None:
        """A plain one-token step run without drafting: teaches width 1's cost and the band rate."""
        priced = self.cost.raw_price(1, context) if self.cost.is_priced(1) else None
        self.gains.fade()
        if not first_round:
            self.cost.observe(1, context, step_s)
        self.rate.observe(context, 1.0, step_s, priced)

    def end_request(self) -> None:
        """End of a request: batch refit of every law that learned in it (§3.2)."""
        self.cost.end_request()

    # --- views ---------------------------------------------------------------------------
    def price_table(self, context: int) -> dict[int, float]:
        """Offered width -> priced verify seconds at ``context`` (Proposition 2 prices)."""
        return self.cost.prices(context)

    def cold_start_progress(self) -> tuple[int, int]:
        """(widths with >= 3 measurements, widths learned)."""
        ws = self.cost.widths()
        return sum(1 for w in ws if self.cost.classes[w].priced), len(ws)

    # --- persistence ---------------------------------------------------------------------
    def state_dict(self) -> dict:
        """JSON-serialisable learned state (lists, floats, ints, str; stable ordering)."""
        return {
            "version": STATE_VERSION,
            "cost": self.cost.state_dict(),
            "chooser": self.chooser.state_dict(),
            "gains": self.gains.state_dict(),
            "rate": self.rate.state_dict(),
            "gates": [[int(b), int(p), self.gates[(b, p)].state_dict()] for b, p in sorted(self.gates)],
            "drafter_gates": [[int(b), int(p), self.drafter_gates[(b, p)].state_dict()]
                              for b, p in sorted(self.drafter_gates)],
            "last_band": self.last_band,
            "max_rows": int(self.max_rows),
            "stall": int(self.stall),
        }

    def load_state(self, state: dict) -> None:
        if int(state.get("version", 0)) != STATE_VERSION:
            raise ValueError(f"unsupported scheduler state version {state.get('version')!r}")
        self.cost.load_state(state["cost"])
        self.chooser.load_state(state["chooser"])
        self.gains.load_state(state["gains"])
        self.rate.load_state(state["rate"])
        self.gates = {}
        for entry in state["gates"]:  # [band, probe, state]; [band, state] from before probes
            b, p, gs = entry if len(entry) == 3 else (entry[0], PROBE_NONE, entry[1])
            gate = self.gates[(int(b), int(p))] = DraftGate()
            gate.load_state(gs)
        self.drafter_gates = {}
        for b, p, gs in state.get("drafter_gates", []):
            gate = self.drafter_gates[(int(b), int(p))] = DrafterGate()
            gate.load_state(gs)
        self.last_band = None if state["last_band"] is None else int(state["last_band"])
        self.max_rows = int(state["max_rows"])
        self.stall = int(state["stall"])
        self._last = None
