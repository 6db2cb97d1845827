"""N-gram fill (§3.3): an index of the request's own text and the chains it proposes.

The index holds the request's committed text (prompt and reply so far). From a starting point,
the anchor or a drafter pick, it follows a chain: the token that followed the most recent
earlier occurrence of the longest matching context, read on along that earlier passage (a
*copy*), or else the most frequent follower of the last ``NGRAM_FOLLOWER_CONTEXT`` (3) tokens (a
*follower*); with ``backoff`` (the engine's index) else the most frequent follower of the last 2
tokens, else of the last one (``BACKOFF_CONTEXTS``; a follower of evidence ``BACKOFF_EVIDENCE``;
not in the paper, see the constant). The chain stops when nothing is proposed or after ``max_depth`` steps; the engine
passes ``NGRAM_MAX_DEPTH`` (32) minus the suffix length so no chain runs more than 32 tokens
below the anchor (Appendix B, Table 14).

An earlier passage "continues" the text only when it matches more than the follower context,
i.e. at least ``NGRAM_MIN_COPY`` = 4 tokens; a shorter match is exactly what the follower table
already covers, and for it the most frequent follower is the better guess than the most recent.

Lookups are hash maps from the last L tokens to the most recent position that followed them,
for a ladder of L from 4 to 32, plus a follower-count table of 3-grams. ``extend`` updates them
for the new tokens only (no rebuild per round); a lookup is at most one dict probe per ladder
length, and reading on along a passage is O(1) per step. Pure Python, no llama_cpp.

Long copies (issue 19). llama.cpp's ngram-mod drafts only when the last ``LONG_COPY_MATCH`` (24)
tokens occurred before and the text after them chains on for at least ``LONG_COPY_MIN`` (48)
tokens, and then verifies the whole chain (up to 64 tokens). In the replay of Qwen-0.5B's replies
(benchmarks/oracle/ngram_mod_replay.py) its drafts were all right on repeated chat text and about half
right on pastes. Chains here used to stop 32 tokens below the anchor, so no verify could reach
ngram-mod's. ``long_copy_rows`` names the rounds where its rule fires; the engine then follows the
anchor's chain to ``LONG_COPY_DEPTH`` tokens, so Eq. (7) may choose up to 64 rows, and once the copy
is confirmed verifies all of it (``learn.width.long_copy_floor``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

from adaspark_app.learn.constants import (COPY_CONTEXT_LADDER, COPY_EVIDENCE_CAP, LONG_COPY_DEPTH, LONG_COPY_MATCH,
                                          LONG_COPY_MIN, NGRAM_FOLLOWER_CONTEXT, NGRAM_MAX_DEPTH)
from adaspark_app.learn.kinds import NgramKind
from adaspark_app.learn.precision import SourcePrecision

# A follower of the last 2 tokens, or else of the last one, proposed where those of the last 3
# and every passage propose nothing (NgramIndex's ``backoff``): a class of its own, evidence 0,
# which no 3-token follower has (its evidence is a count, at least 1), so the source's precision
# learns it apart. It is right less often: on the bundled model's `ar` replies to held-out chats
# and pastes the 2-token followers 44-65% of the time and the 1-token ones 24-27%, against
# 88-90% for the index's other first proposals; where a second row costs little (a GPU) a guess
# right a quarter of the time still pays.
BACKOFF_EVIDENCE = 0
# The shorter follower contexts the engine's index backs off to, longest first.
BACKOFF_CONTEXTS: tuple[int, ...] = (2, 1)
# A copy must match more than the follower context (see the module docstring).
NGRAM_MIN_COPY = NGRAM_FOLLOWER_CONTEXT + 1
# Context lengths with a position map. The longest matching length on this ladder picks the
# passage; its true match length (the evidence) is then measured token by token up to the cap.
COPY_CONTEXTS: tuple[int, ...] = tuple(
    L for L in COPY_CONTEXT_LADDER if NGRAM_MIN_COPY <= L <= NGRAM_MAX_DEPTH
) or (NGRAM_MIN_COPY,)
# ngram-mod's rule (llama.cpp common/common.h defaults n_match 24, n_min 48, n_max 64): a copy
# matched on at least LONG_COPY_MATCH tokens whose passage runs on LONG_COPY_MIN more is verified
# whole, up to LONG_COPY_DEPTH tokens (learn/constants.py); LONG_COPY_CONFIRM is the width floor's
# (learn/width.py).


def starts_long_copy(step: "NgramStep | None") -> bool:
    """Whether a chain's first step could start ngram-mod's draft: a copy matched on at least
    LONG_COPY_MATCH tokens."""
    return step is not None and step.kind == NgramKind.COPY and step.evidence >= LONG_COPY_MATCH


def long_copy_rows(steps: Sequence["NgramStep"]) -> int:
    """Rows ngram-mod's rule verifies for the anchor's chain ``steps``: 1 + the chain's leading
    copy steps when the first is a copy matched on >= LONG_COPY_MATCH tokens and they number at
    least LONG_COPY_MIN (capped at LONG_COPY_DEPTH); else 0 (the rule does not fire)."""
    if not steps or not starts_long_copy(steps[0]):
        return 0
    k = 0
    for st in steps[:LONG_COPY_DEPTH]:
        if st.kind != NgramKind.COPY:
            break
        k += 1
    return 1 + k if k >= LONG_COPY_MIN else 0


class NgramStep(NamedTuple):
    """One proposed token of an n-gram chain (a named tuple: a chain makes dozens a round, and a
    frozen dataclass cost a microsecond each to build).

    ``kind`` is ``NgramKind.COPY`` (continues an earlier passage) or ``NgramKind.FOLLOWER`` (the
    most frequent follower of the last 3 tokens). ``evidence`` is, for a copy, the length of the matched
    context (capped at ``COPY_EVIDENCE_CAP``); for a follower, its follower count, or
    ``BACKOFF_EVIDENCE`` (0) for a backoff follower of the last 2 tokens or the last one. These
    feed the bucket of Eq. (6)'s n-gram terms.
    """

    token: int
    kind: NgramKind
    evidence: int


class NgramIndex:
    """Suffix index of one request's committed text (§3.3 "N-gram candidates").

    Maintained incrementally: ``extend`` with each round's committed tokens. ``chain`` proposes
    a continuation of (committed text + an uncommitted suffix); ``predict_next`` is the top-1
    proposal at the anchor, used to measure the source precision p_src of Eq. (6).
    """

    __slots__ = ("_tokens", "_pos", "_follow", "_best", "_short", "_first", "_ambiguous", "_long", "_stop",
                 "_anchor")

    def __init__(self, tokens: Sequence[int] = (), stop: Callable[[int], bool] | None = None,
                 backoff: Sequence[int] = ()) -> None:
        """``stop``: tokens no chain proposes; a chain ends before one (``Backend.is_control``).

        ``backoff``: shorter follower contexts, longest first (the engine's source gives
        ``BACKOFF_CONTEXTS``: the last 2 tokens, then the last one): where neither a passage nor
        the last 3 tokens' followers propose anything, the most frequent follower of the first of
        them that occurred before does (a ``BACKOFF_EVIDENCE`` follower). Empty, the default: the
        index of the paper, which the oracles' replays keep.

        A reply that restates the user's message (a function's signature and docstring, a
        pasted passage) matches the end of that message, and the copy read on from there runs
        into the chat template's markers: end of turn, start of turn, the role. The target never
        writes those inside a reply, so every row after the first marker is wasted: on
        Qwen2.5-Coder-1.5B such a copy, cold-measured at 64 rows (26 plain steps), accepted 2.
        """
        self._stop = stop
        self._tokens: list[int] = []
        # _pos[L][last L tokens] = index of the token that most recently followed them
        self._pos: dict[int, dict[tuple[int, ...], int]] = {L: {} for L in COPY_CONTEXTS}
        # _follow[3-gram][token] = how often token followed it; _best[3-gram] = (token, count)
        self._follow: dict[tuple[int, ...], dict[int, int]] = {}
        self._best: dict[tuple[int, ...], tuple[int, int]] = {}
        # the same for each backoff context: (length, follow, best), longest first
        if any(not 0 < int(L) < NGRAM_FOLLOWER_CONTEXT for L in backoff):
            raise ValueError(f"backoff contexts must be shorter than {NGRAM_FOLLOWER_CONTEXT} tokens: {backoff}")
        self._short: tuple[tuple[int, dict, dict], ...] = tuple((int(L), {}, {}) for L in backoff)
        self._first: tuple[int, NgramStep | None] = (-1, None)  # (length, first step) cache
        # contexts of NGRAM_MIN_COPY tokens that earlier passages continued with 2+ different tokens
        self._ambiguous: set[tuple[int, ...]] = set()
        self._long: tuple[int, int] = (-1, 0)  # (length, long_copy_rows at the anchor) cache
        # (length, depth, steps): the last chain from the end of the committed text, no suffix; a
        # chain's first d steps are the chain of depth d, so a round's long_copy and draft share it
        self._anchor: tuple[int, int, list[NgramStep]] = (-1, 0, [])
        self.extend(tokens)

    def __len__(self) -> int:
        return len(self._tokens)

    @property
    def tokens(self) -> list[int]:
        """The committed text indexed so far (a copy)."""
        return list(self._tokens)

    def begins(self, tokens: Sequence[int]) -> bool:
        """Whether the text indexed so far is the start of `tokens` (then ``extend`` with the rest
        gives the index a build over all of `tokens` gives: every table is a function of the text)."""
        n = len(self._tokens)
        return n <= len(tokens) and self._tokens == list(tokens[:n])

    def extend(self, tokens: Sequence[int], precision: SourcePrecision | None = None) -> None:
        """Append committed tokens and index them incrementally.

        With ``precision`` given, each token is first predicted from the text before it and the
        outcomes folded into that tracker (p_src, Eq. (6); all of them at the end, in one call), so
        ``extend(path, precision)`` after each round keeps p_src current with no extra bookkeeping
        in the engine.
        """
        toks = self._tokens
        pos = self._pos
        # the follower tables, (context length, follow, best): the last 3 tokens', then the backoff's
        followers = ((NGRAM_FOLLOWER_CONTEXT, self._follow, self._best), *self._short)
        widest = COPY_CONTEXTS[-1]
        outcomes: list[tuple[NgramStep | None, int]] = []  # (the prediction before it, the token)
        for t in tokens:
            t = int(t)
            if precision is not None:
                outcomes.append((self.first_step(), t))
            i = len(toks)
            window = tuple(toks[-widest:])  # the contexts before token i are suffixes of it
            for L, table in pos.items():
                if i >= L:
                    key = window[-L:]
                    if L == NGRAM_MIN_COPY:
                        q = table.get(key)
                        if q is not None and toks[q] != t:
                            self._ambiguous.add(key)
                    table[key] = i
            for L, follow, best in followers:
                if i >= L:
                    key = window[-L:]
                    counts = follow.get(key)
                    if counts is None:
                        counts = follow[key] = {}
                    c = counts.get(t, 0) + 1
                    counts[t] = c
                    b = best.get(key)
                    # ties go to the most recent follower to reach the count
                    if b is None or c >= b[1]:
                        best[key] = (t, c)
            toks.append(t)
        if outcomes:
            precision.observe_many(outcomes)  # type: ignore[union-attr]  # the tracker reads none of the index

    def chain(self, suffix: Sequence[int] = (), max_depth: int = NGRAM_MAX_DEPTH) -> list[NgramStep]:
        """Continue the text (committed + ``suffix``) for up to ``max_depth`` steps (§3.3).

        Each step proposes the token that followed the most recent earlier occurrence of the
        longest matching context (at least ``NGRAM_MIN_COPY`` tokens) and then reads on along
        that earlier passage; where no passage continues, the most frequent follower of the
        last 3 tokens; the chain stops when nothing is proposed. ``suffix`` holds uncommitted
        tokens (the drafter's picks down to some depth) that the chain starts after. The chain's
        own tokens count as text for the steps after them, so a passage may overlap itself.
        """
        toks = self._tokens
        n = len(toks)
        ext: list[int] = [int(t) for t in suffix]
        out: list[NgramStep] = []
        if max_depth <= 0:
            return out
        anchored = not ext
        if anchored:
            at, depth, steps = self._anchor
            if at == n and depth >= max_depth:
                return steps[:max_depth]
        stop = self._stop
        widest = COPY_CONTEXTS[-1]
        follow_ctx = NGRAM_FOLLOWER_CONTEXT
        while len(out) < max_depth:
            total = n + len(ext)
            # the last `widest` tokens of the text (committed + ext): every context is a suffix of it
            e = len(ext)
            window = tuple(ext[e - widest:]) if e >= widest else tuple(toks[max(0, n - (widest - e)):]) + tuple(ext)
            found = self._passage(window, total)
            if found >= 0:
                # measure the true match (the ladder only bounds it from below); found < n
                if not ext:
                    k = self._copy_match(found)
                else:
                    k = 0
                    while (k < COPY_EVIDENCE_CAP and found - 1 - k >= 0 and toks[found - 1 - k]
                           == (toks[total - 1 - k] if total - 1 - k < n else ext[total - 1 - k - n])):
                        k += 1
                # read on along the passage to the depth or a stop token: a copy, once found, is the
                # rest of the chain (past the committed text it reads its own steps: a passage may
                # overlap itself); each copied token extends the matched context by one
                copy, p, match = NgramKind.COPY, found, k
                for _ in range(max_depth - len(out)):
                    tok = toks[p] if p < n else ext[p - n]
                    if stop is not None and stop(tok):
                        break
                    out.append(NgramStep(tok, copy, match))
                    ext.append(tok)
                    p += 1
                    match = match + 1 if match < COPY_EVIDENCE_CAP else COPY_EVIDENCE_CAP
                break
            if total < follow_ctx:
                break
            step = self._follower(window)
            if step is None or (stop is not None and stop(step.token)):
                break
            out.append(step)
            ext.append(step.token)
        if anchored:
            self._anchor = (n, max_depth, out)
            return list(out)
        return out

    def _passage(self, window: tuple[int, ...], total: int) -> int:
        """Where the earlier passage that the longest matching context (on the ladder) continues
        goes on: the position of its next token, or -1. ``window``: the text's last tokens (at
        least the widest context's worth, or all of a shorter text), ``total`` the text's length."""
        found = -1
        for L in COPY_CONTEXTS:
            if total < L:
                break
            q = self._pos[L].get(window[-L:])
            if q is None:
                break  # no occurrence of L tokens: none of any longer context either
            found = q
        return found

    def _copy_match(self, found: int) -> int:
        """The true match of the committed text's end with the text before position ``found`` (the
        ladder only bounds it from below), capped at COPY_EVIDENCE_CAP."""
        toks = self._tokens
        n, k = len(toks), 0
        while k < COPY_EVIDENCE_CAP and found - 1 - k >= 0 and toks[found - 1 - k] == toks[n - 1 - k]:
            k += 1
        return k

    def first_step(self) -> NgramStep | None:
        """The first step of the chain from the end of the committed text (cached per length):
        the probe the draft gate reads before a round, and the prediction p_src is scored on."""
        n = len(self._tokens)
        if self._first[0] != n:
            self._first = (n, self._first_step())
        return self._first[1]

    def _first_step(self) -> NgramStep | None:
        """``chain((), 1)``'s step, without the chain's machinery (every round and every committed
        token asks for it): the copy of the longest matching context, else the follower."""
        toks = self._tokens
        n = len(toks)
        found = self._passage(tuple(toks[-COPY_CONTEXTS[-1]:]), n) if n >= NGRAM_MIN_COPY else -1
        stop = self._stop
        if found >= 0:
            tok = toks[found]
            return None if stop is not None and stop(tok) else NgramStep(tok, NgramKind.COPY, self._copy_match(found))
        if n < NGRAM_FOLLOWER_CONTEXT:
            return None
        step = self._follower(tuple(toks[n - NGRAM_FOLLOWER_CONTEXT:]))
        if step is None or (stop is not None and stop(step.token)):
            return None
        return step

    def _follower(self, window: tuple[int, ...]) -> NgramStep | None:
        """The most frequent follower of the last 3 tokens of ``window`` (the text's last tokens,
        at least 3), else that of the first backoff context that occurred before (evidence
        BACKOFF_EVIDENCE)."""
        best = self._best.get(window[-NGRAM_FOLLOWER_CONTEXT:])
        if best is not None:
            return NgramStep(best[0], NgramKind.FOLLOWER, best[1])
        for L, _, table in self._short:
            best = table.get(window[-L:])
            if best is not None:
                return NgramStep(best[0], NgramKind.FOLLOWER, BACKOFF_EVIDENCE)
        return None

    def long_copy(self) -> int:
        """Rows ngram-mod's rule would verify from the end of the committed text (``long_copy_rows``
        of the anchor's chain followed to LONG_COPY_DEPTH), or 0 when it would not draft. Cached
        per length; the chain is only followed when the first step is a long enough copy."""
        n = len(self._tokens)
        if self._long[0] != n:
            # the chain is followed only where its first step could start a long copy
            rows = long_copy_rows(self.chain((), LONG_COPY_DEPTH)) if starts_long_copy(self.first_step()) else 0
            self._long = (n, rows)
        return self._long[1]

    def anchor_depth(self) -> int:
        """How deep the engine follows the anchor's chain: LONG_COPY_DEPTH where ngram-mod's rule
        fires (the copy is verified whole), else NGRAM_MAX_DEPTH."""
        return LONG_COPY_DEPTH if self.long_copy() else NGRAM_MAX_DEPTH

    def anchor_ambiguous(self) -> bool:
        """Whether the last NGRAM_MIN_COPY committed tokens occurred before followed by two or more
        different tokens. A copy proposed there was picked among passages that part ways at this
        very point, so it is much less likely right than its matched length says: on the long
        pastes, copies matched on 8-15 tokens were right first 54% of the time here, against 96%
        elsewhere (benchmarks/results/oracle/ngram_policy_ceiling_longpaste.md)."""
        toks = self._tokens
        return len(toks) >= NGRAM_MIN_COPY and tuple(toks[-NGRAM_MIN_COPY:]) in self._ambiguous

    def predict_next(self) -> int | None:
        """The source's top-1 proposal at the anchor (the end of the committed text), or None.

        Used for the precision p_src of Eq. (6): compare it with the token actually committed.
        """
        step = self.first_step()
        return step.token if step is not None else None
