"""Schema migrations, registered in order by a decorator and recorded by function name.

The habit is simonw/llm's: every open of the store runs :func:`migrate`; each migration runs once,
in one transaction together with the ``_migrations`` row that records it, so a kill in the middle
of a migration leaves the previous schema intact. Never edit or reorder a released migration:
append a new one. The schema version is the number of migrations applied and is kept in
``pragma user_version`` and in the ``meta`` table; ``pragma application_id`` marks the file as ours.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from datetime import datetime, timezone

from sqlite_utils import Database

# "ADSP": marks a SQLite file as an AdaSpark store (pragma application_id, offset 68 of the header).
APPLICATION_ID = 0x41445350
MIGRATIONS_TABLE = "_migrations"

Migration = Callable[[Database], None]
MIGRATIONS: list[Migration] = []


def migration(fn: Migration) -> Migration:
    """Register ``fn`` as the next migration; its function name is what the store records."""
    if any(m.__name__ == fn.__name__ for m in MIGRATIONS):
        raise ValueError(f"duplicate migration name {fn.__name__}")
    MIGRATIONS.append(fn)
    return fn


def schema_version() -> int:
    """The schema version this code writes: the number of migrations it knows."""
    return len(MIGRATIONS)


def known_names() -> list[str]:
    return [m.__name__ for m in MIGRATIONS]


def now_iso() -> str:
    """UTC timestamp with microseconds; ISO strings of one format sort in time order."""
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


def applied_names(conn: sqlite3.Connection) -> list[str]:
    """Names of the migrations recorded in ``conn``'s database, in the order they were applied."""
    has = conn.execute(
        "select 1 from sqlite_master where type = 'table' and name = ?", (MIGRATIONS_TABLE,)
    ).fetchone()
    if not has:
        return []
    return [r[0] for r in conn.execute(f"select name from [{MIGRATIONS_TABLE}] order by rowid")]


def migrate(db: Database, stop_after: str | None = None) -> list[str]:
    """Apply every registered migration not yet recorded, in order; return the names applied.

    Runs inside the caller's transaction if one is open (the store opens with ``BEGIN IMMEDIATE``
    so two processes cannot migrate at once); otherwise opens its own. ``stop_after`` (a migration
    name) stops early: tests use it to build a store at the previous schema.
    """
    conn = db.conn
    own_transaction = not conn.in_transaction
    if own_transaction:
        conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute(
            f"create table if not exists [{MIGRATIONS_TABLE}] "
            "(name text primary key, applied_at text not null)"
        )
        done = set(applied_names(conn))
        ran: list[str] = []
        for fn in MIGRATIONS:
            name = fn.__name__
            if name not in done:
                fn(db)
                conn.execute(
                    f"insert into [{MIGRATIONS_TABLE}] (name, applied_at) values (?, ?)",
                    (name, now_iso()),
                )
                ran.append(name)
            if name == stop_after:
                break
        if ran:  # an open that finds nothing to do writes nothing
            version = len(applied_names(conn))
            conn.execute(f"pragma user_version = {int(version)}")
            conn.execute(
                "insert or replace into meta (key, value) values ('schema_version', ?)",
                (str(version),),
            )
    except BaseException:
        if own_transaction and conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    if own_transaction:
        conn.execute("COMMIT")
    return ran


# --- the migrations, oldest first -------------------------------------------------------------
# sqlite-utils' create/create_index/add_column execute plain DDL on the connection, so they join
# the open transaction. Rows are written with plain SQL: sqlite-utils 3.x wraps insert/upsert in
# `with conn:`, which would commit the migration's transaction half way.


