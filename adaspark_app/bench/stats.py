"""Comparison statistics of `adaspark bench`, as the paper computes them (§4.1, Table 4).

Pure functions over reply records: no I/O, no timing, no engine. numpy only.

- A reply's decode speed is generated tokens over decode seconds (first to last generated token).
- Two arms are compared by the geometric mean, over replies, of the per-reply speed ratio
  (arm over base arm, the same conversation and turn), with a 95% percentile bootstrap interval
  that resamples whole conversations (replies of one conversation share a history and a store
  state, so they are not independent).
- A reply that hit the token cap in either arm is a greedy repetition loop: trivially predictable
  text that favours every speculative method. It is left out of that comparison and counted.
- A reply with no decode interval (one token, or zero seconds) has no speed: left out, counted.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

import numpy as np

BOOTSTRAP_RESAMPLES = 2000  # percentile interval; 2,000 resamples put the 2.5% tails within ~0.3% of converged
BOOTSTRAP_SEED = 0  # fixed so a report can be recomputed exactly from its replies
CONFIDENCE = 0.95
BAND_FIRST = 256  # context bands: [0, 256), [256, 512), [512, 1024), ... by where a reply starts


def context_band(start_context: int | None) -> str | None:
    """The context band of a reply that starts at `start_context` tokens (prompt included):
    "0-255", "256-511", "512-1023", ... doubling; None when the start is unknown.

    A pinned width may beat the learner in one band and lose in another (verify costs grow with
    context, and so does the text a copy can come from), so the report compares arms per band."""
    if start_context is None or start_context < 0:
        return None
    lo, hi = 0, BAND_FIRST
    while start_context >= hi:
        lo, hi = hi, hi * 2
    return f"{lo}-{hi - 1}"


def band_key(label: str) -> int:
    """Sort key of a band label (its lower end)."""
    return int(label.split("-", 1)[0])


@dataclass
class ReplyRecord:
    """One timed reply of one arm (the fields of OUT.jsonl the statistics need)."""

    arm: str
    conversation: str
    turn: int
    n_tokens: int
    decode_s: float
    looped: bool = False
    category: str | None = None
    text: str = ""
    rounds: int = 0
    widths: dict[int, int] = field(default_factory=dict)
    measure_rounds: int = 0
    repeat: int = 0
    accepted_by_source: dict[str, int] = field(default_factory=dict)  # accepted draft tokens by source
    calibration: dict[str, float] = field(default_factory=dict)  # tree rounds: rounds, expected, accepted
    start_context: int | None = None  # tokens in context when the reply began (`prompt_length`)

    @property
    def speed(self) -> float | None:
        """Decode tokens per second, or None when the reply has no decode interval."""
        if self.n_tokens <= 0 or self.decode_s <= 0:
            return None
        return self.n_tokens / self.decode_s

    @classmethod
    def from_json(cls, d: Mapping) -> "ReplyRecord":
        """Build from an OUT.jsonl-style dict (extra keys ignored; width keys may be strings)."""
        return cls(
            arm=str(d["arm"]),
            conversation=str(d["conversation"]),
            turn=int(d["turn"]),
            n_tokens=int(d["n_tokens"]),
            decode_s=float(d["decode_s"]),
            looped=bool(d.get("looped", False)),
            category=d.get("category"),
            text=d.get("text", "") or "",
            rounds=int(d.get("rounds", 0) or 0),
            widths={int(k): int(v) for k, v in (d.get("widths") or {}).items()},
            measure_rounds=int(d.get("measure_rounds", 0) or 0),
            repeat=int(d.get("repeat", 0) or 0),
            accepted_by_source={str(k): int(v) for k, v in (d.get("accepted_by_source") or {}).items()},
            calibration={str(k): float(v) for k, v in (d.get("calibration") or {}).items()},
            start_context=int(d["prompt_length"]) if d.get("prompt_length") is not None else None,
        )


@dataclass
class MergedReply:
    """One (arm, conversation, turn) over its repeats: mean speed, looped if any repeat looped."""

    arm: str
    conversation: str
    turn: int
    category: str | None
    speed: float | None
    looped: bool
    text: str  # the first repeat's text (repeats differ only by rounding, if at all)
    n_tokens: int
    decode_s: float
    rounds: int
    widths: dict[int, int]
    measure_rounds: int
    start_context: int | None = None


@dataclass
class Comparison:
    """An arm against the base arm over one set of replies (all, or one category)."""

    arm: str
    base: str
    ratio: float | None  # geometric mean of per-reply speed ratios
    ci_low: float | None
    ci_high: float | None
    replies: int  # replies the ratio rests on
    conversations: int
    excluded_looped: int  # paired replies left out: hit the cap in either arm
    excluded_no_speed: int  # paired replies left out: no decode interval in either arm
    unpaired: int  # replies of the arm with no base reply (or the reverse)
    identical: int  # paired replies whose text equals the base arm's
    paired: int

    @property
    def identical_share(self) -> float | None:
        return self.identical / self.paired if self.paired else None

    def to_json(self) -> dict:
        return {
            "arm": self.arm,
            "base": self.base,
            "geomean_ratio": self.ratio,
            "ci95": [self.ci_low, self.ci_high],
            "replies": self.replies,
            "conversations": self.conversations,
            "excluded_looped": self.excluded_looped,
            "excluded_no_speed": self.excluded_no_speed,
            "unpaired": self.unpaired,
            "identical": self.identical,
            "paired": self.paired,
            "identical_share": self.identical_share,
        }


def geometric_mean(values: Iterable[float]) -> float:
    """exp(mean(log x)); raises ValueError on an empty input or a non-positive value."""
    xs = np.asarray(list(values), dtype=float)
    if xs.size == 0:
        raise ValueError("geometric mean of no values")
    if np.any(xs <= 0) or not np.all(np.isfinite(xs)):
        raise ValueError("geometric mean needs positive finite values")
    return float(np.exp(np.mean(np.log(xs))))


def bootstrap_interval(
    log_ratios_by_conversation: Mapping[str, Sequence[float]],
    *,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
    confidence: float = CONFIDENCE,
) -> tuple[float, float]:
    """Percentile bootstrap interval of the geometric-mean ratio, resampling conversations.

    Each resample draws as many conversations as there are, with replacement, and pools all
    their replies' log ratios; the statistic is exp(mean). Conversation order is sorted by id
    so the result depends only on the data and the seed.
    """
    groups = [np.asarray(log_ratios_by_conversation[k], dtype=float)
              for k in sorted(log_ratios_by_conversation)]
    groups = [g for g in groups if g.size]
    if not groups:
        raise ValueError("bootstrap over no replies")
    sums = np.array([g.sum() for g in groups])
    counts = np.array([g.size for g in groups], dtype=float)
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(groups), size=(resamples, len(groups)))
    stats = np.exp(sums[picks].sum(axis=1) / counts[picks].sum(axis=1))
    alpha = (1.0 - confidence) / 2.0
    lo, hi = np.quantile(stats, [alpha, 1.0 - alpha])
    return float(lo), float(hi)


def merge_repeats(records: Iterable[ReplyRecord]) -> dict[tuple[str, str, int], MergedReply]:
    """Group records by (arm, conversation, turn); a reply's speed is the mean over repeats
    (as the paper averages AdaSpark's two runs), and it counts as looped if any repeat looped."""
    groups: dict[tuple[str, str, int], list[ReplyRecord]] = defaultdict(list)
    for r in records:
        groups[(r.arm, r.conversation, r.turn)].append(r)
    merged = {}
    for key, rs in groups.items():
        rs.sort(key=lambda r: r.repeat)
        speeds = [r.speed for r in rs]
        speed = None if any(s is None for s in speeds) else float(np.mean(speeds))
        widths: dict[int, int] = defaultdict(int)
        for r in rs:
            for w, n in r.widths.items():
                widths[w] += n
        merged[key] = MergedReply(
            arm=key[0], conversation=key[1], turn=key[2], category=rs[0].category,
            speed=speed, looped=any(r.looped for r in rs), text=rs[0].text,
            n_tokens=sum(r.n_tokens for r in rs), decode_s=sum(r.decode_s for r in rs),
            rounds=sum(r.rounds for r in rs), widths=dict(widths),
            measure_rounds=sum(r.measure_rounds for r in rs), start_context=rs[0].start_context,
        )
    return merged


def compare(
    merged: Mapping[tuple[str, str, int], MergedReply],
    arm: str,
    base: str,
    *,
    category: str | None = None,
    band: str | None = None,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> Comparison:
    """`arm` over `base`: geometric mean of per-reply speed ratios, bootstrap interval over
    conversations, exclusions counted, identical-reply share. `category` restricts the replies
    to one category (the base reply's category decides), `band` to the turns whose base reply
    started in that context band (`context_band`)."""
    arm_keys = {(c, t) for (a, c, t) in merged if a == arm}
    base_keys = {(c, t) for (a, c, t) in merged if a == base}
    if category is not None:
        arm_keys = {k for k in arm_keys if merged[(arm, *k)].category == category}
        base_keys = {k for k in base_keys if merged[(base, *k)].category == category}
    if band is not None:  # by the base reply's start: a turn keeps its band in every arm
        base_keys = {k for k in base_keys if context_band(merged[(base, *k)].start_context) == band}
        arm_keys &= base_keys
    paired_keys = sorted(arm_keys & base_keys)
    unpaired = len(arm_keys ^ base_keys)
    by_conv: dict[str, list[float]] = defaultdict(list)
    looped = no_speed = identical = 0
    for conv, turn in paired_keys:
        a, b = merged[(arm, conv, turn)], merged[(base, conv, turn)]
        if a.text == b.text:
            identical += 1
        if a.looped or b.looped:
            looped += 1
            continue
        if a.speed is None or b.speed is None:
            no_speed += 1
            continue
        by_conv[conv].append(math.log(a.speed / b.speed))
    n = sum(len(v) for v in by_conv.values())
    ratio = lo = hi = None
    if n:
        ratio = geometric_mean(math.exp(x) for v in by_conv.values() for x in v)
        lo, hi = bootstrap_interval(by_conv, resamples=resamples, seed=seed)
    return Comparison(
        arm=arm, base=base, ratio=ratio, ci_low=lo, ci_high=hi, replies=n,
        conversations=len(by_conv), excluded_looped=looped, excluded_no_speed=no_speed,
        unpaired=unpaired, identical=identical, paired=len(paired_keys),
    )


@dataclass
class ArmSummary:
    """What one arm did over the whole run (its own looped replies left out of the rates)."""

    arm: str
    replies: int
    looped: int
    tokens: int  # generated tokens of non-looped replies
    decode_s: float
    rounds: int
    measure_rounds: int
    widths: dict[int, int]  # verified width -> rounds, all replies
    accepted_by_source: dict[str, int] = field(default_factory=dict)  # non-looped replies
    tree_rounds: int = 0  # priced rounds that verified more than one row (cold-start measurements left out)
    expected_accepted: float = 0.0  # the pricing model's S(n) summed over those rounds
    accepted: int = 0  # draft tokens they accepted

    @property
    def tokens_per_s(self) -> float | None:
        """Summed tokens over summed decode seconds (Table 4's tok/s), looped replies left out."""
        return self.tokens / self.decode_s if self.decode_s > 0 else None

    @property
    def tokens_per_round(self) -> float | None:
        return self.tokens / self.rounds if self.rounds else None

    @property
    def width_shares(self) -> dict[int, float]:
        return width_shares(self.widths)

    @property
    def accepted_per_round_by_source(self) -> dict[str, float]:
        """Accepted draft tokens per round, by the source that proposed them."""
        if not self.rounds:
            return {}
        return {k: v / self.rounds for k, v in sorted(self.accepted_by_source.items())}

    @property
    def calibration(self) -> float | None:
        """Expected over accepted draft tokens on tree rounds: 1.0 is calibrated pricing,
        above 1 the acceptance model promises more than the target gives."""
        return self.expected_accepted / self.accepted if self.accepted else None

    def to_json(self) -> dict:
        return {
            "arm": self.arm,
            "replies": self.replies,
            "looped": self.looped,
            "tokens": self.tokens,
            "decode_s": self.decode_s,
            "tokens_per_s": self.tokens_per_s,
            "rounds": self.rounds,
            "tokens_per_round": self.tokens_per_round,
            "measure_rounds": self.measure_rounds,
            "widths": {str(k): v for k, v in sorted(self.widths.items())},
            "width_shares": {str(k): v for k, v in sorted(self.width_shares.items())},
            "accepted_by_source": dict(sorted(self.accepted_by_source.items())),
            "accepted_per_round_by_source": self.accepted_per_round_by_source,
            "tree_rounds": self.tree_rounds,
            "expected_accepted": self.expected_accepted,
            "accepted": self.accepted,
            "calibration": self.calibration,
        }


def width_shares(widths: Mapping[int, int]) -> dict[int, float]:
    """Share of rounds at each verified width."""
    total = sum(widths.values())
    if not total:
        return {}
    return {int(w): n / total for w, n in sorted(widths.items())}


def summarize_arm(records: Iterable[ReplyRecord], arm: str) -> ArmSummary:
    """Totals of one arm over every repeat. Tokens, seconds and rounds leave out looped
    replies (a loop inflates tokens per round); widths count every round that ran."""
    rs = [r for r in records if r.arm == arm]
    ok = [r for r in rs if not r.looped]
    widths: dict[int, int] = defaultdict(int)
    for r in rs:
        for w, n in r.widths.items():
            widths[int(w)] += int(n)
    by_source: dict[str, int] = defaultdict(int)
    for r in ok:
        for src, n in r.accepted_by_source.items():
            by_source[src] += n
    return ArmSummary(
        arm=arm, replies=len(rs), looped=len(rs) - len(ok),
        tokens=sum(r.n_tokens for r in ok), decode_s=sum(r.decode_s for r in ok),
        rounds=sum(r.rounds for r in ok), measure_rounds=sum(r.measure_rounds for r in rs),
        widths=dict(widths), accepted_by_source=dict(by_source),
        tree_rounds=int(sum(r.calibration.get("rounds", 0) for r in ok)),
        expected_accepted=float(sum(r.calibration.get("expected", 0.0) for r in ok)),
        accepted=int(sum(r.calibration.get("accepted", 0) for r in ok)),
    )


def categories(merged: Mapping[tuple[str, str, int], MergedReply], base: str) -> list[str]:
    """Categories present among the base arm's replies, in sorted order (None left out)."""
    return sorted({m.category for (a, _, _), m in merged.items() if a == base and m.category})


def bands(merged: Mapping[tuple[str, str, int], MergedReply], base: str) -> list[str]:
    """Context bands present among the base arm's replies, lowest first (unknown starts left out)."""
    found = {context_band(m.start_context) for (a, _, _), m in merged.items() if a == base}
    return sorted((b for b in found if b is not None), key=band_key)


def full_comparison(
    records: Sequence[ReplyRecord],
    arms: Sequence[str],
    *,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> dict:
    """Everything the report shows: each arm's summary, and each later arm against the first,
    over all replies, per category and per context band. JSON-ready."""
    base = arms[0]
    merged = merge_repeats(records)
    cats = categories(merged, base)
    bnds = bands(merged, base)
    out = {
        "base_arm": base,
        "arms": {a: summarize_arm(records, a).to_json() for a in arms},
        "comparisons": {},
        "categories": cats,
        "bands": bnds,
    }
    for arm in arms[1:]:
        overall = compare(merged, arm, base, resamples=resamples, seed=seed)
        per_cat = {c: compare(merged, arm, base, category=c, resamples=resamples, seed=seed).to_json()
                   for c in cats}
        per_band = {b: compare(merged, arm, base, band=b, resamples=resamples, seed=seed).to_json()
                    for b in bnds}
        out["comparisons"][arm] = {"overall": overall.to_json(), "by_category": per_cat, "by_band": per_band}
    # looped in any arm: the paper's "looped" column
    looped_any = {(c, t) for (a, c, t), m in merged.items() if m.looped}
    out["looped_any_arm"] = len(looped_any)
    return out
