"""Export and import of learned state as versioned JSON.

The document is ``{"format": "adaspark-store", "version": 1, "learned": [entry, ...]}`` with one
entry per key, sorted by key, each ``{"key": {model_id, device_id, drafter_id}, "key_meta",
"state", "n_saves", "created", "updated", "requests": [summary, ...]}`` (summaries oldest first).
It is written with sorted keys and fixed indentation, and import stores exactly what it reads, so
export -> import -> export is byte-identical. Each learned state must load as the engine loads it
(``learn.learned_state.validate``): one that does not is refused, naming the field, and a state in the
previous layout (b9fbe7f) is stored migrated. Conversations are not exported: they are the
user's chats, not what the scheduler learned.

Import modes: ``replace`` makes each imported key's state and summaries exactly the file's (keys
not in the file are kept); ``merge`` keeps, per key, whichever state was updated later and takes
the union of the request summaries. Everything is validated before anything is written, and the
whole import is one transaction.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field
from typing import Any

from adaspark_app.errors import StoreError
from adaspark_app.learn.state import StateError
from adaspark_app.learn.learned_state import validate as validate_learned

from .. import json_input
from .db import Store
from .fingerprint import LearnedKey
from .migrations import now_iso
from .rows import SUMMARY_FIELDS, dumps_compact, fetch_rows, insert_summary, loads, names, summary_out, summary_row

FORMAT = "adaspark-store"
VERSION = 1
MODES = ("replace", "merge")


def _dump(doc: Any) -> str:
    return json.dumps(doc, sort_keys=True, indent=2, ensure_ascii=False) + "\n"


def export_doc(store: Store, key: LearnedKey | None = None) -> dict:
    """The export document as Python data (see module docstring)."""
    sql = "select * from learned"
    params: list = []
    if key is not None:
        key = store.key(key)
        sql += " where key_id = ?"
        params.append(key.key_id)
    sql += " order by model_id, device_id, coalesce(drafter_id, '')"
    with store.read() as conn:
        rows = fetch_rows(conn, sql, params)
        if key is not None and not rows:
            raise StoreError(f"no learned state for key {key.key_id} in {store.path}")
        entries = []
        for r in rows:
            reqs = fetch_rows(conn, "select * from requests where key_id = ? order by id", (r["key_id"],)
            )
            summaries = []
            for q in reqs:
                s = summary_out(q, int_width_keys=False)
                s.pop("id", None)
                s.pop("key_id", None)
                summaries.append(s)
            entries.append(
                {
                    "key": {
                        "model_id": r["model_id"],
                        "device_id": r["device_id"],
                        "drafter_id": r["drafter_id"],
                    },
                    "key_meta": loads(r["key_meta"], f"key metadata of {r['key_id']}"),
                    "state": loads(r["state"], f"learned state of {r['key_id']}"),
                    "n_saves": r["n_saves"],
                    "created": r["created"],
                    "updated": r["updated"],
                    "requests": summaries,
                }
            )
    return {"format": FORMAT, "version": VERSION, "learned": entries}


def export_json(store: Store, key: LearnedKey | None = None) -> str:
    """The export document as text: sorted keys, two-space indent, trailing newline."""
    return _dump(export_doc(store, key))


@dataclass
class _Entry:
    key: LearnedKey
    state_json: str
    meta_json: str | None
    n_saves: int
    created: str
    updated: str
    requests: list[dict] = field(default_factory=list)
    names: dict = field(default_factory=dict)


def _fail(where: str, msg: str) -> StoreError:
    return StoreError(f"import: {where}: {msg}")


def parse_export(text: str) -> list[_Entry]:
    """Validate an export document completely; StoreError names the first problem found."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            raise StoreError("import: the file is not UTF-8 text") from None
    try:
        doc = json_input.loads(text)
    except ValueError as exc:
        lineno = getattr(exc, "lineno", "?")
        colno = getattr(exc, "colno", "?")
        msg = getattr(exc, "msg", str(exc))
        raise StoreError(
            f"import: not valid JSON (line {lineno}, column {colno}: {msg})"
        ) from None
    except RecursionError:
        raise StoreError("import: JSON nested too deeply") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise StoreError(f'import: not an AdaSpark store export (expected "format": "{FORMAT}")')
    version = doc.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise StoreError(f"import: invalid export version {version!r}")
    if version > VERSION:
        raise StoreError(
            f"import: export format version {version} is newer than this AdaSpark reads "
            f"({VERSION}); upgrade adaspark"
        )
    learned = doc.get("learned")
    if not isinstance(learned, list):
        raise StoreError('import: "learned" must be a list')
    entries: list[_Entry] = []
    seen: set[str] = set()
    for i, item in enumerate(learned):
        where = f"learned[{i}]"
        if not isinstance(item, dict):
            raise _fail(where, "must be an object")
        k = item.get("key")
        if not isinstance(k, dict):
            raise _fail(where, '"key" must be an object with model_id, device_id, drafter_id')
        try:
            key = LearnedKey(k.get("model_id"), k.get("device_id"), k.get("drafter_id")).validated()
        except StoreError as exc:
            raise _fail(where + ".key", str(exc)) from None
        if key.key_id in seen:
            raise _fail(where, f"key {key.key_id} appears twice")
        seen.add(key.key_id)
        state = item.get("state")
        if not isinstance(state, dict):
            raise _fail(where, '"state" must be an object')
        try:  # what the engine loads, so an import can never leave a state that stops it
            state = validate_learned(state)
        except StateError as exc:
            raise _fail(where + ".state", f"the learned state does not load: {exc}") from None
        meta = item.get("key_meta")
        if meta is not None and not isinstance(meta, dict):
            raise _fail(where, '"key_meta" must be an object or null')
        n_saves = item.get("n_saves", 0)
        if n_saves is None:
            n_saves = 0
        if isinstance(n_saves, bool) or not isinstance(n_saves, int) or n_saves < 0:
            raise _fail(where, '"n_saves" must be a non-negative integer')
        stamps = {}
        for name in ("created", "updated"):
            v = item.get(name)
            if v is None:
                v = now_iso()
            if not isinstance(v, str):
                raise _fail(where, f'"{name}" must be a timestamp string')
            stamps[name] = v
        reqs = item.get("requests", [])
        if reqs is None:
            reqs = []
        if not isinstance(reqs, list):
            raise _fail(where, '"requests" must be a list')
        rows = []
        for j, s in enumerate(reqs):
            try:
                rows.append(summary_row(s))
            except StoreError as exc:
                raise _fail(f"{where}.requests[{j}]", str(exc)) from None
        entries.append(
            _Entry(
                key=key,
                state_json=dumps_compact(state),
                meta_json=dumps_compact(meta) if meta is not None else None,
                n_saves=n_saves,
                created=stamps["created"],
                updated=stamps["updated"],
                requests=rows,
                names=names(meta or {}, key._asdict()),
            )
        )
    return entries


