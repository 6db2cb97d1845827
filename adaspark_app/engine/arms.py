"""Decoding arms: how a round's arm-specific steps are filled. `adaspark` learns; the rest are baselines.

An arm is parsed from its name (`Arm`, `parse_arm`) and run as a policy object (`policy_for`).
The round loop (`decoder.Decoder.round`) is the same for every arm; a policy answers four
questions of it:

- ``gate``: does this round draft at all, and with the drafter? (before Algorithm 1 line 3)
- ``propose``: which candidates (lines 3-4): the AdaSpark tree, or a chain for `chain:K`
- ``price``: q for every candidate (line 5): the acceptance model, or certainty for a chain
- ``choose``: the width n* (lines 7-10): the scheduler, or the arm's fixed rule

and ``observe``/``observe_plain``/``after_round`` hand the outcome to the arm's learners.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..errors import ArgumentError
from ..learn.gates import PROBE_NONE, probe_class
from ..learn.kinds import Decider, NgramKind
from .ngram import long_copy_floor
from .rounds import DraftDecision, RoundStart, RoundTree, Verified, WidthChoice

if TYPE_CHECKING:  # the decoder hands itself to the policy; no import cycle at run time
    from .decoder import Decoder

MAX_WIDTH = 64
ARM_KINDS = ("adaspark", "ar", "chain", "pinned")


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
        hi = MAX_WIDTH - 1 if kind == "chain" else MAX_WIDTH  # a chain of K tokens verifies K + 1 rows
        try:
            k = int(num)
        except ValueError:
            k = -1
        if 1 <= k <= hi:
            return Arm(kind, k)
        raise ArgumentError(f"arm {text!r}: {kind} takes a whole number from 1 to {hi}")
    raise ArgumentError(f"unknown arm {text!r}: use adaspark, ar, chain:K or pinned:N")


class ArmPolicy:
    """The AdaSpark tree verified at a width the subclass sets; learns acceptance, not widths."""

    #: Whether the acceptance model learns from this arm's rounds (a chain is not priced by it).
    learns_acceptance = True
    #: Whether Algorithm 1 line 12 (the exploration row) applies.
    explores = True
    #: Whether the arm ever drafts (keeps the n-gram index and feeds the drafter).
    drafts = True

    def __init__(self, arm: Arm) -> None:
        self.arm = arm

    def gate(self, dec: "Decoder", r: RoundStart) -> DraftDecision:
        """Whether this round drafts (and with the drafter); a baseline always drafts."""
        return DraftDecision(draft=True, use_drafter=dec.drafter is not None)

    def propose(self, dec: "Decoder", use_drafter: bool):
        """Algorithm 1 lines 3-4: the drafter's block and the n-gram chains."""
        return dec.tree_candidates(use_drafter)

    def price(self, dec: "Decoder", tree: RoundTree, r: RoundStart) -> tuple[np.ndarray, str]:
        """Algorithm 1 line 5: q_j by Eq. (6), or the head-based estimate while the guard prefers it."""
        tree.cset.ng_prec = dec.node_precision(tree.cset)  # only the acceptance model reads it
        return dec.acceptance.q(tree.cset, r.context, tree.p_src)

    def choose(self, dec: "Decoder", tree: RoundTree, r: RoundStart) -> WidthChoice:
        raise NotImplementedError

    def observe(self, dec: "Decoder", tree: RoundTree, choice: WidthChoice, result: Verified,
                r: RoundStart) -> None:
        """The width learners' update (Algorithm 1 lines 15-16); baselines learn no widths."""

    def observe_plain(self, dec: "Decoder", r: RoundStart, step_s: float) -> None:
        """A plain step run instead of a tree; baselines learn nothing from it."""

    def after_round(self, dec: "Decoder", r: RoundStart, gate: DraftDecision, committed: int) -> None:
        """Called after every round that consulted the gates, with the tokens it committed."""


class PlainPolicy(ArmPolicy):
    """`ar`, and any arm on a recurrent target: one plain step per round."""

    drafts = False

    def __init__(self, arm: Arm, reason: Decider = Decider.ARM) -> None:
        super().__init__(arm)
        self.reason = reason

    def gate(self, dec: "Decoder", r: RoundStart) -> DraftDecision:
        return DraftDecision(draft=False, use_drafter=False, decided_by=self.reason)


class PinnedPolicy(ArmPolicy):
    """`pinned:N`: the AdaSpark tree, always verified at N rows."""

    def choose(self, dec: "Decoder", tree: RoundTree, r: RoundStart) -> WidthChoice:
        return WidthChoice(width=self.arm.k, decided_by=Decider.ARM)


class ChainPolicy(ArmPolicy):
    """`chain:K`: the first K drafter picks, or the n-gram continuation of the anchor, all verified."""

    learns_acceptance = False
    explores = False

    def propose(self, dec: "Decoder", use_drafter: bool):
        return dec.chain_candidates(self.arm.k)

    def price(self, dec: "Decoder", tree: RoundTree, r: RoundStart) -> tuple[np.ndarray, str]:
        return np.ones(len(tree.cands)), "none"

    def choose(self, dec: "Decoder", tree: RoundTree, r: RoundStart) -> WidthChoice:
        return WidthChoice(width=len(tree.cands) + 1, decided_by=Decider.ARM)


