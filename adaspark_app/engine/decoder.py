"""The round loop (Algorithm 1) over one target context: propose, price, choose, verify, commit, learn.

State kept between rounds and turns: `kv_tokens`, the tokens whose cells sit in seq 0 at positions
0..len-1, and the anchor, the last committed token, which is not in the KV cache yet and is row 0
of the next verify. A reply is a sequence of rounds; each round commits the accepted path and the
target's argmax after it (the bonus token).

`Decoder.round` is Algorithm 1 step by step; what differs between arms (`adaspark` and the
baselines) is the arm's policy object (`arms.py`), and the values passed between the steps are
typed records (`rounds.py`).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ..errors import ContextOverflowError
from ..learn.acceptance import AcceptanceModel, CandidateSet, contradicted
from ..learn.constants import FIXED_EMA_WEIGHT, NGRAM_MAX_DEPTH, TOP_K, TREE_DRAFT_ROWS
from ..learn.kinds import Decider, source_counts
from ..learn.precision import SourcePrecision
from ..learn.scheduler import WidthScheduler
from .arms import MAX_WIDTH, Arm, policy_for
from .backend import LlamaBackend
from .ngram import NgramIndex
from .rounds import DraftDecision, RoundStart, RoundTree, Verified, WidthChoice
from .sampling import GREEDY, Sampler, SamplingSettings
from .tree import (KIND_NGRAM, KIND_PICK, KIND_SIBLING, Candidates, accepted_path, best_first_order,
                   child_labels, committable, cut_at_batch_front, expected_accepted, layout, path_products, sampled_path)


class SelfCheckError(AssertionError):
    """The debug self-check found an emitted token that is not the target's argmax for its prefix."""


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


def _trace(choice: WidthChoice | None, gate: DraftDecision) -> dict[str, Any]:
    """The decision trace of a round: the gates' verdicts and, for a scheduled round, the chooser's terms."""
    t: dict[str, Any] = {"draft_skipped": gate.draft_skipped, "drafter_skipped": gate.drafter_skipped,
                         "probe": gate.probe}
    plan = choice.plan if choice is not None else None
    if plan is not None:
        t.update(incumbent=plan.incumbent, argmax=plan.argmax, mode=plan.mode, values=plan.values,
                 rho=plan.rho, D_ms=plan.fixed_s * 1e3, gains=list(plan.gains), bounded=plan.bounded)
    return t


