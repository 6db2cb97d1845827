"""The round loop (Algorithm 1) over one target context: draft, price, order, size, verify, commit.

State kept between rounds and turns: `kv_tokens`, the tokens whose cells sit in seq 0 at positions
0..len-1, and the anchor, the last committed token, which is not in the KV cache yet and is row 0
of the next verify. A reply is a sequence of rounds; each round commits the accepted path and the
target's argmax after it (the bonus token).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..learn.acceptance import AcceptanceModel, CandidateSet, contradicted
from ..learn.constants import NGRAM_MAX_DEPTH, TOP_K
from ..learn.scheduler import PROBE_NONE, WidthScheduler, probe_class
from .arms import MAX_WIDTH, Arm
from .backend import LlamaBackend
from .ngram import KIND_CODES, KIND_COPY, NgramIndex, NgramStep, SourcePrecision
from .tree import (KIND_NGRAM, KIND_PICK, KIND_SIBLING, Candidates, accepted_path, best_first_order,
                   child_labels, expected_accepted, layout, path_products)


class SelfCheckError(AssertionError):
    """The debug self-check found an emitted token that is not the target's argmax for its prefix."""


#: Drafted positions a tree round asks the drafter for. Each row of the block costs about 1 ms on this
#: CPU (an eighth of a target step: the Markov head and the head's rows), and the shipped drafter's
#: rows past the fourth are accepted in under 0.5% of blocks (tools/train_drafter, held out).
TREE_DRAFT_ROWS = 4


@dataclass
class RoundOutcome:
    """What one round committed and what it measured."""

    new_tokens: list[int]
    width: int
    measured: bool
    verify_s: float
    fixed_s: float
    predicted_s: float | None
    expected_accepted: float
    accepted: int
    priced_by: str
    rows_by_source: dict[str, int] = field(default_factory=dict)
    accepted_by_source: dict[str, int] = field(default_factory=dict)
    offered: dict[int, float] = field(default_factory=dict)
    band_rate: float | None = None


