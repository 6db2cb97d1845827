"""The chat's footer builds its keys in its own style: the keys look as Textual's `Footer` draws
them, and no key is restyled on the way in."""

from __future__ import annotations

from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.widgets import Footer
from textual.widgets._footer import FooterKey

from adaspark_app.ui.widgets import KeyFooter


def _host(footer_type: type[Footer], compact: bool) -> App:
    class Host(App):
        BINDINGS = [Binding("ctrl+n", "new", "New"), Binding("f2", "rename", "Rename"),
                    Binding("f3", "settings", "Settings")]

        def compose(self) -> ComposeResult:
            yield footer_type(compact=compact)

        def action_new(self) -> None:
            pass

        action_rename = action_settings = action_new

    return Host()


async def _keys(footer_type: type[Footer], compact: bool, restyled: list) -> list[tuple]:
    app = _host(footer_type, compact)
    async with app.run_test(size=(100, 10)) as pilot:
        await pilot.pause()
        original = app.update_styles

        def counting(node=None, animate: bool = True) -> None:
            if isinstance(node, FooterKey):
                restyled.append(node)
            original(node, animate=animate)

        app.update_styles = counting
        app.screen.refresh_bindings()  # as a focus move does: the footer builds its keys again
        await pilot.pause()
        await pilot.pause()
        return [(k.key, k.compact, sorted(k.classes)) for k in app.query(FooterKey)]


async def test_keys_look_as_the_stock_footer_draws_them_and_are_not_restyled():
    for compact in (False, True):
        stock_restyled: list = []
        ours_restyled: list = []
        stock = await _keys(Footer, compact, stock_restyled)
        ours = await _keys(KeyFooter, compact, ours_restyled)
        assert ours == stock and len(ours) >= 4, (ours, stock)  # the three bindings and the palette's key
        # the bound keys (the palette's key is built apart, in Textual's way, in both)
        bound = lambda keys: [k.key for k in keys if not k.has_class("-command-palette")]  # noqa: E731
        assert bound(stock_restyled), "the stock footer restyles its keys: this test measures nothing"
        assert not bound(ours_restyled), bound(ours_restyled)
