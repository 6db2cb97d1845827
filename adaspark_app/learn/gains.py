"""Gains g_d, g_n of Eq. (7) (§3.4 ii): realised over predicted marginal tokens, per source.

S, a sum of per-node probabilities, is a poor estimate of what extra rows buy, so the marginal
of each source is rescaled by a gain fitted as a line in context, g(c) = a + b u (u = c / 8192),
by ridge least squares of realised on predicted marginal, shrunk toward g = 1 (ridge weight
GAIN_RIDGE times each regressor's sum of squares; for the slope at least GAIN_RIDGE times
sum p^2, see ``GainLine._solve``), gated on evidence (``GainLine.evidence``) and clamped to
GAIN_CLAMP. The line is read
only inside the range of contexts it was fitted on (flat beyond): fitted on one request, its
slope is noise, and extrapolated a few thousand tokens it would drive a gain to its clamp. One pair serves
rows above n0, a second pair the rows below it. By Proposition 1 a round's accepted path says
what every narrower prefix of its tree would have accepted, so no extra rounds are needed.
"""

from __future__ import annotations

import numpy as np

from .kinds import Source
from .constants import CONTEXT_UNIT, GAIN_CLAMP, GAIN_EVIDENCE_Z, GAIN_HALF_LIFE, GAIN_RIDGE, N0
from .state import StateError, fields, integer, numbers, sequence, text, versioned

# Evidence gate: a gain leaves 1 by the share min(1, (|Z| / GAIN_EVIDENCE_Z)^2) of its fitted
# correction, Z the self-normalised statistic of realised minus predicted marginal. Few, noisy
# rounds then cannot set a gain that steers the chooser away from the rows that would correct it.
# Evidence fades with a half-life in rounds (every round, whether or not it teaches the line): a
# gain that has steered the chooser to widths that no longer teach it (width 1 teaches no row)
# drifts back toward 1 and the rows get tried again, instead of staying locked on a bad start.
_GAIN_DECAY = 0.5 ** (1.0 / GAIN_HALF_LIFE)

SOURCES = (Source.DRAFTER.value, Source.NGRAM.value)  # the sources with a gain (agreed rows count as drafter rows)
SIDES = ("lower", "upper")
STATE_VERSION = 1  # of state_dict's layout (learn/state.py)


class GainLine:
    """One gain line: sufficient statistics of the ridge fit realised ~ (a + b u) * predicted."""

    def __init__(self) -> None:
        self.stats = [0.0] * 7  # sum p^2, p^2 u, p^2 u^2, p r, p r u, p^2 (r-p)^2, p^3
        self.count = 0
        self.a, self.b = 1.0, 0.0
        self.z2 = 0.0  # (Z / GAIN_EVIDENCE_Z)^2, see evidence()
        self.u_lo, self.u_hi = 0.0, 0.0  # range of contexts seen (u = c / 8192)

    def observe(self, predicted: float, realised: float, context: int) -> None:
        if predicted <= 1e-12:
            return
        u = context / CONTEXT_UNIT
        p, r = predicted, realised
        s = self.stats
        s[0] += p * p
        s[1] += p * p * u
        s[2] += p * p * u * u
        s[3] += p * r
        s[4] += p * r * u
        s[5] += p * p * (r - p) ** 2
        s[6] += p * p * p
        self.u_lo, self.u_hi = (u, u) if self.count == 0 else (min(self.u_lo, u), max(self.u_hi, u))
        self.count += 1
        self._solve()

    def _solve(self) -> None:
        s = self.stats
        # Ridge toward (a, b) = (1, 0). The slope's weight is 0.02 x max(sum (p u)^2, sum p^2): the
        # contexts of a few requests span a small part of one CONTEXT_UNIT, and there sum (p u)^2
        # hardly restrains a slope fitted on noise; a slope survives once contexts span ~8k tokens.
        la, lb = GAIN_RIDGE * s[0], GAIN_RIDGE * max(s[2], s[0])
        m00, m01, m11 = s[0] + la, s[1], s[2] + lb  # 2x2 normal equations, solved in closed form
        v0, v1 = s[3] + la, s[4]
        det = m00 * m11 - m01 * m01
        if det > 1e-12 * m00 * m11:
            self.a, self.b = (v0 * m11 - m01 * v1) / det, (m00 * v1 - m01 * v0) / det
        else:
            self.a, self.b = v0 / m00, 0.0
        spread = max(s[5], s[6])
        self.z2 = (s[3] - s[0]) ** 2 / spread / GAIN_EVIDENCE_Z**2 if spread > 0.0 else 0.0

    def fade(self, factor: float) -> None:
        """Scale all evidence by ``factor``: the fit (a, b) is unchanged, Z^2 shrinks with it."""
        if self.count:
            self.stats = [v * factor for v in self.stats]
            # solved from the faded sums, as load_state does (not z2 *= factor: equal in exact
            # arithmetic, not in floats), so a reloaded line decides bit for bit alike
            if self.stats[0] > 0.0:
                self._solve()
            else:
                self.a, self.b, self.z2 = 1.0, 0.0, 0.0

    def evidence(self) -> float:
        """Share of the fitted correction in use: (|Z| / GAIN_EVIDENCE_Z)^2, at most 1.

        Z = sum p (r - p) / sqrt(max(sum p^2 (r - p)^2, sum p^3)): realised against predicted
        marginal in units of its own spread (floored by a Poisson spread, r ~ p).
        """
        return min(1.0, self.z2)

    def value(self, context: int) -> float:
        """g(c), clamped to GAIN_CLAMP (which also keeps Proposition 2's condition g >= 0)."""
        if self.count == 0:
            return 1.0
        u = min(max(context / CONTEXT_UNIT, self.u_lo), self.u_hi)
        g = 1.0 + min(1.0, self.z2) * (self.a + self.b * u - 1.0)
        return min(max(g, GAIN_CLAMP[0]), GAIN_CLAMP[1])

    def state_dict(self) -> dict:
        return {
            "stats": [float(v) for v in self.stats],
            "count": int(self.count),
            "u_range": [float(self.u_lo), float(self.u_hi)],
        }

    def load_state(self, state: dict, where: str = "line") -> None:
        """Restore from ``state_dict``; StateError on a malformed state, nothing changed then."""
        s = fields(state, where, ("stats", "count", "u_range"))
        stats = numbers(s["stats"], f"{where}.stats", 7, lo=0.0)  # sums of products of p, r, u >= 0
        count = integer(s["count"], f"{where}.count")
        u_lo, u_hi = numbers(s["u_range"], f"{where}.u_range", 2, lo=0.0)
        if u_lo > u_hi:
            raise StateError(f"{where}.u_range: low end {u_lo!r} above high end {u_hi!r}")
        self.stats, self.count, self.u_lo, self.u_hi = stats, count, u_lo, u_hi
        # A line not taught for ~140k rounds has faded to sum p^2 = 0.0 (float underflow): its
        # evidence is gone, so it reads 1, as the limit of the fit would.
        if self.count and stats[0] > 0.0:
            self._solve()
        else:
            self.a, self.b, self.z2 = 1.0, 0.0, 0.0


