"""The store's rows: learned-state and request-summary rows as the SQLite tables hold them, and
back (JSON columns, typed summary columns), and text columns read as text. Shared by ``db`` (the
store) and ``transfer`` (export and import)."""

from __future__ import annotations

import json
import math
import sqlite3
from typing import Any

from adaspark_app.errors import StoreError

from .fingerprint import LearnedKey
from .migrations import now_iso

SUMMARY_FIELDS: dict[str, type] = {
    "arm": str,
    "conversation": str,
    "turn": int,
    "n_tokens": int,
    "decode_s": float,
    "rounds": int,
    "widths": dict,
    "measure_rounds": int,
    "tokens_per_s": float,
    "created": str,
}
_SQLITE_INT_MIN, _SQLITE_INT_MAX = -2**63, 2**63 - 1  # an INTEGER column's range


def to_jsonable(obj: Any) -> Any:
    """Plain JSON types from learner state: numpy scalars/arrays to Python, dict keys to str.

    JSON object keys are strings: a state saved as ``{8: ...}`` loads back as ``{"8": ...}``.
    """
    if obj is None or isinstance(obj, (str, bool, int, float)):
        if isinstance(obj, int) and not isinstance(obj, bool) and type(obj) is not int:
            return int(obj)
        if isinstance(obj, float) and type(obj) is not float:
            return float(obj)
        return obj
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    tolist = getattr(obj, "tolist", None)  # numpy arrays and scalars
    if callable(tolist):
        return to_jsonable(tolist())
    if hasattr(obj, "item"):
        return to_jsonable(obj.item())
    raise StoreError(f"learned state holds a {type(obj).__name__}, which cannot be stored as JSON")


def dumps_compact(obj: Any) -> str:
    return json.dumps(to_jsonable(obj), sort_keys=True, separators=(",", ":"))


def loads(text: str | None, what: str, error: type[StoreError] = StoreError) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except (TypeError, ValueError, RecursionError) as exc:  # RecursionError: nesting too deep
        raise error(f"the store holds unreadable JSON in {what}: {exc}") from None


def int_keys(widths: dict | None) -> dict | None:
    if widths is None:
        return None
    out: dict = {}
    for k, v in widths.items():
        try:
            out[int(k)] = v
        except (TypeError, ValueError):
            out[k] = v
    return out




def names(meta: dict, row: dict) -> dict:
    def name(part: str) -> str | None:
        if not isinstance(meta, dict):
            return None
        given = meta.get(f"{part}_name")  # the engine may pass display names beside the fingerprints
        if isinstance(given, str) and given:
            return given
        fp = meta.get(part)
        return fp.get("name") if isinstance(fp, dict) else None

    return {
        "model_name": name("model") or row.get("model_id"),
        "device_name": name("device") or row.get("device_id"),
        "drafter_name": name("drafter") or row.get("drafter_id"),
    }


def upsert_learned(
    conn: sqlite3.Connection, key: LearnedKey, state_json: str, meta_json: str | None, now: str
) -> None:
    """Insert or update one learned row; key_meta is kept when not given."""
    cur = conn.execute(
        "update learned set state = ?, key_meta = coalesce(?, key_meta), "
        "n_saves = coalesce(n_saves, 0) + 1, updated = ? where key_id = ?",
        (state_json, meta_json, now, key.key_id),
    )
    if cur.rowcount == 0:
        conn.execute(
            "insert into learned (key_id, model_id, device_id, drafter_id, state, key_meta, "
            "n_saves, created, updated) values (?, ?, ?, ?, ?, ?, 1, ?, ?)",
            (key.key_id, key.model_id, key.device_id, key.drafter_id, state_json, meta_json,
             now, now),
        )


def iso_from_epoch(t: float) -> str:
    from datetime import datetime, timezone

    try:
        return datetime.fromtimestamp(float(t), timezone.utc).isoformat(timespec="microseconds")
    except (OverflowError, OSError, ValueError):
        raise StoreError(f"request summary field 'created' is not a valid time: {t!r}") from None


def summary_row(summary: dict) -> dict:
    """Split a summary dict into typed columns and `extra` (JSON of the other keys)."""
    if not isinstance(summary, dict):
        raise StoreError(f"request summary must be a dict, got {type(summary).__name__}")
    s = to_jsonable(summary)
    row: dict[str, Any] = {}
    for name, typ in SUMMARY_FIELDS.items():
        v = s.pop(name, None)
        if v is None:
            row[name] = None
        elif typ is dict:
            if not isinstance(v, dict):
                raise StoreError(f"request summary field {name!r} must be an object")
            row[name] = json.dumps(v, sort_keys=True, separators=(",", ":"))
        elif name == "created" and isinstance(v, (int, float)) and not isinstance(v, bool):
            row[name] = iso_from_epoch(v)  # time.time() from the engine
        elif typ is str:
            row[name] = v if isinstance(v, str) else str(v)
        elif typ is int:
            whole = isinstance(v, int) or (isinstance(v, float) and v.is_integer())
            if isinstance(v, bool) or not whole or not _SQLITE_INT_MIN <= v <= _SQLITE_INT_MAX:
                raise StoreError(f"request summary field {name!r} must be an integer that SQLite holds, got {v!r}")
            row[name] = int(v)
        else:
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise StoreError(f"request summary field {name!r} must be a number, got {v!r}")
            row[name] = float(v)
    if row["tokens_per_s"] is None and row["n_tokens"] is not None and row["decode_s"]:
        if row["decode_s"] > 0 and math.isfinite(row["decode_s"]):
            row["tokens_per_s"] = row["n_tokens"] / row["decode_s"]
    if row["created"] is None:
        row["created"] = now_iso()
    row["extra"] = json.dumps(s, sort_keys=True, separators=(",", ":")) if s else None
    return row


def insert_summary(conn: sqlite3.Connection, key_id: str, row: dict) -> None:
    cols = ["key_id", *SUMMARY_FIELDS, "extra"]
    conn.execute(
        f"insert into requests ({', '.join(cols)}) values ({', '.join('?' * len(cols))})",
        [key_id, *(row[c] for c in SUMMARY_FIELDS), row["extra"]],
    )


def summary_out(row: dict, *, int_width_keys: bool) -> dict:
    """A stored summary row as the flat dict it was saved as (plus id and key_id)."""
    out = dict(row)
    extra = loads(out.pop("extra", None), "request summary extra") or {}
    widths = loads(out.get("widths"), "request summary widths")
    out["widths"] = int_keys(widths) if int_width_keys else widths
    for k, v in extra.items():
        out.setdefault(k, v)
    return out


def fetch_rows(conn: sqlite3.Connection, sql: str, params: tuple | list = ()) -> list[dict]:
    """The rows of a query as dicts keyed by column name."""
    cur = conn.execute(sql, params)
    cols = [d[0] for d in cur.description]
    return [dict(zip(cols, r)) for r in cur.fetchall()]


def as_text(value: object) -> str:
    """A stored text column's value as text: a store written elsewhere (another version, by hand)
    may hold a number or a blob there, which the chat shows rather than fails on."""
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", errors="replace")
    return "" if value is None else str(value)


def texts(row: dict, *columns: str) -> dict:
    """`row` with each of `columns` as text (`as_text`; None stays None)."""
    for c in columns:
        if row.get(c) is not None:
            row[c] = as_text(row[c])
    return row
