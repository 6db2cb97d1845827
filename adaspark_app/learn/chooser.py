"""Width chooser of §3.4: Eq. (7) at the band's long-run rate, with hysteresis.

    V(n) = 1 + S(n0) + g_d dS_d(n) + g_n dS_ng(n) - rho_m (D + T(n, c))        (Eq. 7)

dS_src(n) = S_src(n) - S_src(n0): the tokens a source's nodes add above n0 (negative below it,
priced with the pair of gains below n0). Until the band's rate is known the chooser maximises
the per-round ratio E(n) / (D + T(n)), where E(n) = 1 + S(n0) + g_d dS_d + g_n dS_ng is the
round's expected tokens. The incumbent is kept unless an alternative beats it by HYSTERESIS x its
expected tokens (by RATIO_MARGIN in ratio mode); the first incumbent is the widest offered width.

Beyond the paper, an alternative also wins once its advantage, summed over rounds, clears the
same margin (a CUSUM with an allowance of PRESSURE_ALLOWANCE x margin per round). With rounds of
one to three tokens (a CPU) a per-round margin of 4% of the tokens can hold a width whose rate
is a few percent below its neighbour's forever; summed, a consistent advantage wins in a few
rounds, while noise (mean zero, less the allowance) drifts down and never crosses.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from .kinds import Decider
from .constants import HYSTERESIS, N0, PRESSURE_ALLOWANCE, RATIO_MARGIN
from .state import integer, number, optional, sequence, unique, versioned

STATE_VERSION = 1  # of state_dict's layout (learn/state.py)


def s_at(s: np.ndarray, n: int) -> float:
    """S(n) from an array over n = 0..N; a width past the tree gives the whole tree's S."""
    return float(s[min(n, len(s) - 1)])


@dataclass
class Scored:
    """One offered width's terms: expected tokens E(n), time D + T(n), and its score."""

    width: int
    tokens: float
    seconds: float
    score: float  # V(n) in rate mode, E(n) / (D + T(n)) in ratio mode


