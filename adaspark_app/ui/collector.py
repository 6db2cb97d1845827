"""Python's cyclic garbage collector while a reply streams (issue 17).

A full collection (the oldest generation) walks every object the UI holds: 120,000-170,000 after
start-up (Textual, Rich, Pygments' lexers), 35-50 ms of CPU on this machine's Xeon. Allocation
counts set it off at any moment: in a profiled session one landed inside 2 of 7 replies, and on
two cores that time is taken from a verify. So while a reply streams, the objects alive at its
start are frozen (`gc.freeze`: collections leave them out) and collections look at the reply's
new objects only; once no reply runs they are unfrozen and one full collection runs, the engine idle.
"""

from __future__ import annotations

import gc


def freeze_for_reply() -> None:
    """Leave every object alive now out of collections until `thaw_after_reply`."""
    gc.freeze()


def thaw_after_reply() -> int:
    """Give the frozen objects back to the collector and collect once; returns what it freed
    (0, and no collection, when nothing is frozen)."""
    if not gc.get_freeze_count():
        return 0
    gc.unfreeze()
    return gc.collect()
