"""Decoding arms: how a round's arm-specific steps are filled. `adaspark` learns; the rest are baselines.

An arm is parsed from its name (`Arm`, `parse_arm`) and run as a policy object (`policy_for`).
The round loop (`decoder.Decoder.round`) is the same for every arm; a policy answers four
questions of it:

- ``gate``: does this round draft at all, and with the drafter? (before Algorithm 1 line 3)
- ``propose``: which candidates (lines 3-4): the AdaSpark tree, or a chain for `chain:K`
- ``price``: q for every candidate (line 5): the acceptance model, or certainty for a chain
- ``choose``: the width n* (lines 7-10): the width decision (``learn/width.py``), or the arm's
  fixed rule

and ``observe``/``observe_plain``/``after_round`` hand the outcome to the arm's learners. A policy
is given what it reads when it is made, the learners (``learn.learned_state.Learners``) and the
draft sources (``candidates.Sources``), and each call the round's records (``rounds.py``): it
never sees the decoder.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..errors import ArgumentError
from ..learn.constants import MAX_WIDTH
from ..learn.gates import PROBE_NONE
from ..learn.kinds import Decider
from ..learn.learned_state import Learners
from ..learn.width import LongCopyStreak, WidthChoice, decide
from .candidates import Sources, chain_candidates, tree_candidates
from .rounds import DraftDecision, RoundStart, RoundTree, Verified
from .tree import Candidates

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

    def __init__(self, arm: Arm, learners: Learners, sources: Sources) -> None:
        self.arm = arm
        self.learners = learners
        self.sources = sources

    def gate(self, r: RoundStart) -> DraftDecision:
        """Whether this round drafts (and with the drafter); a baseline always drafts."""
        return DraftDecision(draft=True, use_drafter=self.sources.drafter is not None)

    def propose(self, use_drafter: bool, anchor: int, anchor_pos: int) -> Candidates:
        """Algorithm 1 lines 3-4: the drafter's block and the n-gram chains."""
        return tree_candidates(self.sources, use_drafter, anchor, anchor_pos)

    def price(self, tree: RoundTree, r: RoundStart) -> tuple[np.ndarray, str]:
        """Algorithm 1 line 5: q_j by Eq. (6), or the head-based estimate while the guard prefers it."""
        return self.learners.acceptance.q(tree.cset, r.context, tree.p_src)

    def choose(self, tree: RoundTree, r: RoundStart) -> WidthChoice:
        raise NotImplementedError

    def observe(self, tree: RoundTree, choice: WidthChoice, selected: list[int], result: Verified,
                r: RoundStart, defer: Callable[[Callable[[], None]], None]) -> None:
        """The width learners' update (Algorithm 1 lines 15-16); baselines learn no widths. ``defer``
        as in ``observe_plain``."""

    def observe_plain(self, r: RoundStart, step_s: float, defer: Callable[[Callable[[], None]], None]) -> None:
        """A plain step run instead of a tree; baselines learn nothing from it. ``defer`` (the
        decoder's ``later``) takes what may wait for the next forward: it runs it then where the
        forward overlaps the host, else at once."""

    def after_round(self, r: RoundStart, gate: DraftDecision, committed: int) -> None:
        """Called after every round that consulted the gates, with the tokens it committed."""


class PlainPolicy(ArmPolicy):
    """`ar`, and any arm on a recurrent target: one plain step per round."""

    drafts = False

    def __init__(self, arm: Arm, learners: Learners, sources: Sources, reason: Decider = Decider.ARM) -> None:
        super().__init__(arm, learners, sources)
        self.reason = reason

    def gate(self, r: RoundStart) -> DraftDecision:
        return DraftDecision(draft=False, use_drafter=False, decided_by=self.reason)


class PinnedPolicy(ArmPolicy):
    """`pinned:N`: the AdaSpark tree, always verified at N rows."""

    def choose(self, tree: RoundTree, r: RoundStart) -> WidthChoice:
        return WidthChoice(width=self.arm.k, decided_by=Decider.ARM)


class ChainPolicy(ArmPolicy):
    """`chain:K`: the first K drafter picks, or the n-gram continuation of the anchor, all verified."""

    learns_acceptance = False
    explores = False

    def propose(self, use_drafter: bool, anchor: int, anchor_pos: int) -> Candidates:
        return chain_candidates(self.sources, self.arm.k, anchor, anchor_pos)

    def price(self, tree: RoundTree, r: RoundStart) -> tuple[np.ndarray, str]:
        return np.ones(len(tree.cands)), "none"

    def choose(self, tree: RoundTree, r: RoundStart) -> WidthChoice:
        return WidthChoice(width=len(tree.cands) + 1, decided_by=Decider.ARM)


