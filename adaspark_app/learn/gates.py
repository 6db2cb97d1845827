"""The gates before Algorithm 1's line 3: whether a round drafts at all, and whether it runs the drafter.

Not in the paper (ADDED): on a CPU, where every verified row costs, a round that drafts must pay
for its drafting time D, and a drafter's forward must pay for itself.

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

from .constants import (
    DRAFTER_HALF_LIFE,
    DRAFTER_MAX_BACKOFF,
    DRAFTER_MIN_ROUNDS,
    DRAFTER_RECHECK,
    DRAFTER_SE_MARGIN,
    GATE_HALF_LIFE,
    GATE_MAX_BACKOFF,
    GATE_MIN_ROUNDS,
    PROBE_COPY_EDGES,
)
from .kinds import NgramKind
from .state import boolean, integer, integers, number, numbers, versioned

STATE_VERSION = 2  # of both gates' state_dict (learn/state.py); 1: the lists of b9fbe7f
_GATE_DECAY = 0.5 ** (1.0 / GATE_HALF_LIFE)
_DRAFTER_DECAY = 0.5 ** (1.0 / DRAFTER_HALF_LIFE)
# Probe classes: 0 no proposal, 1 a follower, 2.. a copy by matched-context bin (4-7, 8-15, 16-31, 32+).
PROBE_NONE, PROBE_FOLLOWER, PROBE_SHORT_COPY = 0, 1, 2  # PROBE_SHORT_COPY: a copy matched on 4-7


def probe_class(kind: NgramKind | None, evidence: int, ambiguous: bool = False) -> int:
    """The gate's probe class of the n-gram proposal at the anchor (kind None: no proposal).

    ``ambiguous``: the anchor's last tokens were continued differently by earlier passages
    (``NgramIndex.anchor_ambiguous``); such a copy counts with the shortest copies unless it
    matched PROBE_COPY_EDGES[-1] tokens or more."""
    if kind is None:
        return PROBE_NONE
    if kind != NgramKind.COPY:
        return PROBE_FOLLOWER
    if ambiguous and evidence < PROBE_COPY_EDGES[-1]:
        return PROBE_SHORT_COPY
    c = PROBE_SHORT_COPY
    for edge in PROBE_COPY_EDGES[1:]:
        if evidence >= edge:
            c += 1
    return c


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
            if advantage > draft_cost:  # a probe that paid for its own D: probe much sooner
                self.backoff //= 2
            else:
                self.backoff = min(self.backoff + 1, GATE_MAX_BACKOFF)
            # the skip from the backoff just set: one taken before halving it waited the old
            # 2^j after a probe that paid (83 rounds on a copy passage after a weak one)
            self.skip_left = max(1, min(2**self.backoff, math.ceil(2**GATE_MAX_BACKOFF * shortfall)))

    def copy(self) -> "DraftGate":
        # field by field, not through load_state: a live gate is copied, not a stored state checked
        g = DraftGate()
        g.adv, g.cost, g.rounds, g.skip_left, g.backoff = self.adv, self.cost, self.rounds, self.skip_left, self.backoff
        return g

    def take_skip(self) -> bool:
        if self.skip_left > 0:
            self.skip_left -= 1
            return True
        return False

    def state_dict(self) -> dict:
        return {"version": STATE_VERSION, "adv": float(self.adv), "cost": float(self.cost),
                "rounds": int(self.rounds), "skip_left": int(self.skip_left), "backoff": int(self.backoff)}

    def load_state(self, state: dict, where: str = "draft gate") -> None:
        """Restore from ``state_dict``; StateError (naming the field) on a state of another
        version or a malformed one, and then nothing is changed."""
        s = versioned(state, where, STATE_VERSION, ("adv", "cost", "rounds", "skip_left", "backoff"))
        adv = number(s["adv"], f"{where}.adv")
        cost = number(s["cost"], f"{where}.cost", lo=0.0)  # a decayed sum of rho * D
        rounds = integer(s["rounds"], f"{where}.rounds")
        # a skip is at most 2^GATE_MAX_BACKOFF rounds; the backoff is an exponent
        skip_left = integer(s["skip_left"], f"{where}.skip_left", hi=2**GATE_MAX_BACKOFF)
        backoff = integer(s["backoff"], f"{where}.backoff", hi=GATE_MAX_BACKOFF)
        self.adv, self.cost, self.rounds, self.skip_left, self.backoff = adv, cost, rounds, skip_left, backoff


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
        g = DrafterGate()  # field by field, as DraftGate.copy
        g.sums, g.squares, g.weights, g.counts = list(self.sums), list(self.squares), list(self.weights), list(self.counts)
        g.skip_left, g.probe_due, g.backoff, g.since_check = self.skip_left, self.probe_due, self.backoff, self.since_check
        return g

    def state_dict(self) -> dict:
        return {"version": STATE_VERSION, "sums": list(map(float, self.sums)),
                "squares": list(map(float, self.squares)), "weights": list(map(float, self.weights)),
                "counts": list(map(int, self.counts)), "skip_left": int(self.skip_left),
                "probe_due": bool(self.probe_due), "backoff": int(self.backoff),
                "since_check": int(self.since_check)}

    def load_state(self, state: dict, where: str = "drafter gate") -> None:
        """Restore from ``state_dict``; StateError (naming the field) on a state of another
        version or a malformed one, and then nothing is changed."""
        s = versioned(state, where, STATE_VERSION, ("sums", "squares", "weights", "counts", "skip_left",
                                                    "probe_due", "backoff", "since_check"))
        sums = numbers(s["sums"], f"{where}.sums", 2)  # [without, with] the drafter
        squares = numbers(s["squares"], f"{where}.squares", 2, lo=0.0)
        weights = numbers(s["weights"], f"{where}.weights", 2, lo=0.0)
        counts = integers(s["counts"], f"{where}.counts", 2)
        skip_left = integer(s["skip_left"], f"{where}.skip_left", hi=2**DRAFTER_MAX_BACKOFF)
        probe_due = boolean(s["probe_due"], f"{where}.probe_due")
        backoff = integer(s["backoff"], f"{where}.backoff", hi=DRAFTER_MAX_BACKOFF)  # an exponent
        since_check = integer(s["since_check"], f"{where}.since_check")
        self.sums, self.squares, self.weights, self.counts = sums, squares, weights, counts
        self.skip_left, self.probe_due, self.backoff, self.since_check = skip_left, probe_due, backoff, since_check
