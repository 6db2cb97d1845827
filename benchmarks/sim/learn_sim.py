"""A small seeded simulator of AdaSpark rounds, for the pure learners' tests and `benchmarks.cost.curve_learn`.

Each round builds a candidate tree with a known acceptance law (per-node q, children of a node
mutually exclusive), orders it best-first by Q (Proposition 1), hands S(n) per source to the
scheduler, draws the target's path once and reads, for the chosen width, which placed nodes lay
on it (so every width sees the same outcome: common random numbers). Verify times come from a
true curve T(n, c) with a small two-sided jitter and one-sided interference on a share of rounds.

The decode rate of the learner and of every pinned width is scored on the *expected* tokens
(1 + true S) and the *noise-free* time of each round, so the comparison carries no sampling
noise while the learner still learns from noisy observations.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np

from adaspark_app.learn.law import context_band
from adaspark_app.learn.scheduler import WidthScheduler

Curve = Callable[[np.ndarray | int, int], np.ndarray | float]  # vectorised over rows


def interp_table(table: dict[int, float], n):
    """table[n] for n in the table, linear between its keys and flat beyond them (vectorised over n)."""
    xs = sorted(table)
    return np.interp(n, xs, [table[x] for x in xs])


# --- verify-time curves T(n, c) in seconds ------------------------------------------------
def dense_step(n: int, c: int) -> float:
    """Dense 4-bit target (Table 1 / Figure 3 shape): flat to 8 rows, +50% per fragment of 8
    rows above, and a context slope growing with the class's rows."""
    frag = (np.asarray(n) + 7) // 8
    steps = np.where(frag == 1, 0.0, 1.0 + np.log2(np.maximum(frag, 1)))
    return 0.020 * 1.5**steps + 0.16e-6 * 8 * frag * c


def routed(n: int, c: int) -> float:
    """Mixture-of-experts target: time rises with every row (8 rows 1.64x, 16 rows 2.1x of 2)."""
    return 0.018 * (n / 2.0) ** 0.357 + 0.02e-6 * n * c


CPU_RATIO = {1: 1.0, 2: 1.85, 4: 2.9, 8: 4.8, 16: 8.5, 32: 16.7, 64: 30.0}
CPU_SLOPE = {1: 0.05, 2: 0.2, 4: 0.5, 8: 1.1, 16: 2.5, 32: 5.2, 64: 10.4}  # extra units per 1,100 tokens


def cpu_linear(n: int, c: int) -> float:
    """The linear curve measured on this CPU (shared/DESIGN.md): one row ~10 ms; at 400 tokens
    2 rows 1.85x ... 64 rows 30x; at 1,500 tokens 8 rows 5.9x and 16 rows 11.0x."""
    return 0.010 * (interp_table(CPU_RATIO, n) + interp_table(CPU_SLOPE, n) * (c - 400) / 1100.0)


def wide_cheaper(n: int, c: int) -> float:
    """A wide class cheaper than a narrower one (the 48-row inversion of §3.2): 17-32 rows
    cost less than 9-16 rows."""
    n = np.asarray(n)
    r = np.select([n <= 8, n <= 16, n <= 32], [1.0, 1.6, 1.35], 3.0)
    return 0.020 * r + 0.05e-6 * n * c


# --- acceptance ---------------------------------------------------------------------------
@dataclass
class Acceptance:
    """Per-round acceptance law of the candidate tree.

    The drafter block has ``block`` positions with top-``k`` candidates: the pick accepted with
    probability p (drawn per round from Beta around ``pick``), its siblings sharing ``sib`` of
    the remainder. With probability ``ngram_share`` a round also has an n-gram chain from the
    anchor whose nodes are accepted with ``ngram_q`` (the chain's first node takes ``ngram_first``
    of the anchor's mass). ``overconfidence`` inflates the q the scheduler is told (S(n)) over
    the true q the target follows, so the gains have something to learn.
    """

    pick: float = 0.7
    pick_conc: float = 8.0
    sib: float = 0.5
    block: int = 8
    k: int = 8
    ngram_share: float = 0.0
    ngram_q: float = 0.9
    ngram_first: float = 0.6
    ngram_len: tuple[int, int] = (4, 24)
    overconfidence: float = 1.0


@dataclass
class Tree:
    parent: np.ndarray  # parent node index (-1 = anchor), in best-first order
    q_true: np.ndarray
    q_pred: np.ndarray
    src: np.ndarray
    Q_true: np.ndarray
    Q_pred: np.ndarray
    path: set[int]  # nodes of the full tree on the target's path


