"""Online verify-cost model of §3.2: learned width table, context law, level, D clock.

A verify of ``n`` rows costs T(n, c) (Eq. 2); the model learns it while serving, per row class
(an interval of the learned width table, priced at its top width) and as a function of context:

    price_k(c) = law_k(c) * level_k * D_now / D_k                                  (Eq. 5)

``law_k`` is the tau-quantile fit of Eq. (4) (``QuantileLaw``): FTRL-Proximal online, and at
the end of each request a batch refit on the sample bank, solved exactly and kept only if it
prices the held-out samples better. ``level_k`` is the minimum of measured/law over the class's
last verifies, and the last factor the D clock. Widths are priced at the cheapest class whose
top is at least that width (Proposition 2). Pure: takes observations, returns numbers; no I/O
and no timing.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from typing import Callable

from .law import QuantileLaw, basis
from .state import (
    StateError,
    boolean,
    fields,
    integer,
    integers,
    number,
    optional,
    seconds,
    sequence,
    text,
    unique,
    versioned,
)
from .constants import (
    COLD_ALWAYS_BELOW,
    COLD_RISK_STEPS,
    CONDITIONAL_MEASUREMENTS,
    DOUBT_SLACK,
    FIXED_EMA_WEIGHT,
    LADDER,
    NEAR_FACTOR,
    LEVEL_CLAMP,
    LEVEL_WINDOW,
    MAX_WIDTH,
    MAX_WIDTHS,
    MEASUREMENTS_BEFORE_PRICED,
    STEEP_RISE,
    REACH_PATIENCE,
    SPLIT_PATIENCE,
)

STATE_VERSION = 1  # of state_dict's layout (learn/state.py)


class RowClass:
    """One learned width (the top of its class): law, level window, measurement count, D_k.

    ``origin`` is how the width entered the table: the starting ``ladder``, the ``reach`` of the
    drafter's trees, or a ``split``; ``born`` the round count when it did.
    """

    def __init__(self, width: int, origin: str = "ladder", born: int = 0) -> None:
        self.width = int(width)
        self.origin = origin
        self.born = int(born)
        self.law = QuantileLaw()
        self.count = 0  # counted measurements (full tree, not a request's first round)
        self.recent: deque[tuple[int, float]] = deque(maxlen=LEVEL_WINDOW)
        self.d_clock = 0.0  # D clock when last measured (0: unknown)
        self.d_drafter = False  # ... of the rounds with the drafter (True) or without it: its kind
        self.level = 1.0

    @property
    def conditional(self) -> bool:
        """Verified only in rounds where it could or did win, so priced after
        CONDITIONAL_MEASUREMENTS: every width but the plain step. A split is measured where it
        could win (scheduler._split_to_measure), a narrow ladder or reach width likewise at a
        lower bound on its price (scheduler._cold_could_win), and a ladder width of
        COLD_ALWAYS_BELOW rows or more first where it wins at an upper bound
        (``VerifyCostModel.at_bound``). Width 1 is timed by plain steps, for free."""
        return self.width > 1

    @property
    def needed(self) -> int:
        """Measurements before the width is offered: §3.2's three for the plain step, and
        CONDITIONAL_MEASUREMENTS (a deviation) for a conditional width: each of its measurements
        is a verify run only because it could win, and once offered every round verified at it
        goes on teaching its class. One sample prices it at that sample's time, which
        interference can only raise: the error leans toward narrower widths, never toward a
        width that costs more than priced. Narrow ladder widths kept the three until session 36:
        on an AMD EPYC (Zen 4) their nine cold rounds (2, 4 and 8 rows, three each) were most of
        the cold start, 2.9-6.7% of the first reply's decode time on the bundled model's chats
        and 14.5% on Qwen2.5-Coder-0.5B's, against 1.0-1.2% and 0.0% with one each
        (git show 982f0c2:benchmarks/results/real-targets/s36/README.md)."""
        return CONDITIONAL_MEASUREMENTS if self.conditional else MEASUREMENTS_BEFORE_PRICED

    @property
    def priced(self) -> bool:
        """Measured enough to be offered (``needed``; read a few dozen times a round: inlined)."""
        return self.count >= (CONDITIONAL_MEASUREMENTS if self.width > 1 else MEASUREMENTS_BEFORE_PRICED)

    def observe(self, context: int, seconds: float, d_clock: float, d_drafter: bool = False) -> None:
        self.count += 1
        self.law.observe(context, seconds)
        self.recent.append((int(context), float(seconds)))
        self.d_clock = d_clock
        self.d_drafter = bool(d_drafter)
        self.update_level()

    def update_level(self) -> None:
        """level = min over the last LEVEL_WINDOW verifies of measured / law, clamped (Eq. 5)."""
        if not self.law.ready or not self.recent:
            self.level = 1.0
            return
        lv = min(t / self.law.seconds(c) for c, t in self.recent)
        self.level = min(max(lv, LEVEL_CLAMP[0]), LEVEL_CLAMP[1])

    def price(self, context: int, d_now: float, phi: tuple[float, ...] | None = None) -> float:
        """Eq. (5): law x level x D_now / D_k; before the law exists, lowest time x D clock.
        ``phi``: ``basis(context)``, where the caller prices many classes at one context."""
        clock = d_now / self.d_clock if d_now > 0.0 and self.d_clock > 0.0 else 1.0
        clock = min(max(clock, LEVEL_CLAMP[0]), LEVEL_CLAMP[1])
        if not self.law.ready:
            return self.law.lowest * clock
        return self.law.seconds(context, phi) * self.level * clock

    def state_dict(self) -> dict:
        return {
            "width": self.width,
            "origin": self.origin,
            "born": self.born,
            "law": self.law.state_dict(),
            "count": int(self.count),
            "recent": [[int(c), float(t)] for c, t in self.recent],
            "d_clock": float(self.d_clock),
            "d_drafter": bool(self.d_drafter),
        }

    def load_state(self, state: dict, where: str = "class") -> None:
        """Restore from ``state_dict``; StateError on a malformed state, nothing changed then."""
        s = fields(state, where, ("width", "origin", "born", "law", "count", "recent", "d_clock"), ("d_drafter",))
        width = integer(s["width"], f"{where}.width", lo=1)
        origin = text(s["origin"], f"{where}.origin", ("ladder", "reach", "split"))
        born = integer(s["born"], f"{where}.born")
        law = QuantileLaw()
        law.load_state(s["law"], f"{where}.law")
        count = integer(s["count"], f"{where}.count", hi=law.samples)  # each measurement is a sample
        recent = []
        for i, entry in enumerate(sequence(s["recent"], f"{where}.recent")):
            c, t = sequence(entry, f"{where}.recent[{i}]", 2)
            recent.append((integer(c, f"{where}.recent[{i}][0]"), seconds(t, f"{where}.recent[{i}][1]")))
        d_clock = number(s["d_clock"], f"{where}.d_clock", lo=0.0)  # 0: unknown
        d_drafter = boolean(s.get("d_drafter", False), f"{where}.d_drafter")  # older states: one mixed clock
        self.width, self.origin, self.born, self.law, self.count = width, origin, born, law, count
        self.recent = deque(recent, maxlen=LEVEL_WINDOW)  # a longer window kept its newest
        self.d_clock, self.d_drafter = d_clock, d_drafter
        self.update_level()


# could_win(a, b) -> excess: how far b-1 rows at T(a) beat the held width by the margin (> 0: could win)
CouldWin = Callable[[int, int], float]


class VerifyCostModel:
    """The learned width table of §3.2: classes, cold start, reach, splits, Proposition 2 prices."""

    def __init__(self, ladder: tuple[int, ...] = LADDER, max_width: int = MAX_WIDTH) -> None:
        self.max_width = int(max_width)
        self.classes: dict[int, RowClass] = {w: RowClass(w) for w in sorted(set(ladder)) if 1 <= w <= max_width}
        self.reach: int | None = None  # widest tree the drafter can offer, once learned
        self.max_available = 0  # widest tree any round offered
        self.rounds_seen = 0
        self.short: dict[int, int] = {}  # measurement rounds whose tree came out narrower
        # The D clock, one window per kind of drafted round: with the drafter's forward D is
        # several times D without it, so a window mixing both would swing its minimum with the
        # mix of rounds, not with the machine. Each class is priced by the clock of its kind.
        self.d_windows: dict[bool, deque[float]] = {False: deque(maxlen=LEVEL_WINDOW),
                                                    True: deque(maxlen=LEVEL_WINDOW)}
        self.last_drafter = False  # kind of the latest drafted round: the clock its verify is measured on
        # Whether the clock of rounds without the drafter scales verify prices. On the CPU the verify
        # and the round's host work share the cores, so D follows the machine's speed. On a GPU
        # (the decoder sets this from LlamaBackend.forward_overlaps each request) D without the
        # drafter is host time alone, which says nothing of the device's speed and grows with the
        # tree: scaled by it, a class measured beside small trees was priced up to 2x its time
        # beside large ones. There the level alone follows the device. Not persisted.
        self.host_clock = True
        # D's running mean per kind of drafted round (``note_round``): what prices the next round's D
        # in Eq. (7) before it is timed. Not persisted: a load starts it afresh.
        self.d_mean: dict[bool, float] = {}
        self._widths: list[int] = []
        self._widths_stale = True
        self._pending: list[int] | None = None  # cache of pending(); reset when a count changes
        self._bounded: frozenset[int] = frozenset()  # at_bound's widths, computed with pending()
        self._cold: list[int] = []  # cold_pending(), split_pending(), measurable_pending(): likewise
        self._split: list[int] = []
        self._measurable: list[int] = []
        self._doubt: list[int] = []  # in_doubt(): likewise
        self._grew_at = 0  # rounds_seen when max_available last grew (not persisted: 0 on load)

    # --- the table -----------------------------------------------------------------------
    def widths(self) -> list[int]:
        """Learned widths within the reach, narrowest first."""
        if self._widths_stale:  # widths change only by a split, a reach or a dropped split
            lim = self.max_width if self.reach is None else min(self.reach, self.max_width)
            self._widths = [w for w in sorted(self.classes) if w <= lim]
            self._widths_stale = False
            self._pending = None
        return self._widths

    def pending(self) -> list[int]:
        """Widths not yet priced (fewer measurements than ``RowClass.needed``), narrowest first."""
        ws = self.widths()
        if self._pending is None:
            # which are at their bound changes only where pending does (a count, a width, a law's
            # lowest time): computed once here, not in each of a round's many at_bound calls
            pend = [w for w in ws if not self.classes[w].priced]
            self._pending = pend
            self._bounded = frozenset(w for w in pend if self._past_risk(w))
            # the lists the plan reads several times a round, kept with pending (read-only)
            self._cold = [w for w in pend if self.classes[w].origin != "split"]
            self._split = [w for w in pend if self.classes[w].origin == "split"]
            self._measurable = [w for w in self._cold if w not in self._bounded]
            self._doubt = self._doubted(ws)
        return self._pending

    def in_doubt(self) -> list[int]:
        """Priced widths whose lowest measured time is not one a verify of their rows can take,
        with fewer than LEVEL_WINDOW measurements: measured again in rounds where they could win
        (``scheduler._recheck``), narrowest first (a deviation from §3.2).

        A width is priced after one measurement, and interference only raises a time: a verify
        measured while another process had the cores was priced at that time, so the chooser never
        verified at it again, and the store kept the price for every later session. Width 2 of the
        bundled model, measured once at 520 ms while another process loaded models (a plain step
        took 12 ms), was priced at 290 ms and never verified again, and the cold widths 4 and 8,
        whose lower bound it was, were never measured. Two signs, each past DOUBT_SLACK: the time
        passes the proportional bound T(a) n / a of a narrower priced width a (``prices``: a
        verify's time rises at most in proportion to its rows), or a wider priced width's lowest
        time (the slack: this CPU's kernels tile rows by 4 and 8, so 3 and 5 rows cost up to 16%
        more than 4 and 8 did). On a GPU, where a kernel switch can make a narrower batch dearer
        by more, the rechecks end when the class's level window is full."""
        self.pending()
        return self._doubt

    def _doubted(self, ws: list[int]) -> list[int]:
        priced = [(w, self.classes[w].law.lowest) for w in ws if self.classes[w].priced]
        out: list[int] = []
        for i, (w, low) in enumerate(priced):
            if w == 1 or self.classes[w].count >= LEVEL_WINDOW:
                continue
            if (any(low > DOUBT_SLACK * t_a * w / a for a, t_a in priced[:i])
                    or any(low > DOUBT_SLACK * t_b for _, t_b in priced[i + 1:])):
                out.append(w)
        return out

    def cold_pending(self) -> list[int]:
        """Unmeasured ladder and reach widths: measured unconditionally, narrowest first."""
        self.pending()
        return self._cold

    def measured_near(self, width: int, context: int) -> bool:
        """Whether ``width`` has been verified at a context of at least ``context`` / NEAR_FACTOR.
        Past that its price is the law's extrapolation, clamped to LAW_CLAMP of its lowest time
        (§3.2): on a 2-core Xeon the bundled model's plain step at 5,000-7,600 tokens took 15.9-16.7
        ms, 3.4 times its time at a short context, and was priced at 8.3-9.2 ms, the clamp."""
        cls = self.classes.get(width)
        return cls is not None and cls.priced and context <= NEAR_FACTOR * cls.law.context_hi

    def split_pending(self) -> list[int]:
        """Unmeasured split widths: measured in rounds where they could win."""
        self.pending()
        return self._split

    def at_bound(self, width: int) -> bool:
        """An unpriced ladder or reach width of COLD_ALWAYS_BELOW rows or more whose cold verify
        could cost more than COLD_RISK_STEPS plain steps: never run as a cold measurement, offered
        instead at an upper bound on its price (``prices(bounds=True)``) and measured by the
        rounds the chooser verifies at it. Where the bound is within COLD_RISK_STEPS (a machine on
        which rows are nearly free, and a wide class may even cost less than a narrower one,
        Proposition 2) it is measured where it could win, as narrow widths are."""
        self.pending()  # refreshes _bounded if a count or a width changed
        return width in self._bounded

    def bounded_among(self, widths: Iterable[int]) -> frozenset[int]:
        """The widths among ``widths`` that are at their bound (``at_bound``), in one set operation."""
        self.pending()
        return self._bounded.intersection(widths)

    def _past_risk(self, width: int) -> bool:
        """at_bound's rule for one unpriced width (pending() caches it)."""
        c = self.classes[width]
        return (c.origin in ("ladder", "reach") and c.width >= COLD_ALWAYS_BELOW
                and self.bound_steps(width) > COLD_RISK_STEPS)

    def bound_steps(self, width: int) -> float:
        """The upper bound min over priced a < n of T(a) n / a, over the plain step's price, from
        their lowest measured times; inf while either is unknown."""
        one = self.classes.get(1)
        below = [w for w in self.widths() if w < width and self.classes[w].priced]
        if one is None or not one.priced or not below or not 0.0 < one.law.lowest < math.inf:
            return math.inf
        return min(self.classes[a].law.lowest * width / a for a in below) / one.law.lowest

    def measurable_pending(self) -> list[int]:
        """Cold pending widths that a cold measurement round may run (not at a bound)."""
        self.pending()
        return self._measurable

    def is_priced(self, width: int) -> bool:
        c = self.classes.get(width)
        return c is not None and c.priced and width in self.widths()

    def d_clock(self, drafter: bool | None = None) -> float:
        """The D clock: lowest fixed cost D over the last LEVEL_WINDOW drafted rounds of one kind,
        with the drafter or without it (None: the latest round's kind); 0: unknown."""
        w = self.d_windows[self.last_drafter if drafter is None else bool(drafter)]
        return min(w) if w else 0.0

    def note_fixed(self, fixed_s: float, drafter: bool = False) -> None:
        """Fold a drafted round's fixed cost D into its kind's clock (not a request's first round)."""
        self.last_drafter = bool(drafter)
        if fixed_s > 0.0:
            self.d_windows[self.last_drafter].append(float(fixed_s))

    def note_round(self, fixed_s: float, drafter: bool) -> None:
        """Fold any drafted round's D (a request's first round too) into the running mean of its
        kind, weight FIXED_EMA_WEIGHT for the newest: the D a round is priced with before it is
        timed (``fixed_estimate``). The D clock (``note_fixed``, ``d_clock``) is the other view of D:
        a window's minimum, the level Eq. (5) scales verify times by."""
        old = self.d_mean.get(drafter)
        self.d_mean[drafter] = fixed_s if old is None else (1 - FIXED_EMA_WEIGHT) * old + FIXED_EMA_WEIGHT * fixed_s

    def fixed_estimate(self, drafter: bool) -> float | None:
        """D's running mean for a drafted round with (or without) the drafter's forward; None until
        one such round ran."""
        return self.d_mean.get(drafter)

    def _clock_for(self, cls: RowClass) -> float:
        """D now on the clock the class was measured on (Eq. 5's D_now / D_k of one kind); 0 (no
        clock: ``RowClass.price`` scales by 1) for rounds without the drafter where D is the host's
        alone (``host_clock`` False)."""
        if not cls.d_drafter and not self.host_clock:
            return 0.0
        return self.d_clock(cls.d_drafter)

    def _set_reach(self, reach: int) -> None:
        self.reach = max(1, int(reach))
        self._widths_stale = True
        if self.reach not in self.classes and len(self.widths()) < MAX_WIDTHS:
            self.classes[self.reach] = RowClass(self.reach, "reach", self.rounds_seen)
            self._widths_stale = True

    def next_measurement(self, available: int) -> int | None:
        """Cold start (§3.2): the narrowest unpriced width (``RowClass.needed``) this round's tree fills.

        ``available`` is the widest verify this round's candidates allow. A pending width wider
        than every tree seen so far teaches the table its reach (REACH_PATIENCE rounds after the
        widest tree last grew); a pending width this round cannot fill waits for a round that
        can, and one at its bound (``at_bound``) for a round that wins at it.
        """
        self.rounds_seen += 1
        for w in self.split_pending():
            if self.rounds_seen - self.classes[w].born > SPLIT_PATIENCE:
                del self.classes[w]  # never could win: merge the class back
                self._widths_stale = True
        if available > self.max_available:
            self.max_available = int(available)
            self._grew_at = self.rounds_seen  # the reach's patience counts from the widest tree
            if self.reach is not None and available > self.reach:
                self.reach = None  # the drafter offered more than the reach: learn it again
                self._widths_stale = True
        for _ in range(2):
            # a width at its bound that some tree could fill waits for a round that wins at it
            pend = [w for w in self.cold_pending() if not (w <= self.max_available and self.at_bound(w))]
            if not pend:
                return None
            w = pend[0]
            if w <= available:
                return None if self.at_bound(w) else w
            if w > self.max_available and self.rounds_seen - self._grew_at >= REACH_PATIENCE:
                self._set_reach(self.max_available)
                continue
            return None
        return None

    def note_short(self, width: int, rows: int, widest_rows: int) -> None:
        """A measurement round whose tree came out narrower than the width it measures."""
        self.short[width] = self.short.get(width, 0) + 1
        if self.short[width] >= MEASUREMENTS_BEFORE_PRICED and width > widest_rows:
            self._set_reach(widest_rows)

    # --- learning ------------------------------------------------------------------------
    def observe(self, width: int, context: int, verify_s: float) -> None:
        """Fold a counted verify of exactly ``width`` rows at ``context`` into its class."""
        cls = self.classes.get(width)
        if cls is None or verify_s <= 0.0:
            return
        was_priced, lowest = cls.priced, cls.law.lowest
        cls.observe(context, verify_s, self.d_clock(), self.last_drafter)
        if not was_priced or cls.law.lowest != lowest or width in self._doubt:
            # pending(), at_bound() and in_doubt() read the counts of unpriced and doubted classes
            # and the lowest times (bound_steps): a priced class's verify that set no new lowest
            # changes none, and most rounds' verifies are such (recomputing them cost ~30 us a
            # round, cold)
            self._pending = None

    def end_request(self) -> int:
        """Batch refit of every law that learned this request; returns how many were replaced."""
        replaced = 0
        for cls in self.classes.values():
            if cls.law.refit():
                replaced += 1
                cls.update_level()
        return replaced

    # --- pricing -------------------------------------------------------------------------
    def raw_price(self, width: int, context: int) -> float:
        """Eq. (5) for the class whose top is ``width``."""
        cls = self.classes[width]
        return cls.price(context, self._clock_for(cls))

    def prices(self, context: int, limit: int | None = None, bounds: bool = False) -> dict[int, float]:
        """Offered widths -> priced seconds at ``context`` (Proposition 2).

        ``bounds``: also offer the unmeasured wide ladder widths (``at_bound``), each at an upper
        bound on its price, the least T(a) n / a over the narrower priced widths a (a deviation from
        §3.2, which measures every ladder width unconditionally). A verify's time is a fixed part
        (the weights streamed once) plus a part that grows with its rows, so it rises at most in
        proportion to the rows. On these machines' curves (issue 19's tables) the bound is 0-25%
        above the measured price, and SmolLM2's attention-bound 32 -> 64 rows overran it by 3%.
        Priced at the bound, a wide width is verified only where it wins even at its dearest; a
        measurement at a lower bound spent up to 11 plain steps on a 63-node chain that accepted
        one token (Qwen2.5-Coder-0.5B, one cold 64-row round: most of a fresh store's cold start).

        Each priced width up to ``limit`` is priced at the cheapest class whose top is at least
        that width: a cheaper wide class pulls the narrower, dearer one down to its price, and
        a narrower class never raises a wider one (no running maximum).

        Past the contexts a class has been measured at, its law's slope is a guess; there its
        price is at least its price at its highest measured context plus what the nearest
        narrower class gains over the same stretch (a class measured this far out, or one whose
        contexts span a factor of two, so its law has a fitted slope): every row attends over
        the context, so a verify of more rows gains at least as much time per token.
        """
        raw: list[tuple[int, float]] = []
        ref: RowClass | None = None  # widest narrower class measured at this context or beyond
        clocks = (self.d_clock(False) if self.host_clock else 0.0, self.d_clock(True))  # _clock_for, by kind
        phi = basis(context)
        for w in self.widths():
            if limit is not None and w > limit:
                break
            cls = self.classes[w]
            if not cls.priced:
                if bounds and raw and self.at_bound(w):
                    raw.append((w, min(p_a * w / a for a, p_a in raw)))
                continue
            d_now = clocks[cls.d_drafter]
            p = cls.price(context, d_now, phi)
            hi = cls.law.context_hi
            if context > hi and ref is not None:
                d_ref = clocks[ref.d_drafter]
                inc = ref.price(context, d_ref) - ref.price(hi, d_ref)
                p = max(p, cls.price(hi, d_now) + inc)
            if context <= hi or hi >= 2 * cls.law.context_lo:  # measured here, or has a fitted slope
                ref = cls
            raw.append((w, p))
        out: list[tuple[int, float]] = []
        best = math.inf
        for w, p in reversed(raw):  # raw is narrowest first
            best = min(best, p)
            out.append((w, best))
        out.reverse()
        return dict(out)

    # --- splits --------------------------------------------------------------------------
    def split(self, held: int, context: int, could_win: CouldWin) -> int | None:
        """Split the nearest class (a, b] where a width inside could change the choice (§3.2).

        Between priced neighbours a < b a width inside costs at least T(a) and accepts at most
        what b-1 rows accept; ``could_win(a, b)`` says by how much that bound beats the held
        width by the switching margin. Split next to the held width when the class's top costs
        more than STEEP_RISE above its bottom, else at its midpoint. Returns the new width.
        """
        if len(self.widths()) >= MAX_WIDTHS or self.split_pending():
            return None
        # a cold width waiting for a round where it could win is not a neighbour yet
        ws = [w for w in self.widths() if self.classes[w].priced]
        best: tuple[int, float, int, int] | None = None
        for a, b in zip(ws, ws[1:]):
            if b - a < 2:
                continue
            excess = could_win(a, b)
            if excess <= 0.0:
                continue
            dist = a - held if held <= a else held - b
            key = (dist, -excess, a, b)
            if best is None or key < best:
                best = key
        if best is None:
            return None
        _, _, a, b = best
        steep = self.raw_price(b, context) > (1.0 + STEEP_RISE) * self.raw_price(a, context)
        if steep:
            new = a + 1 if held <= a else b - 1
        else:
            new = (a + b) // 2
        self.classes[new] = RowClass(new, "split", self.rounds_seen)
        self._widths_stale = True
        return new

    # --- persistence ---------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {
            "version": STATE_VERSION,
            "max_width": self.max_width,
            "classes": [self.classes[w].state_dict() for w in sorted(self.classes)],
            "reach": self.reach,
            "max_available": int(self.max_available),
            "rounds_seen": int(self.rounds_seen),
            "short": [[int(w), int(k)] for w, k in sorted(self.short.items())],
            "d_window": [float(d) for d in self.d_windows[False]],
            "d_window_drafter": [float(d) for d in self.d_windows[True]],
            "last_drafter": bool(self.last_drafter),
        }

    def load_state(self, state: dict, where: str = "cost") -> None:
        """Restore from ``state_dict``; StateError (naming the field) on a state of another
        version or a malformed one, and then nothing is changed."""
        s = versioned(state, where, STATE_VERSION, ("max_width", "classes", "reach", "max_available",
                                                    "rounds_seen", "short", "d_window"),
                      ("d_window_drafter", "last_drafter"))  # absent in states written before the per-kind clock
        max_width = integer(s["max_width"], f"{where}.max_width", lo=1)
        classes: dict[int, RowClass] = {}
        for i, cs in enumerate(sequence(s["classes"], f"{where}.classes")):
            cls = RowClass(1)
            cls.load_state(cs, f"{where}.classes[{i}]")
            if cls.width in classes:
                raise StateError(f"{where}.classes[{i}]: repeats width {cls.width}")
            classes[cls.width] = cls
        reach = optional(integer, s["reach"], f"{where}.reach", lo=1)
        max_available = integer(s["max_available"], f"{where}.max_available")
        rounds_seen = integer(s["rounds_seen"], f"{where}.rounds_seen")
        short_list = [integers(e, f"{where}.short[{i}]", 2) for i, e in enumerate(sequence(s["short"], f"{where}.short"))]
        unique([w for w, _ in short_list], f"{where}.short")
        windows = {}
        for key, kind in (("d_window", False), ("d_window_drafter", True)):
            windows[kind] = [seconds(d, f"{where}.{key}[{i}]")
                             for i, d in enumerate(sequence(s.get(key, []), f"{where}.{key}"))]
        last_drafter = boolean(s.get("last_drafter", False), f"{where}.last_drafter")
        self.max_width, self.classes, self.reach = max_width, classes, reach
        self.max_available, self.rounds_seen = max_available, rounds_seen
        self.short = {w: k for w, k in short_list}
        self.d_windows = {k: deque(v, maxlen=LEVEL_WINDOW) for k, v in windows.items()}
        self.last_drafter = last_drafter
        self._widths_stale = True
        self._pending = None
