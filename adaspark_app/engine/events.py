"""What the engine reports: one event per round and one summary per reply.

These are plain dataclasses so the UI, the headless runner and the benchmarks read the same
facts. The engine's worker thread creates them; consumers must treat them as read-only.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ..learn.kinds import SOURCES  # noqa: F401  (re-exported: the keys of the per-source counts)


@dataclass
class RoundEvent:
    """One verify round (Algorithm 1), as logged to ROUNDS.jsonl and shown in the live panel."""

    conversation: str
    turn: int
    round_index: int
    context: int  # committed tokens before the round (c)
    width: int  # rows verified: the anchor plus width-1 candidates
    measured: bool  # a cold-start round run to measure a width
    verify_ms_predicted: float | None  # the cost model's price for this width (None: not priced)
    verify_ms: float  # measured time of the verify forward alone
    fixed_ms: float  # the round's fixed cost D: drafting, tree build, bookkeeping
    expected_accepted: float  # S(n*) under the pricing model
    accepted: int  # draft tokens accepted (the bonus token not counted)
    committed: int  # tokens committed this round (accepted + bonus, clipped at a stop)
    priced_by: str  # "fitted" | "head" | "none"
    rows_by_source: dict[str, int] = field(default_factory=dict)
    accepted_by_source: dict[str, int] = field(default_factory=dict)
    offered: dict[int, float] = field(default_factory=dict)  # width -> priced verify ms now
    band_rate: float | None = None  # long-run tokens/s of the context band, if known
    text: str = ""  # text released to the user by this round (UTF-8 safe)
    reply_tokens: int = 0  # tokens generated so far in this reply
    reply_seconds: float = 0.0  # decode seconds so far in this reply
    prefill: bool = False  # the reply's first token, which the prefill produced: no round ran
    # --- the decision trace: why this round verified `width` rows (adaspark explain) ---
    decided_by: str = "arm"  # the layer that set the width (learn.kinds.Decider)
    incumbent: int | None = None  # the width the chooser held when the round began
    argmax: int | None = None  # the chooser's best-scored offered width: what its rule alone would verify
    mode: str | None = None  # "rate" (V(n) at rho_m) or "ratio" (until the band's rate is known)
    values: dict[int, float] = field(default_factory=dict)  # offered width -> V(n), tokens, at price rho
    rho: float | None = None  # the price of time, tokens/s
    D_ms: float | None = None  # the fixed cost D that priced the round
    gains: list[float] | None = None  # g_d, g_n below n0, then above
    draft_skipped: bool = False  # the draft gate skipped drafting
    drafter_skipped: bool = False  # the drafter gate left the drafter out
    probe: int = 0  # the n-gram probe class at the anchor (learn/gates.py)
    cut_tokens: int = 0  # accepted draft tokens the path cut discarded (engine/tree.py cut_at_batch_front)
    bounded: bool = False  # verified while priced at its upper bound: not yet priced (learn/cost.py at_bound)
    ends_at: int = 0  # the tree was one chain ending at this many rows, and `values` carry the chain-end credit
    # --- sampling (engine/sampling.py): the reply's settings; temperature 0 is greedy ---
    sampling: dict[str, Any] = field(default_factory=dict)  # SamplingSettings.to_json()
    seed: int | None = None  # the reply's seed (None: greedy, no draw)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("text", None)
        d["offered"] = {str(k): v for k, v in self.offered.items()}
        d["values"] = {str(k): v for k, v in self.values.items()}
        return d


@dataclass
class ReplyResult:
    """One generated reply, as written to OUT.jsonl."""

    conversation: str
    turn: int
    text: str
    n_tokens: int
    decode_s: float  # first to last generated token
    prefill_s: float  # the first token's wait: the prompt's tokens, a saved context's read, the prefill
    prompt_tokens: int  # tokens prefilled for this turn (only the new ones when KV is reused)
    context: int  # committed tokens at the end of the reply
    rounds: int
    widths: dict[int, int]  # verified width -> rounds
    measure_rounds: int
    rows_by_source: dict[str, int]
    accepted_by_source: dict[str, int]
    looped: bool  # hit the token cap
    stopped: bool  # cancelled by the user
    arm: str
    tokens: list[int] = field(default_factory=list)
    ngram_rounds: int = 0  # verified rounds with n-gram rows: rounds the n-gram widened (Table 7)
    drafter_rounds: int = 0  # rounds that ran the DSpark drafter's forward
    decided_by: dict[str, int] = field(default_factory=dict)  # deciding layer -> rounds (adaspark explain)
    sampling: dict[str, Any] = field(default_factory=dict)  # SamplingSettings.to_json(); temperature 0: greedy
    seed: int | None = None  # the seed the reply was drawn with (None: greedy)
    # --- the context window (engine/context_window.py) ---
    dropped_turns: int = 0  # oldest turns left out of the prompt so history and reply fit
    prompt_length: int = 0  # tokens of the whole prompt (prompt_tokens counts only the prefilled ones)
    capped_to: int | None = None  # the reply's cap when the context left less than max_tokens
    learned_not_saved: str | None = None  # why the store refused what the reply taught (a full disk)
    restored_tokens: int = 0  # history tokens read from the conversation's saved context, not prefilled
    read_ahead_tokens: int = 0  # history tokens prefilled before the reply was asked (ChatEngine.read_ahead)

    @property
    def tokens_per_s(self) -> float:
        return self.n_tokens / self.decode_s if self.decode_s > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["widths"] = {str(k): v for k, v in sorted(self.widths.items())}
        d["tokens_per_s"] = self.tokens_per_s
        if d["learned_not_saved"] is None:
            del d["learned_not_saved"]  # the usual case: the rows `run` writes stay as they were
        for key in ("restored_tokens", "read_ahead_tokens"):
            if not d[key]:
                del d[key]  # `run` keeps no saved contexts and reads nothing ahead
        return d


@dataclass(frozen=True)
class ReadAhead:
    """What `ChatEngine.read_ahead` did for a conversation before its next reply was asked."""

    conversation: str | None  # None: a new conversation's first message, read as it was typed
    restored: int  # history tokens put back from the conversation's saved context
    read: int  # history tokens prefilled
    held: int  # history tokens the KV cache holds now (the next prompt's start; a draft's too)
    total: int  # the history's tokens (and the draft's): held < total where the reading was stopped
