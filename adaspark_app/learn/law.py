"""The context law of one row class (§3.2, Eq. (4)): a verify's time as a function of context.

``law_k(c)`` is the tau-quantile fit over the basis phi(u) = [1, u, u^2, sqrt(u), ln(1+u)], u =
c / 8192: FTRL-Proximal online (``_Ftrl``), and at the end of each request a batch refit on the
sample bank (``fit_quantile``, solved exactly), kept only if it prices the held-out samples better
(``QuantileLaw.refit``). The cost model (``cost.py``) keeps one law per row class and scales it by
the class's level and the D clock (Eq. (5)). Pure: takes observations, returns numbers.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from .constants import (
    BANK_PER_BAND,
    CONTEXT_UNIT,
    FTRL_ALPHA,
    FTRL_BETA,
    HELDOUT_FRACTION,
    HELDOUT_SMALL_BAND,
    LAMBDA1,
    LAMBDA2,
    LAW_CLAMP,
    REFIT_EPS,
    REFIT_ITERATIONS,
    SAMPLES_BEFORE_LAW,
    SQGRAD_CAP,
    TAU_QUANTILE,
)
from .state import StateError, boolean, fields, integer, numbers, optional, seconds, sequence

N_BASIS = 5  # terms of the basis phi(u) of Eq. (4)


def context_band(context: int) -> int:
    """Context band of §3.2/§3.4: the bit length of the context (128-255 -> 8, 256-511 -> 9)."""
    return max(int(context), 0).bit_length()


@lru_cache(maxsize=512)
def basis(context: float) -> tuple[float, float, float, float, float]:
    """phi(u) = [1, u, u^2, sqrt(u), ln(1+u)] with u = c / 8192 (Eq. 4)."""
    u = max(float(context), 0.0) / CONTEXT_UNIT
    return (1.0, u, u * u, math.sqrt(u), math.log1p(u))


def quantile_loss(v: float, tau: float = TAU_QUANTILE) -> float:
    """Koenker-Bassett check loss l_tau(v) = v (tau - 1[v < 0]) of Eq. (4)."""
    return v * (tau - (1.0 if v < 0.0 else 0.0))


def fit_quantile(x: np.ndarray, y: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """Minimise sum_t weight_t l_tau(y_t - theta.x_t) + l1 |theta|_1 + l2 |theta|^2 (Eq. 4).

    Iteratively reweighted least squares: each l_tau(r) is replaced by its quadratic majoriser
    at the current residual; the L1 term likewise. The context coefficients theta[1:] are kept
    non-negative by an active set (the most negative one is pinned to zero and the system
    solved again). Five unknowns and at most a few hundred samples: well under a millisecond.
    """
    m, k = x.shape
    theta = np.zeros(k)
    free = np.ones(k, dtype=bool)
    for _ in range(REFIT_ITERATIONS):
        r = y - x @ theta
        wq = weight * np.where(r < 0.0, 1.0 - TAU_QUANTILE, TAU_QUANTILE) / np.maximum(np.abs(r), REFIT_EPS)
        xtw = x.T * wq
        a = xtw @ x + np.diag(2.0 * LAMBDA2 + LAMBDA1 / np.maximum(np.abs(theta), 1e-6))
        b = xtw @ y
        free[:] = True
        while True:
            idx = np.flatnonzero(free)
            sol = np.linalg.solve(a[np.ix_(idx, idx)], b[idx])
            new = np.zeros(k)
            new[idx] = sol
            neg = [i for i in idx if i > 0 and new[i] < 0.0]
            if not neg:
                break
            free[min(neg, key=lambda i: new[i])] = False
        if np.max(np.abs(new - theta)) < 1e-9:
            theta = new
            break
        theta = new
    return theta


class _Ftrl:
    """FTRL-Proximal on the tau-quantile loss with the elastic net of Eq. (4).

    Predicts the verify time over the class scale as ``1 + w . phi(u)``: the offset of one scale
    unit is where the law starts (the scale is the lowest of the first measured times), so the
    elastic net shrinks toward the class's scale rather than toward zero seconds. The context
    coefficients w[1:] are kept non-negative, so the law never falls as context grows. The
    accumulated squared gradient is capped (SQGRAD_CAP), which floors the learning rate so the
    law can follow a machine that drifts.
    """

    __slots__ = ("z", "n", "w")

    def __init__(self) -> None:
        self.z = [0.0] * N_BASIS
        self.n = [0.0] * N_BASIS
        self.w = [0.0] * N_BASIS

    def predict(self, phi: tuple[float, ...]) -> float:
        w = self.w
        return 1.0 + w[0] * phi[0] + w[1] * phi[1] + w[2] * phi[2] + w[3] * phi[3] + w[4] * phi[4]

    def step(self, phi: tuple[float, ...], y: float) -> None:
        """One FTRL-Proximal step on l_tau(y - prediction)."""
        coef = (1.0 if y < self.predict(phi) else 0.0) - TAU_QUANTILE  # d loss / d prediction
        z, n, w = self.z, self.n, self.w
        for i in range(N_BASIS):
            g = coef * phi[i]
            if g == 0.0:
                continue
            n_old = n[i]
            n_new = min(n_old + g * g, SQGRAD_CAP)
            sigma = (math.sqrt(n_new) - math.sqrt(n_old)) / FTRL_ALPHA
            z[i] += g - sigma * w[i]
            n[i] = n_new
            w[i] = self._weight(i)

    def _weight(self, i: int) -> float:
        zi = self.z[i]
        if abs(zi) <= LAMBDA1:
            return 0.0
        den = (FTRL_BETA + math.sqrt(self.n[i])) / FTRL_ALPHA + LAMBDA2
        wi = -(zi - math.copysign(LAMBDA1, zi)) / den
        return max(wi, 0.0) if i > 0 else wi

    def set_weights(self, w: list[float]) -> None:
        """Set the weights and the z that FTRL would need to produce them at the current n."""
        for i in range(N_BASIS):
            wi = max(w[i], 0.0) if i > 0 else w[i]
            den = (FTRL_BETA + math.sqrt(self.n[i])) / FTRL_ALPHA + LAMBDA2
            self.z[i] = 0.0 if wi == 0.0 else -wi * den - math.copysign(LAMBDA1, wi)
            # w read back from z, as load_state does: a reloaded law then prices bit for bit alike
            self.w[i] = self._weight(i)

    def state_dict(self) -> dict:
        return {"z": [float(v) for v in self.z], "n": [float(v) for v in self.n]}

    def load_state(self, state: dict, where: str = "ftrl") -> None:
        """Restore from ``state_dict``; StateError on a malformed state, nothing changed then."""
        s = fields(state, where, ("z", "n"))
        z = numbers(s["z"], f"{where}.z", N_BASIS)
        n = numbers(s["n"], f"{where}.n", N_BASIS, lo=0.0)  # square roots are taken of it
        self.z, self.n = z, n
        self.w = [self._weight(i) for i in range(N_BASIS)]


class QuantileLaw:
    """The context law of one row class: Eq. (4) online, plus the sample bank and batch refit.

    Times are regressed normalised by the class scale (the lowest of its first three measured
    times). The bank keeps the newest BANK_PER_BAND samples of every context band; at the end of
    a request ``refit`` trains a candidate on the bank (bands interleaved, the newest quarter of
    every band with >= 4 samples held out) and keeps it only if its quantile loss on the judged
    samples is lower than the online law's.
    """

    def __init__(self) -> None:
        self.ftrl = _Ftrl()
        self.first: list[float] = []  # first SAMPLES_BEFORE_LAW measured times
        self.scale: float | None = None
        self.lowest = math.inf
        self.samples = 0
        self.bank: dict[int, list[tuple[int, float]]] = {}
        self.dirty = False
        self.context_lo = 0  # lowest context sampled
        self.context_hi = 0  # highest context sampled

    @property
    def ready(self) -> bool:
        """A law is used for pricing once it has SAMPLES_BEFORE_LAW samples."""
        return self.scale is not None

    def seconds(self, context: float, phi: tuple[float, ...] | None = None) -> float:
        """law_k(c) in seconds, clamped to LAW_CLAMP times the class's lowest time (§3.2).

        Below the lowest context the law has samples at it is read flat: the context terms are
        non-negative, so the law never rises as context falls, but a fit on long contexts alone
        would extrapolate its intercept downward without evidence. ``phi``: ``basis(context)``,
        where the caller prices many classes at one context.
        """
        assert self.scale is not None
        if phi is None or context < self.context_lo:
            phi = basis(max(context, self.context_lo))
        t = self.scale * self.ftrl.predict(phi)
        lo, hi = LAW_CLAMP[0] * self.lowest, LAW_CLAMP[1] * self.lowest
        return hi if t > hi else lo if t < lo else t

    def observe(self, context: int, seconds: float) -> None:
        """Fold one measured verify time into the bank and the online law."""
        self.context_lo = int(context) if self.samples == 0 else min(self.context_lo, int(context))
        self.context_hi = max(self.context_hi, int(context))
        self.samples += 1
        self.lowest = min(self.lowest, seconds)
        band = self.bank.setdefault(context_band(context), [])
        band.append((int(context), float(seconds)))
        if len(band) > BANK_PER_BAND:
            del band[0]
        self.dirty = True
        if self.scale is None:
            self.first.append(float(seconds))
            if len(self.first) >= SAMPLES_BEFORE_LAW:
                self.scale = min(self.first)
                for b in sorted(self.bank):  # replay the samples seen before the scale was known
                    for c, t in self.bank[b]:
                        self.ftrl.step(basis(c), t / self.scale)
            return
        self.ftrl.step(basis(context), seconds / self.scale)

    def _split_bank(self) -> tuple[list[list[tuple[int, float]]], list[tuple[int, float]]]:
        train: list[list[tuple[int, float]]] = []
        judged: list[tuple[int, float]] = []
        for b in sorted(self.bank):
            samples = self.bank[b]
            if len(samples) < SAMPLES_BEFORE_LAW:  # too few to tell a verify from interference
                judged.extend(samples)
            elif len(samples) >= HELDOUT_SMALL_BAND:
                k = max(1, int(len(samples) * HELDOUT_FRACTION))
                train.append(samples[:-k])
                judged.extend(samples[-k:])
            else:  # too small to hold any out: train on it and judge on all of it
                train.append(list(samples))
                judged.extend(samples)
        return train, judged

    def _loss(self, ftrl: _Ftrl, samples: list[tuple[int, float]]) -> float:
        assert self.scale is not None
        return sum(quantile_loss(t / self.scale - ftrl.predict(basis(c))) for c, t in samples)

    def refit(self) -> bool:
        """End-of-request batch refit (§3.2). Returns True when the candidate replaced the law.

        The candidate minimises Eq. (4) on the training part of the bank, every band weighted
        alike (so a sparse bank counts as much as a full one), solved to convergence by
        ``fit_quantile``; it keeps the online law's accumulated squared gradients, so the law
        goes on learning online at the rate it had reached. A band trains the candidate only
        once it holds SAMPLES_BEFORE_LAW samples: with five basis terms an exact solve would
        pass through a lone interfered sample (Proposition 3 needs some free rounds to see).
        """
        if self.scale is None or not self.dirty:
            return False
        self.dirty = False
        train, judged = self._split_bank()
        rows, ys, wts = [], [], []
        for band in train:
            for c, t in band:
                rows.append(basis(c))
                ys.append(t / self.scale - 1.0)
                wts.append(1.0 / len(band))
        if not rows:
            return False
        x = np.asarray(rows)
        w = np.asarray(wts)
        theta = fit_quantile(x, np.asarray(ys), w * (len(w) / w.sum()))
        cand = _Ftrl()
        cand.n = list(self.ftrl.n)
        cand.set_weights([float(v) for v in theta])
        if self._loss(cand, judged) < self._loss(self.ftrl, judged):
            self.ftrl = cand
            return True
        return False

    def state_dict(self) -> dict:
        return {
            "ftrl": self.ftrl.state_dict(),
            "first": [float(t) for t in self.first],
            "scale": self.scale,
            "lowest": None if math.isinf(self.lowest) else float(self.lowest),
            "samples": int(self.samples),
            "bank": [[int(b), [[int(c), float(t)] for c, t in self.bank[b]]] for b in sorted(self.bank)],
            "dirty": bool(self.dirty),
            "context_lo": int(self.context_lo),
            "context_hi": int(self.context_hi),
        }

    def load_state(self, state: dict, where: str = "law") -> None:
        """Restore from ``state_dict``; StateError on a malformed state, nothing changed then."""
        s = fields(state, where, ("ftrl", "first", "scale", "lowest", "samples", "bank", "dirty",
                                  "context_lo", "context_hi"))
        ftrl = _Ftrl()
        ftrl.load_state(s["ftrl"], f"{where}.ftrl")
        first = [seconds(t, f"{where}.first[{i}]") for i, t in enumerate(sequence(s["first"], f"{where}.first"))]
        scale = optional(seconds, s["scale"], f"{where}.scale")
        lowest = optional(seconds, s["lowest"], f"{where}.lowest")
        samples = integer(s["samples"], f"{where}.samples")
        if (lowest is None) != (samples == 0):  # every sample lowers `lowest`; prices divide by it
            raise StateError(f"{where}.lowest: must be given exactly when samples > 0")
        if scale is not None and lowest is None:
            raise StateError(f"{where}.scale: set with no samples")
        bank: dict[int, list[tuple[int, float]]] = {}
        for i, entry in enumerate(sequence(s["bank"], f"{where}.bank")):
            at = f"{where}.bank[{i}]"
            b, samples_of_band = sequence(entry, at, 2)
            band = integer(b, f"{at}[0]", hi=64)
            if band in bank:
                raise StateError(f"{at}: repeats band {band}")
            bank[band] = []
            for j, sample in enumerate(sequence(samples_of_band, f"{at}[1]")):
                c, t = sequence(sample, f"{at}[1][{j}]", 2)
                bank[band].append((integer(c, f"{at}[1][{j}][0]"), seconds(t, f"{at}[1][{j}][1]")))
        dirty = boolean(s["dirty"], f"{where}.dirty")
        lo, hi = integer(s["context_lo"], f"{where}.context_lo"), integer(s["context_hi"], f"{where}.context_hi")
        self.ftrl, self.first, self.scale, self.samples, self.bank = ftrl, first, scale, samples, bank
        self.lowest = math.inf if lowest is None else lowest
        self.dirty, self.context_lo, self.context_hi = dirty, lo, hi
