"""Keys of the learned store: what a model file, a device and a drafter are, in a few fields.

The verify's cost law is a property of the model file, the device, the kernels and the context
(paper §5, "Two learners, two clocks"): it converges once per model and device and is stored under
this key. A model is identified by a hash of its GGUF header, metadata and tensor table (the bytes
before the tensor data: architecture, shapes, quantisation types), not of gigabytes of weights.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import stat
from pathlib import Path
from typing import Any, NamedTuple

from adaspark_app.errors import ModelLoadError, StoreError
from adaspark_app.gguf_file import GGUFError, file_identity, is_gguf, read_gguf_header
from adaspark_app.gguf_types import file_type_name, tensor_type_name

ID_HEX_CHARS = 16  # short ids: 64 bits of sha256, plenty for a handful of models and devices
_ID_RE = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")

# gguf_file.file_identity (path, device, inode, size, mtime) -> fingerprint; a model's header is
# read once per process
_MODEL_CACHE: dict[tuple, dict] = {}


def _short_hash(obj: Any) -> str:
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:ID_HEX_CHARS]


def _quant_name(file_type: Any) -> str | None:
    name = file_type_name(file_type)
    if name is None:
        return None
    for prefix in ("MOSTLY_", "ALL_"):
        if name.startswith(prefix):
            name = name[len(prefix):]
    return name


def _dominant_tensor_type(tensor_types: dict[int, int]) -> str | None:
    """The tensor type holding most elements: the quantisation when general.file_type is absent."""
    if not tensor_types:
        return None
    ttype = max(sorted(tensor_types), key=lambda k: tensor_types[k])
    return tensor_type_name(ttype) or f"type{ttype}"


def model_fingerprint(path: str | os.PathLike) -> dict:
    """Fingerprint of a GGUF model file: name, architecture, quantisation, size, header hash, id.

    ``header_sha256`` covers every byte before the tensor data offset (magic, version, metadata
    KV, tensor infos, alignment padding); ``id`` is its first 16 hex digits. The header is
    walked by gguf_file.read_gguf_header (tests check it against gguf.GGUFReader). Raises
    ModelLoadError naming the file if it is missing or not a GGUF.
    """
    p = Path(path)
    try:
        st = p.stat()
    except OSError as exc:
        raise ModelLoadError(f"cannot read model file {p}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):  # from the stat above, not a second one
        raise ModelLoadError(f"model path {p} is not a file")
    cache_key = file_identity(p, st)  # as gguf_file keeps a header
    if cache_key in _MODEL_CACHE:
        return dict(_MODEL_CACHE[cache_key])
    try:
        gguf = is_gguf(p)
    except OSError as exc:
        raise ModelLoadError(f"cannot read model file {p}: {exc.strerror or exc}") from None
    if not gguf:
        raise ModelLoadError(f"{p} is not a GGUF file")
    try:
        # arrays are skipped, not read: SmolLM2's 49k-token vocabulary would cost seconds
        head = read_gguf_header(p, skip_arrays=True)
    except GGUFError as exc:
        raise ModelLoadError(f"{p} is not a readable GGUF file: {exc.reason}") from None
    data_offset = min(head.data_offset, st.st_size)  # a file cut inside the padding
    name = head.kv.get("general.name")
    arch = head.kv.get("general.architecture")
    file_type = head.kv.get("general.file_type")
    if isinstance(file_type, bool) or not isinstance(file_type, int):
        file_type = None  # absent or of a foreign type: the quantisation comes from the tensors
    h = hashlib.sha256()
    with open(p, "rb") as fh:
        remaining = data_offset
        while remaining > 0:
            chunk = fh.read(min(remaining, 1 << 20))
            if not chunk:
                break
            h.update(chunk)
            remaining -= len(chunk)
    header_sha = h.hexdigest()
    quant = _quant_name(file_type) if file_type is not None else None
    dominant = _dominant_tensor_type(head.tensor_types) if quant is None else None
    fp = {
        "kind": "model",
        "id": header_sha[:ID_HEX_CHARS],
        "name": str(name) if name else p.stem,
        "architecture": str(arch) if arch else None,
        "file_type": int(file_type) if file_type is not None else None,
        "quantisation": quant or dominant,
        "size": int(st.st_size),
        "n_tensors": head.n_tensors,
        "gguf_version": head.version,
        "header_bytes": data_offset,
        "header_sha256": header_sha,
        "file": p.name,
    }
    _MODEL_CACHE[cache_key] = fp
    return dict(fp)


def drafter_fingerprint(path: str | os.PathLike | None) -> dict | None:
    """model_fingerprint of the drafter file, or None when decoding runs without a drafter."""
    if path is None:
        return None
    fp = model_fingerprint(path)
    fp["kind"] = "drafter"
    return fp


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            text = fh.read()
        for key in ("model name", "Hardware", "Processor", "cpu model"):
            m = re.search(rf"^{key}\s*:\s*(.+)$", text, re.MULTILINE)
            if m and m.group(1).strip():
                return re.sub(r"\s+", " ", m.group(1).strip())
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown cpu"


def _backend_from_info(info: str) -> str:
    low = info.lower()
    for needle, name in (
        ("cuda", "cuda"),
        ("metal", "metal"),
        ("vulkan", "vulkan"),
        ("hip", "rocm"),
        ("sycl", "sycl"),
        ("opencl", "opencl"),
    ):
        # "CUDA : ARCHS = ..." or "CUDA = 1" names a backend; "CUDA = 0" does not
        if re.search(rf"\b{needle}\b", low) and not re.search(rf"\b{needle}\s*=\s*0", low):
            return name
    return "cpu"


def device_fingerprint(
    n_threads: int,
    backend_info: str,
    *,
    backend: str | None = None,
    gpu: str | None = None,
    gpu_layers: int = 0,
    gpu_detail: dict | None = None,
) -> dict:
    """Fingerprint of the device a cost law was learned on.

    ``backend_info`` is the llama.cpp build/version string the engine passes (e.g. the package
    version plus ``llama_print_system_info()``); ``backend`` ("cpu", "cuda", ...) is inferred from
    it unless given; ``gpu`` names the GPU when layers run on one, ``gpu_layers`` how many (-1:
    all) and ``gpu_detail`` the rest of what identifies it (compute capability, driver). The id
    hashes every field but the display name, so a different thread count, llama.cpp build, GPU,
    driver or layer split is a different device. On the CPU (``gpu_layers`` 0) the GPU fields are
    left out, so a CPU device keeps the id it had before they existed.
    """
    if int(n_threads) < 1:
        raise ValueError(f"n_threads must be >= 1, got {n_threads}")
    cpu = _cpu_name()
    fp: dict[str, Any] = {
        "kind": "device",
        "backend": backend or _backend_from_info(backend_info or ""),
        "cpu": cpu,
        "gpu": gpu,
        "machine": platform.machine(),
        "system": platform.system(),
        "n_threads": int(n_threads),
        "llama_build": backend_info or "",
    }
    if gpu_layers:
        fp["gpu_layers"] = int(gpu_layers)
        fp["gpu_detail"] = dict(gpu_detail or {})
    fp["id"] = _short_hash(fp)
    if gpu_layers:
        from adaspark_app.engine.offload import layers_text

        layers = layers_text(gpu_layers)
        detail = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in sorted((gpu_detail or {}).items()))
        fp["name"] = f"{gpu or 'GPU'}{f' ({detail})' if detail else ''}, {layers} on it, {fp['backend']}"
    else:
        fp["name"] = f"{gpu or cpu}, {int(n_threads)} threads, {fp['backend']}"
    return fp


def check_id(value: Any, what: str, *, optional: bool = False) -> str | None:
    """Validate one id of a LearnedKey (short, no '/' so key ids cannot collide)."""
    if value is None and optional:
        return None
    if not isinstance(value, str) or not _ID_RE.match(value):
        raise StoreError(f"invalid {what} {value!r}: expected a short id of letters, digits, '._:-'")
    return value


class LearnedKey(NamedTuple):
    """What learned state is stored under: (model, device, drafter or None)."""

    model_id: str
    device_id: str
    drafter_id: str | None = None

    @property
    def key_id(self) -> str:
        """One string naming the key in the store and on the command line."""
        return f"{self.model_id}/{self.device_id}/{self.drafter_id or '-'}"

    @classmethod
    def from_key_id(cls, key_id: str) -> "LearnedKey":
        parts = key_id.split("/")
        if len(parts) != 3:
            raise StoreError(f"invalid key id {key_id!r}: expected MODEL/DEVICE/DRAFTER")
        return cls(parts[0], parts[1], None if parts[2] == "-" else parts[2]).validated()

    @classmethod
    def from_fingerprints(
        cls, model: dict, device: dict, drafter: dict | None = None
    ) -> "LearnedKey":
        return cls(model["id"], device["id"], drafter["id"] if drafter else None).validated()

    def validated(self) -> "LearnedKey":
        check_id(self.model_id, "model id")
        check_id(self.device_id, "device id")
        check_id(self.drafter_id, "drafter id", optional=True)
        if self.drafter_id == "-":
            raise StoreError("invalid drafter id '-': reserved for 'no drafter'")
        return self


def key_meta(model: dict, device: dict, drafter: dict | None = None) -> dict:
    """The ``key_meta`` the engine passes to save_learned: the three fingerprints."""
    return {"model": model, "device": device, "drafter": drafter}
