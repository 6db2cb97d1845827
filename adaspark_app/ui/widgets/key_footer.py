"""The chat's footer of keys: Textual's `Footer`, each key built in the footer's style.

The footer builds a `FooterKey` per shown binding each time the bindings change (a focus move,
a screen pushed): about 30 on the chat screen, several times during start-up. A `FooterKey` starts
compact and the footer then binds it to its own `compact` (off), so each key was restyled twice on
the way in: 2.05 of 6.5 s in a profile of four app starts. Here each key starts in the footer's
style, so the binding changes nothing and no key is restyled (a start-up's CPU about 6% lower).
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.widgets import Footer
from textual.widgets._footer import FooterKey


class KeyFooter(Footer):
    """`Footer` whose keys are built already in its `compact` style."""

    def compose(self) -> ComposeResult:
        for widget in super().compose():
            # only the keys bound to the footer's style (the command palette's key is not)
            if isinstance(widget, FooterKey) and "compact" in (getattr(widget, "_reactive_connect", None) or {}):
                widget.set_reactive(FooterKey.compact, self.compact)
                widget.set_class(self.compact, "-compact", update=False)  # what its watcher would set
            yield widget
