"""The values one round passes between its steps (Algorithm 1), each a typed record.

`Decoder.round` runs: start -> gate -> propose -> price -> choose -> select -> verify -> commit
-> learn. Each step reads and returns one of these (the width is ``learn.width.WidthChoice``), so
a step's inputs are named, not a list of positional parameters. ``RoundOutcome`` is what a round
reports: what it committed, what it measured and why it verified the width it did.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..learn.acceptance import CandidateSet
from ..learn.gates import PROBE_NONE
from ..learn.kinds import Decider, decider_value, source_counts
from ..learn.width import WidthChoice
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


def _frozen(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


_NONE_F, _NONE_I, _NONE_B = _frozen(np.zeros(0)), _frozen(np.zeros(0, np.int64)), _frozen(np.zeros(0, bool))
_ZERO_S = _frozen(np.zeros(2))


@dataclass
class RoundTree:
    """The round's candidates, priced and ordered (Algorithm 1 lines 3-6)."""

    cands: Candidates
    cset: CandidateSet
    use_drafter: bool
    p_src: float  # the n-gram source's precision on the committed text (Eq. 6)
    # set by Decoder.price (the defaults, shared and read-only, are an unpriced tree's: no allocation)
    q: np.ndarray = field(default_factory=lambda: _NONE_F)  # P(accepted | parent accepted)
    Q: np.ndarray = field(default_factory=lambda: _NONE_F)  # path products (Proposition 1)
    Q_commit: np.ndarray = field(default_factory=lambda: _NONE_F)  # Q where the cut keeps the node, else 0
    order: np.ndarray = field(default_factory=lambda: _NONE_I)  # best-first order O
    is_ng: np.ndarray = field(default_factory=lambda: _NONE_B)  # n-gram rows (not agreed)
    s_d: np.ndarray = field(default_factory=lambda: _ZERO_S)  # S(n) from the drafter's nodes
    s_n: np.ndarray = field(default_factory=lambda: _ZERO_S)  # S(n) from the n-gram's nodes
    priced_by: str = "none"  # "fitted" | "head" | "none"
    # rows that verify the tree whole where it is one chain that ends there: nothing continues it, or
    # the reply's token budget ends there (the scheduler's chain-end credit); else 0
    ends_at: int = 0

    def expected_accepted(self, width: int) -> float:
        """S(width): expected accepted tokens among the first width-1 nodes."""
        s = self.s_d + self.s_n
        return float(s[min(width, len(s) - 1)])


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


@dataclass
class RoundCounters:
    """What a decoder's rounds did, counted over its life (tests and benchmarks read them)."""

    tree_rounds_with_ngram: int = 0  # tree rounds with an n-gram node: every EXPLORATION_PERIOD-th explores
    cut_rounds: int = 0  # rounds whose accepted path was cut to keep KV cells in position order
    cut_tokens: int = 0  # accepted tokens the cut discarded, over all rounds
    checked_rows: int = 0  # rows the self-check verified (``self_check.check_rows``)


@dataclass
class RoundOutcome:
    """What one round committed, what it measured, and why it verified the width it did."""

    new_tokens: list[int]
    width: int
    measured: bool = False
    verify_s: float = 0.0
    fixed_s: float = 0.0
    predicted_s: float | None = None
    expected_accepted: float = 0.0
    accepted: int = 0
    priced_by: str = "none"
    rows_by_source: dict[str, int] = field(default_factory=dict)
    accepted_by_source: dict[str, int] = field(default_factory=dict)
    offered: dict[int, float] = field(default_factory=dict)
    band_rate: float | None = None
    prefill: bool = False  # the reply's first token, from the prefill: no round ran
    decided_by: str = Decider.ARM.value  # the layer that set the width (Decider)
    trace: dict[str, Any] = field(default_factory=dict)  # the rest of the decision trace (ROUNDS.jsonl)


def decision_trace(choice: WidthChoice | None, gate: DraftDecision) -> dict[str, Any]:
    """The decision trace of a round: the gates' verdicts and, for a scheduled round, the chooser's terms."""
    t: dict[str, Any] = {"draft_skipped": gate.draft_skipped, "drafter_skipped": gate.drafter_skipped,
                         "probe": gate.probe}
    plan = choice.plan if choice is not None else None
    if plan is not None:
        t.update(incumbent=plan.incumbent, argmax=plan.argmax, mode=plan.mode, values=plan.values,
                 rho=plan.rho, D_ms=plan.fixed_s * 1e3, gains=list(plan.gains), bounded=plan.bounded,
                 ends_at=plan.ends_at)
    return t


def tree_outcome(tree: RoundTree, choice: WidthChoice, result: Verified, gate: DraftDecision) -> RoundOutcome:
    """A verified round's outcome: the committed tokens, rows and acceptance by source, the trace."""
    cands = tree.cands
    rows_by, acc_by = source_counts(), source_counts()
    for j in result.layout.nodes[1:]:
        rows_by[cands.source(j)] += 1
    for j in result.path:
        acc_by[cands.source(j)] += 1
    plan = choice.plan
    return RoundOutcome(
        new_tokens=[cands.token[j] for j in result.path] + [result.bonus], width=choice.width,
        measured=choice.measured, verify_s=result.verify_s, fixed_s=result.fixed_s,
        predicted_s=choice.predicted_s, expected_accepted=tree.expected_accepted(choice.width),
        accepted=len(result.path), priced_by=tree.priced_by, rows_by_source=rows_by, accepted_by_source=acc_by,
        offered=plan.offered if plan is not None else {}, band_rate=plan.band_rate if plan is not None else None,
        decided_by=decider_value(choice.decided_by),
        trace={**decision_trace(choice, gate), "cut_tokens": len(result.full_path) - len(result.path)})
