"""The round loop (Algorithm 1) over one target context: propose, price, choose, verify, commit, learn.

State kept between rounds and turns: `kv_tokens`, the tokens whose cells sit in seq 0 at positions
0..len-1, and the anchor, the last committed token, which is not in the KV cache yet and is row 0
of the next verify. A reply is a sequence of rounds (``reply.run_reply``); each round commits the
accepted path and the target's token after it (the bonus token).

`Decoder.round` is Algorithm 1 step by step. Its collaborators each do one job: the draft sources
(``proposers.py``, one begin / draft / accept interface, the tree built by ``candidates.py``), the
learners per temperature band (``learn.learned_state.Learners``), the arm's policy (``arms.py``:
the gates and the width decision, ``learn/width.py``, for `adaspark`; a fixed rule for a
baseline), and the values passed between the steps are typed records (``rounds.py``).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from ..errors import ContextOverflowError
from ..learn.kinds import Decider, decider_value
from ..learn.learned_state import Learners
from ..learn.width import WidthChoice, clamp
from .arms import Arm, policy_for
from .backend import LlamaBackend
from .candidates import Sources, candidate_set
from .proposers import DrafterSource, NgramSource
from .rounds import (DraftDecision, RoundCounters, RoundOutcome, RoundStart, RoundTree, Verified, decision_trace,
                     tree_outcome)
from .sampling import GREEDY, Sampler, SamplingSettings
from .self_check import check_rows
from .tree import Candidates, accepted_path, chain_ends_at, child_labels, cut_at_batch_front, layout, sampled_path, \
    tree_values


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many first tokens `a` and `b` share."""
    m, lim = 0, min(len(a), len(b))
    while m < lim and a[m] == b[m]:
        m += 1
    return m


def shared_prefix(cached: list[int], prompt: list[int]) -> int:
    """How many of the prompt's first tokens `cached` holds, the prompt's last token left out:
    it is always decoded (its logits give the reply's first token). What `Decoder.start_reply`
    keeps of a cache, and what a saved context would give (ChatEngine)."""
    return common_prefix(cached, prompt[:-1])