def draw_path(children: Mapping[int, Sequence[int]], q: Sequence[float], rng: np.random.Generator) -> list[int]:
    """The target's path through a tree (node -1 is the root): at each node one child is drawn
    with probability q[child] (or none, with what is left), until none or a leaf."""
    path: list[int] = []
    node = -1
    while True:
        kids = children.get(node, [])
        if not kids:
            return path
        u, acc_mass, nxt = rng.random(), 0.0, None
        for kid in kids:
            acc_mass += q[kid]
            if u < acc_mass:
                nxt = kid
                break
        if nxt is None:
            return path
        path.append(nxt)
        node = nxt


def build_tree(rng: np.random.Generator, acc: Acceptance, max_nodes: int = 63) -> Tree:
    p = float(rng.beta(acc.pick * acc.pick_conc, (1.0 - acc.pick) * acc.pick_conc))
    parents: list[int] = []
    qs: list[float] = []
    srcs: list[int] = []
    has_ng = rng.random() < acc.ngram_share
    scale0 = (1.0 - acc.ngram_first) if has_ng else 1.0
    sib_w = 0.5 ** np.arange(acc.k - 1)
    sib_w = sib_w / sib_w.sum()
    prev = -1
    for pos in range(acc.block):
        scale = scale0 if pos == 0 else 1.0
        pick_idx = len(parents)
        parents.append(prev)
        qs.append(p * scale)
        srcs.append(0)
        for j in range(acc.k - 1):
            parents.append(prev)
            qs.append((1.0 - p) * acc.sib * sib_w[j] * scale)
            srcs.append(0)
        prev = pick_idx
    if has_ng:
        length = int(rng.integers(acc.ngram_len[0], acc.ngram_len[1] + 1))
        prev = -1
        for d in range(length):
            idx = len(parents)
            parents.append(prev)
            qs.append(acc.ngram_first if d == 0 else acc.ngram_q)
            srcs.append(1)
            prev = idx
    q = np.array(qs)
    qp = np.minimum(q * acc.overconfidence, 0.999)
    m = len(q)
    qp_list = qp.tolist()
    Qt_list: list[float] = []
    Qp_list: list[float] = []
    for i, par_i in enumerate(parents):  # parents precede children in construction order
        Qt_list.append(qs[i] * (1.0 if par_i < 0 else Qt_list[par_i]))
        Qp_list.append(qp_list[i] * (1.0 if par_i < 0 else Qp_list[par_i]))
    Qt, Qp = np.array(Qt_list), np.array(Qp_list)
    order = np.lexsort((np.arange(m), -Qp))[:max_nodes]  # Proposition 1: decreasing Q, ties by index
    order_list = order.tolist()
    pos_of = {o: i for i, o in enumerate(order_list)}
    # draw the target's path in the full tree: at each accepted node one child or none
    children: dict[int, list[int]] = {}
    for i, par_i in enumerate(parents):
        children.setdefault(par_i, []).append(i)
    path = set(draw_path(children, qs, rng))
    return Tree(
        parent=np.array([pos_of.get(parents[o], -1) if parents[o] >= 0 else -1 for o in order_list]),
        q_true=q[order],
        q_pred=qp[order],
        src=np.array(srcs)[order],
        Q_true=Qt[order],
        Q_pred=Qp[order],
        path={pos_of[i] for i in path if i in pos_of},
    )


def s_arrays(tree: Tree) -> tuple[np.ndarray, np.ndarray]:
    """S(n) per source, n = 0..N (N - 1 nodes): s[0] = s[1] = 0."""
    qd = np.where(tree.src == 0, tree.Q_pred, 0.0)
    qn = np.where(tree.src == 1, tree.Q_pred, 0.0)
    return np.concatenate([[0.0], np.cumsum(np.r_[0.0, qd])]), np.concatenate([[0.0], np.cumsum(np.r_[0.0, qn])])


def accepted_flags(tree: Tree, width: int) -> np.ndarray:
    """Which of the first width-1 nodes lie on the accepted path of that tree (prefix of the path)."""
    placed = width - 1
    flags = np.zeros(placed, dtype=bool)
    for i in range(placed):
        if i in tree.path and (tree.parent[i] < 0 or flags[tree.parent[i]]):
            flags[i] = True
    return flags


