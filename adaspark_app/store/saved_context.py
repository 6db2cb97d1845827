"""Conversations' KV caches kept on disk, so reopening a long conversation does not read its history
again: `chat --continue` on 3,679 tokens of history waited 13.7 s for its first token on 2 cores.

The chat's engine writes a conversation's cache when it leaves it (a reply in another
conversation, the chat's end) and reads it at the next reply in that conversation, where the
prompt starts with more than the engine holds. What is read is exactly what was computed: the
reply after it is the one the chat would have given had it stayed open.

One file per conversation and engine, in the folder beside the store (``folder_for``):

    MAGIC, a 4-byte little-endian header length, the header (JSON: format, the engine's identity
    hash, the conversation's hash, the token count, the body's length and sha256, the drafter
    part's length), then the body: the tokens (int32, little-endian), llama.cpp's state of the
    target's sequence 0 and, with a DSpark drafter, the state of the drafter's (its features of
    the same positions; else nothing).

A file is a cache, read as untrusted input: one from another version, engine or model, damaged
or cut short is deleted (it is never given to llama.cpp unchecked) and the history is prefilled
as before. Saving is best effort: a full disk costs a later prefill, never a reply. The folder
is kept under a size limit (the config file's ``saved_context_mb``), the least recently used file
going first; deleting a conversation deletes its files.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..output_paths import put_in_place, temp_for

MAGIC = b"ADASPARK-KV\n"
FORMAT = 1
SUFFIX = ".kv"
SAVING = ".saving-"  # a file being written; one left by a process killed mid-save is removed later
STALE_SAVING_S = 600.0
#: A history shorter than this prefills in about a second on 2 cores: not worth a file.
MIN_TOKENS = 256
#: The config file's default for ``saved_context_mb``.
DEFAULT_LIMIT_MB = 2048
_MAX_HEADER = 1 << 16


def folder_for(store_path: str | os.PathLike) -> Path:
    """The saved contexts of the store at `store_path`: `<store name>.kv` beside it."""
    p = Path(store_path)
    return p.with_name(p.name + SUFFIX)


def _hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def identity_hash(identity: dict[str, Any]) -> str:
    """What makes a cache usable: the same model file, device, llama.cpp build, kernels and cache
    types (the caller's dict); hashed into the file's name and header."""
    return _hash(json.dumps(identity, sort_keys=True, default=str))


@dataclass(frozen=True)
class Saved:
    """A saved context found for a conversation: its tokens, read and checked; the state is read
    only when it is used (``SavedContexts.state``)."""

    path: Path
    tokens: list[int]
    body_offset: int
    body_length: int
    sha256: str
    drafter_length: int  # the drafter's state, at the body's end (0: none)


class SavedContexts:
    """The saved contexts of one engine (its `identity`) in `folder`, kept under `limit_bytes`."""

    def __init__(self, folder: str | os.PathLike, identity: dict[str, Any], limit_bytes: int) -> None:
        self.folder = Path(folder)
        self.identity = identity_hash(identity)
        self.limit_bytes = max(0, int(limit_bytes))
        self.last_error: str | None = None  # why the last save did not happen (a full disk)

    def takes(self, n_bytes: int) -> bool:
        """Whether a context of `n_bytes` is kept: at most a quarter of the limit, so the folder
        holds four conversations at least, and the chat's end never waits on gigabytes (a 7B
        model's 32k-token context is 1.8 GB)."""
        return n_bytes <= self.limit_bytes // 4

    def path_for(self, conversation_id: str) -> Path:
        return self.folder / f"{_hash(conversation_id)}-{self.identity}{SUFFIX}"

    # ------------------------------------------------------------------ writing
    def save(self, conversation_id: str, tokens: list[int], state: bytes | memoryview,
             drafter_state: bytes | memoryview = b"") -> bool:
        """Write the conversation's cache (atomically: a reader sees the old file or the new one),
        then trim the folder to the limit. False, with `last_error`, where it could not be written."""
        self.last_error = None
        body_tokens = struct.pack(f"<{len(tokens)}i", *tokens)
        digest = hashlib.sha256(body_tokens)
        digest.update(state)
        digest.update(drafter_state)
        length = len(body_tokens) + len(state) + len(drafter_state)
        header = json.dumps({"format": FORMAT, "identity": self.identity, "conversation": _hash(conversation_id),
                             "n_tokens": len(tokens), "body_length": length, "sha256": digest.hexdigest(),
                             "drafter_length": len(drafter_state)}).encode()
        size = len(MAGIC) + 4 + len(header) + length
        if size > self.limit_bytes:
            self.last_error = f"{size >> 20} MiB is over the limit of {self.limit_bytes >> 20} MiB"
            return False
        tmp = None
        try:
            self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd, tmp = temp_for(self.path_for(conversation_id), prefix=SAVING)
            with os.fdopen(fd, "wb") as f:
                f.write(MAGIC + struct.pack("<I", len(header)) + header)
                f.write(body_tokens)
                f.write(state)
                f.write(drafter_state)
            put_in_place(tmp, self.path_for(conversation_id))
            tmp = None
        except OSError as err:
            self.last_error = err.strerror or str(err)
            return False
        finally:
            if tmp is not None:
                _unlink(Path(tmp))
        self.trim(keep=self.path_for(conversation_id))
        return True

    def trim(self, keep: Path | None = None) -> None:
        """Delete the least recently used files until the folder is within the limit (`keep` last),
        and what a process killed mid-save left (a `.saving-` file untouched for 10 minutes)."""
        try:
            entries = [(e.stat().st_mtime, e.stat().st_size, Path(e.path)) for e in os.scandir(self.folder)
                       if e.is_file(follow_symlinks=False) and (e.name.endswith(SUFFIX) or e.name.startswith(SAVING))]
        except OSError:
            return
        stale = time.time() - STALE_SAVING_S
        for mtime, _, path in [e for e in entries if e[2].name.startswith(SAVING)]:
            if mtime < stale:
                _unlink(path)
        entries = [e for e in entries if e[2].name.endswith(SUFFIX)]
        total = sum(size for _, size, _ in entries)
        for _, size, path in sorted(entries, key=lambda e: (e[2] == keep, e[0])):
            if total <= self.limit_bytes:
                break
            _unlink(path)
            total -= size

    # ------------------------------------------------------------------ reading
    def find(self, conversation_id: str) -> Saved | None:
        """The conversation's saved context for this engine, its header and tokens checked (the
        body's checksum is checked by ``state``); None where there is none. A file that does not
        check out is deleted."""
        path = self.path_for(conversation_id)
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                head = f.read(len(MAGIC) + 4)
                if len(head) < len(MAGIC) + 4 or head[:len(MAGIC)] != MAGIC:
                    return _bad(path)
                (n_header,) = struct.unpack("<I", head[len(MAGIC):])
                if n_header > _MAX_HEADER:
                    return _bad(path)
                header = json.loads(f.read(n_header).decode("utf-8"))
                n, length, sha = header["n_tokens"], header["body_length"], header["sha256"]
                drafter = header["drafter_length"]
                offset = len(MAGIC) + 4 + n_header
                if (header.get("format") != FORMAT or header.get("identity") != self.identity
                        or header.get("conversation") != _hash(conversation_id)
                        or not all(isinstance(v, int) and not isinstance(v, bool) for v in (n, length, drafter))
                        or not isinstance(sha, str) or n < 1 or drafter < 0 or 4 * n + drafter >= length
                        or offset + length != size):
                    return _bad(path)
                raw = f.read(4 * n)
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError, AttributeError, struct.error):
            return _bad(path)
        if len(raw) != 4 * n:
            return _bad(path)
        return Saved(path, list(struct.unpack(f"<{n}i", raw)), offset, length, sha, drafter)

    def state(self, saved: Saved) -> tuple[memoryview, memoryview] | None:
        """The saved llama.cpp states, the target's and the drafter's (empty without one): writable
        views, which ctypes reads without a copy. Their checksum is checked (None, and the file
        deleted, where it fails); the file counts as used now."""
        body = bytearray(saved.body_length)
        try:
            with open(saved.path, "rb") as f:
                f.seek(saved.body_offset)
                got = f.readinto(body)
        except OSError:
            return _bad(saved.path)
        if got != saved.body_length or hashlib.sha256(body).hexdigest() != saved.sha256:
            return _bad(saved.path)
        try:
            os.utime(saved.path)
        except OSError:
            pass
        view = memoryview(body)
        split = saved.body_length - saved.drafter_length
        return view[4 * len(saved.tokens):split], view[split:]

    def discard(self, saved: Saved) -> None:
        """Delete a saved context llama.cpp refused."""
        _unlink(saved.path)


def usage(folder: str | os.PathLike) -> tuple[int, int]:
    """(saved contexts, bytes) in `folder` (0, 0 where there is none)."""
    try:
        sizes = [e.stat().st_size for e in os.scandir(folder) if e.name.endswith(SUFFIX) and e.is_file()]
    except OSError:
        return 0, 0
    return len(sizes), sum(sizes)


def clear(folder: str | os.PathLike) -> None:
    """Delete every saved context in `folder` (the config's `saved_context_mb = 0`: none kept)."""
    _delete_where(folder, lambda name: name.endswith(SUFFIX) or name.startswith(SAVING))


def forget_conversation(folder: str | os.PathLike, conversation_id: str) -> None:
    """Delete every saved context of a conversation (any engine): called where it is deleted."""
    prefix = _hash(conversation_id) + "-"
    _delete_where(folder, lambda name: name.startswith(prefix) and name.endswith(SUFFIX))


def _delete_where(folder: str | os.PathLike, chosen) -> None:
    try:
        names = [e.name for e in os.scandir(folder) if chosen(e.name)]
    except OSError:
        return
    for name in names:
        _unlink(Path(folder) / name)


def _bad(path: Path) -> None:
    _unlink(path)
    return None


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass
