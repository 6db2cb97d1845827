"""A Textual compositor whose partial updates render only the widgets they touch.

Textual's `Compositor._get_renders(crop)` picks the widgets to render for a partial update by
their *clip* (the region of their container), not by the part of them that is visible. Nearly
every widget of the chat screen is clipped by the screen itself, so a one-line change to a
streaming reply renders the sidebar, the panel, the header and the footer too (17 widgets, ~46
cached lines each, through every line filter): about half of the UI's CPU while a reply streams
(measured in issue 17 with `benchmarks/ui/ui_cpu.py`), on a machine where every UI cycle is taken
from a verify.

`CroppedCompositor` selects by the visible part (region within clip) and renders only the
crop's lines of it. It is exact: a cut the update writes lies inside the crop, so only a widget
whose visible part overlaps the crop can paint it, and the front-to-back order of the rest is
unchanged. If Textual's compositor no
longer has the internals this relies on, `install` leaves the screen's own compositor.
"""

from __future__ import annotations

from typing import Any, Iterable

from textual._compositor import Compositor
from textual.geometry import Region
from textual.strip import Strip


class CroppedCompositor(Compositor):
    """`Compositor` that renders, for a partial update, only widgets whose visible part overlaps it."""

    def _get_renders(self, crop: Region | None = None) -> Iterable[tuple[Region, Region, list[Strip]]]:
        if not crop:
            yield from super()._get_renders(crop)
            return
        overlaps = crop.overlaps
        intersection = Region.intersection
        top, bottom = crop.y, crop.bottom
        for widget, (region, clip) in self.visible_widgets.items():
            visible = intersection(region, clip)
            if not visible or not overlaps(visible):
                continue
            # Only the crop's lines, at the visible part's full width: the caller cuts each line
            # at the screen's cuts from the left edge of what it is given, so that edge must stay.
            x, y, width, height = visible
            y0, y1 = max(y, top), min(y + height, bottom)
            rows = Region(x, y0, width, y1 - y0)
            yield region, intersection(clip, rows), widget.render_lines(Region(x - region.x, y0 - region.y, width, y1 - y0))


def install(screen: Any) -> bool:
    """Give `screen` a CroppedCompositor (before it is first laid out). False if this Textual's
    compositor differs from the one this was written against (the screen keeps its own)."""
    current = getattr(screen, "_compositor", None)
    if type(current) is not Compositor or not callable(getattr(Compositor, "_get_renders", None)) \
            or not hasattr(Compositor, "visible_widgets"):
        return False
    screen._compositor = CroppedCompositor()
    return True