class WidthChooser:
    """Holds the incumbent width and scores offered widths by Eq. (7) or the ratio."""

    def __init__(self) -> None:
        self.incumbent: int | None = None
        self.held = 0  # consecutive non-measuring rounds the incumbent was chosen
        self.pressure: dict[int, float] = {}  # alternative -> summed relative advantage (CUSUM)
        self.reason = Decider.CHOOSER  # why the last choose() returned what it did (decision trace)

    @staticmethod
    def expected_tokens(
        n: int, s_d: np.ndarray | list[float], s_n: np.ndarray | list[float], gains: tuple[float, float, float, float]
    ) -> float:
        """E(n) = 1 + S(n0) + g_d dS_d(n) + g_n dS_ng(n); the pair of gains by side of n0."""
        return WidthChooser.expected_tokens_at((n,), s_d, s_n, gains)[n]

    @staticmethod
    def expected_tokens_at(
        widths: Iterable[int], s_d: np.ndarray | list[float], s_n: np.ndarray | list[float],
        gains: tuple[float, float, float, float]
    ) -> dict[int, float]:
        """``expected_tokens`` of each width, the bases read once: the plan asks for every offered
        width each round (``expected_tokens`` is this for one width)."""
        last = len(s_d) - 1
        base_d, base_n = float(s_d[min(N0, last)]), float(s_n[min(N0, last)])
        out: dict[int, float] = {}
        for n in widths:
            gd, gn = (gains[0], gains[1]) if n < N0 else (gains[2], gains[3])
            k = min(n, last)
            out[n] = 1.0 + base_d + base_n + gd * (float(s_d[k]) - base_d) + gn * (float(s_n[k]) - base_n)
        return out

    def score(
        self,
        prices: dict[int, float],
        s_d: np.ndarray | list[float],
        s_n: np.ndarray | list[float],
        fixed_s: float,
        gains: tuple[float, float, float, float],
        rho: float | None,
        tokens: dict[int, float] | None = None,
    ) -> dict[int, Scored]:
        """Score every offered width: V(n) of Eq. (7) if rho is known, else the per-round ratio.
        ``tokens``: E(n) of the offered widths where the caller has them already."""
        out: dict[int, Scored] = {}
        for n, t in prices.items():
            e = tokens[n] if tokens is not None else self.expected_tokens(n, s_d, s_n, gains)
            sec = fixed_s + t
            sc = e - rho * sec if rho is not None else e / max(sec, 1e-12)
            out[n] = Scored(n, e, sec, sc)
        return out

    @staticmethod
    def advantage(alt: Scored, inc: Scored, rate_mode: bool) -> float:
        """``alt`` over ``inc`` relative to the margin's unit: V difference over the incumbent's
        expected tokens (rate mode), or the ratio's relative gain (ratio mode)."""
        if rate_mode:
            return (alt.score - inc.score) / max(inc.tokens, 1e-12)
        return alt.score / max(inc.score, 1e-12) - 1.0

    @staticmethod
    def beats(alt: Scored, inc: Scored, rate_mode: bool) -> float:
        """How far ``alt`` clears the switching margin against ``inc`` (> 0: it switches)."""
        if rate_mode:
            return alt.score - inc.score - HYSTERESIS * inc.tokens
        return alt.score - (1.0 + RATIO_MARGIN) * inc.score

    def stand_in(self, offered: list[int]) -> int:
        """The incumbent if offered, else the widest offered width below it (else the narrowest)."""
        assert self.incumbent is not None
        if self.incumbent in offered:
            return self.incumbent
        below = [w for w in offered if w < self.incumbent]
        return below[-1] if below else offered[0]

    @staticmethod
    def argmax(scored: dict[int, Scored]) -> int:
        """The best-scored offered width, ties toward the narrower: Eq. (7) without hysteresis."""
        return max(sorted(scored), key=lambda w: (scored[w].score, -w))

    def choose(self, scored: dict[int, Scored], rate_mode: bool, bounded: frozenset[int] = frozenset(),
               best: int | None = None) -> int:
        """argmax of the score over the offered widths, kept at the incumbent unless beaten.

        ``bounded``: widths offered at an upper bound on their price, never measured: one may win
        a round, but never becomes the first incumbent (the widest offered width otherwise).

        Sets ``reason``: ``chooser`` (the argmax won), ``hysteresis`` (the incumbent held against a
        better-scored width inside the margin), ``stand_in`` (likewise, for the incumbent's stand-in
        while the incumbent is not offered) or ``pressure`` (the CUSUM switched). ``best``:
        ``argmax(scored)`` where the caller has it."""
        offered = sorted(scored)
        if self.incumbent is None:  # first incumbent: the widest offered width (§3.4), measured
            self.incumbent = max((w for w in offered if w not in bounded), default=offered[0])
            self.held = 0
        inc = self.stand_in(offered)
        if best is None:
            best = self.argmax(scored)
        choice = inc
        self.reason = Decider.CHOOSER if best == inc else (
            Decider.HYSTERESIS if inc == self.incumbent else Decider.STAND_IN)
        if best != inc and self.beats(scored[best], scored[inc], rate_mode) > 0.0:
            choice = best
            self.reason = Decider.CHOOSER
        elif inc == self.incumbent:
            margin = HYSTERESIS if rate_mode else RATIO_MARGIN
            allowance = PRESSURE_ALLOWANCE * margin
            top = 0.0
            for w in offered:
                if w == inc:
                    continue
                p = max(0.0, self.pressure.get(w, 0.0) + self.advantage(scored[w], scored[inc], rate_mode) - allowance)
                self.pressure[w] = p
                if p > margin and p > top:
                    choice, top = w, p
                    self.reason = Decider.PRESSURE
        if inc == self.incumbent:
            if choice == self.incumbent:
                self.held += 1
            else:
                self.incumbent, self.held = choice, 0
                self.pressure.clear()
        return choice

    def state_dict(self) -> dict:
        return {
            "version": STATE_VERSION,
            "incumbent": self.incumbent,
            "held": int(self.held),
            "pressure": [[int(w), float(p)] for w, p in sorted(self.pressure.items())],
        }

    def load_state(self, state: dict, where: str = "chooser") -> None:
        """Restore from ``state_dict``; StateError (naming the field) on a state of another
        version or a malformed one, and then nothing is changed."""
        s = versioned(state, where, STATE_VERSION, ("incumbent", "held", "pressure"))
        incumbent = optional(integer, s["incumbent"], f"{where}.incumbent", lo=1)
        held = integer(s["held"], f"{where}.held")
        pressure = []
        for i, entry in enumerate(sequence(s["pressure"], f"{where}.pressure")):
            w, p = sequence(entry, f"{where}.pressure[{i}]", 2)
            pressure.append((integer(w, f"{where}.pressure[{i}][0]", lo=1),
                             number(p, f"{where}.pressure[{i}][1]", lo=0.0)))  # a CUSUM is >= 0
        unique([w for w, _ in pressure], f"{where}.pressure")
        self.incumbent, self.held, self.pressure = incumbent, held, dict(pressure)
