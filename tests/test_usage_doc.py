"""docs/usage.md documents every command and every option the CLI takes (``cli.build_parser``) and
every key of the chat (``AdaSparkApp.key_bindings``, what the help screen lists): an option or a
key added without a word in the user's guide fails here."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from adaspark_app.cli import build_parser
from adaspark_app.ui.app import AdaSparkApp

USAGE = Path(__file__).resolve().parent.parent / "docs" / "usage.md"


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(command path, its long options) for every command and subcommand of ``parser``."""
    options = [o for a in parser._actions if not isinstance(a, argparse._SubParsersAction)
               for o in a.option_strings if o.startswith("--") and o != "--help"]
    yield path, options
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sub in a.choices.items():
                yield from _commands(sub, (*path, name))


def _mentions(text: str, option: str) -> bool:
    """``option`` written as an option (``--key``, not the start of ``--keep-capped``)."""
    return re.search(re.escape(option) + r"(?![\w-])", text) is not None


def test_every_command_and_option_of_the_cli_is_in_the_users_guide():
    text = USAGE.read_text()
    commands = list(_commands(build_parser()))
    assert {p[0] for p, _ in commands if p} >= {"chat", "run", "bench", "store", "models", "drafter", "explain"}
    assert ((), ["--version"]) in commands
    missing = [f"adaspark {' '.join(p)}" for p, _ in commands if p and f"adaspark {p[0]}" not in text]
    missing += [" ".join(("adaspark", *p, o)) for p, options in commands for o in options if not _mentions(text, o)]
    assert missing == [], "not in docs/usage.md: " + ", ".join(missing)


def test_an_option_is_found_only_where_it_is_written_whole():
    """Guards the check itself: a prefix of a longer option does not count as the option."""
    assert _mentions("use `--keep-capped` here", "--keep-capped")
    assert not _mentions("use `--keep-capped` here", "--keep")
    assert _mentions("[--key KEY]", "--key") and not _mentions("--keys", "--key")


_KEY_NAMES = {"escape": "Esc", "question_mark": "?"}


def key_display(key: str) -> str:
    """A Textual key as the guide writes it: ``ctrl+up`` -> ``Ctrl+Up``, ``escape`` -> ``Esc``."""
    return "+".join(_KEY_NAMES.get(p, p.upper() if len(p) == 1 or p[0] == "f" and p[1:].isdigit() else p.capitalize())
                    for p in key.split("+"))


def test_every_key_of_the_chat_is_in_the_guides_key_table():
    text = USAGE.read_text()
    table = text[text.index("### Keys"):]
    table = table[:table.index("\n###", 1)]
    keys = {k.strip() for _, b in AdaSparkApp.key_bindings() for k in b.key.split(",")}
    assert {"escape", "ctrl+q", "f5", "ctrl+up", "delete", "enter"} <= keys
    missing = sorted(k for k in keys if re.search(r"(?<![\w+])" + re.escape(key_display(k)) + r"(?![\w+])", table) is None)
    assert missing == [], "keys not in the key table of docs/usage.md: " + ", ".join(map(key_display, missing))


def test_keys_are_written_as_the_guide_writes_them():
    assert [key_display(k) for k in ("ctrl+up", "escape", "f12", "question_mark", "shift+enter", "ctrl+j")] == [
        "Ctrl+Up", "Esc", "F12", "?", "Shift+Enter", "Ctrl+J"]


def test_every_setting_of_the_config_file_is_in_the_guides_example():
    from adaspark_app import config

    text = USAGE.read_text()
    section = text[text.index("## Config file"):]
    section = section[:section.index("\n## ", 1)]
    assert len(config._TOP_KEYS) >= 9 and len(config._SAMPLING_KEYS) >= 7
    missing = [k for k in config._TOP_KEYS if k != "sampling" and re.search(rf"(?m)^{k} = ", section) is None]
    missing += [f"sampling.{k}" for k in config._SAMPLING_KEYS
                if not (re.search(rf"(?m)^{k} = ", section) or _mentions(section, "--" + k.replace("_", "-")))]
    assert "[sampling]" in section and missing == [], "not in the config example of docs/usage.md: " + ", ".join(missing)
