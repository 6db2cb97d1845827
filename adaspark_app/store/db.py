"""The one SQLite file: learned state per (model, device, drafter), request summaries, chats.

Safety rules, in the order :meth:`Store.open` applies them:

1. A file that exists and is not empty is inspected before anything is written: its first 16
   bytes must be SQLite's magic, then a read-only connection checks ``pragma application_id``,
   the ``_migrations`` table and the schema version. A foreign file (not SQLite, or SQLite of
   another application) or a store of a newer schema raises StoreError and is never modified.
2. Only then is it opened read-write: WAL journal (readers never block the writer, so the TUI and
   a headless run can share one store), ``busy_timeout`` (a writer waits for the other instead of
   failing), ``synchronous=NORMAL`` (in WAL mode a committed transaction survives a process kill;
   only a power loss can drop the last ones, never corrupt).
3. Migrations run under ``BEGIN IMMEDIATE`` (two processes opening a new file cannot both
   migrate), after re-checking the identity under that lock.

Every write is one ``BEGIN IMMEDIATE`` transaction, so a kill loses at most the write in flight:
``save_learned`` stores the learned state and the request's summary together or not at all.
One Store may be shared by threads (the engine's worker saves, the UI thread reads chats): a lock
serialises use of the connection.
"""

from __future__ import annotations

import json
import os
import random
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlite_utils import Database

from adaspark_app.errors import StoreError

from .chats import ChatTables
from .fingerprint import LearnedKey
from .migrations import APPLICATION_ID, MIGRATIONS_TABLE, applied_names, known_names, migrate, now_iso, schema_version
from .rows import dumps_compact, fetch_rows, insert_summary, loads, names, summary_out, summary_row, upsert_learned

ENV_VAR = "ADASPARK_STORE"
APP_NAME = "adaspark"
DB_NAME = "adaspark.db"
BUSY_TIMEOUT_MS = 15_000  # a write transaction takes milliseconds; wait long before giving up
SQLITE_MAGIC = b"SQLite format 3\x00"


def default_store_path() -> Path:
    """$ADASPARK_STORE if set, else <platformdirs user data dir>/adaspark/adaspark.db."""
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env).expanduser()
    from platformdirs import user_data_dir

    return Path(user_data_dir(APP_NAME)) / DB_NAME


def resolve_store_path(path: str | os.PathLike | None) -> Path:
    return Path(path).expanduser() if path not in (None, "") else default_store_path()


# --- JSON helpers -------------------------------------------------------------------------------


class UnreadableState(StoreError):
    """A key's learned-state row is not a JSON object (the engine keeps it aside, see
    ``Store.quarantine_learned``, where other store errors stop it)."""


class _LockedError(Exception):
    """An open attempt met a lock SQLite's busy handler does not wait on; the caller retries."""


# --- identity checks ----------------------------------------------------------------------------


# (st_dev, st_ino) -> Stores open on that file in this process. POSIX record locks belong to the
# process, and closing ANY descriptor of a file drops all of them: a plain open()/close() of a
# store file that a connection of this process holds would silently release SQLite's locks on
# it, and another process could then checkpoint or recover under that connection (seen as
# "database disk image is malformed"). SQLite's own descriptors are shared and closed safely.
_OPEN_FILES: dict[tuple[int, int], int] = {}
_OPEN_FILES_LOCK = threading.Lock()


def _why(exc: sqlite3.Error, path: Path) -> str:
    """SQLite's message, and where it says only "disk I/O error" (its write-ahead log could not
    be made) and the disk holding the store is full, that too."""
    text = str(exc)
    if "disk I/O error" in text:
        try:
            st = os.statvfs(path.parent)
        except OSError:
            return text
        if st.f_bavail * st.f_frsize < (1 << 20):
            text += f" (the disk holding it has {st.f_bavail * st.f_frsize // 1024} KiB free)"
    return text