class Decoder:
    """Runs rounds for one arm on one backend; owns the learners (persisted by the caller)."""

    def __init__(self, backend: LlamaBackend, arm: Arm, drafter=None, self_check: bool = False) -> None:
        self.backend = backend
        self.arm = arm
        self.learners = Learners()
        self.sources = Sources(NgramSource(backend.is_control, self.learners.precision),
                               DrafterSource(drafter) if drafter is not None else None)
        self.policy = policy_for(arm, self.learners, self.sources, plain_only=backend.recurrent)
        self.self_check = self_check
        self.kv_tokens: list[int] = []
        self.anchor: int | None = None
        self.sampling: SamplingSettings = GREEDY  # greedy decodes the argmax path, untouched
        self.sampler: Sampler | None = None
        self.round_index = 0
        self.request_round = 0
        self.counters = RoundCounters()
        self._pending: list[Callable[[], None]] = []  # work left for the next forward (``later``)
        self._pending_error: BaseException | None = None  # raised by pending work, raised again by _raise_pending

    def later(self, work: Callable[[], None]) -> None:
        """Run `work` during the next forward where it overlaps the host (a GPU: the host would
        otherwise wait), else now. Work runs in the order given, all of it before the reply ends
        or the learned state is read; what it reads of the decoder it must take now."""
        if self.backend.forward_overlaps:
            self._pending.append(work)
        else:
            work()

    def _run_pending(self) -> None:
        """Run, in order, the work a round left for the next forward, if any. It runs inside a
        verify, between the forward's start and its logits' read: an error there waits until the
        round is whole (``_raise_pending``), so the KV cache never holds half a round."""
        pending, self._pending = self._pending, []
        for work in pending:
            try:
                work()
            except BaseException as e:  # noqa: BLE001 - raised again once the round is whole
                if self._pending_error is None:
                    self._pending_error = e

    def _raise_pending(self) -> None:
        """Raise the first error pending work raised, once (``_run_pending``)."""
        err, self._pending_error = self._pending_error, None
        if err is not None:
            raise err

    def _flush_pending(self) -> None:
        """Run what waits for a forward now (the reply's end, the state read) and raise its error."""
        self._run_pending()
        self._raise_pending()

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        """The learned state (``learn.learned_state``'s layout)."""
        self._flush_pending()
        return self.learners.state_dict()

    def load_state(self, state: dict) -> None:
        self.learners.load_state(state)

    def set_sampling(self, settings: SamplingSettings) -> SamplingSettings:
        """Decode the next replies with `settings` (a random seed is drawn if unset); switches the
        learners to the settings' temperature band. Returns the settings with their seed."""
        if settings.greedy:
            self.sampling, self.sampler = settings, None
        else:
            self.sampler = Sampler(settings)
            self.sampling = self.sampler.settings
        self.learners.use_band(settings.band)
        return self.sampling

    @property
    def context(self) -> int:
        """Committed tokens: the KV cache plus the anchor."""
        return len(self.kv_tokens) + (1 if self.anchor is not None else 0)

    def committed(self) -> list[int]:
        return self.kv_tokens + ([self.anchor] if self.anchor is not None else [])

    def _history_tail(self) -> list[int]:
        """The committed tokens the repeat penalty can see (the last repeat_last_n), anchor last."""
        n = self.sampling.repeat_last_n
        kv = self.kv_tokens[-n:] if n > 0 else []
        return kv + ([self.anchor] if self.anchor is not None else [])

    @property
    def _drafter_fed(self) -> DrafterSource | None:
        """The drafter source when committed rows' features go to it (a drafter, an arm that drafts)."""
        return self.sources.drafter if self.policy.drafts else None

    # ------------------------------------------------------------------ a reply's start and end
    def start_reply(self, prompt: list[int],
                    between: Callable[[int], bool] | None = None) -> tuple[int | None, int, float]:
        """Make the KV cache hold `prompt`, prefilling only what differs from what is cached.

        Returns (first generated token, tokens prefilled, prefill seconds). between(done) runs
        between the prefill's chunks with the tokens prefilled so far (``LlamaBackend.prefill``);
        where it returns True the prefill stops: the first token is None and the cache keeps the
        prompt's start read so far, for the next reply to go on from.
        """
        b = self.backend
        self._flush_pending()
        # D without the drafter is host time alone where the forward runs on a GPU: not a clock there
        self.learners.cost.host_clock = not b.forward_overlaps
        if len(prompt) >= b.n_ctx - 1:
            raise ContextOverflowError(
                f"the prompt has {len(prompt)} tokens but the context holds {b.n_ctx}: "
                "start a new conversation or shorten the message")
        m = shared_prefix(self.kv_tokens, prompt)
        t0 = time.perf_counter()
        first, done = self._read(prompt, m, self.sampler is None, between)
        if first is None:  # stopped between chunks
            return None, done, time.perf_counter() - t0
        if self.sampler is not None:  # the first token is drawn like every other: at its position
            first = self.sampler.draw(b.logits_view(1)[0], len(prompt), self.sampler.history(prompt))
        self.anchor = first
        self.sources.ngram.begin(prompt)  # before the first token is shown: part of its wait
        dt = time.perf_counter() - t0
        self.learners.acceptance.begin_request()
        self.request_round = 0
        return first, len(prompt) - m, dt

    def read_ahead(self, tokens: list[int], between: Callable[[int], bool] | None = None) -> int:
        """Make the KV cache hold `tokens` (the start of a prompt to come: a conversation's
        history while its next message is typed), prefilling only what differs from what is
        cached, and no token drawn. between(done) as in ``start_reply``: True stops the reading
        there, the cache keeping what was read. Returns the tokens prefilled."""
        self._flush_pending()
        if len(tokens) >= self.backend.n_ctx - 1:
            return 0
        m = common_prefix(self.kv_tokens, tokens)
        done = 0
        if m < len(tokens):  # else all cached already (and maybe more of the prompt to come): kept
            # the last reply's way of taking tokens (its token unused): a change of it would make a
            # GPU reserve its graphs again, here and at the next reply (LlamaBackend._tokens_on_device)
            first, done = self._read(tokens, m, self.sampler is None, between)
            if first is None:
                return done
        self.sources.ngram.begin(tokens)  # the n-gram index too: the reply indexes only its message
        return done

    def _read(self, tokens: list[int], m: int, argmax: bool,
              between: Callable[[int], bool] | None) -> tuple[int | None, int]:
        """Keep the cache's first m tokens and prefill tokens[m:] after them (the drafter's features
        with them where it drafts). Returns (the argmax after the last token, -1 without argmax,
        None where `between` stopped the prefill; tokens prefilled). The cache then holds what was
        read, with no anchor: `start_reply` sets the first token as the anchor."""
        b = self.backend
        b.seq_rm(0, m, -1)
        self.kv_tokens = self.kv_tokens[:m]
        self.anchor = None
        if self.sources.drafter is not None:
            self.sources.drafter.begin(m)
        fed = self._drafter_fed
        first = b.prefill(tokens[m:], m, on_chunk=fed.accept if fed is not None else None,
                          argmax=argmax, between=between)
        done = len(tokens) - m if first is not None else b.seq_pos_max(0) + 1 - m
        self.kv_tokens = list(tokens[:m + done])
        return first, done

    def adopt_cache(self, tokens: list[int]) -> None:
        """Sequence 0 of the KV cache now holds `tokens` at positions 0..len-1, put back from a
        saved context (ChatEngine): the next ``start_reply`` prefills only what follows them."""
        self._flush_pending()
        self.kv_tokens = list(tokens)
        self.anchor = None
        if self.sources.drafter is not None:  # its KV was put back with the target's
            self.sources.drafter.forget_pending()

    def end_reply(self, keep: int) -> None:
        """Trim the committed state to its first `keep` tokens (a stop inside a round's path)."""
        self._run_pending()  # the last round's work (its error after the trim)
        toks = self.committed()[:keep]
        self.kv_tokens = toks[:-1] if toks else []
        self.anchor = toks[-1] if toks else None
        self.backend.seq_rm(0, len(self.kv_tokens), -1)
        if self.sources.drafter is not None:
            self.sources.drafter.truncate(len(self.kv_tokens))
        self.learners.scheduler.end_request()
        self._raise_pending()

    # ------------------------------------------------------------------ one round (Algorithm 1)
    def round(self, budget: int | None = None) -> RoundOutcome:
        """One round: commits the accepted path and the bonus token (Algorithm 1, line by line).

        ``budget``: tokens the reply may still emit (its cap less what it has); no round verifies
        more rows than that (``learn.width.clamp``).
        """
        r = self._start(budget)                       # line 1: the committed prefix x (n-gram index synced: line 18)
        gate = self.policy.gate(r)                    # (added) the draft and drafter gates
        if not gate.draft:
            return self._finish(r, gate, self._plain(r, gate.decided_by))
        cands = self.policy.propose(gate.use_drafter, self.anchor, len(self.kv_tokens))  # lines 3-4
        if len(cands) == 0:
            return self._finish(r, gate, self._plain(r, Decider.NO_PROPOSAL))
        tree = self.price(cands, gate.use_drafter, r)          # lines 5-6: q_j, Q_j, best-first order O, S(n)
        choice = self.policy.choose(tree, r)                   # lines 7-10: n*, cold/split or Eq. (7)
        selected = self.select(tree, choice, r)                # lines 11-12: first n*-1 nodes, exploration row
        result = self.verify(tree, selected)                   # line 13: one forward, the accepted path
        self.commit(tree, result)                              # line 14: commit the path and the bonus token
        self.learn(tree, choice, selected, result, r)          # lines 15-17: cost, rate, gains, acceptance
        return self._finish(r, gate, tree_outcome(tree, choice, result, gate))

    def _start(self, budget: int | None) -> RoundStart:
        first_round = self.request_round == 0
        self.request_round += 1
        self.round_index += 1
        r = RoundStart(t0=time.perf_counter(), context=self.context, first_round=first_round, budget=budget)
        if self.policy.drafts:
            self.sources.ngram.accept(self.kv_tokens, self.anchor)
        return r

    def _finish(self, r: RoundStart, gate: DraftDecision, out: RoundOutcome) -> RoundOutcome:
        self._raise_pending()  # the round is whole: committed, learned
        self.policy.after_round(r, gate, len(out.new_tokens))
        if not out.trace:  # a plain round: only the gates' part of the trace (a tree round has it all)
            out.trace = decision_trace(None, gate)
        return out

    # ------------------------------------------------------------------ lines 5-6: price
    def price(self, cands: Candidates, use_drafter: bool, r: RoundStart) -> RoundTree:
        """q for every candidate, Q along each path, the best-first order and S(n) for every n."""
        prec = self.learners.precision
        tree = RoundTree(cands=cands, cset=candidate_set(cands, prec), use_drafter=use_drafter, p_src=prec.value)
        tree.q, tree.priced_by = self.policy.price(tree, r)
        # What the commit can keep (tree.committable): the cut drops every node off the batch's
        # front, so Eq. (1) and the best-first order run on Q where it keeps the node, 0 elsewhere;
        # pricing the uncut Q over-promised accepted tokens on branching trees.
        tree.Q, tree.Q_commit, tree.order, tree.is_ng, tree.s_d, tree.s_n = tree_values(tree.q, tree.cset)
        if r.budget is not None and r.budget >= 1:
            tree.s_d, tree.s_n = tree.s_d[:r.budget + 1], tree.s_n[:r.budget + 1]  # widths up to the budget
        tree.ends_at = chain_ends_at(cands, r.budget)
        return tree

    # ------------------------------------------------------------------ lines 11-12: select
    def select(self, tree: RoundTree, choice: WidthChoice, r: RoundStart) -> list[int]:
        """Clamp n* (``learn.width.clamp``); the first n*-1 nodes of O; every EXPLORATION_PERIOD-th
        round with n-gram candidates, the last row explores (line 12)."""
        cands = tree.cands
        width = clamp(choice.width, len(cands), self.backend.n_ctx - r.context, r.budget)
        if width < choice.width:
            choice.decided_by = Decider.CLAMP
        choice.width = width
        selected = tree.order[:width - 1].tolist()
        if self.policy.explores and width > 1 and tree.is_ng.any():
            self.counters.tree_rounds_with_ngram += 1
            acc, nth = self.learners.acceptance, self.counters.tree_rounds_with_ngram
            if len(selected) >= 2 and acc.explores_at(nth):
                placed = np.zeros(len(cands), dtype=bool)
                placed[selected[:-1]] = True
                pick = acc.exploration_pick(tree.cset, placed, nth)
                if pick is not None and pick not in selected[:-1]:
                    selected[-1] = int(pick)
        return selected

    # ------------------------------------------------------------------ line 13: verify
    def verify(self, tree: RoundTree, selected: list[int]) -> Verified:
        """One target forward over the anchor and the selected nodes, laid out depth-first."""
        b = self.backend
        cands = tree.cands
        anchor_pos = len(self.kv_tokens)
        lay = layout(selected, cands)
        b.open_leaf_seqs(lay.leaf_seqs)
        sampler = self.sampler
        out = b.verify([self.anchor] + [cands.token[j] for j in lay.nodes[1:]],
                       [anchor_pos + d for d in lay.depth], lay.seq_ids, argmax=sampler is None,
                       while_computing=self._run_pending)
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
        self.counters.cut_rounds += int(cut)
        self.counters.cut_tokens += len(full_path) - len(path)
        return Verified(layout=lay, argmax=out.argmax, full_path=full_path, path=path, rows=rows, bonus=bonus,
                        verify_s=out.seconds, anchor_pos=anchor_pos, draws=draws)

    # ------------------------------------------------------------------ line 14: commit
    def commit(self, tree: RoundTree, result: Verified) -> None:
        """Commit the path and the bonus token: KV cells, committed tokens, the drafter's features."""
        lay, k = result.layout, len(result.path)
        self.backend.keep_verified_path(lay.seq_ids, lay.leaf_seqs, result.rows[-1], result.anchor_pos, k + 1)
        path_tokens = [tree.cands.token[j] for j in result.path]
        if self.self_check:
            self.counters.checked_rows += check_rows(lay, tree.cands, result.targets, result.rows, path_tokens,
                                                     result.bonus, result.anchor_pos)
        if self.sources.drafter is not None:
            self.sources.drafter.accept(result.rows, [result.anchor_pos + i for i in range(k + 1)])
        self.kv_tokens.append(self.anchor)
        self.kv_tokens.extend(path_tokens)
        self.anchor = result.bonus

    # ------------------------------------------------------------------ lines 15-17: learn
    def learn(self, tree: RoundTree, choice: WidthChoice, selected: list[int], result: Verified,
              r: RoundStart) -> None:
        """The acceptance model learns from every child of every accepted parent (line 17); then the
        round's D is known and the arm's width learners take the round (lines 15-16).

        Where the backend's forward overlaps the host (a GPU: ``LlamaBackend.forward_overlaps``),
        the acceptance model learns during the next round's forward instead, where it costs no
        time: the next round is priced one round's labels behind, and D leaves that work out. The
        scheduler's rate, gains and draft gate wait likewise (its cost model learns now), and a
        plain step's width-1 cost and band rate (``_plain``); all through ``later``."""
        if self.policy.learns_acceptance:
            # sampled: a candidate is accepted when the draw equals it (labels from the draws)
            cands, lay, targets, full_path = tree.cands, result.layout, result.targets, result.full_path
            acc = self.learners.acceptance
            if self.backend.forward_overlaps:  # later, labels and all, with this round's pricing (the next replaces it)
                self.later(acc.deferred(tree.cset, r.context, tree.p_src,
                                        lambda: child_labels(cands, lay, targets, full_path)))
            else:
                acc.learn(tree.cset, r.context, tree.p_src, child_labels(cands, lay, targets, full_path))
        result.fixed_s = (time.perf_counter() - r.t0) - result.verify_s
        self.policy.observe(tree, choice, selected, result, r, self.later)
        self.learners.cost.note_round(result.fixed_s, tree.use_drafter)

    # ------------------------------------------------------------------ plain step
    def _plain(self, r: RoundStart, decided_by: Decider | None) -> RoundOutcome:
        """Width 1 without a tree: one plain step of the anchor."""
        b = self.backend
        anchor = self.anchor
        pos = len(self.kv_tokens)
        if self.sampler is None:
            out = b.verify([anchor], [pos], [(0,)], while_computing=self._run_pending)
            nxt = int(out.argmax[0])
        else:
            out = b.verify([anchor], [pos], [(0,)], argmax=False, while_computing=self._run_pending)
            nxt = self.sampler.draw(b.logits_view(1)[0], pos + 1, self.sampler.history(self._history_tail()))
        self.kv_tokens.append(anchor)
        self.anchor = nxt
        fed = self._drafter_fed
        if fed is not None:
            fed.accept([0], [pos])
        fixed = time.perf_counter() - r.t0 - out.seconds
        self.policy.observe_plain(r, out.seconds + fixed, self.later)
        return RoundOutcome(new_tokens=[nxt], width=1, verify_s=out.seconds, fixed_s=fixed,
                            decided_by=decider_value(decided_by or Decider.ARM))