class Decoder:
    """Runs rounds for one arm on one backend; owns the learners (persisted by the caller)."""

    def __init__(self, backend: LlamaBackend, arm: Arm, drafter=None, self_check: bool = False) -> None:
        self.backend = backend
        self.arm = arm
        self.drafter = drafter
        self.self_check = self_check
        self.plain_only = backend.recurrent
        self.policy = policy_for(arm, plain_only=self.plain_only)
        self.scheduler = WidthScheduler()
        self.acceptance = AcceptanceModel()
        self.precision = SourcePrecision()
        self.kv_tokens: list[int] = []
        self.anchor: int | None = None
        self.ngram: NgramIndex | None = None
        self._ng_synced = 0
        self._fixed_ema: dict[bool, float] = {}  # D by whether the drafter ran
        self.drafter_rounds = 0  # rounds that ran the drafter's forward
        self.round_index = 0
        self.request_round = 0
        self.tree_rounds_with_ngram = 0
        self.cut_rounds = 0  # rounds whose accepted path was cut to keep KV cells in position order
        self.cut_tokens = 0  # accepted tokens the cut discarded, over all rounds
        self.checked_rows = 0
        # Target features of committed rows not yet injected into the drafter: kept as copies so a
        # run of plain steps costs no drafter forward; injected in one batch before the next draft.
        self._feed_feats: list[np.ndarray] = []
        self._feed_pos: list[int] = []
        # Sampling (engine/sampling.py): None decodes greedily, the argmax path of old, untouched.
        self.sampling: SamplingSettings = GREEDY
        self.sampler: Sampler | None = None
        # Learned state per temperature band (sampling.temperature_band): acceptance, gains, gates
        # and the long-run rate differ between greedy and sampled decoding, so each band has its
        # own scheduler and acceptance model; the verify-cost model is one, shared (a forward costs
        # the same whatever is drawn from it). Band 0 (greedy) is the top level of state_dict.
        self._bands: dict[int, tuple[WidthScheduler, AcceptanceModel]] = {0: (self.scheduler, self.acceptance)}
        self.band = 0

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        """Greedy's learners at the top level (as before sampling existed); each sampled temperature
        band's scheduler and acceptance model under "by_temperature" -> band (as a string)."""
        sched0, acc0 = self._bands[0]
        out = {"scheduler": sched0.state_dict(), "acceptance": acc0.state_dict(),
               "precision": self.precision.state_dict()}
        extra = {str(b): {"scheduler": sc.state_dict(), "acceptance": ac.state_dict()}
                 for b, (sc, ac) in sorted(self._bands.items()) if b != 0}
        if extra:
            out["by_temperature"] = extra
        return out

    def load_state(self, state: dict) -> None:
        sched0, acc0 = self._bands[0]
        if state.get("scheduler"):
            sched0.load_state(state["scheduler"])
        if state.get("acceptance"):
            acc0.load_state(state["acceptance"])
        if state.get("precision"):
            self.precision.load_state(state["precision"])
        for key, sub in (state.get("by_temperature") or {}).items():
            sc, ac = self._band_learners(int(key))
            if sub.get("scheduler"):
                sc.load_state(sub["scheduler"])
            if sub.get("acceptance"):
                ac.load_state(sub["acceptance"])
        for sc, _ in self._bands.values():
            sc.cost = sched0.cost  # one verify-cost model (load_state replaces the object)

    def _band_learners(self, band: int) -> tuple[WidthScheduler, AcceptanceModel]:
        """The scheduler and acceptance model of a temperature band, created empty on first use
        (sharing band 0's verify-cost model: cold-start measurements need not be repeated)."""
        if band not in self._bands:
            sc = WidthScheduler()
            sc.cost = self._bands[0][0].cost
            self._bands[band] = (sc, AcceptanceModel())
        return self._bands[band]

    def set_sampling(self, settings: SamplingSettings) -> SamplingSettings:
        """Decode the next replies with `settings` (a random seed is drawn if unset); switches the
        learners to the settings' temperature band. Returns the settings with their seed."""
        if settings.greedy:
            self.sampling, self.sampler = settings, None
        else:
            self.sampler = Sampler(settings)
            self.sampling = self.sampler.settings
        self.band = settings.band
        self.scheduler, self.acceptance = self._band_learners(self.band)
        return self.sampling

    def _history_tail(self) -> list[int]:
        """The committed tokens the repeat penalty can see (the last repeat_last_n), anchor last."""
        n = self.sampling.repeat_last_n
        kv = self.kv_tokens[-n:] if n > 0 else []
        return kv + ([self.anchor] if self.anchor is not None else [])

    @property
    def context(self) -> int:
        """Committed tokens: the KV cache plus the anchor."""
        return len(self.kv_tokens) + (1 if self.anchor is not None else 0)

    def committed(self) -> list[int]:
        return self.kv_tokens + ([self.anchor] if self.anchor is not None else [])

    @property
    def feeds_drafter(self) -> bool:
        """Whether committed rows' target features go to the drafter (a drafter, and an arm that drafts)."""
        return self.drafter is not None and self.policy.drafts

    # ------------------------------------------------------------------ prefill
    def start_reply(self, prompt: list[int]) -> tuple[int, int, float]:
        """Make the KV cache hold `prompt`, prefilling only what differs from what is cached.

        Returns (first generated token, tokens prefilled, prefill seconds).
        """
        b = self.backend
        if len(prompt) >= b.n_ctx - 1:
            raise ContextOverflowError(
                f"the prompt has {len(prompt)} tokens but the context holds {b.n_ctx}: "
                "start a new conversation or shorten the message")
        m = 0
        lim = min(len(self.kv_tokens), len(prompt) - 1)
        while m < lim and self.kv_tokens[m] == prompt[m]:
            m += 1
        b.seq_rm(0, m, -1)
        self.kv_tokens = self.kv_tokens[:m]
        if self.drafter is not None:
            self._drafter_truncate(m)
        t0 = time.perf_counter()
        first = b.prefill(prompt[m:], m, on_chunk=self._note_rows if self.feeds_drafter else None,
                          argmax=self.sampler is None)
        if self.sampler is not None:  # the first token is drawn like every other: at its position
            first = self.sampler.draw(b.logits_view(1)[0], len(prompt), self.sampler.history(prompt))
        dt = time.perf_counter() - t0
        self.kv_tokens = list(prompt)
        self.anchor = first
        self.ngram = NgramIndex(prompt, stop=self.backend.is_control)
        self._ng_synced = len(prompt)
        self.acceptance.begin_request()
        self.request_round = 0
        return first, len(prompt) - m, dt

    def end_reply(self, keep: int) -> None:
        """Trim the committed state to its first `keep` tokens (a stop inside a round's path)."""
        toks = self.committed()[:keep]
        self.kv_tokens = toks[:-1] if toks else []
        self.anchor = toks[-1] if toks else None
        self.backend.seq_rm(0, len(self.kv_tokens), -1)
        if self.drafter is not None:
            self._drafter_truncate(len(self.kv_tokens))
        self.scheduler.end_request()

    # ------------------------------------------------------------------ one round (Algorithm 1)
    def round(self, budget: int | None = None) -> RoundOutcome:
        """One round: commits the accepted path and the bonus token (Algorithm 1, line by line).

        ``budget``: tokens the reply may still emit (its cap less what it has). A round commits at
        most as many tokens as it verifies rows, so no round verifies more rows than that: rows
        past the cap would be paid for and thrown away.
        """
        r = self._start(budget)                       # line 1: the committed prefix x (n-gram index synced: line 18)
        gate = self.policy.gate(self, r)              # (added) the draft and drafter gates
        if not gate.draft:
            return self._finish(r, gate, self._plain(r, gate.decided_by))
        cands = self.policy.propose(self, gate.use_drafter)    # lines 3-4: drafter block, n-gram chains
        if len(cands) == 0:
            return self._finish(r, gate, self._plain(r, Decider.NO_PROPOSAL))
        tree = self.price(cands, gate.use_drafter, r)          # lines 5-6: q_j, Q_j, best-first order O, S(n)
        choice = self.policy.choose(self, tree, r)             # lines 7-10: n*, cold/split or Eq. (7)
        self.select(tree, choice, r)                           # lines 11-12: first n*-1 nodes, exploration row
        result = self.verify(tree, choice)                     # line 13: one forward, the accepted path
        self.commit(tree, result)                              # line 14: commit the path and the bonus token
        self.learn(tree, choice, result, r)                    # lines 15-17: cost, rate, gains, acceptance
        return self._finish(r, gate, self._outcome(tree, choice, result, gate))

    def _start(self, budget: int | None) -> RoundStart:
        first_round = self.request_round == 0
        self.request_round += 1
        self.round_index += 1
        r = RoundStart(t0=time.perf_counter(), context=self.context, first_round=first_round, budget=budget)
        if self.policy.drafts:
            self._sync_ngram()
        return r

    def _finish(self, r: RoundStart, gate: DraftDecision, out: RoundOutcome) -> RoundOutcome:
        self.policy.after_round(self, r, gate, len(out.new_tokens))
        if not out.trace:  # a plain round: only the gates' part of the trace (a tree round has it all)
            out.trace = _trace(None, gate)
        return out

    # ------------------------------------------------------------------ line 5-6: price
    def price(self, cands: Candidates, use_drafter: bool, r: RoundStart) -> RoundTree:
        """q for every candidate, Q along each path, the best-first order and S(n) for every n."""
        tree = RoundTree(cands=cands, cset=self._candidate_set(cands), use_drafter=use_drafter,
                         p_src=self.precision.value)
        tree.q, tree.priced_by = self.policy.price(self, tree, r)
        tree.Q = path_products(tree.q, np.asarray(cands.parent))
        # What the commit can keep (tree.committable): the cut drops every node off the batch's
        # front, so Eq. (1) and the best-first order run on Q where it keeps the node, 0 elsewhere;
        # pricing the uncut Q over-promised accepted tokens on branching trees.
        tree.Q_commit = committable(tree.Q, np.asarray(cands.parent))
        tree.order = best_first_order(tree.Q_commit)
        tree.is_ng = np.array([k == KIND_NGRAM and not a for k, a in zip(cands.kind, cands.agreed)], dtype=bool)
        tree.s_d, tree.s_n = expected_accepted(tree.Q_commit, tree.order, tree.is_ng)
        if r.budget is not None and r.budget >= 1:
            tree.s_d, tree.s_n = tree.s_d[:r.budget + 1], tree.s_n[:r.budget + 1]  # widths up to the budget
        return tree

    # ------------------------------------------------------------------ lines 11-12: select
    def select(self, tree: RoundTree, choice: WidthChoice, r: RoundStart) -> None:
        """Clamp n* to what the tree, the budget and the context hold; take the first n*-1 nodes of O;
        every EXPLORATION_PERIOD-th round with n-gram candidates, the last row explores (line 12)."""
        cands = tree.cands
        width = max(1, min(choice.width, len(cands) + 1, MAX_WIDTH, self.backend.n_ctx - r.context,
                           r.budget if r.budget is not None else MAX_WIDTH))
        if width < choice.width:
            choice.decided_by = Decider.CLAMP
        choice.width = width
        selected = [int(j) for j in tree.order[:width - 1]]
        if self.policy.explores and width > 1 and tree.is_ng.any():
            self.tree_rounds_with_ngram += 1
            placed = np.zeros(len(cands), dtype=bool)
            placed[selected[:-1]] = True
            if len(selected) >= 2:
                pick = self.acceptance.exploration_pick(tree.cset, placed, self.tree_rounds_with_ngram)
                if pick is not None and pick not in selected[:-1]:
                    selected[-1] = int(pick)
        choice.selected = selected

    # ------------------------------------------------------------------ line 13: verify
    def verify(self, tree: RoundTree, choice: WidthChoice) -> Verified:
        """One target forward over the anchor and the selected nodes, laid out depth-first."""
        b = self.backend
        cands = tree.cands
        anchor_pos = len(self.kv_tokens)
        lay = layout(choice.selected, cands)
        b.open_leaf_seqs(lay.leaf_seqs)
        sampler = self.sampler
        out = b.verify([self.anchor] + [cands.token[j] for j in lay.nodes[1:]],
                       [anchor_pos + d for d in lay.depth], lay.seq_ids, argmax=sampler is None)
        draws = None
        if sampler is None:
            full_path, bonus, rows = accepted_path(lay, cands, out.argmax)
        else:
            logits, tail = b.logits_view(len(lay.nodes)), self._history_tail()

            def draw(row: int, path_tokens: list[int]) -> int:
                # the row's prefix: the committed tokens, then the path above it (its own history)
                return sampler.draw(logits[row], anchor_pos + len(path_tokens) + 1,
                                    sampler.history(tail, path_tokens))

            full_path, bonus, rows, draws = sampled_path(lay, cands, draw)
        path, rows, bonus, cut = cut_at_batch_front(cands, full_path, rows, bonus)
        self.cut_rounds += int(cut)
        self.cut_tokens += len(full_path) - len(path)
        return Verified(layout=lay, argmax=out.argmax, full_path=full_path, path=path, rows=rows, bonus=bonus,
                        verify_s=out.seconds, anchor_pos=anchor_pos, draws=draws)

    # ------------------------------------------------------------------ line 14: commit
    def commit(self, tree: RoundTree, result: Verified) -> None:
        """Commit the path and the bonus token: KV cells, committed tokens, the drafter's features."""
        lay, k = result.layout, len(result.path)
        self.backend.keep_verified_path(lay.seq_ids, lay.leaf_seqs, result.rows[-1], result.anchor_pos, k + 1)
        path_tokens = [tree.cands.token[j] for j in result.path]
        if self.self_check:
            self._check_rows(lay, tree.cands, result.targets, result.rows, path_tokens, result.bonus,
                             result.anchor_pos)
        if self.drafter is not None:
            self._note_rows(result.rows, [result.anchor_pos + i for i in range(k + 1)])
        self.kv_tokens.append(self.anchor)
        self.kv_tokens.extend(path_tokens)
        self.anchor = result.bonus

    # ------------------------------------------------------------------ lines 15-17: learn
    def learn(self, tree: RoundTree, choice: WidthChoice, result: Verified, r: RoundStart) -> None:
        """The acceptance model learns from every child of every accepted parent (line 17); then the
        round's D is known and the arm's width learners take the round (lines 15-16)."""
        if self.policy.learns_acceptance:
            # sampled: a candidate is accepted when the draw equals it (labels from the draws)
            labels = child_labels(tree.cands, result.layout, result.targets, result.full_path)
            self.acceptance.learn(tree.cset, r.context, tree.p_src, labels)
        result.fixed_s = (time.perf_counter() - r.t0) - result.verify_s
        self.policy.observe(self, tree, choice, result, r)
        old = self._fixed_ema.get(tree.use_drafter)
        self._fixed_ema[tree.use_drafter] = (result.fixed_s if old is None
                                             else (1 - FIXED_EMA_WEIGHT) * old + FIXED_EMA_WEIGHT * result.fixed_s)

    def fixed_estimate(self, use_drafter: bool) -> float | None:
        """Running estimate of a drafted round's fixed cost D, with or without the drafter's forward."""
        return self._fixed_ema.get(use_drafter)

    def _outcome(self, tree: RoundTree, choice: WidthChoice, result: Verified, gate: DraftDecision) -> RoundOutcome:
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
            decided_by=Decider(choice.decided_by).value,
            trace={**_trace(choice, gate), "cut_tokens": len(result.full_path) - len(result.path)})

    # ------------------------------------------------------------------ plain step
    def _plain(self, r: RoundStart, decided_by: Decider | None) -> RoundOutcome:
        """Width 1 without a tree: one plain step of the anchor."""
        b = self.backend
        anchor = self.anchor
        pos = len(self.kv_tokens)
        if self.sampler is None:
            out = b.verify([anchor], [pos], [(0,)])
            nxt = int(out.argmax[0])
        else:
            out = b.verify([anchor], [pos], [(0,)], argmax=False)
            nxt = self.sampler.draw(b.logits_view(1)[0], pos + 1, self.sampler.history(self._history_tail()))
        self.kv_tokens.append(anchor)
        self.anchor = nxt
        if self.feeds_drafter:
            self._note_rows([0], [pos])
        fixed = time.perf_counter() - r.t0 - out.seconds
        self.policy.observe_plain(self, r, out.seconds + fixed)
        return RoundOutcome(new_tokens=[nxt], width=1, verify_s=out.seconds, fixed_s=fixed,
                            decided_by=Decider(decided_by or Decider.ARM).value)

    # ------------------------------------------------------------------ drafter feed
    def _note_rows(self, rows: list[int], positions: list[int]) -> None:
        """Right after a target decode: keep the features of the committed rows for the drafter."""
        self._feed_feats.append(self.drafter.target_features(rows))
        self._feed_pos.extend(positions)

    def _drafter_truncate(self, n: int) -> None:
        """Follow the target's seq 0 back to positions < n (pending features included)."""
        self._drafter_flush(n)
        self.drafter.truncate(n)

    def _drafter_flush(self, n: int | None = None) -> None:
        """Inject the pending features of positions the drafter lacks (below n, if given)."""
        if not self._feed_pos:
            return
        feats = np.concatenate(self._feed_feats)
        start = self.drafter.n_positions()
        keep = [i for i, p in enumerate(self._feed_pos) if p >= start and (n is None or p < n)]
        if keep:
            self.drafter.feed_features(feats[keep], [self._feed_pos[i] for i in keep])
        self._feed_feats, self._feed_pos = [], []

    # ------------------------------------------------------------------ candidates
    def _sync_ngram(self) -> None:
        """Extend the n-gram index with the committed tokens it has not seen (incremental)."""
        toks = self.committed()
        if self.ngram is None:
            self.ngram = NgramIndex(toks, stop=self.backend.is_control)
        elif self._ng_synced < len(toks):
            self.ngram.extend(toks[self._ng_synced:], self.precision)
        self._ng_synced = len(toks)

    def _drafter_fits(self) -> bool:
        """A drafter whose block fits the context at this anchor. A reply that runs to the
        context's end (the context window lets it: engine/context_window.py) drafts its last
        block_size positions from the n-gram index alone: drafts change speed, never the text."""
        d = self.drafter
        return d is not None and len(self.kv_tokens) + d.block_size <= d.n_ctx

    def chain_candidates(self, k: int) -> Candidates:
        """`chain:K`: the drafter's first K picks, or without a drafter the n-gram continuation
        from the anchor, up to K tokens (prompt lookup)."""
        cands = Candidates()
        par = -1
        if self._drafter_fits():
            self._drafter_flush()
            block = self.drafter.draft(self.anchor, len(self.kv_tokens), 1, rows=self.drafter.rows_for(k))
            self.drafter_rounds += 1
            for i in range(min(k, block.tokens.shape[0])):
                par = cands.add(par, int(block.tokens[i, 0]), KIND_PICK, sigma=float(block.share[i, 0]))
            return cands
        for st in self.ngram.chain([], k):
            par = cands.add(par, st.token, KIND_NGRAM, ng_kind=int(st.kind), ng_evidence=st.evidence)
        return cands

    def tree_candidates(self, use_drafter: bool = True) -> Candidates:
        """Drafter block (picks spine, siblings as leaves) and n-gram chains from the anchor and each pick."""
        cands = Candidates()
        picks: list[int] = []
        if use_drafter and self._drafter_fits():
            self._drafter_flush()
            block = self.drafter.draft(self.anchor, len(self.kv_tokens), TOP_K,
                                       rows=self.drafter.rows_for(TREE_DRAFT_ROWS))
            self.drafter_rounds += 1
            par = -1
            conf = block.conf
            for i in range(block.tokens.shape[0]):
                toks = block.tokens[i]
                share = block.share[i]
                h = float(conf[i]) if conf is not None else float("nan")
                sigma = float(share[0])
                sib_mass = float(share[1:].sum()) or 1.0
                pick = cands.add(par, int(toks[0]), KIND_PICK, h=h, sigma=sigma)
                for kk in range(1, len(toks)):
                    if cands.child(par, int(toks[kk])) is None:
                        cands.add(par, int(toks[kk]), KIND_SIBLING, h=h, sigma=sigma,
                                  r=float(share[kk]) / sib_mass)
                picks.append(pick)
                par = pick
        # n-gram chains from the anchor and from each pick (§3.3)
        heads = [-1] + picks
        suffix: list[int] = []
        for depth0, head in enumerate(heads):
            if head >= 0:
                suffix.append(cands.token[head])
            # the anchor's chain runs to 63 tokens on a long copy (ngram.LONG_COPY_DEPTH), so the
            # chooser may verify it whole; chains below a pick stay within NGRAM_MAX_DEPTH
            steps = self.ngram.chain(suffix, self.ngram.anchor_depth() if head < 0 else NGRAM_MAX_DEPTH - depth0)
            par = head
            for st in steps:
                kind = int(st.kind)
                existing = cands.child(par, st.token)
                if existing is not None:
                    if cands.kind[existing] != KIND_NGRAM and not cands.agreed[existing]:
                        cands.agreed[existing] = True
                        cands.ng_kind[existing] = kind
                        cands.ng_evidence[existing] = st.evidence
                    if cands.kind[existing] != KIND_NGRAM and existing not in picks:
                        break  # an agreed sibling is a leaf: the drafter scores nothing below it
                    par = existing
                    if existing in picks:
                        break  # the chain from that pick continues it
                    continue
                # a different proposal under a parent with drafter children: contradiction
                for c in cands.children.get(par, {}).values():
                    if cands.kind[c] != KIND_NGRAM and cands.contra_evidence[c] < 0:
                        cands.contra_evidence[c] = st.evidence
                        cands.contra_kind[c] = kind
                par = cands.add(par, st.token, KIND_NGRAM, ng_kind=kind, ng_evidence=st.evidence)
        return cands

    def node_precision(self, c: CandidateSet) -> np.ndarray:
        """Per candidate, the committed text's precision for the class of its n-gram proposal
        (its own, the one it agrees with, or the one contradicting it): CandidateSet.ng_prec;
        the overall value for drafter candidates with none."""
        contra = contradicted(c)
        kind = np.where(contra, c.contra_kind, c.ng_kind)
        evidence = np.where(contra, c.contra_evidence, c.ng_evidence)
        return self.precision.for_class(kind, evidence)

    @staticmethod
    def _candidate_set(c: Candidates) -> CandidateSet:
        return CandidateSet(
            parent=np.asarray(c.parent, dtype=np.int64), kind=np.asarray(c.kind, dtype=np.int64),
            token=np.asarray(c.token, dtype=np.int64), depth=np.asarray(c.depth, dtype=np.int64),
            h=np.asarray(c.h, dtype=np.float64), sigma=np.asarray(c.sigma, dtype=np.float64),
            r=np.asarray(c.r, dtype=np.float64), ng_kind=np.asarray(c.ng_kind, dtype=np.int64),
            ng_evidence=np.asarray(c.ng_evidence, dtype=np.int64),
            ng_above=np.asarray(c.ng_above, dtype=np.int64), agreed=np.asarray(c.agreed, dtype=bool),
            contra_evidence=np.asarray(c.contra_evidence, dtype=np.int64),
            contra_kind=np.asarray(c.contra_kind, dtype=np.int64))

    # ------------------------------------------------------------------ self-check
    def _check_rows(self, lay, cands, argmax, rows, path_tokens, bonus, anchor_pos) -> None:
        """Debug self-check: each emitted token is the argmax of the row whose prefix is exactly the
        emitted prefix (the row's ancestry equals the committed tokens at those positions)."""
        emitted = path_tokens + [bonus]
        for i, r in enumerate(rows):
            node = lay.nodes[r]
            anc = []
            j = node
            while j >= 0:
                anc.append(cands.token[j])
                j = cands.parent[j]
            anc.reverse()
            if anc != path_tokens[:i] or lay.depth[r] != i:
                raise SelfCheckError(f"row {r} holds prefix {anc} at depth {lay.depth[r]}, "
                                     f"expected {path_tokens[:i]}")
            if int(argmax[r]) != emitted[i]:
                raise SelfCheckError(f"emitted token {emitted[i]} at position {anchor_pos + i + 1} is not "
                                     f"the target's token {int(argmax[r])} of its row (argmax, or draw)")
            self.checked_rows += 1