# --- the simulation ------------------------------------------------------------------------
@dataclass
class Machine:
    curve: Curve
    d_fixed: float = 0.003  # D: drafter forward + tree build, seconds
    jitter: float = 0.003  # two-sided, relative
    interference: float = 0.2  # share of rounds slowed
    slow: tuple[float, float] = (0.1, 0.6)  # relative slowdown of an interfered round

    def measure(self, rng: np.random.Generator, seconds: float) -> float:
        t = seconds * (1.0 + rng.uniform(-self.jitter, self.jitter))
        if rng.random() < self.interference:
            t *= 1.0 + rng.uniform(*self.slow)
        return t


@dataclass
class BandScore:
    rounds: int = 0
    tokens: float = 0.0
    seconds: float = 0.0
    pinned_tokens: np.ndarray = field(default_factory=lambda: np.zeros(65))
    pinned_seconds: np.ndarray = field(default_factory=lambda: np.zeros(65))
    plain_seconds: float = 0.0
    widths: dict[int, int] = field(default_factory=dict)
    drafted: int = 0

    def rate(self) -> float:
        return self.tokens / self.seconds

    def best_pinned(self) -> tuple[int, float]:
        rates = self.pinned_tokens[1:] / self.pinned_seconds[1:]
        i = int(np.argmax(rates))
        return i + 1, float(rates[i])

    def plain_rate(self) -> float:
        return self.rounds / self.plain_seconds


@dataclass
class RunResult:
    bands: dict[int, BandScore]
    plans: list  # (request, round, context, plan) for every drafted round
    measure_rounds: int
    scheduler: WidthScheduler


def simulate(
    machine: Machine,
    acc: Acceptance,
    requests: list[tuple[int, int]],
    seed: int = 0,
    scheduler: WidthScheduler | None = None,
    score_from_request: int = 1,
    max_width: int = 64,
    rng: np.random.Generator | None = None,
) -> RunResult:
    """Run ``requests`` ((start context, rounds) each) through the scheduler.

    Rounds of requests from ``score_from_request`` on are scored per context band against every
    pinned width 1..64 (which pays D every round, as the engine's pinned:N arm does) and against
    plain decode (no drafting). Pass ``rng`` to continue a random stream across calls.
    """
    rng = rng if rng is not None else np.random.default_rng(seed)
    sch = scheduler if scheduler is not None else WidthScheduler(max_width=max_width)
    bands: dict[int, BandScore] = {}
    plans = []
    measure_rounds = 0
    for r_i, (ctx0, n_rounds) in enumerate(requests):
        ctx = ctx0
        for k in range(n_rounds):
            first = k == 0
            tree = build_tree(rng, acc, max_nodes=max_width - 1)
            n_nodes = len(tree.Q_true)
            s_true = np.concatenate([[0.0], np.cumsum(np.r_[0.0, tree.Q_true])])
            d_true = machine.d_fixed
            t_plain = float(machine.curve(1, ctx))
            draft = sch.wants_draft(ctx)
            if draft:
                s_d, s_n = s_arrays(tree)
                d_meas = machine.measure(rng, d_true)
                plan = sch.plan(ctx, s_d, s_n, d_meas)
                w = min(plan.width, n_nodes + 1)
                flags = accepted_flags(tree, w)
                t_true = float(machine.curve(w, ctx))
                v_meas = machine.measure(rng, t_true)
                committed = int(flags.sum()) + 1
                sch.observe(plan, ctx, v_meas, d_meas, committed, first, tree.Q_pred[: w - 1], tree.src[: w - 1], flags)
                exp_tokens = 1.0 + s_true[w]
                exp_seconds = d_true + t_true
                measure_rounds += int(plan.measured)
                plans.append((r_i, k, ctx, plan))
            else:
                w = 1
                v_meas = machine.measure(rng, t_plain)
                sch.observe_plain(ctx, v_meas, first)
                committed = 1
                exp_tokens, exp_seconds = 1.0, t_plain
            if r_i >= score_from_request:
                b = bands.setdefault(context_band(ctx), BandScore())
                b.rounds += 1
                b.tokens += exp_tokens
                b.seconds += exp_seconds
                b.widths[w] = b.widths.get(w, 0) + 1
                b.drafted += int(draft)
                ns = np.arange(1, 65)
                eff = np.minimum(ns, n_nodes + 1)
                b.pinned_tokens[1:] += 1.0 + s_true[eff]
                b.pinned_seconds[1:] += d_true + machine.curve(eff, ctx)
                b.plain_seconds += t_plain
            ctx += committed
        sch.end_request()
    return RunResult(bands, plans, measure_rounds, sch)
