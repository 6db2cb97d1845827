"""``adaspark store list | show | export [--out F] | import F [--merge] | reset [--yes]``.

The main CLI registers this with ``add_parser(subparsers)`` and dispatches ``run(args)``.
Errors are StoreError (one line, exit 2 in the main CLI).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

from rich.console import Console, RenderHook
from rich.segment import Segment
from rich.table import Table

from adaspark_app.bounded_read import TooLarge, read_at_most
from adaspark_app.errors import AdaSparkError, StoreError
from adaspark_app.output_paths import put_in_place, temp_for

from adaspark_app.learn.state import StateError
from adaspark_app.learn.learned_state import validate as validate_learned
from adaspark_app.wording import counted, one_line, printable

from .db import Store, UnreadableState, resolve_store_path
from .fingerprint import LearnedKey
from .transfer import export_json, import_json

PRICE_CONTEXTS = (256, 1024, 4096)
SHOW_REQUESTS = 10
# ``show --requests N`` lists at most this many (SQLite's LIMIT takes a 64-bit integer; nobody reads more)
SHOW_REQUESTS_MAX = 1_000_000
# bytes `import` reads of an export at most (an export is a few kB a key; a device never ends)
IMPORT_LIMIT = 256 << 20
ACTIONS = ("list", "show", "export", "import", "reset")


def _add_store_option(p: argparse.ArgumentParser, *, top: bool) -> None:
    p.add_argument(
        "--store",
        metavar="DB",
        # on the actions SUPPRESS keeps `store --store X list` from being reset to None
        default=None if top else argparse.SUPPRESS,
        help="learned-state database (default: $ADASPARK_STORE, else the user data dir)",
    )


def add_parser(subparsers: Any) -> None:
    """Register ``store`` and its actions on the main CLI's subparsers."""
    p = subparsers.add_parser(
        "store",
        help="inspect, export, import or reset learned state",
        description="Inspect, export, import or reset the learned store.",
    )
    _add_store_option(p, top=True)
    p.set_defaults(func=run)
    acts = p.add_subparsers(dest="store_action", metavar="{" + ",".join(ACTIONS) + "}")
    acts.required = True

    a = acts.add_parser("list", help="one row per (model, device, drafter) key")
    _add_store_option(a, top=False)

    a = acts.add_parser("show", help="learned widths, priced verify times and acceptance state")
    a.add_argument("--key", help="key id prefix or model name (default: every key)")
    a.add_argument(
        "--requests", type=int, default=SHOW_REQUESTS, metavar="N", help="recent requests to list"
    )
    _add_store_option(a, top=False)

    a = acts.add_parser("export", help="write learned state as versioned JSON")
    a.add_argument("--out", metavar="F", help="output file (default: stdout)")
    a.add_argument("--key", help="export one key (id prefix or model name)")
    _add_store_option(a, top=False)

    a = acts.add_parser("import", help="read an export: replace (default) or --merge")
    a.add_argument("file", metavar="F", help="export file, or - for stdin")
    a.add_argument(
        "--merge",
        action="store_true",
        help="per key keep the later state and add request summaries, instead of replacing",
    )
    _add_store_option(a, top=False)

    a = acts.add_parser("reset", help="delete learned state (asks first unless --yes)")
    a.add_argument("--yes", action="store_true", help="do not ask")
    a.add_argument("--key", help="reset one key (id prefix or model name)")
    _add_store_option(a, top=False)


