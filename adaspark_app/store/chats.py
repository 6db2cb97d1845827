"""The store's chats: conversations, their messages, and the chat's reply in flight.

`ChatTables` is mixed into `Store` (db.py), whose `write` and `read` transactions and `path` it
uses; db.py keeps the file's opening and safety checks and the learned state.
"""

from __future__ import annotations

import json
import sqlite3
import uuid
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING

from adaspark_app.errors import StoreError

from .migrations import now_iso
from .rows import as_text, dumps_compact, fetch_rows, loads, texts

ROLES = ("system", "user", "assistant", "tool")  # the roles a stored message may have


def title_from(text: str, limit: int = 60) -> str:
    """A conversation title from its first user message: one line, cut on a word boundary."""
    words = " ".join((text or "").split())
    if not words:
        return "New conversation"
    if len(words) <= limit:
        return words
    cut = words[:limit]
    space = cut.rfind(" ")
    if space >= limit // 3:
        cut = cut[:space]
    return cut.rstrip(" ,.;:-") + "…"


def _check_messages(messages: list[tuple[str, str, dict | None]]) -> None:
    for role, content, _meta in messages:
        if role not in ROLES:
            raise StoreError(f"unknown message role {role!r} (expected one of {', '.join(ROLES)})")
        if not isinstance(content, str):
            raise StoreError("message content must be a string")


def _json_or_none(raw: str | None) -> object:
    """A JSON column's value; None where it is empty or not JSON (a store written elsewhere)."""
    try:
        return loads(raw, "a JSON column")
    except StoreError:
        return None


