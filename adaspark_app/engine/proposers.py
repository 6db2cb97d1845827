"""The draft sources of a round, each behind one interface: begin / draft / accept.

llama.cpp's ``common/speculative.cpp`` gives every drafter one interface and leaves the loop to
the caller; so do these. The decoder (``decoder.py``) owns the loop: it calls ``begin`` when a
reply starts, ``accept`` with what the target committed, and the arm's policy (``arms.py``)
calls ``draft`` through ``candidates.py``, which builds the round's tree from both sources.

- ``NgramSource`` (§3.3): an index of the reply's committed text (``ngram.NgramIndex``); ``draft``
  follows a chain from the anchor or from a drafter pick. ``accept`` extends the index with the
  tokens committed since it last looked, and the n-gram source's precision (Eq. 6's p_src) learns
  from how the index would have predicted each of them.
- ``DrafterSource`` (§2.2): a DSpark block drafter (``dspark.py``) on the target's hidden
  features. ``accept`` keeps the features of the rows the target just committed (they are only
  readable right after the target's decode); they are injected in one batch before the next
  draft, so a run of plain steps costs no drafter forward. Its KV cache follows the target's
  sequence 0.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from ..learn.gates import PROBE_NONE, probe_class
from ..learn.kinds import NgramKind
from ..learn.precision import SourcePrecision
from .ngram import BACKOFF_CONTEXTS, BACKOFF_EVIDENCE, NgramIndex, NgramStep


class NgramSource:
    """The n-gram proposer: the reply's committed text, indexed; precision learns as it grows."""

    def __init__(self, is_control: Callable[[int], bool], precision: SourcePrecision,
                 backoff: Sequence[int] = BACKOFF_CONTEXTS) -> None:
        self.is_control = is_control  # tokens no chain proposes (the backend's control tokens)
        self.precision = precision
        self.backoff = tuple(backoff)  # shorter follower contexts where nothing else proposes (ngram.py)
        self.index: NgramIndex | None = None
        self._synced = 0  # committed tokens the index holds

    def begin(self, prompt: Sequence[int]) -> None:
        """A reply starts: index its prompt (the reply's first token comes with the first accept).
        Where the index holds the prompt's start (the conversation's previous reply, or its history
        read ahead) only the rest is indexed: the same index, without indexing a long history
        again before the first token (14.2 ms at 4,000 tokens, 29.3 ms at 8,000, on a Xeon core:
        benchmarks/cost/ngram_begin.py)."""
        if self.index is not None and self.index.begins(prompt):
            self.index.extend(prompt[len(self.index):])
        else:
            self.index = NgramIndex(prompt, stop=self.is_control, backoff=self.backoff)
        self._synced = len(prompt)

    def accept(self, kv_tokens: Sequence[int], anchor: int | None) -> None:
        """The committed text is now ``kv_tokens`` and the ``anchor``: index the tokens it has not
        seen (no rebuild; Algorithm 1 line 18), each first scored against the index's prediction."""
        tail = [anchor] if anchor is not None else []
        n = len(kv_tokens) + len(tail)
        if self.index is None:
            self.index = NgramIndex(list(kv_tokens) + tail, stop=self.is_control, backoff=self.backoff)
        elif self._synced < n:  # the new tokens: committed[synced:], without copying the whole text
            self.index.extend(list(kv_tokens[self._synced:]) + tail, self.precision)
        self._synced = n

    def draft(self, suffix: Sequence[int], max_depth: int) -> list[NgramStep]:
        """The chain continuing the committed text and ``suffix`` (drafter picks above it), at most
        ``max_depth`` steps."""
        return self.index.chain(suffix, max_depth)

    def anchor_depth(self) -> int:
        """How deep the anchor's chain may run: to LONG_COPY_DEPTH on a long copy, else NGRAM_MAX_DEPTH."""
        return self.index.anchor_depth()

    def long_copy(self) -> int:
        """Rows llama.cpp's ngram-mod rule would verify at the anchor (0: it would not draft)."""
        return self.index.long_copy()

    def proposes(self) -> bool:
        """Whether the index proposes anything at the anchor (a backoff follower too)."""
        return self.index.first_step() is not None

    def probe(self) -> int:
        """The gates' probe class of the proposal at the anchor: a copy whose context earlier
        passages continued differently counts with the shortest copies (``gates.probe_class``);
        a backoff follower counts as no proposal, so its rounds' gate learns apart from the
        index's other proposals whether drafting pays there (with a drafter: the drafter's
        rounds with at most that guess)."""
        step = self.index.first_step()
        if step is None or (step.kind == NgramKind.FOLLOWER and step.evidence == BACKOFF_EVIDENCE):
            return PROBE_NONE
        return probe_class(step.kind, step.evidence, step.kind == NgramKind.COPY and self.index.anchor_ambiguous())


class DrafterSource:
    """The DSpark drafter: its cache follows the target's; committed rows' features fed lazily."""

    def __init__(self, drafter) -> None:
        self.drafter = drafter  # dspark.DSparkDrafter
        self.rounds = 0  # drafts run (each a drafter forward)
        # Target features of committed rows not yet injected: kept as copies so a run of plain
        # steps costs no drafter forward; injected in one batch before the next draft.
        self._feats: list[np.ndarray] = []
        self._positions: list[int] = []

    def begin(self, cached: int) -> None:
        """A reply starts on a KV cache that keeps its first ``cached`` positions: follow it back."""
        self.truncate(cached)

    def accept(self, rows: Sequence[int], positions: Sequence[int]) -> None:
        """Right after a target decode: keep the features of its committed ``rows`` (at ``positions``)."""
        self._feats.append(self.drafter.target_features(rows))
        self._positions.extend(positions)

    def fits(self, anchor_pos: int) -> bool:
        """Whether a block drafted at ``anchor_pos`` fits the drafter's context. A reply that runs to
        the context's end (the context window lets it: context_window.py) drafts its last
        block_size positions from the n-gram index alone: drafts change speed, never the text."""
        return anchor_pos + self.drafter.block_size <= self.drafter.n_ctx

    def draft(self, anchor: int, anchor_pos: int, k: int, n_draft: int):
        """A block of ``n_draft`` drafted positions after the anchor, ``k`` candidates each
        (``dspark.DraftBlock``); pending features are injected first."""
        self._flush()
        block = self.drafter.draft(anchor, anchor_pos, k, rows=self.drafter.rows_for(n_draft))
        self.rounds += 1
        return block

    def flush(self) -> None:
        """Inject every pending feature now (before the drafter's KV is saved)."""
        self._flush()

    def forget_pending(self) -> None:
        """Drop the pending features: the target's cache was replaced (a saved context put back)."""
        self._feats, self._positions = [], []

    def truncate(self, n: int) -> None:
        """Follow the target's sequence 0 back to positions < n (pending features included)."""
        self._flush(n)
        self.drafter.truncate(n)

    def _flush(self, n: int | None = None) -> None:
        """Inject the pending features of positions the drafter lacks (below n, if given)."""
        if not self._positions:
            return
        feats = np.concatenate(self._feats)
        start = self.drafter.n_positions()
        keep = [i for i, p in enumerate(self._positions) if p >= start and (n is None or p < n)]
        if keep:
            self.drafter.feed_features(feats[keep], [self._positions[i] for i in keep])
        self._feats, self._positions = [], []
