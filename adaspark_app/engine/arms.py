"""Decoding arms: how a round's width is set. `adaspark` learns it; the others are baselines."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ArgumentError

MAX_WIDTH = 64


@dataclass(frozen=True)
class Arm:
    """`ar`: plain one-token decode. `chain:K`: an n-gram chain of up to K draft tokens.
    `pinned:N`: the AdaSpark tree with its width pinned at N rows. `adaspark`: the scheduler."""

    kind: str
    k: int = 0

    def __str__(self) -> str:
        return self.kind if self.kind in ("ar", "adaspark") else f"{self.kind}:{self.k}"


def parse_arm(text: str) -> Arm:
    """Parse ARM: adaspark | ar | chain:K | pinned:N, with a clear error."""
    t = text.strip().lower()
    if t in ("ar", "adaspark"):
        return Arm(t)
    kind, sep, num = t.partition(":")
    if sep and kind in ("chain", "pinned"):
        try:
            k = int(num)
        except ValueError:
            k = -1
        lo = 1 if kind == "chain" else 1
        if lo <= k <= (MAX_WIDTH - 1 if kind == "chain" else MAX_WIDTH):
            return Arm(kind, k)
        raise ArgumentError(f"arm {text!r}: {kind} takes a whole number from {lo} to "
                            f"{MAX_WIDTH - 1 if kind == 'chain' else MAX_WIDTH}")
    raise ArgumentError(f"unknown arm {text!r}: use adaspark, ar, chain:K or pinned:N")