class AdaSparkPolicy(ArmPolicy):
    """`adaspark`: the gates decide whether to draft, the scheduler chooses the width and learns."""

    def __init__(self, arm: Arm) -> None:
        super().__init__(arm)
        self.last_whole = 0  # draft tokens accepted in a row by rounds each accepted whole (ngram.long_copy_floor)

    @staticmethod
    def probe(dec: "Decoder") -> int:
        """The gates' probe class of the n-gram proposal at the anchor: a copy whose context earlier
        passages continued differently counts with the shortest copies (gates.probe_class)."""
        step = dec.ngram.first_step()
        if step is None:
            return PROBE_NONE
        return probe_class(step.kind, step.evidence, step.kind == NgramKind.COPY and dec.ngram.anchor_ambiguous())

    def gate(self, dec: "Decoder", r: RoundStart) -> DraftDecision:
        """The draft gate and the drafter gate, keyed by the n-gram probe at the anchor (gates.py)."""
        probe = self.probe(dec)
        sched = dec.scheduler
        if probe == PROBE_NONE and dec.drafter is None:
            return DraftDecision(draft=False, use_drafter=False, decided_by=Decider.NO_PROPOSAL, probe=probe)
        if not sched.wants_draft(r.context, probe):
            return DraftDecision(draft=False, use_drafter=False, decided_by=Decider.DRAFT_GATE, probe=probe,
                                 draft_skipped=True)
        if dec.drafter is None:
            return DraftDecision(draft=True, use_drafter=False, probe=probe)
        use = sched.wants_drafter(r.context, probe)
        if not use and probe == PROBE_NONE:
            return DraftDecision(draft=False, use_drafter=False, decided_by=Decider.DRAFTER_GATE, probe=probe,
                                 drafter_skipped=True, asked_drafter_gate=True)
        return DraftDecision(draft=True, use_drafter=use, probe=probe, drafter_skipped=not use,
                             asked_drafter_gate=True)

    def choose(self, dec: "Decoder", tree: RoundTree, r: RoundStart) -> WidthChoice:
        """Algorithm 1 lines 7-10: a cold or split measurement, else Eq. (7) with hysteresis."""
        fixed_now = time.perf_counter() - r.t0
        fixed_ema = dec.fixed_estimate(tree.use_drafter)
        plan = dec.scheduler.plan(r.context, tree.s_d, tree.s_n, fixed_ema if fixed_ema is not None else fixed_now,
                                  may_measure=not r.first_round)
        if r.first_round:
            self.last_whole = 0  # a new request: the last reply's copy confirms nothing here
        # A confirmed long copy is verified at least as far as llama.cpp's ngram-mod would (the
        # special case and why: ngram.long_copy_floor); a measurement keeps its width.
        floor = 0 if plan.measured else long_copy_floor(dec.ngram.long_copy(), self.last_whole)
        if floor > plan.width:
            return WidthChoice(width=floor, decided_by=Decider.LONG_COPY, predicted_s=None, plan=plan)
        return WidthChoice(width=plan.width, decided_by=plan.decided_by, measured=plan.measured,
                           predicted_s=plan.predicted_verify_s, plan=plan)

    def observe(self, dec: "Decoder", tree: RoundTree, choice: WidthChoice, result: Verified,
                r: RoundStart) -> None:
        # whole: every row accepted but at most the last, which may be the exploration row. The
        # streak runs on over rounds accepted whole: a copy verified 8 rows at a time and right
        # every time (the acceptance model prices long copies low) is confirmed as surely as one
        # verified 33 rows at once.
        whole = len(result.path) >= max(choice.width - 2, 1)  # a round that accepted nothing breaks it
        self.last_whole = self.last_whole + len(result.path) if whole else 0
        sel = np.asarray(choice.selected, dtype=np.int64)
        # The gains learn what the round committed against what it priced: the cut path and the
        # committable Q (tree.committable), the terms Eq. (7) scores; the uncut path over-valued
        # branching trees.
        in_path = set(result.path)
        dec.scheduler.observe(choice.plan, r.context, result.verify_s, result.fixed_s,
                              len(result.path) + 1, r.first_round, tree.Q_commit[sel], tree.is_ng[sel].astype(np.int64),
                              np.array([j in in_path for j in choice.selected], dtype=bool), tree.use_drafter)

    def observe_plain(self, dec: "Decoder", r: RoundStart, step_s: float) -> None:
        self.last_whole = 0
        dec.scheduler.observe_plain(r.context, step_s, r.first_round)

    def after_round(self, dec: "Decoder", r: RoundStart, gate: DraftDecision, committed: int) -> None:
        if gate.asked_drafter_gate:
            dec.scheduler.observe_drafter(r.context, gate.probe, gate.use_drafter, committed,
                                          time.perf_counter() - r.t0)


def policy_for(arm: Arm, plain_only: bool = False) -> ArmPolicy:
    """The policy object that runs `arm` (plain decode on a target that cannot verify trees)."""
    if plain_only:
        return PlainPolicy(arm, Decider.PLAIN_ONLY)
    if arm.kind == "ar":
        return PlainPolicy(arm)
    if arm.kind == "chain":
        return ChainPolicy(arm)
    if arm.kind == "pinned":
        return PinnedPolicy(arm)
    return AdaSparkPolicy(arm)
