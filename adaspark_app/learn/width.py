"""The width decision: every rule that can set a round's width n* (Algorithm 1 lines 7-11), named.

A round's width is decided in layers, each named in the decision trace by ``kinds.Decider``:

1. the scheduler's plan (``scheduler.WidthScheduler.plan``): a cold or split measurement of the
   verify-cost model (§3.2), else Eq. (7) at the long-run rate with hysteresis, the stand-in and
   CUSUM pressure (``chooser.py``), and, for a tree that is one chain ending inside it, the round
   that what a narrower width leaves would need (ADDED, ``WidthScheduler._credit_chain_end``);
2. the long-copy floor (ADDED, ``long_copy_floor``): a copy of the conversation's own text that
   has just been right for LONG_COPY_CONFIRM tokens in a row is verified as far as llama.cpp's
   ngram-mod would;
3. the clamp (``clamp``, line 11): no wider than the tree, MAX_WIDTH, the context's room and the
   reply's token budget.

A baseline arm (``engine/arms.py``) replaces layers 1-2 with its fixed rule; the clamp applies to
every arm. Every knob is in ``constants.py``. Pure: no I/O, no timing.
"""

from __future__ import annotations

from dataclasses import dataclass

from .constants import LONG_COPY_CONFIRM, MAX_WIDTH
from .kinds import Decider
from .scheduler import WidthPlan


@dataclass
class WidthChoice:
    """The width n* of one round and the layer that set it."""

    width: int
    decided_by: Decider
    measured: bool = False  # a cold-start or split measurement
    predicted_s: float | None = None  # the cost model's price of this width
    plan: WidthPlan | None = None  # the scheduler's plan and trace (the adaspark arm)


class LongCopyStreak:
    """Draft tokens accepted in a row by rounds that were each accepted whole: what confirms a long
    copy for ``long_copy_floor``. A streak over rounds, not one round's draft (see there)."""

    def __init__(self) -> None:
        self.tokens = 0

    def reset(self) -> None:
        """A new request, or a plain step: the last reply's copy confirms nothing here."""
        self.tokens = 0

    def observe(self, width: int, accepted: int) -> None:
        """A verified round of ``width`` rows accepted ``accepted`` draft tokens. Whole: every row
        accepted but at most the last, which may be the exploration row; a round that accepted
        nothing breaks the streak. A copy verified 8 rows at a time and right every time (the
        acceptance model prices long copies low) is confirmed as surely as one verified 33 rows at
        once."""
        whole = accepted >= max(width - 2, 1)
        self.tokens = self.tokens + accepted if whole else 0


def long_copy_floor(rows: int, streak: int) -> int:
    """The width floor for a round whose anchor chain ngram-mod's rule verifies in ``rows`` rows
    (``engine.ngram.long_copy_rows``; 0: it does not fire), given ``streak``: the draft tokens the
    rounds just before accepted in a row, each round accepted whole (all its rows but at most an
    exploration row; ``LongCopyStreak``), else 0. A streak over rounds, not one round's draft: on Qwen2.5-Coder-1.5B a
    pasted passage's copy was verified 8 rows at a time and accepted whole 22 rounds running
    while the acceptance model priced 16 rows below 8, so one round never confirmed it.

    Why a floor outside Eq. (7), and why only once confirmed: the acceptance model caps a copy's
    evidence at 32 tokens and the cost model rarely holds prices past 32 rows, so V(n) cannot see
    that a copy which has just been right for 32+ tokens in a row is worth verifying whole; once
    it has been, verifying what ngram-mod would lost nothing in the replay. Unconfirmed, it loses:
    replaying
    Qwen-0.5B's paste-and-ask replies (benchmarks/oracle/ngram_mod_replay.py), a floor on every firing of
    the rule cut the priced speed from 2.39x to 2.19x (pastes' copies part from their source every
    few dozen tokens, and a 64-row verify costs 14.7 one-row steps there against 7.7 for 32 rows,
    verify_cost_cpu_qwen0.5b.json.gz).
    """
    return rows if rows > 0 and streak >= LONG_COPY_CONFIRM else 0


def decide(plan: WidthPlan, long_copy_rows: int, streak: int) -> WidthChoice:
    """Layers 1-2: the scheduler's plan, raised to the long-copy floor where it applies (a
    measurement keeps its width: it prices the width it measures)."""
    floor = 0 if plan.measured else long_copy_floor(long_copy_rows, streak)
    if floor > plan.width:
        return WidthChoice(width=floor, decided_by=Decider.LONG_COPY, predicted_s=None, plan=plan)
    return WidthChoice(width=plan.width, decided_by=plan.decided_by, measured=plan.measured,
                       predicted_s=plan.predicted_verify_s, plan=plan)


def clamp(width: int, nodes: int, room: int, budget: int | None) -> int:
    """Layer 3 (line 11): the widest verify the round can run: the anchor and its ``nodes``
    candidates, at most MAX_WIDTH rows, the ``room`` left in the context, and the ``budget`` of
    tokens the reply may still emit (a round commits at most as many tokens as it verifies rows,
    so rows past the cap would be paid for and thrown away)."""
    return max(1, min(width, nodes + 1, MAX_WIDTH, room, budget if budget is not None else MAX_WIDTH))
