"""What AdaSpark writes to a terminal is text, never a terminal command hidden in it: a model's
reply may hold ESC or BEL (`ESC ]52;c;...` would set the clipboard), and file names and GGUF
metadata are untrusted. The chat drops such characters from every line it draws
(`ui/control_filter.py`); the commands print them as escapes (`wording.printable`). What is
stored stays exactly what the model wrote."""

from __future__ import annotations

import os
import subprocess
import sys

from rich.segment import Segment
from textual.color import Color
from textual.geometry import Region

from adaspark_app.store import Store
from adaspark_app.ui.app import AdaSparkApp
from adaspark_app.ui.control_filter import DropControls
from adaspark_app.wording import printable
from model_trees import write_gguf
from ui_fakes import scripted, wait_until

HOSTILE = "Sure \x1b]52;c;cHduZWQ=\x07and \x1b[2J\x9b31m red\x7f."


def test_printable_writes_control_characters_as_escapes():
    assert printable("a\x1b[31mb\x07\tc\nd\x9b") == "a\\x1b[31mb\\x07\tc\nd\\x9b"
    assert printable("plain é 中") == "plain é 中"
    # a file name's byte that is not UTF-8 (a surrogate escape) could not be written at all
    assert printable("rep\udcffort") == "rep\\udcffort" and printable("rep\udcffort").encode("utf-8")


def test_the_filter_drops_control_characters_and_keeps_the_cells():
    line = [Segment("ok "), Segment("a\x1b[31mb\x07"), Segment("\x1b"), Segment("x", None, [(1,)])]
    out = DropControls().apply(line, Color(0, 0, 0))
    assert [s.text for s in out] == ["ok ", "a[31mb", "x"]
    assert out[-1].control == [(1,)]  # Textual's own control segments stay
    assert sum(s.cell_length for s in out) == sum(s.cell_length for s in line)
    clean = [Segment("nothing to do")]
    assert DropControls().apply(clean, Color(0, 0, 0)) is clean


def drawn_text(widget) -> str:
    """Every character `widget` and the widgets in it draw, as their lines reach the terminal
    (line filters applied)."""
    out = []
    for w in [widget, *widget.walk_children()]:
        lines = w.render_lines(Region(0, 0, w.size.width, w.size.height))
        out += ["".join(s.text for s in line) for line in lines]
    return "\n".join(out)


async def test_a_reply_holding_terminal_commands_is_drawn_without_them_and_stored_exactly(tmp_path):
    store = Store.open(tmp_path / "chat.db")
    app = AdaSparkApp(scripted([HOSTILE], model_name="evil\x1b[31m.gguf"), store, store_label="chat.db",
                      exit_on_load_error=False)
    try:
        async with app.run_test(size=(100, 30)) as pilot:
            chat = app.chat_screen
            chat.prompt.text = "hi"
            await pilot.press("enter")
            await wait_until(pilot, lambda: chat.conversation.turns and not chat.generating)
            reply = chat.chat_view.messages()[-1]
            await wait_until(pilot, lambda: "Sure" in drawn_text(reply), what="the reply drawn")
            drawn = drawn_text(reply) + drawn_text(app.screen.query_one("Header"))
            assert "Sure" in drawn and "red" in drawn and "evil[31m.gguf" in drawn
            assert not any(c in drawn for c in "\x1b\x07\x9b\x7f")
        (conv,) = store.list_conversations()
        assert store.get_messages(conv["id"])[-1]["content"] == HOSTILE  # what the model wrote
    finally:
        store.close()


def test_commands_print_names_from_files_as_escapes(tmp_path):
    folder = tmp_path / "models"
    write_gguf(folder / "evil\x1b]0;pwned\x07.gguf")
    env = {**os.environ, "ADASPARK_MODELS": str(folder), "ADASPARK_CONFIG": str(tmp_path / "none.toml")}
    listed = subprocess.run([sys.executable, "-m", "adaspark_app.cli", "models", "--paths"], capture_output=True,
                            text=True, timeout=120, env=env)
    assert "evil\\x1b]0;pwned\\x07.gguf" in listed.stdout and "\x1b" not in listed.stdout
    missing = subprocess.run([sys.executable, "-m", "adaspark_app.cli", "run", str(tmp_path / "no\x1b[2Jscript.jsonl")],
                             capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and "no\\x1b[2Jscript.jsonl" in missing.stderr and "\x1b" not in missing.stderr


def test_explain_prints_names_from_its_log_as_escapes(tmp_path, capsys):
    from adaspark_app.cli import main

    log = tmp_path / "rounds.jsonl"
    log.write_text('{"conversation": "c\\u001b[2J", "turn": 0, "width": 1, "decided_by": "cold\\u0007", '
                   '"committed": 1}\n')
    assert main(["explain", str(log)]) == 0
    out = capsys.readouterr().out
    assert "c\\x1b[2J turn 0" in out and "cold\\x07" in out and "\x1b" not in out and "\x07" not in out


async def test_brackets_in_names_titles_and_errors_are_text_not_markup(tmp_path):
    """`[/]` in a conversation's title, a model's name or an error was read as Textual markup and
    raised MarkupError, which ended the chat (a notification quoting it, the delete dialog, the
    settings dialog, the status line). Every such text is plain now."""
    from ui_fakes import notifications

    store = Store.open(tmp_path / "chat.db")
    cid = store.create_conversation("arr[/] and [bold]x[/i]", "m")
    store.replace_messages_from(cid, None, [("user", "arr[/]", None), ("assistant", "ok [/b]", {"n_tokens": 2})])
    app = AdaSparkApp(scripted(["Reply with [/] and [red]x[/blue]"], model_name="evil[/]model"), store,
                      store_label="x[/]y.db", exit_on_load_error=False, system="be [/] brief")
    try:
        async with app.run_test(size=(140, 34), notifications=True) as pilot:
            chat = app.chat_screen
            await wait_until(pilot, lambda: app.engine.ready)
            await chat.open_conversation(cid)
            chat.prompt.text = "hi [/] there"
            await pilot.press("enter")
            await wait_until(pilot, lambda: len(chat.conversation.turns) == 4 and not chat.generating)
            chat.set_status("failed to load /m/evil[/]x.gguf")
            for key in ("f3", "f8", "f2"):  # settings, delete, rename: dialogs quoting the title and model
                await pilot.press(key)
                await pilot.pause(0.2)
                await pilot.press("escape")
            app.notify("Deleted “arr[/]”.")
            chat.notify("screen [/] notify")
            await pilot.pause(0.3)
            assert {"Deleted “arr[/]”.", "screen [/] notify"} <= set(notifications(app))
            assert chat.chat_view.messages()[-1].text == "Reply with [/] and [red]x[/blue]"
            assert app.return_code is None  # still running
    finally:
        store.close()