def _file_id(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def _open_in_this_process(path: Path) -> bool:
    fid = _file_id(path)
    with _OPEN_FILES_LOCK:
        return fid is not None and _OPEN_FILES.get(fid, 0) > 0


def _check_magic(path: Path) -> None:
    """The SQLite header, read with a plain file handle; never on a file this process holds open
    through a Store (closing the handle would drop that connection's locks, see _OPEN_FILES)."""
    if _open_in_this_process(path):
        return  # checked when this process first opened it, and SQLite reads it now
    try:
        with open(path, "rb") as fh:
            head = fh.read(len(SQLITE_MAGIC))
    except OSError as exc:
        raise StoreError(f"cannot read store {path}: {exc.strerror or exc}") from None
    if head != SQLITE_MAGIC:
        raise StoreError(f"{path} is not an AdaSpark store (not a SQLite database); left untouched")


def _identify(conn: sqlite3.Connection, path: Path) -> str:
    """'fresh' (empty database we may initialise) or 'ours'; StoreError for anything else.

    Reads only. Called on a read-only connection before the store is opened for writing, and
    again under the write lock.
    """
    try:
        app_id = conn.execute("pragma application_id").fetchone()[0]
        user_version = conn.execute("pragma user_version").fetchone()[0]
        names = [
            r[0]
            for r in conn.execute(
                "select name from sqlite_master where name not like 'sqlite_%'"
            )
        ]
    except sqlite3.OperationalError as exc:  # could not read it (a full disk, a lock), whatever it holds
        raise StoreError(f"cannot read store {path}: {_why(exc, path)}") from None
    except sqlite3.DatabaseError as exc:
        raise StoreError(f"{path} is not an AdaSpark store ({exc}); left untouched") from None
    if app_id == 0 and user_version == 0 and not names:
        return "fresh"
    if app_id != APPLICATION_ID:
        raise StoreError(
            f"{path} is not an AdaSpark store (a SQLite database of another application); "
            "left untouched"
        )
    if MIGRATIONS_TABLE not in names:
        raise StoreError(f"{path} is a damaged AdaSpark store (no {MIGRATIONS_TABLE} table)")
    try:
        applied = applied_names(conn)
        meta_version = None
        if "meta" in names:
            row = conn.execute("select value from meta where key = 'schema_version'").fetchone()
            meta_version = int(row[0]) if row and str(row[0]).isdigit() else None
    except sqlite3.DatabaseError as exc:
        raise StoreError(f"{path} is a damaged AdaSpark store ({exc})") from None
    known = set(known_names())
    unknown = [n for n in applied if n not in known]
    version = max(user_version, meta_version or 0, len(applied))
    if unknown or version > schema_version():
        raise StoreError(
            f"{path} was written by a newer AdaSpark (schema {version}, this version knows "
            f"{schema_version()}); upgrade adaspark or choose another --store. "
            "Left untouched"
        )
    return "ours"


def _check_readonly(path: Path) -> None:
    """Identify an existing file through a read-only connection (it cannot write, by design).

    Without a -wal file beside it the file holds the whole database, and ``immutable=1`` reads it
    without creating -wal/-shm files next to a file that may not be ours. With a -wal file (a
    store in use, or left by a killed process) a plain read-only connection reads through it.
    """
    uri = Path(os.path.abspath(path)).as_uri() + "?mode=ro"
    if not Path(str(path) + "-wal").exists():
        uri += "&immutable=1"
    try:
        conn = sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_MS / 1000)
    except sqlite3.Error as exc:
        raise StoreError(f"cannot open store {path}: {_why(exc, path)}") from None
    try:
        _identify(conn, path)
    finally:
        conn.close()


def _database(conn: sqlite3.Connection) -> Database:
    """sqlite-utils over our connection, without loading sqlite-utils plugins into it."""
    try:
        return Database(conn, execute_plugins=False)
    except TypeError:  # sqlite-utils older than 3.34
        return Database(conn)


# --- the store ----------------------------------------------------------------------------------


