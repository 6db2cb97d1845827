"""Find the GGUF files a user already has: the Hugging Face hub cache, LM Studio's folders,
Ollama's blobs (through its manifests), the bundled model, and folders from the config file and
$ADASPARK_MODELS (locations.py says where each tool keeps them).

Each entry is named as its source names it, with no merging of copies across sources:

- Hugging Face: `org/name/file.gguf` (the repo id and the file), from
  `models--org--name/snapshots/<revision>/<file>`, a symlink to `../../blobs/<sha>`. A blob still
  being written is `blobs/<sha>.incomplete`: listed as a partial download.
- LM Studio: `publisher/repo/file.gguf` under a models folder.
- Ollama: `name:tag` (`ns/name:tag` outside the library namespace, `host/ns/name:tag` for another
  registry), from `manifests/<host>/<ns>/<name>/<tag>`, whose layer of media type
  application/vnd.ollama.image.model is the blob `blobs/sha256-<hex>`; a `-partial` blob is a
  download in progress.
- A folder: the file's path below the folder.

Discovery never raises for what it finds: unreadable directories are skipped, and every file
that cannot be used is an entry with its problem (entry.inspect_model). A model split in shards
(`-00001-of-00003.gguf`) is listed once, by its first shard, which llama.cpp opens.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Iterable, Iterator, Sequence

from ..gguf_file import is_gguf
from .entry import SOURCES, ModelEntry, inspect_model, is_gguf_name
from .locations import env_model_dirs, hf_hub_cache, lmstudio_model_dirs, ollama_models_dirs

# The bundled model as every listing and label names it (its file's general.name is a training run's).
BUNDLED_TITLE = "SmolLM2-135M-Instruct"
BUNDLED_NAME = f"{BUNDLED_TITLE} (bundled)"
OLLAMA_MODEL_MEDIA = "application/vnd.ollama.image.model"
OLLAMA_REGISTRY = "registry.ollama.ai"
OLLAMA_LIBRARY = "library"
OLLAMA_PARTIAL_RE = re.compile(r"^(sha256-[0-9a-fA-F]{64})-partial")
#: suffixes downloaders give a file until it is complete
PARTIAL_SUFFIXES = (".incomplete", ".part", ".partial", ".download", ".crdownload", ".tmp")
SHARD_RE = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)
MAX_DEPTH = 6  # how deep a folder is walked: model trees are shallow, a home directory is not
MAX_MANIFEST_BYTES = 1 << 20


def discover_models(folders: Sequence[str | os.PathLike] = (), *, include_bundled: bool = True,
                    store_path: str | os.PathLike | None = None, learned: bool = True,
                    notes: list[str] | None = None) -> list[ModelEntry]:
    """Every model found, in SOURCES order then by name. `folders`: the config file's model
    folders ($ADASPARK_MODELS is added). learned: look up which have a learned state on this
    device in the store (`store_path`, default the user's store; an absent store means none).
    notes: if given, gets a sentence for each folder the user named that cannot be read (the
    tools' own default places are looked in quietly: most users have only some of them)."""
    entries: list[ModelEntry] = []
    if include_bundled:
        entries += bundled_entries()
    entries += hf_entries(hf_hub_cache())
    for d in lmstudio_model_dirs():
        entries += lmstudio_entries(d)
    for d in ollama_models_dirs():
        entries += ollama_entries(d)
    seen: set[Path] = set()
    for d in [*map(Path, folders), *env_model_dirs()]:
        d = Path(os.path.expanduser(str(d)))
        if d in seen:
            continue
        seen.add(d)
        if notes is not None:
            problem = _folder_problem(d)
            if problem:
                notes.append(f"model folder {d}: {problem}; not searched")
        entries += folder_entries(d)
    if learned:
        mark_learned(entries, store_path)
    order = {s: i for i, s in enumerate(SOURCES)}
    entries.sort(key=lambda e: (order.get(e.source, len(order)), e.name.lower()))
    return entries


# ---------------------------------------------------------------------------------- sources
def bundled_entries() -> list[ModelEntry]:
    """The bundled SmolLM2 (found without importing its package), or nothing."""
    from ..engine.backend import default_model_path
    from ..errors import ModelLoadError

    try:
        path = default_model_path()
    except ModelLoadError:
        return []
    return [inspect_model(ModelEntry(BUNDLED_NAME, "bundled", path))]


def hf_entries(cache: Path) -> list[ModelEntry]:
    """GGUF files in a Hugging Face hub cache: one entry per (repo, revision, file) distinct blob."""
    out: list[ModelEntry] = []
    for repo_dir in _subdirs(cache):
        if not repo_dir.name.startswith("models--"):
            continue  # datasets--, spaces--: not models
        repo_id = repo_dir.name[len("models--"):].replace("--", "/")
        seen: dict[str, ModelEntry] = {}  # blob -> entry: the same file in two revisions is one copy
        for snap in _subdirs(repo_dir / "snapshots"):
            for path, rel in _walk(snap):
                if not is_gguf_name(rel) or _skip_shard(rel):
                    continue
                name = f"{repo_id}/{rel}"
                blob = os.path.realpath(path)
                if blob in seen:
                    continue
                entry = ModelEntry(name, "hf", str(path), extra={"revision": snap.name})
                if not os.path.exists(path):
                    entry.problem = "its blob is missing (an interrupted download, or a pruned cache)"
                seen[blob] = _with_shards(entry, path, rel)
        out += [inspect_model(e) for e in seen.values()]
        for blob in _files(repo_dir / "blobs"):
            if blob.name.endswith(".incomplete") and _looks_like_gguf(blob):
                out.append(inspect_model(ModelEntry(
                    f"{repo_id} (downloading {blob.name[:12]}…)", "hf", str(blob),
                    problem="partial download (the blob is still .incomplete)")))
    return out


def lmstudio_entries(models_dir: Path) -> list[ModelEntry]:
    """GGUF files in an LM Studio models folder (publisher/repo/file.gguf)."""
    return _tree_entries(models_dir, "lmstudio")


def folder_entries(folder: Path) -> list[ModelEntry]:
    """GGUF files below a folder the user named (config file, $ADASPARK_MODELS)."""
    return _tree_entries(folder, "folder")


def ollama_entries(models_dir: Path) -> list[ModelEntry]:
    """Ollama's models: every manifest resolved to its model blob, and partial blobs."""
    out: list[ModelEntry] = []
    manifests = models_dir / "manifests"
    blobs = models_dir / "blobs"
    for path, rel in _walk(manifests, max_depth=4):
        parts = rel.split("/")
        if len(parts) != 4:
            continue  # host/namespace/name/tag
        name = ollama_name(*parts)
        out.append(_ollama_entry(name, path, blobs))
    partial: dict[str, Path] = {}  # digest -> its partial file (Ollama adds -partial-N chunk files)
    for blob in _files(blobs):
        m = OLLAMA_PARTIAL_RE.match(blob.name)
        if m and (m.group(1) not in partial or blob.name == f"{m.group(1)}-partial"):
            partial[m.group(1)] = blob
    for digest, blob in partial.items():
        out.append(ModelEntry(f"(downloading {digest[:19]}…)", "ollama", str(blob),
                              size=_size(blob), problem="partial download"))
    return out


def ollama_name(host: str, namespace: str, model: str, tag: str) -> str:
    """Ollama's short name for a manifest path: name:tag in the library, ns/name:tag elsewhere
    on its registry, host/ns/name:tag on another registry."""
    if host == OLLAMA_REGISTRY:
        return f"{model}:{tag}" if namespace == OLLAMA_LIBRARY else f"{namespace}/{model}:{tag}"
    return f"{host}/{namespace}/{model}:{tag}"


def _ollama_entry(name: str, manifest: Path, blobs: Path) -> ModelEntry:
    entry = ModelEntry(name, "ollama", str(manifest))
    try:
        if manifest.stat().st_size > MAX_MANIFEST_BYTES:
            raise ValueError("too large")
        data = json.loads(manifest.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError, RecursionError):
        entry.problem = "its manifest is not readable JSON"
        return entry
    layers = data.get("layers") if isinstance(data, dict) else None
    layer = next((x for x in layers if isinstance(x, dict) and x.get("mediaType") == OLLAMA_MODEL_MEDIA),
                 None) if isinstance(layers, list) else None
    digest = layer.get("digest") if layer else None
    if not isinstance(digest, str) or not re.fullmatch(r"sha256[:-][0-9a-fA-F]{64}", digest):
        entry.problem = "its manifest names no model layer"
        return entry
    blob = blobs / digest.replace(":", "-")
    entry.path = str(blob)
    entry.extra["manifest"] = str(manifest)
    if not blob.is_file():
        partial = any(b.name.startswith(blob.name + "-partial") for b in _files(blobs))
        entry.problem = "partial download" if partial else "its model blob is missing"
        return entry
    declared = layer.get("size")
    expected = declared if isinstance(declared, int) and not isinstance(declared, bool) and declared > 0 else None
    return inspect_model(entry, expected_size=expected)


# ---------------------------------------------------------------------------------- helpers
def _tree_entries(root: Path, source: str) -> list[ModelEntry]:
    out: list[ModelEntry] = []
    for path, rel in _walk(root):
        low = rel.lower()
        if is_gguf_name(low):
            if not _skip_shard(rel):
                out.append(inspect_model(_with_shards(ModelEntry(rel, source, str(path)), path, rel)))
        elif ".gguf" in low and low.endswith(PARTIAL_SUFFIXES):
            out.append(inspect_model(ModelEntry(rel, source, str(path), problem="partial download")))
    return out


def _skip_shard(rel: str) -> bool:
    """A shard after the first: llama.cpp opens the first and finds the rest itself."""
    m = SHARD_RE.search(rel)
    return m is not None and int(m.group(1)) != 1


def _with_shards(entry: ModelEntry, path: Path, rel: str) -> ModelEntry:
    """For a first shard: the total size, or a problem if a later shard is missing."""
    m = SHARD_RE.search(rel)
    if m is None or entry.problem is not None:
        return entry
    n = int(m.group(2))
    stem = path.name[: SHARD_RE.search(path.name).start()]
    missing = [k for k in range(2, n + 1) if not (path.parent / f"{stem}-{k:05d}-of-{n:05d}.gguf").exists()]
    entry.extra["shards"] = n
    if missing:
        entry.problem = f"shard {missing[0]} of {n} is missing"
    return entry


def _walk(root: Path, max_depth: int = MAX_DEPTH) -> Iterator[tuple[Path, str]]:
    """(path, path relative to root with '/') of every file below root, hidden entries skipped;
    symlinks to files are followed (the HF cache is made of them), to directories not."""
    stack: list[tuple[Path, str, int]] = [(root, "", 0)]
    while stack:
        d, prefix, depth = stack.pop()
        try:
            with os.scandir(d) as it:
                items = sorted(it, key=lambda e: e.name)
        except OSError:
            continue
        for item in reversed(items):
            if item.name.startswith("."):
                continue
            rel = f"{prefix}{item.name}"
            try:
                if item.is_dir(follow_symlinks=False):
                    if depth + 1 < max_depth:
                        stack.append((Path(item.path), rel + "/", depth + 1))
                    continue
            except OSError:
                continue
            yield Path(item.path), rel


def _folder_problem(d: Path) -> str | None:
    """Why the folder `d` cannot be searched (missing, not a folder, unreadable), or None."""
    try:
        with os.scandir(d):
            return None
    except FileNotFoundError:
        return "no such folder"
    except NotADirectoryError:
        return "not a folder"
    except OSError as err:
        return (err.strerror or str(err)).lower()


def _subdirs(d: Path) -> Iterable[Path]:
    try:
        return sorted(p for p in d.iterdir() if p.is_dir() and not p.name.startswith("."))
    except OSError:
        return []


def _files(d: Path) -> list[Path]:
    try:
        return sorted(p for p in d.iterdir() if p.is_file())
    except OSError:
        return []


def _size(p: Path) -> int | None:
    try:
        return p.stat().st_size
    except OSError:
        return None


def _looks_like_gguf(p: Path) -> bool:
    try:
        return is_gguf(p)
    except OSError:
        return False


# ---------------------------------------------------------------------------------- learned state
def mark_learned(entries: list[ModelEntry], store_path: str | os.PathLike | None = None, *,
                 rows: list[dict] | None = None) -> None:
    """Set `learned` on each usable entry: the store holds a learned state for its model id on
    this device. `rows`: the store's `list_learned()` when the caller has the store open (a
    process must not open a second connection to a store it has open: see `learned_rows`); else
    the store at `store_path` (default the user's) is read, an absent one meaning none (it is not
    created)."""
    ids = learned_model_ids(learned_rows(store_path) if rows is None else rows)
    for e in entries:
        e.learned = None if e.broken else (e.model_id in ids)


def learned_rows(store_path: str | os.PathLike | None = None, *, strict: bool = False) -> list[dict]:
    """`Store.list_learned()` of the store at `store_path`, [] if there is none or it does not
    open (strict: a file that is not a store raises its StoreError, for a --store the user
    named). Only for a process that does not have that store open already: opening it checks the
    file with a plain open(), and closing that descriptor drops the POSIX locks SQLite holds on
    the file for the process's other connections."""
    from ..errors import AdaSparkError
    from ..store import Store
    from ..store.db import resolve_store_path

    path = resolve_store_path(store_path)
    if not path.is_file():
        return []
    try:
        with Store.open(path) as store:
            return store.list_learned()
    except AdaSparkError:
        if strict:
            raise
        return []


def learned_model_ids(rows: Sequence[dict]) -> set[str]:
    """Model ids with a learned state on this device. The store's device id hashes the
    llama.cpp build, which only loading llama.cpp tells, so "this device" is matched by the CPU
    and machine recorded with each state."""
    import platform

    from ..store.fingerprint import _cpu_name

    here = (_cpu_name(), platform.machine())
    ids: set[str] = set()
    for r in rows:
        meta = r.get("key_meta") if isinstance(r, dict) else None
        device = meta.get("device") if isinstance(meta, dict) else None
        if isinstance(device, dict) and (device.get("cpu"), device.get("machine")) == here:
            ids.add(str(r.get("model_id")))
    return ids


def find_model(name: str, entries: Sequence[ModelEntry]) -> ModelEntry | None:
    """The entry called `name` (exactly, else case-insensitively), or None."""
    for e in entries:
        if e.name == name:
            return e
    low = name.lower()
    return next((e for e in entries if e.name.lower() == low), None)
