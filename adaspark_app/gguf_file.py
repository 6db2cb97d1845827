"""The one GGUF reader: header, metadata, tensor table and plain tensors of a GGUF file.

Both `store` (model fingerprints) and `engine` (drafter checks, `drafter init`) read GGUF files
through this module; it imports neither. The format is llama.cpp's `gguf.cpp` / gguf-py's:

    magic "GGUF" | version u32 | n_tensors u64 | n_kv u64
    n_kv x (key string, value type u32, value)
    n_tensors x (name string, n_dims u32, ne u64 x n_dims, ggml type u32, offset u64)
    padding to general.alignment (default 32) | tensor data

Files are written in the byte order of the machine that wrote them, so a big-endian GGUF
exists (s390x builds, gguf-py's `--bigendian`). The magic is always the bytes "GGUF"; the byte
order shows in the version: read little-endian, a big-endian file's version has its low 16 bits
zero (version 3 reads as 0x03000000). gguf-py's GGUFReader uses the same rule.

Everything here reads untrusted files: a truncated file, an absurd count or length, an unknown
value type or a bad alignment raises `GGUFError` (a ModelLoadError and a ValueError) naming the
file, never IndexError or struct.error.
"""

from __future__ import annotations

import dataclasses
import errno
import mmap
import os
import stat
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from adaspark_app.errors import ModelLoadError

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)  # v1 had 32-bit counts; llama.cpp no longer reads it
DEFAULT_ALIGNMENT = 32
HEADER_BYTES = 24  # magic, version, n_tensors, n_kv

# GGUF metadata value types (gguf.GGUFValueType) and, for the fixed-width ones, struct codes
VALUE_UINT8, VALUE_INT8, VALUE_UINT16, VALUE_INT16 = 0, 1, 2, 3
VALUE_UINT32, VALUE_INT32, VALUE_FLOAT32, VALUE_BOOL = 4, 5, 6, 7
VALUE_STRING, VALUE_ARRAY = 8, 9
VALUE_UINT64, VALUE_INT64, VALUE_FLOAT64 = 10, 11, 12
SCALAR_CODES: dict[int, str] = {
    VALUE_UINT8: "B", VALUE_INT8: "b", VALUE_UINT16: "H", VALUE_INT16: "h",
    VALUE_UINT32: "I", VALUE_INT32: "i", VALUE_FLOAT32: "f", VALUE_BOOL: "?",
    VALUE_UINT64: "Q", VALUE_INT64: "q", VALUE_FLOAT64: "d",
}

#: Arrays up to this many items are read by default; longer ones (tokenizer scores, merges) are
#: skipped unless asked for, except tokenizer.ggml.tokens, which the drafter checks.
SMALL_ARRAY = 4096
#: Arrays of numbers up to this many items (a value per layer: llama.cpp's LLAMA_MAX_LAYERS) are
#: read even where arrays are skipped.
LAYER_ARRAY = 512
TOKENS_KEY = "tokenizer.ggml.tokens"
TOKENIZER_MODEL_KEY = "tokenizer.ggml.model"
MAX_DIMS = 4  # GGML_MAX_DIMS: llama.cpp refuses a tensor with more
MAX_TENSOR_NAME = 63  # GGML_MAX_NAME - 1: llama.cpp refuses a longer tensor name (gguf.cpp)
MAX_REASON = 300  # characters of a reason kept: it quotes the file's own names, any length
MAX_ARRAY_NESTING = 8  # arrays of arrays: a bound so a crafted file cannot exhaust the stack

#: ggml tensor types `read_gguf_tensor` reads, and their numpy dtypes.
GGML_NUMPY_TYPES = {0: np.float32, 1: np.float16, 27: np.int64}  # F32, F16, I64

# the smallest encodings, to refuse counts the rest of the file cannot possibly hold
_MIN_KV_BYTES = 8 + 4 + 1  # empty key, type, one-byte value
_MIN_TENSOR_BYTES = 8 + 4 + 4 + 8  # empty name, n_dims = 0, type, offset
_MIN_STRING_BYTES = 8
_MIN_ARRAY_BYTES = 4 + 8


