"""Long-run decode rate rho_m of a context band (§3.4 i, Proposition 5).

Committed tokens over time, both decayed with a half-life of RATE_HALF_LIFE rounds of the band:
a stochastic form of Dinkelbach's iteration, the rate the rule achieves is the price of time it
uses next. A band is the set of contexts with the same bit length; until a band holds
BAND_MIN_ROUNDS rounds its rate is unknown and the chooser uses the per-round ratio.

Two clocks are kept. ``achieved`` divides by measured round time. ``rate`` - the price of time in
Eq. (7) - divides by each round's *priced* time (D clock + the cost model's price of the verify
it ran): the cost model prices a low quantile (Proposition 3), free of interference, so a rate
over measured time would price that interference-free time at an interference-depressed rate
and buy rows (and drafts) that do not pay. Both sides of Eq. (7) then run on one clock.
"""

from __future__ import annotations

from .constants import BAND_MIN_ROUNDS, RATE_HALF_LIFE
from .law import context_band
from .state import integer, numbers, sequence, unique, versioned

_DECAY = 0.5 ** (1.0 / RATE_HALF_LIFE)
STATE_VERSION = 1  # of state_dict's layout (learn/state.py)


class LongRunRate:
    """Decayed tokens / decayed seconds per context band."""

    def __init__(self) -> None:
        self.bands: dict[int, list[float]] = {}  # band -> [tokens, measured s, priced s, rounds]

    def observe(self, context: int, tokens: float, seconds: float, priced_seconds: float | None = None) -> None:
        """One round: committed tokens, measured time, and its priced time (None: use measured)."""
        if seconds <= 0.0:
            return
        priced = seconds if priced_seconds is None or priced_seconds <= 0.0 else priced_seconds
        b = self.bands.setdefault(context_band(context), [0.0, 0.0, 0.0, 0.0])
        b[0] = b[0] * _DECAY + float(tokens)
        b[1] = b[1] * _DECAY + float(seconds)
        b[2] = b[2] * _DECAY + float(priced)
        b[3] += 1

    def rounds(self, context: int) -> int:
        b = self.bands.get(context_band(context))
        return 0 if b is None else int(b[3])

    def rate(self, context: int) -> float | None:
        """rho_m of Eq. (7) in tokens per priced second, or None until the band holds 8 rounds."""
        b = self.bands.get(context_band(context))
        if b is None or b[3] < BAND_MIN_ROUNDS or b[2] <= 0.0:
            return None
        return b[0] / b[2]

    def achieved(self, context: int) -> float | None:
        """The band's achieved decode rate in tokens per measured second."""
        b = self.bands.get(context_band(context))
        if b is None or b[3] < BAND_MIN_ROUNDS or b[1] <= 0.0:
            return None
        return b[0] / b[1]

    def state_dict(self) -> dict:
        return {"version": STATE_VERSION,
                "bands": [[int(k), [float(v) for v in self.bands[k]]] for k in sorted(self.bands)]}

    def load_state(self, state: dict, where: str = "rate") -> None:
        """Restore from ``state_dict``; StateError (naming the field) on a state of another
        version or a malformed one, and then nothing is changed."""
        s = versioned(state, where, STATE_VERSION, ("bands",))
        bands = []
        for i, entry in enumerate(sequence(s["bands"], f"{where}.bands")):
            k, vals = sequence(entry, f"{where}.bands[{i}]", 2)
            # [tokens, measured s, priced s, rounds]: decayed sums, never negative
            bands.append((integer(k, f"{where}.bands[{i}][0]", hi=64), numbers(vals, f"{where}.bands[{i}][1]", 4, lo=0.0)))
        unique([k for k, _ in bands], f"{where}.bands")
        self.bands = dict(bands)