class ChatTables:
    """Conversations, messages and replies in flight (see the module's docstring)."""

    path: Path

    if TYPE_CHECKING:  # Store's own
        def write(self) -> AbstractContextManager[sqlite3.Connection]: ...

        def read(self) -> AbstractContextManager[sqlite3.Connection]: ...

    # -- conversations ---------------------------------------------------------------------------

    def create_conversation(self, title: str, model: str, system: str | None = None,
                            settings: dict | None = None) -> str:
        """Create a conversation; return its id (uuid hex). ``settings``: its own settings as a
        JSON-able dict (the chat app's max tokens, sampling and model path)."""
        cid = uuid.uuid4().hex
        now = now_iso()
        settings_json = dumps_compact(settings) if settings is not None else None
        with self.write() as conn:
            conn.execute(
                "insert into conversations (id, title, model, system, settings, created, updated) "
                "values (?, ?, ?, ?, ?, ?, ?)",
                (cid, title_from(title), model, system, settings_json, now, now),
            )
        return cid

    def set_conversation_settings(self, conversation_id: str, system: str | None,
                                  settings: dict | None, model: str | None = None) -> None:
        """Replace a conversation's system prompt and settings (and its model label, if given).
        Does not touch ``updated``: the list orders conversations by their last message."""
        settings_json = dumps_compact(settings) if settings is not None else None
        with self.write() as conn:
            if model is None:
                cur = conn.execute("update conversations set system = ?, settings = ? where id = ?",
                                   (system, settings_json, conversation_id))
            else:
                cur = conn.execute(
                    "update conversations set system = ?, settings = ?, model = ? where id = ?",
                    (system, settings_json, model, conversation_id))
            if cur.rowcount == 0:
                raise StoreError(f"no conversation {conversation_id!r} in {self.path}")

    def last_conversation(self) -> dict | None:
        """The most recently updated conversation (as `get_conversation`), or None."""
        with self.read() as conn:
            rows = fetch_rows(conn, "select id from conversations order by updated desc, rowid desc limit 1")
        return self.get_conversation(rows[0]["id"]) if rows else None

    def add_message(
        self, conversation_id: str, role: str, content: str, meta: dict | None = None
    ) -> int:
        """Append a message; return its id. Touches the conversation's `updated`."""
        return self.replace_messages_from(conversation_id, None, [(role, content, meta)])[0]

    def list_conversations(self, search: str | None = None) -> list[dict]:
        """Conversations, most recently updated first; ``search`` matches titles and messages."""
        sql = """
            select c.id, c.title, c.model, c.system, c.created, c.updated,
                   (select count(*) from messages m where m.conversation_id = c.id) as n_messages
            from conversations c
        """
        params: list = []
        if search:
            like = "%" + search.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
            sql += """
                where c.title like ? escape '\\'
                   or exists (select 1 from messages m
                              where m.conversation_id = c.id and m.content like ? escape '\\')
            """
            params += [like, like]
        sql += " order by c.updated desc, c.rowid desc"
        with self.read() as conn:
            rows = fetch_rows(conn, sql, params)
        for r in rows:
            texts(r, "id", "title", "model", "created", "updated")
        return rows

    def get_conversation(self, conversation_id: str) -> dict | None:
        """The conversation's row: id, title, model, system, settings, created, updated.

        ``settings`` is the stored dict, or None; a stored value that is not a JSON object (a
        damaged or hand-edited store) is None too, with the reason in ``settings_error``, so the
        conversation still opens (the chat app falls back to its defaults and says so)."""
        with self.read() as conn:
            rows = fetch_rows(
                conn, "select * from conversations where id = ?", (conversation_id,)
            )
        if not rows:
            return None
        row = texts(rows[0], "id", "title", "model", "created", "updated")
        raw = row.get("settings")
        row["settings"] = None
        if raw is not None:
            try:
                value = json.loads(raw)
            except (TypeError, ValueError, RecursionError) as exc:
                row["settings_error"] = f"its stored settings are not JSON ({exc})"
            else:
                if isinstance(value, dict):
                    row["settings"] = value
                else:
                    row["settings_error"] = "its stored settings are not a JSON object"
        return row

    def get_messages(self, conversation_id: str) -> list[dict]:
        """The conversation's messages in order: id, role, content (text), meta (None where the
        stored one is not JSON), created."""
        with self.read() as conn:
            rows = fetch_rows(
                conn,
                "select id, role, content, meta, created from messages "
                "where conversation_id = ? order by id",
                (conversation_id,),
            )
        for r in rows:
            r["meta"] = _json_or_none(r["meta"])  # the message still shows, without its figures
            texts(r, "role", "content", "created")  # SQLite keeps any type in any column
        return rows

    def replace_messages_from(self, conversation_id: str, first_id: int | None,
                              messages: list[tuple[str, str, dict | None]],
                              in_flight: int | None = None) -> list[int]:
        """Drop the conversation's messages from id ``first_id`` on (None: drop none) and append
        ``messages`` ((role, content, meta) each), in one transaction: a regenerated reply or an
        edited turn replaces the old ones, or nothing changes. ``in_flight``: the id of the reply
        in flight (`begin_reply`) these messages settle; its row goes in the same transaction.
        Returns the new messages' ids."""
        _check_messages(messages)
        with self.write() as conn:
            if in_flight is not None:
                conn.execute("delete from replies_in_flight where id = ?", (int(in_flight),))
            return self._replace(conn, conversation_id, first_id, messages)

    def _replace(self, conn: sqlite3.Connection, conversation_id: str, first_id: int | None,
                 messages: list[tuple[str, str, dict | None]]) -> list[int]:
        now = now_iso()
        cur = conn.execute("update conversations set updated = ? where id = ?", (now, conversation_id))
        if cur.rowcount == 0:
            raise StoreError(f"no conversation {conversation_id!r} in {self.path}")
        if first_id is not None:
            conn.execute("delete from messages where conversation_id = ? and id >= ?",
                         (conversation_id, int(first_id)))
        ids: list[int] = []
        for role, content, meta in messages:
            cur = conn.execute(
                "insert into messages (conversation_id, role, content, meta, created) values (?, ?, ?, ?, ?)",
                (conversation_id, role, content, dumps_compact(meta) if meta is not None else None, now),
            )
            ids.append(int(cur.lastrowid))
        return ids

    # -- the chat's reply in flight --------------------------------------------------------------
    # Written as it streams, so a chat that ends without recording it (killed, a crash)
    # loses neither the message it answers nor the text so far: the next chat settles the row.

    def begin_reply(self, conversation_id: str, prompt: str | None, replace_from: int | None,
                    meta: dict, owner: str) -> int:
        """A reply to the conversation has been asked for: `prompt` is the new user message
        (None: a regenerate), `replace_from` the store id of the first message it replaces, and
        `owner` the process that writes it (`owner.this_owner`). Returns the row's id."""
        now = now_iso()
        with self.write() as conn:
            cur = conn.execute(
                "insert into replies_in_flight (conversation_id, prompt, replace_from, content, meta, owner, "
                "created, updated) values (?, ?, ?, '', ?, ?, ?, ?)",
                (conversation_id, prompt, replace_from, dumps_compact(meta), owner, now, now),
            )
            # the conversation in use: `chat --continue` opens it, also when the chat is killed now
            conn.execute("update conversations set updated = ? where id = ?", (now, conversation_id))
            return int(cur.lastrowid)

    def update_reply(self, reply_id: int, content: str, meta: dict) -> None:
        """The reply in flight's text and meta so far (nothing if the row has been settled)."""
        with self.write() as conn:
            conn.execute("update replies_in_flight set content = ?, meta = ?, updated = ? where id = ?",
                         (content, dumps_compact(meta), now_iso(), int(reply_id)))

    def end_reply(self, reply_id: int) -> None:
        """The reply in flight will not be recorded (withdrawn: its prompt went back in the box)."""
        with self.write() as conn:
            conn.execute("delete from replies_in_flight where id = ?", (int(reply_id),))

    def replies_in_flight(self) -> list[dict]:
        """Every reply in flight: id, conversation_id, prompt, replace_from, content, meta (a
        dict; {} where the stored one is not a JSON object), owner, created, updated."""
        with self.read() as conn:
            rows = fetch_rows(conn, "select * from replies_in_flight order by id")
        for r in rows:
            meta = _json_or_none(r["meta"])
            r["meta"] = meta if isinstance(meta, dict) else {}
            texts(r, "conversation_id", "prompt", "content", "owner", "created", "updated")
        return rows

    def settle_reply(self, reply_id: int, messages: list[tuple[str, str, dict | None]]) -> list[int] | None:
        """Settle a reply in flight whose chat has gone: its row leaves, and ``messages`` replace
        the conversation's from the row's ``replace_from`` on, in one transaction. None (nothing
        written) when the row is gone (another chat settled it) or its conversation is (the row
        is dropped)."""
        _check_messages(messages)
        with self.write() as conn:
            row = conn.execute("select conversation_id, replace_from from replies_in_flight where id = ?",
                               (int(reply_id),)).fetchone()
            if row is None:
                return None
            conn.execute("delete from replies_in_flight where id = ?", (int(reply_id),))
            if conn.execute("select 1 from conversations where id = ?", (row[0],)).fetchone() is None:
                return None
            first_id = row[1] if isinstance(row[1], int) else None  # another type: replace nothing
            return self._replace(conn, row[0], first_id, messages) if messages else []

    def rename_conversation(self, conversation_id: str, title: str) -> None:
        with self.write() as conn:
            cur = conn.execute(
                "update conversations set title = ?, updated = ? where id = ?",
                (title_from(title), now_iso(), conversation_id),
            )
            if cur.rowcount == 0:
                raise StoreError(f"no conversation {conversation_id!r} in {self.path}")

    def delete_conversation(self, conversation_id: str) -> None:
        with self.write() as conn:
            conn.execute("delete from messages where conversation_id = ?", (conversation_id,))
            conn.execute("delete from replies_in_flight where conversation_id = ?", (conversation_id,))
            conn.execute("delete from drafts where conversation_id = ?", (conversation_id,))
            cur = conn.execute("delete from conversations where id = ?", (conversation_id,))
            if cur.rowcount == 0:
                raise StoreError(f"no conversation {conversation_id!r} in {self.path}")
        from .saved_context import folder_for, forget_conversation

        forget_conversation(folder_for(self.path), conversation_id)  # its KV caches: its text, in other words

    # -- the message box's draft -----------------------------------------------------------------

    def save_draft(self, conversation_id: str | None, text: str) -> None:
        """What the message box holds for the conversation (None: a new one, not stored yet);
        '' forgets it. Nothing is kept for a conversation that is not in the store."""
        key = conversation_id or ""
        with self.write() as conn:
            if not text:
                conn.execute("delete from drafts where conversation_id = ?", (key,))
            elif key == "" or conn.execute("select 1 from conversations where id = ?", (key,)).fetchone():
                conn.execute("insert or replace into drafts (conversation_id, text, updated) values (?, ?, ?)",
                             (key, text, now_iso()))

    def draft(self, conversation_id: str | None) -> str:
        """The message box's draft for the conversation (None: a new one); '' when there is none."""
        with self.read() as conn:
            row = conn.execute("select text from drafts where conversation_id = ?",
                               (conversation_id or "",)).fetchone()
        return as_text(row[0]) if row is not None else ""
