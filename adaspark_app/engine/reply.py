"""One reply: rounds of the decoder until the end-of-generation token, the token cap or a stop.

The reply's statistics (rounds, widths, rows and acceptance by source, the deciding layers) are
counted here, over the decoder's rounds; the engine (``chat_engine.py``) turns them into a
``ReplyResult`` and its events.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from ..learn.kinds import source_counts
from .decoder import Decoder
from .rounds import RoundOutcome


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
    drafter = dec.sources.drafter
    drafted0 = drafter.rounds if drafter is not None else 0
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
    stats["drafter_rounds"] = (drafter.rounds if drafter is not None else 0) - drafted0
    return reply, stats