def run_reply(dec: Decoder, max_tokens: int, is_eog: Callable[[int], bool],
              on_round: Callable[[RoundOutcome, list[int]], None] | None = None,
              cancel: threading.Event | None = None, first_token: int | None = None) -> tuple[list[int], dict]:
    """Decode rounds until EOS, the token cap or cancellation. Returns (reply tokens, stats).

    The reply's tokens include the first token (from the prefill) and, if reached, the
    end-of-generation token. decode_s runs from the first to the last generated token.
    """
    reply: list[int] = []
    stats = {"rounds": 0, "widths": {}, "measure_rounds": 0, "looped": False, "stopped": False, "eog": False,
             "ngram_rounds": 0, "drafter_rounds": 0, "decided_by": {},
             "rows_by_source": source_counts(), "accepted_by_source": source_counts()}
    t_first = time.perf_counter()
    if first_token is not None:
        reply.append(first_token)
        if on_round is not None:
            on_round(RoundOutcome(new_tokens=[first_token], width=0, prefill=True), [first_token])
        if is_eog(first_token):
            stats["eog"] = True
    t_last = t_first
    base = dec.context - len(reply)
    drafted0 = dec.drafter_rounds
    while not stats["eog"] and len(reply) < max_tokens:
        if cancel is not None and cancel.is_set():
            stats["stopped"] = True
            break
        if dec.context >= dec.backend.n_ctx - 1:
            break
        oc = dec.round(budget=max_tokens - len(reply))
        stats["rounds"] += 1
        stats["widths"][oc.width] = stats["widths"].get(oc.width, 0) + 1
        stats["measure_rounds"] += int(oc.measured)
        stats["decided_by"][oc.decided_by] = stats["decided_by"].get(oc.decided_by, 0) + 1
        stats["ngram_rounds"] += int(oc.rows_by_source.get("ngram", 0) > 0)
        for key in stats["rows_by_source"]:
            stats["rows_by_source"][key] += oc.rows_by_source.get(key, 0)
            stats["accepted_by_source"][key] += oc.accepted_by_source.get(key, 0)
        new: list[int] = []
        for t in oc.new_tokens:
            if len(reply) >= max_tokens:
                break
            reply.append(t)
            new.append(t)
            if is_eog(t):
                stats["eog"] = True
                break
        t_last = time.perf_counter()
        if on_round is not None:
            on_round(oc, new)
    if len(reply) >= max_tokens and not stats["eog"]:
        stats["looped"] = True
    # Trim state to what was emitted: the committed context is the prompt plus the reply.
    dec.end_reply(base + len(reply))
    stats["decode_s"] = t_last - t_first
    stats["drafter_rounds"] = dec.drafter_rounds - drafted0
    return reply, stats
