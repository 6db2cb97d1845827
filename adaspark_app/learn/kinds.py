"""The round's vocabulary in one place: where a candidate came from and what kind of node it is.

Every module that labels candidates, rows or proposals (the tree, the n-gram index, the
acceptance model, the gains, the events and the UI) reads these names, so a code means the same
thing everywhere and a reader of the paper finds each class once.
"""

from __future__ import annotations

from enum import Enum, IntEnum


class Source(str, Enum):
    """The row class by source (§3.3, Table 7): a drafter candidate, an n-gram node, or a node
    both proposed (``agreed``). The string values are the keys of ``rows_by_source`` and
    ``accepted_by_source`` in OUT.jsonl and ROUNDS.jsonl."""

    DRAFTER = "drafter"
    NGRAM = "ngram"
    AGREED = "agreed"


#: The keys of the per-source counts, in report order.
SOURCES: tuple[str, ...] = tuple(s.value for s in Source)


def source_counts() -> dict[str, int]:
    """A zeroed per-source count, keyed as OUT.jsonl keys it."""
    return {s: 0 for s in SOURCES}


class NodeKind(IntEnum):
    """A candidate's kind in the round's tree: the drafter's pick at a position (the spine), one
    of its top-K siblings (a leaf), or a node of an n-gram chain."""

    PICK = 0
    SIBLING = 1
    NGRAM = 2


class Decider(str, Enum):
    """The layer that set a round's width (ROUNDS.jsonl ``decided_by``; ``adaspark explain``)."""

    CHOOSER = "chooser"  # the chooser's best-scored offered width: Eq. (7), or the ratio until rho_m is known
    HYSTERESIS = "hysteresis"  # the incumbent held against a better-scored width inside the margin
    STAND_IN = "stand_in"  # the incumbent is not offered this round: the widest offered width below it held
    PRESSURE = "pressure"  # the CUSUM of an alternative's advantages cleared the margin (chooser.py)
    COLD = "cold"  # a cold-start measurement of a width not yet priced (Algorithm 1 line 8; RowClass.needed)
    SPLIT = "split"  # a measurement of a new split width, in a round where it could win (§3.2)
    RECHECK = "recheck"  # a priced width measured again where it could win: its time is one its rows cannot take (cost.in_doubt)
    CLAMP = "clamp"  # the width was cut to what the tree, the reply's token budget or the context holds
    LONG_COPY = "long_copy"  # a confirmed long copy verified whole, as llama.cpp's ngram-mod would (arms.py)
    DRAFT_GATE = "draft_gate"  # the draft gate skipped drafting: a plain one-token step
    DRAFTER_GATE = "drafter_gate"  # the drafter gate left the drafter out and nothing else was proposed
    NO_PROPOSAL = "no_proposal"  # nothing to propose (no drafter, no n-gram continuation): a plain step
    ARM = "arm"  # a baseline arm's own rule: ar (plain), chain:K (the whole chain), pinned:N
    PLAIN_ONLY = "plain_only"  # a recurrent or hybrid target: plain decode, no tree verify


def decider_value(d: Decider | str) -> str:
    """The trace's name of a layer: ``Decider(d).value`` without Enum's call where ``d`` is a
    member already (every round reports one; the call cost microseconds a round)."""
    return d.value if type(d) is Decider else Decider(d).value


class NgramKind(IntEnum):
    """An n-gram proposal's class (the acceptance model's ``ng_kind`` codes): none, a copy of an
    earlier passage (evidence: matched context length), or the most frequent follower of the
    last tokens (evidence: its count)."""

    NONE = 0
    COPY = 1
    FOLLOWER = 2