class _Printable:
    """A renderable drawn as `inner` is, its text's control characters written as escapes."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __rich_console__(self, console: Console, options: Any) -> Any:
        for segment in console.render(self.inner, options):
            if segment.control or not segment.text:
                yield segment
            else:
                yield Segment(printable(segment.text), segment.style)


class PrintableText(RenderHook):
    """What the store holds (model and device names from GGUF files, a damaged state's text) is
    printed as text: its control characters reach the terminal as escapes, not as commands."""

    def process_renderables(self, renderables: list[Any]) -> list[Any]:
        return [_Printable(r) for r in renderables]


def run(args: argparse.Namespace, console: Console | None = None) -> int:
    """Run one ``store`` action; return the exit code. Raises StoreError on failure."""
    action = getattr(args, "store_action", None)
    if action not in ACTIONS:
        raise StoreError(f"store: choose an action: {', '.join(ACTIONS)}")
    if console is None:
        # piped output (scripts, tests) gets room for key ids instead of rich's default 80 columns
        console = Console(highlight=False, markup=False, width=None if sys.stdout.isatty() else 160)
        console.push_render_hook(PrintableText())
    if action == "show":
        n = getattr(args, "requests", SHOW_REQUESTS)
        if not 0 <= n <= SHOW_REQUESTS_MAX:
            raise StoreError(f"store show: --requests must be from 0 to {SHOW_REQUESTS_MAX}, got {n}")
    path = resolve_store_path(getattr(args, "store", None))
    if action in ("list", "show", "export") and not path.exists():
        # looking must not create a store (a typo in --store would leave an empty database)
        if action == "export":
            raise StoreError(f"no store at {path}")
        console.print(f"no learned state in {path} (no store there yet)")
        return 0
    store = Store.open(path)
    try:
        return {
            "list": _cmd_list,
            "show": _cmd_show,
            "export": _cmd_export,
            "import": _cmd_import,
            "reset": _cmd_reset,
        }[action](store, args, console)
    finally:
        store.close()


def main_for_tests(argv: list[str], console: Console | None = None) -> int:
    """Parse ``argv`` as ``adaspark <argv>`` with only ``store`` registered, run it, return the
    exit code; errors print ``adaspark: error: <msg>`` to stderr and return 2, like the CLI."""
    parser = argparse.ArgumentParser(prog="adaspark")
    sub = parser.add_subparsers(dest="command")
    add_parser(sub)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    try:
        return run(args, console)
    except AdaSparkError as exc:
        sys.stderr.write(f"adaspark: error: {one_line(str(exc))}\n")
        return exc.exit_code


# --- actions ------------------------------------------------------------------------------------


def _select(store: Store, pattern: str | None) -> list[LearnedKey]:
    keys = store.find_keys(pattern)
    if pattern and not keys:
        raise StoreError(f"no learned key matches {pattern!r} in {store.path}")
    return keys


def _one(store: Store, pattern: str | None) -> LearnedKey | None:
    if not pattern:
        return None
    keys = _select(store, pattern)
    if len(keys) > 1:
        ids = ", ".join(k.key_id for k in keys)
        raise StoreError(f"{pattern!r} matches {len(keys)} keys ({ids}); give more of the key id")
    return keys[0]


def _cmd_list(store: Store, args: argparse.Namespace, console: Console) -> int:
    rows = store.list_learned()
    if not rows:
        console.print(f"no learned state in {store.path}")
        _show_kept_aside(store, console, set())
        _show_saved_contexts(store, console)
        return 0
    t = Table(title=f"learned state in {store.path}", title_justify="left")
    for col in ("key", "model", "device", "drafter", "requests", "saves", "updated"):
        t.add_column(col, justify="right" if col in ("requests", "saves") else "left")
    for r in rows:
        t.add_row(
            r["key_id"],
            str(r["model_name"]),
            str(r["device_name"]),
            str(r["drafter_name"] or "-"),
            str(r["n_requests"]),
            str(r["n_saves"]),
            str(r["updated"])[:19].replace("T", " "),
        )
    console.print(t)
    _show_kept_aside(store, console, set())
    _show_saved_contexts(store, console)
    return 0


def _show_saved_contexts(store: Store, console: Console) -> None:
    """The chat's saved contexts beside the store (store/saved_context.py), where there are any."""
    from .saved_context import folder_for, usage

    folder = folder_for(store.path)
    n, size = usage(folder)
    if n:
        console.print(f"saved contexts: {_count(n, 'conversation')}, {size / 1e6:.1f} MB in {folder} "
                      "(the config file's saved_context_mb caps them; 0 keeps none)", markup=False, highlight=False)


def _count(value: Any, noun: str) -> str:
    """A stored count and its noun ("1 request", "3 saves"); a store written elsewhere may hold
    anything there, shown as it is."""
    if isinstance(value, int) and not isinstance(value, bool):
        return counted(value, noun)
    return f"{value} {noun}s"


def _ms(seconds: Any) -> str:
    try:
        v = float(seconds) * 1e3
    except (TypeError, ValueError):
        return "-"
    return f"{v:.2f}" if math.isfinite(v) else "-"


def _scalars(d: Any, prefix: str = "", depth: int = 0) -> list[tuple[str, str]]:
    """Flatten the scalar leaves of a state dict (counts, guard sums) for display."""
    out: list[tuple[str, str]] = []
    if not isinstance(d, dict) or depth > 2:
        return out
    for k in sorted(d):
        v = d[k]
        name = f"{prefix}{k}"
        if isinstance(v, bool) or isinstance(v, (int, float, str)) or v is None:
            out.append((name, f"{v:.6g}" if isinstance(v, float) else str(v)))
        elif isinstance(v, dict):
            out.extend(_scalars(v, name + ".", depth + 1))
    return out


def _show_widths(state: dict, console: Console) -> None:
    """The scheduler's priced widths; ``state`` has passed ``learn.learned_state.validate``."""
    from adaspark_app.learn.scheduler import WidthScheduler

    sched = WidthScheduler()
    sched.load_state(state["scheduler"])
    tables = {c: dict(sched.price_table(c)) for c in PRICE_CONTEXTS}
    widths = sorted({int(w) for t in tables.values() for w in t})
    t = Table(title="learned widths: priced verify time (ms)", title_justify="left")
    t.add_column("width", justify="right")
    for c in PRICE_CONTEXTS:
        t.add_column(f"ctx {c}", justify="right")
    for w in widths:
        t.add_row(str(w), *(_ms(_get_width(tables[c], w)) for c in PRICE_CONTEXTS))
    if widths:
        console.print(t)
    else:
        console.print("widths: none priced yet")
    priced, learned = sched.cold_start_progress()
    console.print(f"cold start: {priced} of {learned} widths priced")


def _get_width(table: dict, w: int) -> Any:
    if w in table:
        return table[w]
    return table.get(str(w))


def _fmt(v: Any) -> str:
    if isinstance(v, (dict, list, tuple)):
        try:
            return json.dumps(v, sort_keys=True, default=str)
        except (TypeError, ValueError):
            return str(v)
    return str(v)


def _show_acceptance(state: dict, console: Console) -> None:
    """The acceptance model's guard and counters; ``state`` has passed ``learn.learned_state.validate``."""
    from adaspark_app.learn.acceptance import AcceptanceModel

    acc_state = state["acceptance"]
    model = AcceptanceModel()
    model.load_state(acc_state)
    fitted, head = model.guard_losses()
    t = Table(title="acceptance model", title_justify="left", show_header=False)
    t.add_column("field")
    t.add_column("value", justify="right")
    t.add_row("priced by", model.priced_by)
    t.add_row("guard loss, fitted", _num(fitted))
    t.add_row("guard loss, head", _num(head))
    for part in ("counters", "guard"):
        for name, value in _scalars(acc_state[part], part + "."):
            t.add_row(name, value)
    t.add_row("bucket labels (sum)", _num(sum(acc_state["bucket_labels"]), 0))
    p = state["precision"]
    t.add_row("n-gram precision (hits / proposals)", f"{p['hits']} / {p['trials']}")
    console.print(t)


def _num(v: Any, digits: int = 4) -> str:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return str(v)
    return f"{f:.{digits}f}" if math.isfinite(f) else "-"


def _show_raw(name: str, part: Any, console: Console) -> None:
    if part is None:
        console.print(f"{name}: nothing stored")
        return
    if isinstance(part, dict):
        leaves = _scalars(part)
        if leaves:
            console.print(f"{name} (raw):")
            t = Table(show_header=False)
            t.add_column("field")
            t.add_column("value", justify="right")
            for k, v in leaves[:40]:
                t.add_row(k, v)
            console.print(t)
        others = sorted(k for k, v in part.items() if isinstance(v, (list, dict)))
        if others:
            console.print(f"{name}: also holds {', '.join(others)}")
        return
    text = _fmt(part)
    console.print(f"{name}: {text[:400]}{'…' if len(text) > 400 else ''}")


def _show_requests(store: Store, key: LearnedKey, n: int, console: Console) -> None:
    rows = store.request_summaries(key, limit=n)
    if not rows:
        return
    t = Table(title=f"last {counted(len(rows), 'request')}", title_justify="left")
    for col in ("created", "arm", "conversation", "turn", "tokens", "tok/s", "rounds", "measured",
                "widths"):
        t.add_column(col, justify="left" if col in ("created", "arm", "conversation", "widths")
                     else "right")
    for r in rows:
        widths = r.get("widths") or {}
        wtext = " ".join(f"{w}:{c}" for w, c in sorted(widths.items(), key=lambda kv: str(kv[0]).zfill(6)))
        t.add_row(
            str(r.get("created") or "")[:19].replace("T", " "),
            str(r.get("arm") or "-"),
            str(r.get("conversation") or "-"),
            _opt(r.get("turn")),
            _opt(r.get("n_tokens")),
            _num(r.get("tokens_per_s"), 1) if r.get("tokens_per_s") is not None else "-",
            _opt(r.get("rounds")),
            _opt(r.get("measure_rounds")),
            wtext or "-",
        )
    console.print(t)


def _opt(v: Any) -> str:
    return "-" if v is None else str(v)


def _show_kept_aside(store: Store, console: Console, shown: set[str]) -> None:
    """States kept aside (they did not load) of keys not shown above: a key whose state was set
    aside has no learned state until the engine saves it again."""
    rows = [q for q in store.quarantined() if q["key_id"] not in shown]
    for q in rows:
        console.print(f"kept aside {str(q['quarantined'])[:19].replace('T', ' ')} for key {q['key_id']}: "
                      f"a learned state that did not load ({q['reason']})")


def _cmd_show(store: Store, args: argparse.Namespace, console: Console) -> int:
    pattern = getattr(args, "key", None)
    keys = _select(store, pattern)
    if not keys:
        console.print(f"no learned state in {store.path}")
        _show_kept_aside(store, console, set())
        return 0
    info = {r["key_id"]: r for r in store.list_learned()}
    for key in keys:
        r = info.get(key.key_id, {})
        console.rule(f"{r.get('model_name')} on {r.get('device_name')}"
                     + (f" with drafter {r.get('drafter_name')}" if key.drafter_id else ""))
        console.print(f"key {key.key_id}: {_count(r.get('n_requests'), 'request')}, "
                      f"{_count(r.get('n_saves'), 'save')}, updated {r.get('updated')}")
        raw = None
        try:
            raw = store.load_learned(key)
            state = validate_learned(raw)
        except (StateError, UnreadableState) as exc:  # shown, never a traceback: show is for looking
            console.print(f"learned state: does not load ({exc}); the engine will keep it aside and start fresh")
            for k in sorted(raw) if isinstance(raw, dict) else ():
                _show_raw(k, raw[k], console)
        else:
            _show_widths(state, console)
            _show_acceptance(state, console)
        for q in store.quarantined(key):
            console.print(f"kept aside {str(q['quarantined'])[:19].replace('T', ' ')}: a learned state "
                          f"that did not load ({q['reason']})")
        _show_requests(store, key, getattr(args, "requests", SHOW_REQUESTS), console)
    if not pattern:
        _show_kept_aside(store, console, {k.key_id for k in keys})
    return 0


def _write_atomic(path: Path, text: str) -> None:
    """Write a file whole or not at all: a temp file in the same folder, then rename."""
    path = path.expanduser()
    try:
        fd, tmp = temp_for(path, prefix=f".{path.name}.")
    except OSError as exc:
        raise StoreError(f"cannot write {path}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as fh:
            fh.write(text)
        put_in_place(tmp, path)  # a device (/dev/stdout, /dev/null) is written through, not replaced
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise StoreError(f"cannot write {path}: {exc.strerror or exc}") from None


def _cmd_export(store: Store, args: argparse.Namespace, console: Console) -> int:
    key = _one(store, getattr(args, "key", None))
    text = export_json(store, key)
    out = getattr(args, "out", None)
    if out and out != "-":
        _write_atomic(Path(out), text)
        n = len(json.loads(text)["learned"])
        sys.stderr.write(f"exported {counted(n, 'learned key')} to {out}\n")
    else:
        sys.stdout.write(text)
        sys.stdout.flush()
    return 0


def _cmd_import(store: Store, args: argparse.Namespace, console: Console) -> int:
    src = args.file
    try:
        text = read_at_most(src if src == "-" else Path(src).expanduser(), IMPORT_LIMIT).decode("utf-8")
    except TooLarge as exc:
        raise StoreError(f"import: {src} is {exc}, not an export") from None
    except FileNotFoundError:
        raise StoreError(f"import: no such file {src}") from None
    except UnicodeDecodeError:
        raise StoreError(f"import: {src} is not UTF-8 text") from None
    except OSError as exc:
        raise StoreError(f"import: cannot read {src}: {exc.strerror or exc}") from None
    try:
        messages = import_json(store, text, "merge" if args.merge else "replace")
    except StoreError as exc:
        raise StoreError(f"{src}: {exc}") from None
    for m in messages:
        console.print(m)
    return 0


def _confirm(question: str) -> bool:
    from rich.prompt import Confirm

    return bool(Confirm.ask(question, default=False))


def _cmd_reset(store: Store, args: argparse.Namespace, console: Console) -> int:
    key = _one(store, getattr(args, "key", None))
    what = f"learned state of {key.key_id}" if key else "ALL learned state"
    if not getattr(args, "yes", False):
        if not sys.stdin.isatty():
            raise StoreError(f"store reset: refusing to delete {what} without --yes (no terminal to ask)")
        if not _confirm(f"Delete {what} in {store.path}? Conversations are kept."):
            console.print("nothing deleted")
            return 1
    n = store.reset(key)
    console.print(f"deleted learned state of {counted(n, 'key')} in {store.path}")
    return 0
