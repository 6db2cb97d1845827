"""One model found on disk, and what its GGUF header says about it.

`inspect_model` reads only the header (adaspark_app.gguf_file, the validated reader) and the file
size: a few ms per file, however large. It never raises on a bad file: a file that is not a GGUF,
is cut short or holds an architecture llama.cpp cannot run comes back with `problem` set.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..gguf_file import GGUFError, is_gguf, read_gguf_header
from ..llama_aborts import header_problem
from .architectures import architecture_problem

SOURCES = ("bundled", "hf", "lmstudio", "ollama", "folder")  # the list's order
SOURCE_LABELS = {"bundled": "bundled", "hf": "hugging face", "lmstudio": "lm studio", "ollama": "ollama",
                 "folder": "folder"}


@dataclass
class ModelEntry:
    """A GGUF found in one place, named as that place names it (no merging across sources).

    problem: None for a usable model, else why it is listed as broken (a partial download, not a
    GGUF, truncated, an architecture llama.cpp does not run). turn_format: "chat template", or for
    a base model "base model, <format> turns" / "base model, plain completion". learned: a
    learned state exists for it on this device (None: not looked up)."""

    name: str
    source: str
    path: str
    size: int | None = None
    architecture: str | None = None
    quantisation: str | None = None
    has_chat_template: bool | None = None
    turn_format: str | None = None
    model_id: str | None = None
    learned: bool | None = None
    problem: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def broken(self) -> bool:
        return self.problem is not None

    @property
    def base_model(self) -> bool:
        return self.has_chat_template is False

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("extra")
        out.update(self.extra)
        out["broken"] = self.broken
        out["base_model"] = self.base_model
        return out


def _file_size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except OSError:
        return None


def _tensor_bytes(info: Any) -> int | None:
    """Bytes of one tensor's data by its ggml type, or None for a type gguf-py does not know."""
    import gguf

    try:
        block, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(info.ggml_type)]
    except (ValueError, KeyError):
        return None
    return info.n_elements // block * type_size


def inspect_model(entry: ModelEntry, expected_size: int | None = None) -> ModelEntry:
    """Fill `entry` from its file's header; set `problem` for anything that stops it loading.

    expected_size: the size a manifest promises (Ollama), checked against the file's."""
    path = Path(entry.path)
    if entry.problem is not None:
        entry.size = entry.size if entry.size is not None else _file_size(path)
        return entry
    try:
        size = path.stat().st_size
        gguf = is_gguf(path)
    except OSError as exc:
        entry.problem = f"cannot read the file ({exc.strerror or exc})"
        return entry
    entry.size = size
    if not gguf:
        entry.problem = "not a GGUF file" if size else "empty file"
        return entry
    if expected_size is not None and size < expected_size:
        entry.problem = f"partial download: {size} of {expected_size} bytes"
        return entry
    try:
        head = read_gguf_header(path, skip_arrays=True)
    except GGUFError as exc:
        entry.problem = f"corrupt GGUF ({exc.reason})"
        return entry
    kv = head.kv
    arch = kv.get("general.architecture")
    entry.architecture = str(arch) if isinstance(arch, str) else None
    entry.quantisation = _quantisation(kv.get("general.file_type"), head.tensor_types)
    template = kv.get("tokenizer.chat_template")
    entry.has_chat_template = isinstance(template, str) and bool(template.strip())
    entry.model_id = _model_id(path)
    end = _data_end(head)
    if end is None:
        entry.problem = "a tensor of a type this llama.cpp does not know"
    elif end > size:
        entry.problem = f"truncated: {size} of {end} bytes"
    else:
        entry.problem = header_problem(head) or architecture_problem(entry.architecture)
    if entry.problem is None:
        entry.turn_format = _turn_format(path, entry)
    return entry


def _data_end(head: Any) -> int | None:
    """Where the last tensor's data ends (None if a tensor's type is unknown)."""
    end = head.data_offset
    for info in head.tensors.values():
        n = _tensor_bytes(info)
        if n is None:
            return None
        end = max(end, head.data_offset + info.offset + n)
    return end


def _quantisation(file_type: Any, tensor_types: dict[int, int]) -> str | None:
    """general.file_type as a name (Q4_K_M), else the tensor type holding most elements."""
    from ..store.fingerprint import _dominant_tensor_type, _quant_name

    if isinstance(file_type, int) and not isinstance(file_type, bool):
        name = _quant_name(file_type)
        if name:
            return name
    return _dominant_tensor_type(tensor_types)


def _model_id(path: Path) -> str | None:
    """The id the learned store keys this model by (store.fingerprint: a hash of the header)."""
    from ..errors import ModelLoadError
    from ..store.fingerprint import model_fingerprint

    try:
        return model_fingerprint(path)["id"]
    except ModelLoadError:
        return None


def _turn_format(path: Path, entry: ModelEntry) -> str:
    """"chat template", or the base model's format (its vocabulary read to check the markers)."""
    from ..engine.template import turn_format_for

    if entry.has_chat_template:
        return "chat template"
    try:
        tokens = set(read_gguf_header(path).tokens or ())  # base models only: the vocabulary
    except GGUFError:
        tokens = set()
    return turn_format_for(None, entry.architecture, lambda m: m.encode("utf-8") in tokens).label()


def human_size(n: int | None) -> str:
    """1.2 GB, 270 MB, 12 KB (decimal units, as download pages show them)."""
    if n is None:
        return "-"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def is_gguf_name(name: str) -> bool:
    return name.lower().endswith(".gguf")


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False