class Store(ChatTables):
    """Learned state, request summaries and conversations in one SQLite file.

    Open with :meth:`Store.open`; safe to share between threads of one process and between
    processes on one file. Every public method raises StoreError (never sqlite3 errors).
    """

    def __init__(self, path: Path, conn: sqlite3.Connection):
        self.path = path
        self._conn = conn
        self.db = _database(conn)
        self._lock = threading.RLock()
        self._closed = False
        self._file_id = _file_id(path)
        if self._file_id is not None:
            with _OPEN_FILES_LOCK:
                _OPEN_FILES[self._file_id] = _OPEN_FILES.get(self._file_id, 0) + 1

    # -- opening ---------------------------------------------------------------------------------

    @classmethod
    def open(cls, path: str | os.PathLike | None = None) -> "Store":
        """Open (creating if needed) the store at ``path``, default :func:`default_store_path`.

        Refuses, without writing a byte, a file that is not an AdaSpark store or is of a newer
        schema; runs pending migrations otherwise.
        """
        p = resolve_store_path(path)
        if p.exists():
            if p.is_dir():
                raise StoreError(f"store path {p} is a directory")
            if p.stat().st_size > 0:
                _check_magic(p)
                _check_readonly(p)
        else:
            try:
                p.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StoreError(f"cannot create the store's folder {p.parent}: {exc}") from None
        # Two processes opening a new file at once can meet SQLITE_BUSY where SQLite calls no busy
        # handler (switching to WAL needs a lock the other holds): back off and open again.
        deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
        while True:
            try:
                return cls._open_connection(p)
            except _LockedError:
                if time.monotonic() > deadline:
                    raise StoreError(f"cannot open store {p}: the database stayed locked by another "
                                     f"process for {BUSY_TIMEOUT_MS // 1000} s") from None
                time.sleep(0.05 + random.random() * 0.1)

    @classmethod
    def _open_connection(cls, p: Path) -> "Store":
        """One attempt at connecting, setting WAL and migrating in one immediate transaction."""
        try:
            conn = sqlite3.connect(
                str(p),
                isolation_level=None,  # we issue BEGIN IMMEDIATE / COMMIT ourselves
                check_same_thread=False,  # guarded by Store._lock
                timeout=BUSY_TIMEOUT_MS / 1000,
            )
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open store {p}: {_why(exc, p)}") from None
        try:
            conn.execute(f"pragma busy_timeout = {BUSY_TIMEOUT_MS}")
            conn.execute("pragma journal_mode = wal")
            conn.execute("pragma synchronous = normal")
            conn.execute("BEGIN IMMEDIATE")
            try:
                # another process may have created the file since the read-only check
                _identify(conn, p)
                store = cls(p, conn)
                migrate(store.db)
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        except StoreError:
            conn.close()
            raise
        except sqlite3.Error as exc:
            conn.close()
            if "locked" in str(exc) or "busy" in str(exc):
                raise _LockedError(str(exc)) from None
            raise StoreError(f"cannot open store {p}: {_why(exc, p)}") from None
        return store

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._conn.close()
                if self._file_id is not None:
                    with _OPEN_FILES_LOCK:
                        left = _OPEN_FILES.get(self._file_id, 0) - 1
                        if left > 0:
                            _OPEN_FILES[self._file_id] = left
                        else:
                            _OPEN_FILES.pop(self._file_id, None)

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Store({str(self.path)!r})"

    # -- plumbing --------------------------------------------------------------------------------

    @contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, taken with the write lock up front (no upgrade deadlocks)."""
        with self._lock:
            self._ensure_open()
            try:
                self._conn.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                raise StoreError(f"store {self.path} is busy or unwritable: {exc}") from None
            try:
                yield self._conn
            except BaseException as exc:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                if isinstance(exc, sqlite3.Error):
                    raise StoreError(f"store {self.path}: write failed: {exc}") from None
                raise
            try:
                self._conn.execute("COMMIT")
            except sqlite3.Error as exc:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                raise StoreError(f"store {self.path}: commit failed: {exc}") from None

    @contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        """Reads in one transaction so a multi-statement read sees one snapshot."""
        with self._lock:
            self._ensure_open()
            try:
                self._conn.execute("BEGIN")
                try:
                    yield self._conn
                finally:
                    if self._conn.in_transaction:
                        self._conn.execute("COMMIT")
            except sqlite3.Error as exc:
                raise StoreError(f"store {self.path}: read failed: {exc}") from None

    def _ensure_open(self) -> None:
        if self._closed:
            raise StoreError(f"store {self.path} is closed")

    @staticmethod
    def key(key: LearnedKey) -> LearnedKey:
        if not isinstance(key, LearnedKey):
            if isinstance(key, (tuple, list)) and len(key) in (2, 3):
                key = LearnedKey(*key)
            else:
                raise StoreError(f"expected a LearnedKey, got {type(key).__name__}")
        return key.validated()

    def schema(self) -> dict:
        """Schema version, applied migrations and application id (for diagnostics and tests)."""
        with self.read() as conn:
            return {
                "application_id": conn.execute("pragma application_id").fetchone()[0],
                "user_version": conn.execute("pragma user_version").fetchone()[0],
                "migrations": applied_names(conn),
            }

    def integrity_check(self) -> str:
        with self.read() as conn:
            return "; ".join(r[0] for r in conn.execute("pragma integrity_check"))

    # -- learned state ---------------------------------------------------------------------------

    def load_learned(self, key: LearnedKey) -> dict | None:
        """The state dict last saved for ``key``, or None if nothing was learned yet."""
        key = self.key(key)
        with self.read() as conn:
            row = conn.execute(
                "select state from learned where key_id = ?", (key.key_id,)
            ).fetchone()
        if row is None:
            return None
        state = loads(row[0], f"learned state of {key.key_id}", UnreadableState)
        if not isinstance(state, dict):
            raise UnreadableState(f"the store's learned state of {key.key_id} is not an object")
        return state

    def quarantine_learned(self, key: LearnedKey, reason: str, loaded: dict | None) -> bool:
        """Keep the learned state of ``key`` aside: move its row, exactly as stored, into
        ``learned_quarantine`` with ``reason``, in one transaction. The key then has no learned
        state (its request summaries stay), so the next save starts it afresh.

        ``loaded`` is the state the caller read and could not use (None: the row was not a JSON
        object). If the row no longer holds it, another process has saved since, and nothing is
        moved: returns False. Returns True when the row was moved.
        """
        key = self.key(key)
        expected = None if loaded is None else dumps_compact(loaded)
        with self.write() as conn:
            row = conn.execute(
                "select model_id, device_id, drafter_id, state, key_meta, n_saves, created, updated "
                "from learned where key_id = ?", (key.key_id,)).fetchone()
            if row is None:
                return False
            try:
                current = json.loads(row[3])
                current = dumps_compact(current) if isinstance(current, dict) else None
            except (TypeError, ValueError, RecursionError, StoreError):
                current = None
            if current != expected:
                return False
            conn.execute(
                "insert into learned_quarantine (key_id, model_id, device_id, drafter_id, state, key_meta, "
                "n_saves, created, updated, reason, quarantined) values (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (key.key_id, *row, " ".join(str(reason).split()), now_iso()))
            conn.execute("delete from learned where key_id = ?", (key.key_id,))
        return True

    def quarantined(self, key: LearnedKey | None = None) -> list[dict]:
        """States kept aside (``quarantine_learned``), oldest first: id, key_id, reason,
        quarantined, updated and the stored ``state`` text; of one key or all."""
        sql = "select id, key_id, reason, quarantined, updated, state from learned_quarantine"
        params: list = []
        if key is not None:
            sql += " where key_id = ?"
            params.append(self.key(key).key_id)
        with self.read() as conn:
            return fetch_rows(conn, sql + " order by id", params)

    def save_learned(
        self,
        key: LearnedKey,
        state: dict,
        summary: dict | None = None,
        key_meta: dict | None = None,
    ) -> None:
        """Save ``state`` for ``key`` with the request's ``summary`` in ONE transaction.

        ``state`` is opaque JSON-able data (``{"scheduler": ..., "acceptance": ...}``; numpy
        values are converted, dict keys become strings). ``summary`` keys: arm, conversation,
        turn, n_tokens, decode_s, rounds, widths {width: rounds}, measure_rounds, tokens_per_s,
        created; other keys are kept too. ``key_meta`` (the fingerprints, see
        ``fingerprint.key_meta``) replaces the stored one when given.
        """
        key = self.key(key)
        if not isinstance(state, dict):
            raise StoreError(f"learned state must be a dict, got {type(state).__name__}")
        state_json = dumps_compact(state)
        meta_json = dumps_compact(key_meta) if key_meta is not None else None
        srow = summary_row(summary) if summary is not None else None
        now = now_iso()
        with self.write() as conn:
            upsert_learned(conn, key, state_json, meta_json, now)
            if srow is not None:
                insert_summary(conn, key.key_id, srow)

    def list_learned(self) -> list[dict]:
        """One row per key: ids, display names, request count, saves, created and updated."""
        with self.read() as conn:
            rows = fetch_rows(
                conn,
                """
                select l.key_id, l.model_id, l.device_id, l.drafter_id, l.key_meta,
                       l.n_saves, l.created, l.updated,
                       (select count(*) from requests r where r.key_id = l.key_id) as n_requests
                from learned l order by l.key_id
                """,
            )
        out = []
        for r in rows:
            meta = loads(r.pop("key_meta"), f"key metadata of {r['key_id']}") or {}
            r.update(names(meta, r))
            r["key_meta"] = meta
            out.append(r)
        return out

    def find_keys(self, pattern: str | None) -> list[LearnedKey]:
        """Keys whose key id starts with ``pattern`` or whose model name contains it (all if None)."""
        rows = self.list_learned()
        if pattern:
            low = pattern.lower()
            rows = [
                r
                for r in rows
                if r["key_id"].startswith(pattern) or low in str(r.get("model_name", "")).lower()
            ]
        return [LearnedKey(r["model_id"], r["device_id"], r["drafter_id"]) for r in rows]

    def request_summaries(self, key: LearnedKey | None = None, limit: int | None = 50) -> list[dict]:
        """Per-request summaries, newest first (all keys, or one), at most ``limit``."""
        sql = "select * from requests"
        params: list = []
        if key is not None:
            sql += " where key_id = ?"
            params.append(self.key(key).key_id)
        sql += " order by id desc"
        if limit is not None:
            sql += " limit ?"
            params.append(int(limit))
        with self.read() as conn:
            rows = fetch_rows(conn, sql, params)
        return [summary_out(r, int_width_keys=True) for r in rows]

    def reset(self, key: LearnedKey | None = None) -> int:
        """Delete the learned state, request summaries and states kept aside of one key (or all);
        return keys deleted. Conversations are kept.
        """
        with self.write() as conn:
            if key is None:
                n = conn.execute("delete from learned").rowcount
                conn.execute("delete from requests")
                conn.execute("delete from learned_quarantine")
            else:
                kid = self.key(key).key_id
                n = conn.execute("delete from learned where key_id = ?", (kid,)).rowcount
                conn.execute("delete from requests where key_id = ?", (kid,))
                conn.execute("delete from learned_quarantine where key_id = ?", (kid,))
        return int(n)
