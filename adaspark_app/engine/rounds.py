"""The values one round passes between its steps (Algorithm 1), each a typed record.

`Decoder.round` runs: start -> gate -> propose -> price -> choose -> select -> verify -> commit
-> learn. Each step reads and returns one of these, so a step's inputs are named, not a list of
positional parameters.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..learn.acceptance import CandidateSet
from ..learn.gates import PROBE_NONE
from ..learn.kinds import Decider
from ..learn.scheduler import WidthPlan
from .tree import Candidates, TreeLayout


@dataclass
class RoundStart:
    """The committed prefix x as the round found it, and the round's clock."""

    t0: float  # perf_counter at the round's start: D runs from here
    context: int  # |x|: committed tokens, the anchor included
    first_round: bool  # the request's first round runs cold: the cost model does not learn from it
    budget: int | None  # tokens the reply may still emit


@dataclass
class DraftDecision:
    """What the gates decided before anything was drafted."""

    draft: bool  # False: this round is a plain one-token step
    use_drafter: bool  # run the DSpark drafter's forward for this round's tree
    decided_by: Decider | None = None  # set when the gates made the round a plain step
    probe: int = PROBE_NONE  # the n-gram probe class at the anchor (learn/gates.py)
    draft_skipped: bool = False  # the draft gate skipped drafting
    drafter_skipped: bool = False  # the drafter gate left the drafter out
    asked_drafter_gate: bool = False  # the drafter gate was consulted: it learns from this round


@dataclass
class RoundTree:
    """The round's candidates, priced and ordered (Algorithm 1 lines 3-6)."""

    cands: Candidates
    cset: CandidateSet
    use_drafter: bool
    p_src: float  # the n-gram source's precision on the committed text (Eq. 6)
    q: np.ndarray = field(default_factory=lambda: np.zeros(0))  # P(accepted | parent accepted)
    Q: np.ndarray = field(default_factory=lambda: np.zeros(0))  # path products (Proposition 1)
    Q_commit: np.ndarray = field(default_factory=lambda: np.zeros(0))  # Q where the cut keeps the node, else 0
    order: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # best-first order O
    is_ng: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))  # n-gram rows (not agreed)
    s_d: np.ndarray = field(default_factory=lambda: np.zeros(2))  # S(n) from the drafter's nodes
    s_n: np.ndarray = field(default_factory=lambda: np.zeros(2))  # S(n) from the n-gram's nodes
    priced_by: str = "none"  # "fitted" | "head" | "none"

    def expected_accepted(self, width: int) -> float:
        """S(width): expected accepted tokens among the first width-1 nodes."""
        s = self.s_d + self.s_n
        return float(s[min(width, len(s) - 1)])


@dataclass
class WidthChoice:
    """The width n* (Algorithm 1 lines 7-10), why, and the rows it selected (lines 11-12)."""

    width: int
    decided_by: Decider
    measured: bool = False  # a cold-start or split measurement
    predicted_s: float | None = None  # the cost model's price of this width
    plan: WidthPlan | None = None  # the scheduler's plan and trace (the adaspark arm)
    selected: list[int] = field(default_factory=list)  # the nodes verified after the anchor


@dataclass
class Verified:
    """One verify forward and the accepted path (Algorithm 1 lines 13-14)."""

    layout: TreeLayout
    argmax: np.ndarray  # the target's argmax per row
    full_path: list[int]  # the accepted nodes, before the cut
    path: list[int]  # the accepted nodes committed (cut where rows leave the batch's front)
    rows: list[int]  # the rows of the committed path, the anchor's row first
    bonus: int  # the target's argmax after the committed path
    verify_s: float  # the measured verify time t
    anchor_pos: int
    fixed_s: float = 0.0  # the round's D, set once the learners have run
    draws: np.ndarray | None = None  # sampled: the target's draw per row (-1 off the path); None greedy

    @property
    def targets(self) -> np.ndarray:
        """The target's token per row: its draw when sampling, else its argmax."""
        return self.argmax if self.draws is None else self.draws