class Gains:
    """The two pairs of gains of §3.4: (drafter, n-gram) below n0 and above n0."""

    def __init__(self) -> None:
        self.lines = {(side, src): GainLine() for side in SIDES for src in SOURCES}

    def fade(self) -> None:
        """One round passed (GAIN_HALF_LIFE)."""
        for line in self.lines.values():
            line.fade(_GAIN_DECAY)

    def at(self, context: int) -> tuple[float, float, float, float]:
        """(g_d below n0, g_n below n0, g_d above n0, g_n above n0) at ``context``."""
        ln = self.lines
        return (
            ln["lower", "drafter"].value(context),
            ln["lower", "ngram"].value(context),
            ln["upper", "drafter"].value(context),
            ln["upper", "ngram"].value(context),
        )

    def observe_round(
        self,
        context: int,
        narrowest: int,
        q_order: np.ndarray,
        src_order: np.ndarray,
        accepted_order: np.ndarray,
    ) -> None:
        """Learn from one verified tree (§3.4, Algorithm 1 line 16).

        q_order[i] is Q of the i-th placed node in best-first order, src_order[i] its source
        (0 drafter, 1 n-gram), accepted_order[i] whether it lay on the accepted path. A width w
        verifies the first w-1 nodes. The upper pair learns from the rows between n0 and the
        round's width when that width exceeds n0; the lower pair from the rows between the
        narrowest offered width and min(width, n0).
        """
        q = np.asarray(q_order, dtype=float)
        width = len(q) + 1
        if width < 2:
            return
        src = np.asarray(src_order)
        acc = np.asarray(accepted_order, dtype=bool)
        spans = [("lower", max(narrowest, 1) - 1, min(width, N0) - 1)]
        if width > N0:
            spans.append(("upper", N0 - 1, width - 1))
        for side, lo, hi in spans:
            if hi <= lo:
                continue
            qs, ss, ac = q[lo:hi], src[lo:hi], acc[lo:hi]
            for k, name in enumerate(SOURCES):
                mask = ss == k
                if mask.any():
                    self.lines[side, name].observe(float(qs[mask].sum()), float(ac[mask].sum()), context)

    def state_dict(self) -> dict:
        return {"version": STATE_VERSION,
                "lines": [[side, src, self.lines[side, src].state_dict()] for side, src in sorted(self.lines)]}

    def load_state(self, state: dict, where: str = "gains") -> None:
        """Restore from ``state_dict``: one entry per (side, source). StateError (naming the
        field) on a state of another version or a malformed one, and then nothing is changed."""
        s = versioned(state, where, STATE_VERSION, ("lines",))
        entries = sequence(s["lines"], f"{where}.lines", len(self.lines))
        lines: dict[tuple[str, str], GainLine] = {}
        for i, entry in enumerate(entries):
            at = f"{where}.lines[{i}]"
            side, src, st = sequence(entry, at, 3)
            key = (text(side, f"{at}[0]", SIDES), text(src, f"{at}[1]", SOURCES))
            if key in lines:
                raise StateError(f"{at}: repeats the line {key[0]} {key[1]}")
            line = lines[key] = GainLine()
            line.load_state(st, f"{at}[2]")
        self.lines = {k: lines[k] for k in self.lines}