def _put(conn: sqlite3.Connection, e: _Entry) -> None:
    conn.execute("delete from learned where key_id = ?", (e.key.key_id,))
    conn.execute(
        "insert into learned (key_id, model_id, device_id, drafter_id, state, key_meta, n_saves, "
        "created, updated) values (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            e.key.key_id,
            e.key.model_id,
            e.key.device_id,
            e.key.drafter_id,
            e.state_json,
            e.meta_json,
            e.n_saves,
            e.created,
            e.updated,
        ),
    )


def _row_identity(row: dict) -> str:
    return json.dumps([row.get(c) for c in (*SUMMARY_FIELDS, "extra")], sort_keys=True)


def _label(e: _Entry) -> str:
    n = e.names
    text = f"{n.get('model_name')} on {n.get('device_name')}"
    if e.key.drafter_id:
        text += f" with drafter {n.get('drafter_name')}"
    return f"{text} [{e.key.key_id}]"


def import_json(store: Store, text: str, mode: str = "replace") -> list[str]:
    """Validate ``text`` and apply it in one transaction; return one message per key."""
    if mode not in MODES:
        raise StoreError(f"import: unknown mode {mode!r} (expected replace or merge)")
    entries = parse_export(text)
    if not entries:
        return ["nothing to import: the export holds no learned state"]
    messages: list[str] = []
    with store.write() as conn:
        for e in entries:
            kid = e.key.key_id
            local = conn.execute(
                "select updated, created from learned where key_id = ?", (kid,)
            ).fetchone()
            n_req = len(e.requests)
            if mode == "replace" or local is None:
                _put(conn, e)
                conn.execute("delete from requests where key_id = ?", (kid,))
                for row in e.requests:
                    insert_summary(conn, kid, row)
                verb = "added" if local is None else "replaced"
                messages.append(f"{verb} {_label(e)}: learned state and {n_req} request summaries")
                continue
            # merge: keep the later state, take the union of the summaries
            if e.updated > (local[0] or ""):
                created = min(local[1] or e.created, e.created)
                _put(conn, e)
                conn.execute("update learned set created = ? where key_id = ?", (created, kid))
                what = "took the imported state (newer)"
            else:
                what = "kept the local state (not older)"
            have = {
                _row_identity(r)
                for r in fetch_rows(conn, "select * from requests where key_id = ?", (kid,))
            }
            added = 0
            for row in e.requests:
                ident = _row_identity(row)
                if ident not in have:
                    insert_summary(conn, kid, row)
                    have.add(ident)
                    added += 1
            messages.append(f"merged {_label(e)}: {what}, {added} new request summaries")
    return messages