class AdaSparkPolicy(ArmPolicy):
    """`adaspark`: the gates decide whether to draft, the width decision chooses the width, and the
    scheduler learns from every round."""

    def __init__(self, arm: Arm, learners: Learners, sources: Sources) -> None:
        super().__init__(arm, learners, sources)
        self.streak = LongCopyStreak()  # confirms a long copy for the width floor (learn/width.py)

    def gate(self, r: RoundStart) -> DraftDecision:
        """The draft gate and the drafter gate, keyed by the n-gram probe at the anchor (gates.py)."""
        probe = self.sources.ngram.probe()
        sched = self.learners.scheduler
        has_drafter = self.sources.drafter is not None
        if probe == PROBE_NONE and not has_drafter and not self.sources.ngram.proposes():
            return DraftDecision(draft=False, use_drafter=False, decided_by=Decider.NO_PROPOSAL, probe=probe)
        if not sched.wants_draft(r.context, probe):
            return DraftDecision(draft=False, use_drafter=False, decided_by=Decider.DRAFT_GATE, probe=probe,
                                 draft_skipped=True)
        if not has_drafter:
            return DraftDecision(draft=True, use_drafter=False, probe=probe)
        use = sched.wants_drafter(r.context, probe)
        if not use and probe == PROBE_NONE and not self.sources.ngram.proposes():
            return DraftDecision(draft=False, use_drafter=False, decided_by=Decider.DRAFTER_GATE, probe=probe,
                                 drafter_skipped=True, asked_drafter_gate=True)
        return DraftDecision(draft=True, use_drafter=use, probe=probe, drafter_skipped=not use,
                             asked_drafter_gate=True)

    def choose(self, tree: RoundTree, r: RoundStart) -> WidthChoice:
        """Algorithm 1 lines 7-10: the scheduler's plan (a cold or split measurement, else Eq. (7)
        with hysteresis), priced with D's running mean (the time so far in a round before any ran),
        then the long-copy floor (``learn.width.decide``)."""
        fixed_now = time.perf_counter() - r.t0
        fixed_mean = self.learners.cost.fixed_estimate(tree.use_drafter)
        plan = self.learners.scheduler.plan(r.context, tree.s_d, tree.s_n,
                                            fixed_mean if fixed_mean is not None else fixed_now,
                                            may_measure=not r.first_round, ends_at=tree.ends_at)
        if r.first_round:
            self.streak.reset()  # a new request: the last reply's copy confirms nothing here
        return decide(plan, self.sources.ngram.long_copy(), self.streak.tokens)

    def observe(self, tree: RoundTree, choice: WidthChoice, selected: list[int], result: Verified,
                r: RoundStart, defer: Callable[[Callable[[], None]], None]) -> None:
        self.streak.observe(choice.width, len(result.path))
        sel = np.asarray(selected, dtype=np.int64)
        # The gains learn what the round committed against what it priced: the cut path and the
        # committable Q (tree.committable), the terms Eq. (7) scores; the uncut path over-valued
        # branching trees.
        in_path = set(result.path)
        self.learners.scheduler.observe(
            choice.plan, r.context, result.verify_s, result.fixed_s, len(result.path) + 1, r.first_round,
            tree.Q_commit[sel], tree.is_ng[sel].astype(np.int64), np.array([j in in_path for j in selected], dtype=bool),
            tree.use_drafter, defer)

    def observe_plain(self, r: RoundStart, step_s: float, defer: Callable[[Callable[[], None]], None]) -> None:
        self.streak.reset()  # now: the next round's width decision reads it
        sched = self.learners.scheduler
        # width 1's cost and the band rate: the next round may price one behind
        defer(lambda: sched.observe_plain(r.context, step_s, r.first_round))

    def after_round(self, r: RoundStart, gate: DraftDecision, committed: int) -> None:
        if gate.asked_drafter_gate:
            self.learners.scheduler.observe_drafter(r.context, gate.probe, gate.use_drafter, committed,
                                                    time.perf_counter() - r.t0)


def policy_for(arm: Arm, learners: Learners, sources: Sources, plain_only: bool = False) -> ArmPolicy:
    """The policy object that runs `arm` (plain decode on a target that cannot verify trees)."""
    if plain_only:
        return PlainPolicy(arm, learners, sources, Decider.PLAIN_ONLY)
    if arm.kind == "ar":
        return PlainPolicy(arm, learners, sources)
    if arm.kind == "chain":
        return ChainPolicy(arm, learners, sources)
    if arm.kind == "pinned":
        return PinnedPolicy(arm, learners, sources)
    return AdaSparkPolicy(arm, learners, sources)