class Decoder:
    """Runs rounds for one arm on one backend; owns the learners (persisted by the caller)."""

    def __init__(self, backend: LlamaBackend, arm: Arm, drafter=None, self_check: bool = False) -> None:
        self.backend = backend
        self.arm = arm
        self.drafter = drafter
        self.self_check = self_check
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
        self.plain_only = backend.recurrent
        self.checked_rows = 0
        # Target features of committed rows not yet injected into the drafter: kept as copies so a
        # run of plain steps costs no drafter forward; injected in one batch before the next draft.
        self._feed_feats: list[np.ndarray] = []
        self._feed_pos: list[int] = []

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        return {"scheduler": self.scheduler.state_dict(), "acceptance": self.acceptance.state_dict(),
                "precision": self.precision.state_dict()}

    def load_state(self, state: dict) -> None:
        if state.get("scheduler"):
            self.scheduler.load_state(state["scheduler"])
        if state.get("acceptance"):
            self.acceptance.load_state(state["acceptance"])
        if state.get("precision"):
            self.precision.load_state(state["precision"])

    @property
    def context(self) -> int:
        """Committed tokens: the KV cache plus the anchor."""
        return len(self.kv_tokens) + (1 if self.anchor is not None else 0)

    def committed(self) -> list[int]:
        return self.kv_tokens + ([self.anchor] if self.anchor is not None else [])

    # ------------------------------------------------------------------ prefill
    def start_reply(self, prompt: list[int]) -> tuple[int, int, float]:
        """Make the KV cache hold `prompt`, prefilling only what differs from what is cached.

        Returns (first generated token, tokens prefilled, prefill seconds).
        """
        b = self.backend
        if len(prompt) >= b.n_ctx - 1:
            from ..errors import ContextOverflowError
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
        on_chunk = self._note_rows if self.drafter is not None and self.arm.kind != "ar" else None
        first = b.prefill(prompt[m:], m, on_chunk=on_chunk)
        dt = time.perf_counter() - t0
        self.kv_tokens = list(prompt)
        self.anchor = first
        self.ngram = NgramIndex(prompt)
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

    # ------------------------------------------------------------------ one round
    def round(self, budget: int | None = None) -> RoundOutcome:
        """Run one round for the arm; returns the committed tokens (accepted path + bonus).

        ``budget``: tokens the reply may still emit (its cap less what it has). A round commits at
        most as many tokens as it verifies rows, so no round verifies more rows than that: rows
        past the cap would be paid for and thrown away.
        """
        t0 = time.perf_counter()
        first_round = self.request_round == 0
        self.request_round += 1
        self.round_index += 1
        arm = self.arm.kind
        if arm == "ar" or self.plain_only:
            return self._plain(t0, first_round, tell_scheduler=False)
        ctx = self.context
        self._sync_ngram()
        use_drafter = self.drafter is not None
        if arm == "adaspark":
            step = self.ngram.first_step()
            probe = self._probe(step)
            if probe == PROBE_NONE and self.drafter is None:
                return self._plain(t0, first_round, tell_scheduler=True)  # nothing to propose
            if not self.scheduler.wants_draft(ctx, probe):
                return self._plain(t0, first_round, tell_scheduler=True)
            if self.drafter is not None:
                use_drafter = self.scheduler.wants_drafter(ctx, probe)
                if not use_drafter and probe == PROBE_NONE:
                    out = self._plain(t0, first_round, tell_scheduler=True)
                    self.scheduler.observe_drafter(ctx, probe, False, 1, time.perf_counter() - t0)
                    return out
                outcome = self._drafting_round(t0, first_round, arm, use_drafter, budget)
                self.scheduler.observe_drafter(ctx, probe, use_drafter, len(outcome.new_tokens),
                                               time.perf_counter() - t0)
                return outcome
        return self._drafting_round(t0, first_round, arm, use_drafter, budget)

    def _probe(self, step: NgramStep | None) -> int:
        """The draft gate's probe class of the n-gram proposal at the anchor (probe_class): a copy
        whose context earlier passages continued differently counts with the shortest copies."""
        if step is None:
            return PROBE_NONE
        return probe_class(step.kind, step.evidence, step.kind == KIND_COPY and self.ngram.anchor_ambiguous())

    def _drafting_round(self, t0: float, first_round: bool, arm: str, use_drafter: bool,
                        budget: int | None = None) -> RoundOutcome:
        """A round that builds candidates (with the drafter's block if `use_drafter`) and verifies."""
        ctx = self.context
        if arm == "chain":
            cands = self._chain_candidates(self.arm.k)
        else:
            cands = self._tree_candidates(use_drafter)
        if len(cands) == 0:
            return self._plain(t0, first_round, tell_scheduler=arm == "adaspark")
        cset = self._candidate_set(cands)
        p_src = self.precision.value
        if arm == "chain":
            q = np.ones(len(cands))
            priced_by = "none"
        else:
            cset.ng_prec = self._node_precision(cset)  # only the acceptance model reads it
            q, priced_by = self.acceptance.q(cset, ctx, p_src)
        parent = np.asarray(cands.parent)
        Q = path_products(q, parent)
        order = best_first_order(Q)
        is_ng = np.array([k == KIND_NGRAM and not a for k, a in zip(cands.kind, cands.agreed)], dtype=bool)
        s_d, s_n = expected_accepted(Q, order, is_ng)
        if budget is not None and budget >= 1:
            s_d, s_n = s_d[:budget + 1], s_n[:budget + 1]  # widths up to the budget are offered
        measured = False
        predicted = None
        offered: dict[int, float] = {}
        band_rate = None
        plan = None
        if arm == "adaspark":
            fixed_now = time.perf_counter() - t0
            fixed_ema = self._fixed_ema.get(use_drafter)
            plan = self.scheduler.plan(ctx, s_d, s_n, fixed_ema if fixed_ema is not None else fixed_now)
            width = plan.width
            measured = plan.measured
            predicted = plan.predicted_verify_s
            offered = plan.offered
            band_rate = plan.band_rate
        elif arm == "pinned":
            width = self.arm.k
        else:  # chain
            width = len(cands) + 1
        width = max(1, min(width, len(cands) + 1, MAX_WIDTH, self.backend.n_ctx - ctx,
                           budget if budget is not None else MAX_WIDTH))
        selected = [int(j) for j in order[:width - 1]]
        if arm != "chain" and width > 1 and (is_ng.any()):
            self.tree_rounds_with_ngram += 1
            placed = np.zeros(len(cands), dtype=bool)
            placed[selected[:-1]] = True
            if len(selected) >= 2:
                pick = self.acceptance.exploration_pick(cset, placed, self.tree_rounds_with_ngram)
                if pick is not None and pick not in selected[:-1]:
                    selected[-1] = int(pick)
        return self._verify_round(t0, first_round, cands, cset, Q, is_ng, selected, width, measured,
                                  predicted, priced_by, offered, band_rate, plan, s_d, s_n, p_src, use_drafter)

    # ------------------------------------------------------------------ plain step
    def _plain(self, t0: float, first_round: bool, tell_scheduler: bool) -> RoundOutcome:
        b = self.backend
        anchor = self.anchor
        pos = len(self.kv_tokens)
        out = b.verify([anchor], [pos], [(0,)])
        nxt = int(out.argmax[0])
        self.kv_tokens.append(anchor)
        self.anchor = nxt
        if self.drafter is not None and self.arm.kind != "ar":
            self._note_rows([0], [pos])
        fixed = time.perf_counter() - t0 - out.seconds
        if tell_scheduler:
            self.scheduler.observe_plain(pos + 1, out.seconds + fixed, first_round)
        return RoundOutcome([nxt], 1, False, out.seconds, fixed, None, 0.0, 0, "none")

    # ------------------------------------------------------------------ candidates
    def _sync_ngram(self) -> None:
        """Extend the n-gram index with the committed tokens it has not seen (incremental)."""
        toks = self.committed()
        if self.ngram is None:
            self.ngram = NgramIndex(toks)
        elif self._ng_synced < len(toks):
            self.ngram.extend(toks[self._ng_synced:], self.precision)
        self._ng_synced = len(toks)

    def _chain_candidates(self, k: int) -> Candidates:
        """`chain:K`: the drafter's first K picks, or without a drafter the n-gram continuation
        from the anchor, up to K tokens (prompt lookup)."""
        cands = Candidates()
        par = -1
        if self.drafter is not None:
            self._drafter_flush()
            block = self.drafter.draft(self.anchor, len(self.kv_tokens), 1, rows=self.drafter.rows_for(k))
            self.drafter_rounds += 1
            for i in range(min(k, block.tokens.shape[0])):
                par = cands.add(par, int(block.tokens[i, 0]), KIND_PICK, sigma=float(block.share[i, 0]))
            return cands
        for st in self.ngram.chain([], k):
            par = cands.add(par, st.token, KIND_NGRAM, ng_kind=KIND_CODES.get(st.kind, 1), ng_evidence=st.evidence)
        return cands

    def _tree_candidates(self, use_drafter: bool = True) -> Candidates:
        """Drafter block (picks spine, siblings as leaves) and n-gram chains from the anchor and each pick."""
        cands = Candidates()
        picks: list[int] = []
        if self.drafter is not None and use_drafter:
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
            steps = self.ngram.chain(suffix, NGRAM_MAX_DEPTH - depth0)
            par = head
            for st in steps:
                kind = KIND_CODES.get(st.kind, 1)
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

    def _node_precision(self, c: CandidateSet) -> np.ndarray:
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

    # ------------------------------------------------------------------ verify and commit
    def _verify_round(self, t0, first_round, cands, cset, Q, is_ng, selected, width, measured,
                      predicted, priced_by, offered, band_rate, plan, s_d, s_n, p_src,
                      use_drafter: bool = True) -> RoundOutcome:
        b = self.backend
        anchor_pos = len(self.kv_tokens)
        lay = layout(selected, cands)
        tokens = [self.anchor] + [cands.token[j] for j in lay.nodes[1:]]
        positions = [anchor_pos + d for d in lay.depth]
        for s in lay.leaf_seqs:
            b.seq_cp(0, s, -1, -1)
        out = b.verify(tokens, positions, lay.seq_ids)
        full_path, bonus, rows = accepted_path(lay, cands, out.argmax)
        path = full_path
        # Commit only the part of the path whose rows are the batch's first rows. llama.cpp's
        # attention walks KV cells in slot order; a path through a later branch leaves its cells
        # after rejected siblings' slots, which later tokens then fill, so the cells would no
        # longer sit in position order and the softmax would sum in another order than plain
        # decode's: replies would drift from `ar`. Cutting there stays lossless (the next token
        # is the target's argmax at the last kept row) and costs the rest of that path.
        c = 0
        while c + 1 < len(rows) and rows[c + 1] == c + 1:
            c += 1
        if c < len(path):
            bonus = cands.token[path[c]]
            path, rows = path[:c], rows[:c + 1]
            self.cut_rounds += 1
        k = len(path)
        if lay.leaf_seqs:
            keep_seq = lay.seq_ids[rows[-1]][0]
            b.seq_cp(keep_seq, 0, anchor_pos, anchor_pos + k + 1)
            for s in lay.leaf_seqs:
                b.seq_rm(s, -1, -1)
        else:
            b.seq_rm(0, anchor_pos + k + 1, -1)
        path_tokens = [cands.token[j] for j in path]
        if self.self_check:
            self._check_rows(lay, cands, out.argmax, rows, path_tokens, bonus, anchor_pos)
        if self.drafter is not None:
            self._note_rows(rows, [anchor_pos + i for i in range(k + 1)])
        self.kv_tokens.append(self.anchor)
        self.kv_tokens.extend(path_tokens)
        self.anchor = bonus
        rows_by: dict[str, int] = {"drafter": 0, "ngram": 0, "agreed": 0}
        acc_by: dict[str, int] = {"drafter": 0, "ngram": 0, "agreed": 0}
        for j in lay.nodes[1:]:
            rows_by[cands.source(j)] += 1
        for j in path:
            acc_by[cands.source(j)] += 1
        if self.arm.kind != "chain":
            labels = child_labels(cands, lay, out.argmax, full_path)
            self.acceptance.learn(cset, anchor_pos + 1, p_src, labels)
        verify_s = out.seconds
        fixed = (time.perf_counter() - t0) - verify_s
        if plan is not None:
            in_path = set(full_path)
            sel = selected
            q_order = Q[np.asarray(sel, dtype=np.int64)] if sel else np.zeros(0)
            src_order = is_ng[np.asarray(sel, dtype=np.int64)].astype(np.int64) if sel else np.zeros(0, np.int64)
            acc_order = np.array([j in in_path for j in sel], dtype=bool)
            self.scheduler.observe(plan, anchor_pos + 1, verify_s, fixed, k + 1, first_round,
                                   q_order, src_order, acc_order)
        self._note_fixed(fixed, use_drafter)
        exp_acc = float((s_d + s_n)[width]) if width < len(s_d) else float((s_d + s_n)[-1])
        return RoundOutcome(path_tokens + [bonus], width, measured, verify_s, fixed, predicted, exp_acc, k,
                            priced_by, rows_by, acc_by, offered, band_rate)

    def _note_fixed(self, fixed: float, use_drafter: bool) -> None:
        """Running estimate of a drafted round's fixed cost D, with and without the drafter's
        forward (plain steps have none to speak of)."""
        old = self._fixed_ema.get(use_drafter)
        self._fixed_ema[use_drafter] = fixed if old is None else 0.8 * old + 0.2 * fixed

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
                                     f"the argmax {int(argmax[r])} of its row")
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
             "ngram_rounds": 0, "drafter_rounds": 0,
             "rows_by_source": {"drafter": 0, "ngram": 0, "agreed": 0},
             "accepted_by_source": {"drafter": 0, "ngram": 0, "agreed": 0}}
    t_first = time.perf_counter()
    if first_token is not None:
        reply.append(first_token)
        if on_round is not None:
            on_round(RoundOutcome([first_token], 0, False, 0.0, 0.0, None, 0.0, 0, "none"), [first_token])
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
