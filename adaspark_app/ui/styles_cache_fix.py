"""A work-around for Textual's `StylesCache` leak (Textualize/textual#6665, open in Textual 8.2).

`textual/_styles_cache.py` decorates the *instance* method `StylesCache.get_inner_outer` with
`functools.lru_cache(1024)`, so every cache key holds the `StylesCache` that asked, and with it
that widget's rendered lines (a `Strip` with seven small caches per line). A chat mounts a widget
per message and per dialog, so up to 1,024 dead widgets' lines stay alive: about 260,000 objects
after 18 chat sessions in one process (measured under the test suite), every one walked again by
each full garbage collection (`ui/collector.py`'s thaw after a reply: ~0.17 s of CPU at that size).

`install` replaces the method with one cached on its two colours only. The result never depended
on the instance (the method builds two styles from the colours), so every widget paints the same.
Where Textual has changed the method (no `lru_cache` on it any more, or another signature), it
leaves Textual's own in place.
"""

from __future__ import annotations

import inspect
from functools import lru_cache
from typing import Any, Callable

CACHE_SIZE = 1024  # Textual's own size for this cache


def install() -> bool:
    """Cache `StylesCache.get_inner_outer` on its colours alone; returns whether it did."""
    from textual._styles_cache import StylesCache

    method = StylesCache.__dict__.get("get_inner_outer")
    original: Callable[..., Any] | None = getattr(method, "__wrapped__", None)
    if original is None or not hasattr(method, "cache_info"):
        return False  # not the leaking lru_cache (fixed upstream, or already installed)
    if list(inspect.signature(original).parameters) != ["cls", "base_background", "background"]:
        return False

    @lru_cache(CACHE_SIZE)
    def inner_outer(base_background: Any, background: Any) -> Any:
        return original(StylesCache, base_background, background)

    def get_inner_outer(self: Any, base_background: Any, background: Any) -> Any:
        return inner_outer(base_background, background)

    get_inner_outer.__doc__ = original.__doc__
    StylesCache.get_inner_outer = get_inner_outer  # type: ignore[method-assign]
    return True