@migration
def m001_initial(db: Database) -> None:
    """Tables for learned state per (model, device, drafter), request summaries, chats, meta."""
    db.execute(f"pragma application_id = {APPLICATION_ID}")
    db["meta"].create({"key": str, "value": str}, pk="key")
    db.execute("insert into meta (key, value) values ('app', 'adaspark')")
    db.execute("insert into meta (key, value) values ('created', ?)", [now_iso()])
    db["learned"].create(
        {
            "key_id": str,
            "model_id": str,
            "device_id": str,
            "drafter_id": str,
            "state": str,  # JSON: {"scheduler": {...}, "acceptance": {...}, ...}
            "key_meta": str,  # JSON: fingerprints and names, for `store list/show`
            "n_saves": int,
            "created": str,
            "updated": str,
        },
        pk="key_id",
        not_null={"model_id", "device_id", "state"},
    )
    db["requests"].create(
        {
            "id": int,
            "key_id": str,
            "arm": str,
            "conversation": str,
            "turn": int,
            "n_tokens": int,
            "decode_s": float,
            "rounds": int,
            "widths": str,  # JSON {width: rounds}
            "measure_rounds": int,
            "tokens_per_s": float,
            "created": str,
        },
        pk="id",
        not_null={"key_id"},
    )
    db["conversations"].create(
        {"id": str, "title": str, "model": str, "system": str, "created": str, "updated": str},
        pk="id",
    )
    db["messages"].create(
        {
            "id": int,
            "conversation_id": str,
            "role": str,
            "content": str,
            "meta": str,  # JSON
            "created": str,
        },
        pk="id",
        not_null={"conversation_id", "role", "content"},
    )


@migration
def m002_request_extra_and_indexes(db: Database) -> None:
    """Keep a summary's extra keys (JSON) and index the lookups `show`, the UI and search make."""
    db["requests"].add_column("extra", str)
    db["requests"].create_index(["key_id", "id"], index_name="idx_requests_key")
    db["messages"].create_index(["conversation_id", "id"], index_name="idx_messages_conversation")
    db["conversations"].create_index(["updated"], index_name="idx_conversations_updated")


@migration
def m003_learned_quarantine(db: Database) -> None:
    """Learned states that did not load (another version's layout, or corrupt), kept aside under
    their key with the reason: the engine starts fresh, and the old state stays in the file."""
    db["learned_quarantine"].create(
        {
            "id": int,
            "key_id": str,
            "model_id": str,
            "device_id": str,
            "drafter_id": str,
            "state": str,  # the row's state exactly as it was stored
            "key_meta": str,
            "n_saves": int,
            "created": str,
            "updated": str,
            "reason": str,  # why it did not load (one line)
            "quarantined": str,
        },
        pk="id",
        not_null={"key_id", "state"},
    )
    db["learned_quarantine"].create_index(["key_id", "id"], index_name="idx_quarantine_key")


@migration
def m004_conversation_settings(db: Database) -> None:
    """Each conversation's own settings (JSON: max tokens, sampling, model path) beside its
    system prompt and model label, so a resumed conversation replies as it did."""
    db["conversations"].add_column("settings", str)


@migration
def m005_replies_in_flight(db: Database) -> None:
    """The chat's reply in flight, written as it streams: the message it answers and the text so
    far, with the process that writes it. A chat that ends without recording the reply (killed,
    a crash) leaves the row, and the next chat keeps the message and that text."""
    db["replies_in_flight"].create(
        {
            "id": int,
            "conversation_id": str,
            "prompt": str,  # the new user message (null: a regenerate, which has none)
            "replace_from": int,  # store id of the first message the reply replaces (null: none)
            "content": str,  # the reply's text so far
            "meta": str,  # JSON: what the reply's stored meta would hold so far
            "owner": str,  # host, pid and start time of the chat process that writes it
            "created": str,
            "updated": str,
        },
        pk="id",
        not_null={"conversation_id", "content", "owner"},
    )


@migration
def m006_drafts(db: Database) -> None:
    """What the chat's message box holds, per conversation ('' for a new one): kept as it is
    typed, so a quit, a kill or a switch to another conversation loses no unsent text."""
    db["drafts"].create({"conversation_id": str, "text": str, "updated": str}, pk="conversation_id",
                        not_null={"text"})
