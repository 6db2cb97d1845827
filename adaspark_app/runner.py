"""Headless scripted conversations: SCRIPT.jsonl in, one ReplyResult per turn out."""

from __future__ import annotations

import gzip
import json
import threading
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, TextIO

from . import json_input
from .bounded_read import TooLarge, read_at_most
from .engine.events import ReplyResult, RoundEvent
from .errors import MessageTooLongError, ScriptError

GZ_LIMIT = 256 << 20  # bytes a .gz script may unpack to: a script is text, not a compression bomb
READ_LIMIT = GZ_LIMIT  # bytes a plain one may hold: read whole, it must fit (a device never ends)


@dataclass
class Conversation:
    """One SCRIPT.jsonl line: {"id": str, "system": str (optional), "turns": [user messages]}."""

    id: str
    turns: list[str]
    system: str | None = None
    category: str | None = None
    line: int = 0
    path: str = ""  # the script it came from (errors name the file and line)


def parse_line(obj: Any, where: str) -> Conversation:
    if not isinstance(obj, dict):
        raise ScriptError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    cid = obj.get("id")
    if not isinstance(cid, (str, int)) or str(cid) == "":
        raise ScriptError(f"{where}: \"id\" must be a non-empty string")
    turns = obj.get("turns")
    if not isinstance(turns, list):
        raise ScriptError(f"{where}: \"turns\" must be a list of user messages")
    if not turns:
        raise ScriptError(f"{where}: conversation {cid!r} has no turns")
    for i, t in enumerate(turns):
        if not isinstance(t, str) or not t.strip():
            raise ScriptError(f"{where}: turn {i + 1} of conversation {cid!r} must be a non-empty string")
    system = obj.get("system")
    if system is not None and not isinstance(system, str):
        raise ScriptError(f"{where}: \"system\" must be a string")
    cat = obj.get("category")
    return Conversation(str(cid), list(turns), system, None if cat is None else str(cat))


def read_jsonl(path: str, what: str) -> Iterator[tuple[int, Any]]:
    """The JSON value of each non-blank line of a JSONL file (gzip-compressed where its name ends in
    .gz), with its line number; a missing or unreadable file or a malformed line is a ScriptError
    naming `what`, the file and the line."""
    packed = str(path).endswith(".gz")  # a gzip-compressed file (SCRIPT.jsonl.gz), read whole as a plain one is
    try:  # a plain one may be a pipe (`run <(make_script)`)
        text = read_at_most(path, GZ_LIMIT if packed else READ_LIMIT, gzip.open if packed else open).decode("utf-8")
    except TooLarge as exc:
        if packed:
            raise ScriptError(f"{what} {path} unpacks to more than {GZ_LIMIT >> 20} MiB") from None
        raise ScriptError(f"{what} {path} is {exc}") from None
    except FileNotFoundError:
        raise ScriptError(f"{what} not found: {path}") from None
    except (OSError, EOFError, UnicodeDecodeError, zlib.error) as exc:  # gzip: BadGzipFile is an OSError
        raise ScriptError(f"cannot read {what} {path}: {exc}") from None
    for n, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            yield n, json_input.loads(raw)
        except json.JSONDecodeError as exc:
            raise ScriptError(f"{path}:{n}: malformed JSON ({exc.msg} at column {exc.colno})") from None
        except RecursionError:
            raise ScriptError(f"{path}:{n}: JSON nested too deeply") from None


def load_script(path: str) -> list[Conversation]:
    """Read SCRIPT.jsonl; every problem is a ScriptError naming the file and line."""
    convs: list[Conversation] = []
    seen: set[str] = set()
    for n, obj in read_jsonl(path, "script"):
        where = f"{path}:{n}"
        conv = parse_line(obj, where)
        if conv.id in seen:
            raise ScriptError(f"{where}: duplicate conversation id {conv.id!r}")
        seen.add(conv.id)
        conv.line = n
        conv.path = str(path)
        convs.append(conv)
    if not convs:
        raise ScriptError(f"{path}: the script has no conversations")
    return convs


def run_conversation(engine: Any, conv: Conversation, max_tokens: int,
                     on_round: Callable[[RoundEvent], None] | None = None,
                     log_rounds: TextIO | None = None, sampling: Any = None,
                     on_reply: Callable[[ReplyResult], None] | None = None,
                     cancel: threading.Event | None = None) -> list[ReplyResult]:
    """Generate every turn of `conv`, carrying each reply as history for the next turn.

    The whole history is passed each turn; the engine leaves out the oldest turns that no longer
    fit its context (`dropped_turns` in each result), as the chat does. on_reply(result) runs as
    each reply completes, so a caller writes it before the next turn starts (nothing is lost if a
    later turn fails). A turn whose message alone is too long for the context raises ScriptError
    naming the script line and the turn; the replies before it have gone to on_reply.

    sampling: the SamplingSettings of every reply (None: the engine's default, greedy).
    cancel: set, the reply in progress ends at its next round (`stopped`; it goes to on_reply as
    every reply does) and no turn starts after it."""
    messages: list[dict[str, str]] = []
    if conv.system:
        messages.append({"role": "system", "content": conv.system})
    results: list[ReplyResult] = []

    def cb(ev: RoundEvent) -> None:
        if log_rounds is not None and not ev.prefill:
            log_rounds.write(json.dumps(ev.to_json()) + "\n")
        if on_round is not None:
            on_round(ev)

    for turn, user in enumerate(conv.turns):
        if cancel is not None and cancel.is_set():
            break
        messages.append({"role": "user", "content": user})
        extra = {} if sampling is None else {"sampling": sampling}
        if cancel is not None:
            extra["cancel"] = cancel
        try:
            res = engine.generate(conv.id, messages, max_tokens=max_tokens, on_round=cb, turn=turn, **extra)
        except MessageTooLongError as err:
            where = f"{conv.path}:{conv.line}" if conv.path else f"line {conv.line}"
            raise ScriptError(f"{where}: turn {turn + 1} of conversation {conv.id!r}: {err}") from None
        messages.append({"role": "assistant", "content": res.text})
        results.append(res)
        if on_reply is not None:
            on_reply(res)
    return results
