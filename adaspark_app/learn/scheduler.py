"""The facade the engine calls each round (Algorithm 1, lines 7-10 and 15-16).

``WidthScheduler`` joins the verify-cost model (§3.2), the gains and long-run rate (§3.4) and the
width chooser (Eq. 7), and adds the draft gate: width 1 (a plain one-token step) is an offered
width, and when the plain step is expected to win the round should not pay for drafting at all.

The draft gate and the drafter gate (``gates.py``) decide whether a round drafts at all, and
whether it runs the drafter; this class keeps one of each per context band and probe class.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .chooser import Scored, WidthChooser, s_at
from .constants import (COLD_ALWAYS_BELOW, HOLD_ROUNDS_BEFORE_SPLIT, LADDER, MAX_WIDTH, PENDING_STALL, PROBE_COPY_EDGES,
                        ROOFLINE_SLOPE_SHARE)
from .cost import VerifyCostModel
from .law import context_band
from .gains import Gains
from .gates import PROBE_NONE, PROBE_SHORT_COPY, DraftGate, DrafterGate
from .kinds import Decider
from .rate import LongRunRate
from .state import StateError, integer, optional, sequence, versioned

STATE_VERSION = 2  # of state_dict's layout (learn/state.py); 1: b9fbe7f's, read through learned_state.migrate
PROBE_MAX = PROBE_SHORT_COPY + len(PROBE_COPY_EDGES) - 1  # the widest probe class (a copy of 32+)


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
    # --- the decision trace (ROUNDS.jsonl) ---
    decided_by: Decider = Decider.CHOOSER  # the layer that set the width
    argmax: int | None = None  # the chooser's best-scored offered width (Eq. 7, or the ratio), no hysteresis
    incumbent: int | None = None  # the width the chooser held when the round began
    mode: str = "ratio"  # "rate": V(n) at the price of time (_price); "ratio": E(n) / (D + T(n)) until rho_m is known
    values: dict[int, float] = field(default_factory=dict)  # offered width -> V(n) at price of time rho
    rho: float | None = None  # the chooser's price of time, tokens/s (WidthScheduler._price), else the plain step's rate
    fixed_s: float = 0.0  # the D that priced the round
    gains: tuple[float, float, float, float] = (1.0, 1.0, 1.0, 1.0)  # g_d, g_n below n0, then above
    bounded: bool = False  # the width was priced at its upper bound (VerifyCostModel.prices): each verify until priced
    ends_at: int = 0  # the chain-end credit scored the widths (_credit_chain_end): the rows that verify the chain whole


class WidthScheduler:
    """Chooses each round's verify width and learns from its outcome. Pure: no I/O, no timing."""

    credits_chain_end = True  # ``_credit_chain_end``; False: Eq. (7) alone (benchmarks compare the two)

    def __init__(self, ladder: tuple[int, ...] = LADDER, max_width: int = MAX_WIDTH) -> None:
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
        return 1.0 / max(self.plain_price(context), 1e-12)

    def _rho(self, context: int) -> float | None:
        """The price of time for the gate: the band's rate, else the plain step's rate."""
        rho = self.rate.rate(context)
        return rho if rho is not None else self._plain_rate(context)

    def _price(self, rho: float | None, offered: dict[int, float], s_d: list[float], fixed_s: float,
               tokens: dict[int, float]) -> float | None:
        """The chooser's price of time in Eq. (7): the band's rate ``rho`` (rho_m), or, for a tree of
        n-gram nodes only that beats the band, the rate of the round itself (None until the
        band's rate is known: the per-round ratio then).

        Eq. (7) prices a verify at the band's long-run rate, right for rounds that come and go
        independently. A copy of the conversation's own text does not: where a round's first
        nodes are accepted, the next round proposes the rest again from the new anchor, now a
        confirmed copy, so the rows a narrow width leaves are not lost. And with no drafter most
        rounds have nothing to verify, so the band's rate is about the plain step's and makes
        wide rows look almost free: on Qwen2.5-Coder-1.5B (HumanEval) the chooser took 32 rows
        (8.8 plain steps) on follower chains that accepted nothing, where pinned:4 was 1.14x
        faster. So a round that earns more than the band is priced at its best rate
        r* = max_n E(n) / (D + T(n)): at that price V(n) <= 0, with 0 at the width of the best
        per-round rate, the rule that a state which repeats (Dinkelbach's fixed point for it)
        wants. A round worse than the band keeps the band's price. With drafter nodes in the
        tree Eq. (7) is kept as the paper has it. ``tokens``: E(n) of each offered width.
        """
        if rho is None or not offered or any(s_d):
            return rho
        best = max(tokens[n] / max(fixed_s + t, 1e-12) for n, t in offered.items())
        return max(rho, best)

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
        if not self.cost.is_priced(1) and 1 in self.cost.widths():
            # Width 1 is a plain step: timed by plain steps for free. Measured on a drafted round
            # it paid D for a tree it threw away (with the drafter ~6 ms a round on the bundled
            # model, a fifth of the cold start).
            return False
        if self.cost.measurable_pending() and self.stall < PENDING_STALL:
            return True
        gate = self._gate(context)
        return not gate.take_skip()

    def plan(self, context: int, s_drafter: np.ndarray, s_ngram: np.ndarray, fixed_s: float,
             may_measure: bool = True, ends_at: int = 0) -> WidthPlan:
        """Choose this round's width (Algorithm 1 lines 7-10).

        s_drafter[n], s_ngram[n] (n = 0..N) are the expected accepted tokens among the first n-1
        nodes of the best-first order from each source; the widest verify is N = len - 1.
        fixed_s is this round's D so far. ``may_measure`` False (a request's first round, whose
        verify the cost model does not count: it runs cold) chooses among priced widths only:
        a measurement there would pay for a verify that teaches nothing. ``ends_at``: the rows that
        verify the tree whole where it is one chain that nothing continues (``_credit_chain_end``),
        else 0.
        """
        s_d = np.asarray(s_drafter, dtype=float).tolist()  # indexed a few dozen times: plain floats
        s_n = np.asarray(s_ngram, dtype=float).tolist()
        available = max(len(s_d) - 1, 1)
        incumbent = self.chooser.incumbent
        measure = self.cost.next_measurement(available)
        if not may_measure:
            measure = None
        offered = self.cost.prices(context, limit=available, bounds=True)
        ends_at = ends_at if self.credits_chain_end and 1 < ends_at == available and offered else 0
        if ends_at and max(offered) < ends_at:
            # the class whose top covers the whole chain: a verify of the chain runs its rows at most
            cover = [(w, t) for w, t in self.cost.prices(context, bounds=True).items() if w > ends_at]
            if cover:
                offered[cover[0][0]] = cover[0][1]
        bounded = self.cost.bounded_among(offered)
        gains = self.gains.at(context)
        band_rate = self.rate.rate(context)
        # E(n), read by the price of time and the scores
        tokens = self.chooser.expected_tokens_at(offered, s_d, s_n, gains)
        rho_m = self._price(band_rate, offered, s_d, fixed_s, tokens)
        rate_mode = rho_m is not None
        scored = self.chooser.score(offered, s_d, s_n, fixed_s, gains, rho_m, tokens) if offered else {}
        if ends_at and rate_mode:
            self._credit_chain_end(scored, ends_at, s_d, s_n, fixed_s, gains, rho_m)
        if measure is not None and not self._cold_could_win(measure, scored, s_d, s_n, gains, rho_m):
            measure = next((w for w in self.cost.measurable_pending() if measure < w <= available
                            and self._cold_could_win(w, scored, s_d, s_n, gains, rho_m)), None)
        recheck = (self._recheck(available, scored, s_d, s_n, gains, rho_m)
                   if measure is None and may_measure and scored else None)

        best = self.chooser.argmax(scored) if scored else None  # Eq. (7) without hysteresis (trace, chooser)
        if measure is not None:
            width, measured, decided_by = measure, True, Decider.COLD
            self.stall = 0
        elif recheck is not None:
            width, measured, decided_by = recheck, True, Decider.RECHECK
        else:
            measured = False
            if self.cost.measurable_pending() and may_measure:
                self.stall += 1
            width = self.chooser.choose(scored, rate_mode, bounded, best) if scored else 1
            decided_by = self.chooser.reason if scored else Decider.COLD
            split_width = (self._split_to_measure(width, scored, s_d, s_n, gains, rho_m, available)
                           if may_measure else None)
            if split_width is not None:
                width, measured, decided_by = split_width, True, Decider.SPLIT
            elif scored and self.chooser.held >= HOLD_ROUNDS_BEFORE_SPLIT and not self.cost.split_pending():
                self._maybe_split(context, scored, s_d, s_n, fixed_s, gains, rho_m, available)

        adv = None
        rho = self._rho(context)  # the draft gate's price: the band's rate, else the plain step's
        if not measured and rho is not None and 1 in scored and width in scored:
            a, b = scored[width], scored[1]
            adv = (a.tokens - b.tokens) - rho * (a.seconds - b.seconds)
        price = rho_m if rho_m is not None else rho  # the trace's V(n): at the chooser's price (_price)
        values = {} if price is None else {w: sc.tokens - price * sc.seconds for w, sc in scored.items()}
        plan = WidthPlan(
            width=int(width),
            measured=measured,
            predicted_verify_s=offered.get(width),
            expected_accepted=s_at(s_d, width) + s_at(s_n, width),
            offered=offered,
            band_rate=band_rate,
            draft=width > 1,
            decided_by=decided_by,
            argmax=best,
            incumbent=incumbent,
            mode="rate" if rate_mode else "ratio",
            values=values,
            rho=price,
            fixed_s=float(fixed_s),
            gains=tuple(float(g) for g in gains),
            bounded=int(width) in bounded,
            ends_at=ends_at if rate_mode else 0,
        )
        narrowest = min(offered) if offered else 1
        self._last = (plan, adv, rho, narrowest, float(fixed_s))
        return plan

    def _credit_chain_end(self, scored: dict[int, Scored], ends_at: int, s_d: list[float], s_n: list[float],
                          fixed_s: float, gains: tuple[float, float, float, float], rho: float) -> None:
        """Eq. (7) with what a width leaves of a chain that nothing continues (a deviation).

        Eq. (7) scores the tokens a width leaves as if later rounds produced them at the long-run
        rate. For a copy that continues past the tree that holds (``_price``): the next round
        proposes the rest again, and more. But where the tree is one chain that ends at
        ``ends_at`` rows (its passage ends, nothing is proposed after it, or the reply's token
        budget ends there), what a narrower width n leaves is all the next round can verify: a
        round of its own, D + T(ends_at - n) for the tokens Eq. (7) left out. That round happens
        when the n-th node, the round's bonus token, is accepted (probability Q_n =
        E(n+1) - E(n)). So width n is scored with those tokens and that round's time:

            V'(n) = V(n) + (E(ends_at) - E(n)) - rho Q_n (D + T(ends_at - n))

        The width that verifies the chain whole is offered even past the tree's widest width
        (at the price of the class that covers it, an upper bound). On the modeled GPU's chats
        the chooser stopped such chains a node or more short, and the round after it finished
        them: 8 of 35 replies carried 1.10x of `pinned:32`'s 1.11x lead over `adaspark`; with
        the credit `adaspark` ran 1.10x on those chats, even on pastes and on this CPU
        (docs/design.md, Deviations). In ratio mode (no rate yet) the scores are left as they are."""
        e = self.chooser.expected_tokens
        e_end = e(ends_at, s_d, s_n, gains)
        narrow = sorted(scored)
        for n in narrow:
            if n >= ends_at:
                break
            tail = [scored[w].seconds for w in narrow if w >= ends_at - n]  # D + T: the narrowest that holds the tail
            if not tail:
                continue
            sc = scored[n]
            q_n = e(n + 1, s_d, s_n, gains) - sc.tokens  # sc: E(n) as scored, not yet credited
            tokens = e_end - rho * q_n * tail[0]  # E(n) + (E(end) - E(n)), less the round that ends the chain
            scored[n] = Scored(n, tokens, sc.seconds, tokens - rho * sc.seconds)

    def _optimistic(
        self, a: int, n: int, scored: dict[int, Scored], s_d: list[float], s_n: list[float],
        gains: tuple[float, float, float, float], rho: float | None,
    ) -> Scored:
        """Width n scored at the price of its lower neighbour a: a width inside a class costs at
        least T(a) and accepts at most what n rows accept (§3.2)."""
        e = self.chooser.expected_tokens(n, s_d, s_n, gains)
        sec = scored[a].seconds  # D + T(a)
        return Scored(n, e, sec, e - rho * sec if rho is not None else e / max(sec, 1e-12))

    def _recheck(
        self, available: int, scored: dict[int, Scored], s_d: list[float], s_n: list[float],
        gains: tuple[float, float, float, float], rho: float | None,
    ) -> int | None:
        """The narrowest width in doubt (``VerifyCostModel.in_doubt``: priced at a time a verify of
        its rows cannot take) this round's tree fills and could win at, at the lower bound a cold
        width is measured at (``_cold_could_win``); None most rounds (no width is in doubt)."""
        doubt = self.cost.in_doubt()
        if not doubt:
            return None
        return next((w for w in doubt if w <= available and self._cold_could_win(w, scored, s_d, s_n, gains, rho)),
                    None)

    def _cold_could_win(
        self, w: int, scored: dict[int, Scored], s_d: list[float], s_n: list[float],
        gains: tuple[float, float, float, float], rho: float | None,
    ) -> bool:
        """Whether a cold width is worth measuring in this round (a deviation from §3.2).

        The paper measures every ladder width unconditionally. On a CPU, where every row costs,
        three verifies each of 16, 32 and 64 rows cost about a hundred plain steps, and most rounds'
        trees could not use them. So a cold width is measured only in a round where it could win:
        at a lower bound on its price it must clear the switching margin against the best priced
        width, the split rule of §3.2 applied to the ladder. The bound is the roofline bound
        (``_roofline_bound``) while the nearest priced width below is narrow (under
        COLD_ALWAYS_BELOW rows), else that neighbour's price: with a drafter the first reply's
        trees (a fresh acceptance model, a drafter right on few rows) were measured at 4, 8 and
        16 rows while accepting nothing, since a lower neighbour's price alone lets any tree
        that promises a little more win. Width 1 is timed by plain steps (``wants_draft``). A
        narrow width never measured stays unoffered. A wide width (COLD_ALWAYS_BELOW rows and up)
        whose verify could cost more than COLD_RISK_STEPS plain steps is not measured here at
        all: it is offered at an upper bound on its price (``VerifyCostModel.at_bound``), so its
        first verify is a round that wins at its dearest, not a bet on a lower bound.
        """
        below = [a for a in scored if a < w and not self.cost.at_bound(a)]  # measured widths
        if w == 1 or not below:
            return True
        best = max(scored.values(), key=lambda x: x.score)
        alt = self._optimistic(below[-1], w, scored, s_d, s_n, gains, rho)
        narrow = [a for a in below if a < COLD_ALWAYS_BELOW]
        if len(narrow) >= 2 and below[-1] == narrow[-1]:
            # nearest priced width below is narrow: the roofline of the narrow widths bounds it
            alt = self._roofline_bound(alt, narrow[-2], narrow[-1], scored, rho)
        return self.chooser.beats(alt, best, rho is not None) > 0.0

    @staticmethod
    def _roofline_bound(alt: Scored, a2: int, a: int, scored: dict[int, Scored], rho: float | None) -> Scored:
        """A narrow cold width n = alt.width priced at a tighter lower bound than T(a).

        Below the compute roof a verify's time rises about linearly in its rows once the
        weights are streamed (one-row step: memory bound; issue 19's tables: 2-row to 64-row
        verifies rise 0.52-0.66 one-row steps per row), so T(n) >= T(a) + s (n - a) with s the
        slope between the two widest priced widths below. Half of it (ROOFLINE_SLOPE_SHARE)
        keeps the bound below a curve that flattens (a tiled kernel). The slope is taken between
        narrow widths only and used only while the nearest priced width below is narrow: wide
        classes may cost less than narrower ones (Proposition 2), where a slope between them
        would overprice the wider. On a concave curve (a routed mixture-of-experts target) the
        1->2 slope over-reaches 16 rows (by 25% on tests/learn_sim.routed): there a wide width
        waits until a wider narrow one is priced. On the bundled model with the drafter a 16-row cold width
        priced at 2 rows' price (the old bound) was measured on a 15-row drafter tree that
        accepted nothing (36 ms for one token).
        """
        slope = max(0.0, (scored[a].seconds - scored[a2].seconds) / (a - a2))
        sec = alt.seconds + ROOFLINE_SLOPE_SHARE * slope * (alt.width - a)
        e = alt.tokens
        return Scored(alt.width, e, sec, e - rho * sec if rho is not None else e / max(sec, 1e-12))

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
            below = [a for a in scored if a < w and not self.cost.at_bound(a)]  # measured widths
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
        use_drafter: bool = False,
        defer: Callable[[Callable[[], None]], None] | None = None,
    ) -> None:
        """Learn from a verified round (Algorithm 1 lines 15-16).

        q_order[i], src_order[i] (0 drafter, 1 n-gram), accepted_order[i] describe the placed
        nodes in best-first order; the verify had len(q_order) + 1 rows. The cost model does
        not learn from a request's first round, which runs cold. ``use_drafter``: the round ran
        the drafter's forward (its D goes to that kind's D clock).

        The rate and the draft gate price the round's D as the chooser did (the plan's D, the
        running mean of D of the round's kind): both sides of Eq. (7) on one D.

        ``defer``, where the forward overlaps the host: the rate, the gains and the draft gate
        learn when it says (during the next forward); the cost model learns now, so that the next
        round's plan counts this round's measurement.
        """
        rows = len(q_order) + 1
        last = self._last if self._last is not None and self._last[0] is plan else None
        if not first_round:
            self.cost.note_fixed(fixed_s, use_drafter)
            if rows == plan.width:
                self.cost.observe(rows, context, verify_s)
            elif rows < plan.width and plan.measured:
                self.cost.note_short(plan.width, rows, self.max_rows)  # does not count; teaches reach
            elif rows in self.cost.classes and self.cost.classes[rows].priced:
                self.cost.observe(rows, context, verify_s)
        self.max_rows = max(self.max_rows, rows)
        d_priced = last[4] if last is not None and last[4] > 0.0 else fixed_s
        narrowest = last[3] if last is not None else 1
        # the round's gate now: the probe class it is kept under is this round's
        gate = self._gate(context) if last is not None and last[1] is not None and last[2] is not None else None

        def outcome() -> None:
            if not plan.measured:
                t_priced = plan.predicted_verify_s if rows == plan.width else None
                priced = None if t_priced is None else d_priced + t_priced
                self.rate.observe(context, committed, fixed_s + verify_s, priced)
            self.gains.fade()
            self.gains.observe_round(context, narrowest, q_order, src_order, accepted_order)
            if gate is not None:
                gate.observe(last[1], last[2] * d_priced)

        if defer is not None:
            defer(outcome)
        else:
            outcome()

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

    def plain_price(self, context: int) -> float:
        """A plain one-row step's priced seconds at ``context``: width 1's own class, which the
        offered prices (``price_table``) may pull down to a cheaper wider class's (the gate's
        rate before the band's, and the panel's "plain")."""
        return self.cost.raw_price(1, context)

    def plain_measured_near(self, context: int) -> bool:
        """Whether the plain step's price at ``context`` rests on plain steps timed near it
        (``VerifyCostModel.measured_near``), not on the law's clamped extrapolation."""
        return self.cost.measured_near(1, context)

    def cold_start_progress(self) -> tuple[int, int]:
        """(widths priced: measured as often as RowClass.needed, widths learned)."""
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

    def load_state(self, state: dict, where: str = "scheduler") -> None:
        """Restore from ``state_dict``; StateError (naming the field) on a state of another
        version or a malformed one, and then nothing is changed. The previous layout (version 1,
        b9fbe7f) loads through ``learn.learned_state.migrate``."""
        s = versioned(state, where, STATE_VERSION, ("cost", "chooser", "gains", "rate", "gates", "drafter_gates",
                                                    "last_band", "max_rows", "stall"))
        cost = VerifyCostModel(max_width=self.cost.max_width)
        cost.load_state(s["cost"], f"{where}.cost")
        chooser = WidthChooser()
        chooser.load_state(s["chooser"], f"{where}.chooser")
        gains = Gains()
        gains.load_state(s["gains"], f"{where}.gains")
        rate = LongRunRate()
        rate.load_state(s["rate"], f"{where}.rate")
        gates = {}
        for name, make in (("gates", DraftGate), ("drafter_gates", DrafterGate)):
            gates[name] = {}
            for i, entry in enumerate(sequence(s[name], f"{where}.{name}")):
                at = f"{where}.{name}[{i}]"
                b, p, gs = sequence(entry, at, 3)  # [context band, probe class, gate state]
                key = (integer(b, f"{at}[0]", hi=64), integer(p, f"{at}[1]", hi=PROBE_MAX))
                if key in gates[name]:
                    raise StateError(f"{at}: repeats band {key[0]}, probe class {key[1]}")
                gate = gates[name][key] = make()
                gate.load_state(gs, f"{at}[2]")
        last_band = optional(integer, s["last_band"], f"{where}.last_band", hi=64)
        max_rows = integer(s["max_rows"], f"{where}.max_rows")
        stall = integer(s["stall"], f"{where}.stall")
        self.cost, self.chooser, self.gains, self.rate = cost, chooser, gains, rate
        self.gates, self.drafter_gates = gates["gates"], gates["drafter_gates"]
        self.last_band, self.max_rows, self.stall = last_band, max_rows, stall
        self._last = None