def has_gguf_magic(head: bytes) -> bool:
    """Whether `head`, a file's first bytes, starts with the GGUF magic: the one check of it."""
    return head[:len(GGUF_MAGIC)] == GGUF_MAGIC


def check_regular(path: str | os.PathLike) -> os.stat_result:
    """`path`'s stat, OSError unless it is a regular file (or a link to one): a FIFO named .gguf
    in a models folder blocked `adaspark models` for ever on its first read, and a device never
    ends."""
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise OSError(errno.EINVAL, "not a regular file", str(path))
    return st


def file_identity(path: str | os.PathLike, st: os.stat_result) -> tuple:
    """What identifies the file at `path` (`st`: its stat) as read, for what is kept of it: where
    it is and its inode, size and mtime, so a file replaced or rewritten is read again."""
    return (os.path.realpath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def is_gguf(path: str | os.PathLike) -> bool:
    """Whether the file at `path` starts with the GGUF magic; OSError if it cannot be read."""
    check_regular(path)
    with open(path, "rb") as fh:
        return has_gguf_magic(fh.read(len(GGUF_MAGIC)))


class GGUFError(ModelLoadError, ValueError):
    """A file is not a readable GGUF (bad magic, unsupported version, truncated, corrupt).

    str() is "<path>: not a readable GGUF file (<reason>)"; `reason` alone is kept for callers
    that word their own message.
    """

    def __init__(self, path: str, reason: str) -> None:
        if len(reason) > MAX_REASON:  # a corrupt length can make a quoted key or name megabytes long
            reason = reason[:MAX_REASON] + f"... ({len(reason) - MAX_REASON} more characters)"
        super().__init__(f"{path}: not a readable GGUF file ({reason})")
        self.path = str(path)
        self.reason = reason


@dataclass
class TensorInfo:
    """One entry of a GGUF tensor table: ggml shape (ne0, ne1, ...), ggml type, data offset."""

    shape: tuple[int, ...]
    ggml_type: int
    offset: int  # from GGUFHeader.data_offset

    @property
    def n_elements(self) -> int:
        """Elements of the tensor (the product of its shape)."""
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass
class GGUFHeader:
    """A GGUF file's metadata and tensor table, read without touching tensor data.

    kv holds scalars (strings decoded as UTF-8) and arrays as lists (string items as bytes,
    nested arrays as lists). By default arrays longer than SMALL_ARRAY items are left out of kv
    except tokenizer.ggml.tokens, which is always kept in `tokens`; see read_gguf_header for
    reading all or none. types maps every key, read or skipped, to (gguf value type, array item
    type or None). byte_order is "<" or ">", the struct prefix of the file's numbers.
    """

    version: int
    byte_order: str
    kv: dict[str, Any]
    types: dict[str, tuple[int, int | None]]
    tokens: list[bytes] | None
    tensors: dict[str, TensorInfo]
    data_offset: int  # first byte of tensor data: the header, metadata, table and padding end here
    # the first token of the vocabulary that repeats an earlier one: (earlier id, its id), read or
    # skipped (llama.cpp aborts on such a vocabulary: ``vocab_problem``)
    repeated_token: tuple[int, int] | None = None
    # for a vocabulary llama.cpp tokenizes with RWKV's trie (tokenizer.ggml.model "rwkv"): a byte
    # that begins a token but is no token alone, or None (its tokenizer loops forever on text with
    # it: ``rwkv_lone_start``)
    rwkv_lone_start: int | None = None

    @property
    def n_tensors(self) -> int:
        """Entries of the tensor table."""
        return len(self.tensors)

    @property
    def tensor_types(self) -> dict[int, int]:
        """ggml type -> elements stored in that type, over the whole tensor table."""
        out: dict[int, int] = {}
        for info in self.tensors.values():
            out[info.ggml_type] = out.get(info.ggml_type, 0) + info.n_elements
        return out


def byte_order_of(version_bytes: bytes) -> str:
    """The struct prefix of a GGUF file given its 4 version bytes (see the module docstring)."""
    (v,) = struct.unpack("<I", version_bytes)
    return ">" if v & 0xFFFF == 0 else "<"


def read_gguf_header(
    path: str | os.PathLike, full: bool = False, *, skip_arrays: bool = False
) -> GGUFHeader:
    """Parse a GGUF file's header, metadata and tensor table (GGUFError if it is not one).

    full: read every array into kv (tokenizer merges and scores too; `drafter init` copies
    them). skip_arrays: read only short arrays of numbers (a value per layer, up to LAYER_ARRAY
    items), not even the tokens; walking past the rest costs one length read per string, and
    the tokens' bytes are looked at once for a repeated token (``repeated_token``: llama.cpp
    aborts on one), so SmolLM2's 49k-token vocabulary is crossed
    in ~20 ms and Qwen2.5's 152k in ~60 (the store fingerprints every model this way). The
    default reads arrays of up to SMALL_ARRAY items and the tokens.
    """
    if full and skip_arrays:
        raise ValueError("read_gguf_header: full and skip_arrays exclude each other")
    path = str(path)
    try:
        st = check_regular(path)
        key = file_identity(path, st) if skip_arrays and SKIP_ARRAYS_KEPT > 0 else None
        if key is not None and key in _SKIP_ARRAYS_READ:
            return _copy(_SKIP_ARRAYS_READ[key])
        with open(path, "rb") as fh:
            size = fh.seek(0, 2)
            if size < HEADER_BYTES:
                raise GGUFError(path, f"{size} bytes, shorter than a GGUF header")
            with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                header = _Walk(path, buf, full=full, skip_arrays=skip_arrays).header()
    except OSError as exc:
        raise GGUFError(path, exc.strerror or str(exc)) from None
    if key is not None:
        while len(_SKIP_ARRAYS_READ) >= SKIP_ARRAYS_KEPT:
            del _SKIP_ARRAYS_READ[next(iter(_SKIP_ARRAYS_READ))]
        _SKIP_ARRAYS_READ[key] = _copy(header)
    return header


# Headers read with skip_arrays, by file: loading a model reads one three times (its default
# context, the checks of what llama.cpp aborts on, the store's fingerprint), 20 ms each for
# SmolLM2. The key changes with the file (a rewrite changes its inode, size or mtime), so a
# replaced file is read again; callers get copies of the kept dicts, so none sees another's
# changes. 0 keeps none (benchmarks/cost/engine_load.py compares).
SKIP_ARRAYS_KEPT = 8
_SKIP_ARRAYS_READ: dict[tuple, GGUFHeader] = {}


def _copy(header: GGUFHeader) -> GGUFHeader:
    """`header` with its own kv, types and tensor table (the entries' values shared)."""
    return dataclasses.replace(header, kv=dict(header.kv), types=dict(header.types),
                               tensors=dict(header.tensors))


def rwkv_unescape(token: bytes) -> bytes:
    """A token's bytes as llama.cpp's RWKV tokenizer reads them (llama_unescape_rwkv_token): `\\t`,
    `\\n`, `\\r`, `\\xHH` (its hex digits read as c - 'a' + 10 from 'a' up, else c - '0', in a
    byte) and `\\` before any other byte, that byte."""
    if b"\\" not in token:
        return token
    out = bytearray()
    escaping, hex_left, acc = False, 0, 0
    for c in token:
        if hex_left:
            acc = ((acc << 4) + ((c - 97 + 10) if c >= 97 else (c - 48))) & 0xFF
            hex_left -= 1
            if not hex_left:
                out.append(acc)
                acc = 0
        elif escaping:
            if c == 0x78:  # x
                hex_left = 2
            else:
                out.append({0x74: 9, 0x6E: 10, 0x72: 13}.get(c, c))
            escaping = False
        elif c == 0x5C:  # backslash
            escaping = True
        else:
            out.append(c)
    return bytes(out)


def rwkv_lone_start(tokens: list[bytes]) -> int | None:
    """The lowest byte that begins a token of this vocabulary but is no token alone, or None.
    llama.cpp's RWKV tokenizer walks its trie from each position to the longest token; where the
    walk from a byte passes no token (no token of that byte alone, and none longer matching), it
    goes back to position 0 and walks the same again, for ever."""
    starts: set[int] = set()
    alone: set[int] = set()
    for token in tokens:
        text = rwkv_unescape(token)
        if text:
            starts.add(text[0])
            if len(text) == 1:
                alone.add(text[0])
    lone = starts - alone
    return min(lone) if lone else None


def _first_repeat(tokens: list[bytes]) -> tuple[int, int] | None:
    """(earlier id, id) of the first token whose bytes an earlier token has, or None."""
    if len(set(tokens)) == len(tokens):  # the usual answer, at C speed
        return None
    seen: dict[bytes, int] = {}
    for i, t in enumerate(tokens):
        first = seen.setdefault(t, i)
        if first != i:
            return first, i
    return None


def read_gguf_tensor(path: str | os.PathLike, header: GGUFHeader, name: str) -> np.ndarray:
    """Tensor `name` of a GGUF file, as stored (F32, F16 or I64), in numpy's row-major shape
    (the reverse of ggml's ne), in native byte order whatever the file's.

    KeyError if the table has no such tensor; GGUFError for another ggml type or a tensor that
    runs past the end of the file.
    """
    path = str(path)
    info = header.tensors[name]
    dtype = GGML_NUMPY_TYPES.get(info.ggml_type)
    if dtype is None:
        raise GGUFError(path, f"tensor {name} has ggml type {info.ggml_type}, not F32, F16 or I64")
    shape = tuple(reversed(info.shape))
    stored = np.dtype(dtype).newbyteorder(header.byte_order)
    start = header.data_offset + info.offset
    nbytes = info.n_elements * stored.itemsize
    try:
        check_regular(path)
        with open(path, "rb") as fh:
            size = fh.seek(0, 2)
            if start + nbytes > size:
                raise GGUFError(path, f"tensor {name} runs past the end of the file")
            if nbytes == 0:
                return np.zeros(shape, dtype=dtype)
            fh.seek(start)
            raw = fh.read(nbytes)
    except OSError as exc:
        raise GGUFError(path, exc.strerror or str(exc)) from None
    if len(raw) != nbytes:
        raise GGUFError(path, f"tensor {name} runs past the end of the file")
    return np.frombuffer(raw, dtype=stored).astype(dtype).reshape(shape)


class _Walk:
    """One pass over a mapped GGUF file; every read checks the bytes are there first."""

    def __init__(self, path: str, buf: Any, *, full: bool, skip_arrays: bool) -> None:
        self.path = path
        self.buf = buf
        self.size = len(buf)
        self.pos = 0
        self.full = full
        self.skip_arrays = skip_arrays
        self.bo = "<"

    def fail(self, reason: str) -> GGUFError:
        return GGUFError(self.path, reason)

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise self.fail(f"{what} runs past the end of the file at byte {self.pos}")

    def u32(self, what: str) -> int:
        self.need(4, what)
        (v,) = struct.unpack_from(self.bo + "I", self.buf, self.pos)
        self.pos += 4
        return v

    def u64(self, what: str) -> int:
        self.need(8, what)
        (v,) = struct.unpack_from(self.bo + "Q", self.buf, self.pos)
        self.pos += 8
        return v

    def raw_string(self, what: str) -> bytes:
        n = self.u64(what)
        self.need(n, what)
        s = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return s

    def string(self, what: str) -> str:
        return self.raw_string(what).decode("utf-8", errors="replace")

    def count(self, what: str, min_bytes: int) -> int:
        """A u64 count, refused when the rest of the file cannot hold that many items."""
        n = self.u64(what)
        if n * min_bytes > self.size - self.pos:
            raise self.fail(f"{what} of {n} cannot fit in the {self.size - self.pos} bytes left")
        return n

    def header(self) -> GGUFHeader:
        if not has_gguf_magic(bytes(self.buf[:4])):
            raise self.fail(f"bad magic {bytes(self.buf[:4])!r}")
        self.bo = byte_order_of(bytes(self.buf[4:8]))
        self.pos = 4
        version = self.u32("version")
        if version not in SUPPORTED_VERSIONS:
            raise self.fail(f"GGUF version {version} is not supported")
        n_tensors = self.u64("tensor count")  # checked against what is left after the metadata
        n_kv = self.count("metadata count", _MIN_KV_BYTES)

        kv: dict[str, Any] = {}
        types: dict[str, tuple[int, int | None]] = {}
        tokens: list[bytes] | None = None
        vocab: list[bytes] = []  # the tokens' bytes, read or skipped, until the metadata's end
        repeated: tuple[int, int] | None = None
        for _ in range(n_kv):
            key = self.string("a metadata key")
            if key in types:
                raise self.fail(f"duplicate metadata key {key}")
            vtype = self.u32(f"the type of {key}")
            if vtype == VALUE_ARRAY:
                item_type = self.u32(f"the item type of {key}")
                n = self.count(f"array {key}", self._item_bytes(item_type, key))
                types[key] = (vtype, item_type)
                is_tokens = key == TOKENS_KEY
                if self.skip_arrays:  # per-layer numbers only: llama_aborts checks them
                    keep = item_type in SCALAR_CODES and n <= LAYER_ARRAY
                else:
                    keep = self.full or is_tokens or n <= SMALL_ARRAY
                if keep:
                    value = self.array(item_type, n, key, 0)
                    kv[key] = value
                    if is_tokens and item_type == VALUE_STRING:
                        tokens = vocab = value
                        repeated = _first_repeat(value)
                elif is_tokens and item_type == VALUE_STRING:
                    repeated, vocab = self.skip_tokens(n, key)
                else:
                    self.skip_array(item_type, n, key, 0)
            else:
                kv[key] = self.value(vtype, key)
                types[key] = (vtype, None)
        lone = rwkv_lone_start(vocab) if kv.get(TOKENIZER_MODEL_KEY) == "rwkv" else None
        del vocab

        if n_tensors * _MIN_TENSOR_BYTES > self.size - self.pos:
            raise self.fail(f"tensor count of {n_tensors} cannot fit in the "
                            f"{self.size - self.pos} bytes left")
        tensors: dict[str, TensorInfo] = {}
        for _ in range(n_tensors):
            raw = self.raw_string("a tensor name")
            if len(raw) > MAX_TENSOR_NAME:
                raise self.fail(f"a tensor name of {len(raw)} bytes, more than {MAX_TENSOR_NAME}")
            name = raw.decode("utf-8", errors="replace")
            if name in tensors:
                raise self.fail(f"duplicate tensor name {name}")
            n_dims = self.u32(f"the dimensions of tensor {name}")
            if n_dims > MAX_DIMS:
                raise self.fail(f"tensor {name} has {n_dims} dimensions, more than {MAX_DIMS}")
            shape = tuple(self.u64(f"the shape of tensor {name}") for _ in range(n_dims))
            ggml_type = self.u32(f"the type of tensor {name}")
            offset = self.u64(f"the offset of tensor {name}")
            tensors[name] = TensorInfo(shape, ggml_type, offset)

        align = kv.get("general.alignment", DEFAULT_ALIGNMENT)
        if isinstance(align, bool) or not isinstance(align, int) or align <= 0 or align & (align - 1):
            raise self.fail(f"general.alignment {align!r} is not a power of two")
        data_offset = self.pos + (-self.pos % align)
        return GGUFHeader(version=version, byte_order=self.bo, kv=kv, types=types, tokens=tokens,
                          tensors=tensors, data_offset=data_offset, repeated_token=repeated,
                          rwkv_lone_start=lone)

    def _item_bytes(self, item_type: int, key: str) -> int:
        """Bytes of the smallest item of an array of this type (an unknown type is refused)."""
        if item_type in SCALAR_CODES:
            return struct.calcsize(SCALAR_CODES[item_type])
        if item_type == VALUE_STRING:
            return _MIN_STRING_BYTES
        if item_type == VALUE_ARRAY:
            return _MIN_ARRAY_BYTES
        raise self.fail(f"unknown array item type {item_type} for {key}")

    def value(self, vtype: int, key: str) -> Any:
        """One scalar or string value."""
        code = SCALAR_CODES.get(vtype)
        if code is not None:
            width = struct.calcsize(code)
            self.need(width, f"the value of {key}")
            (v,) = struct.unpack_from(self.bo + code, self.buf, self.pos)
            self.pos += width
            return v
        if vtype == VALUE_STRING:
            return self.string(f"the value of {key}")
        raise self.fail(f"unknown value type {vtype} for {key}")

    def array(self, item_type: int, n: int, key: str, depth: int) -> list:
        """n items of an array whose count has been read (string items as bytes)."""
        code = SCALAR_CODES.get(item_type)
        if code is not None:
            dtype = np.dtype(self.bo + code)
            self.need(n * dtype.itemsize, f"array {key}")
            items = np.frombuffer(self.buf, dtype=dtype, count=n, offset=self.pos).tolist()
            self.pos += n * dtype.itemsize
            return items
        if item_type == VALUE_STRING:
            return [self.raw_string(f"an item of {key}") for _ in range(n)]
        if item_type == VALUE_ARRAY:
            if depth >= MAX_ARRAY_NESTING:
                raise self.fail(f"array {key} nests deeper than {MAX_ARRAY_NESTING}")
            out = []
            for _ in range(n):
                inner = self.u32(f"an item type in {key}")
                count = self.count(f"an array in {key}", self._item_bytes(inner, key))
                out.append(self.array(inner, count, key, depth + 1))
            return out
        raise self.fail(f"unknown array item type {item_type} for {key}")

    def skip_tokens(self, n: int, key: str) -> tuple[tuple[int, int] | None, list[bytes]]:
        """Move past the vocabulary's n strings as ``skip_array`` does: which token first repeats
        an earlier one (``_first_repeat``), and the strings (the header's reader drops them once it
        has read the tokenizer's model)."""
        length = struct.Struct(self.bo + "Q").unpack_from
        buf, size, pos = self.buf, self.size, self.pos
        strings: list[bytes] = []
        keep = strings.append
        for _ in range(n):
            if pos + 8 > size:
                break
            (ln,) = length(buf, pos)
            end = pos + 8 + ln
            if end > size:
                break
            keep(buf[pos + 8:end])
            pos = end
        else:
            self.pos = pos
            return _first_repeat(strings), strings
        raise self.fail(f"array {key} runs past the end of the file")

    def skip_array(self, item_type: int, n: int, key: str, depth: int) -> None:
        """Move past n items without building them: fixed-width items in one step."""
        code = SCALAR_CODES.get(item_type)
        if code is not None:
            width = n * struct.calcsize(code)
            self.need(width, f"array {key}")
            self.pos += width
        elif item_type == VALUE_STRING:
            # the hot loop of a fingerprint (one per vocabulary entry): no helper calls
            length = struct.Struct(self.bo + "Q").unpack_from
            buf, size, pos = self.buf, self.size, self.pos
            for _ in range(n):
                if pos + 8 > size:
                    break
                (ln,) = length(buf, pos)
                pos += 8 + ln
                if pos > size:
                    break
            else:
                self.pos = pos
                return
            raise self.fail(f"array {key} runs past the end of the file")
        elif item_type == VALUE_ARRAY:
            if depth >= MAX_ARRAY_NESTING:
                raise self.fail(f"array {key} nests deeper than {MAX_ARRAY_NESTING}")
            for _ in range(n):
                inner = self.u32(f"an item type in {key}")
                count = self.count(f"an array in {key}", self._item_bytes(inner, key))
                self.skip_array(inner, count, key, depth + 1)
        else:
            raise self.fail(f"unknown array item type {item_type} for {key}")
