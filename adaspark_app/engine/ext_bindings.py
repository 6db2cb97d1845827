"""ctypes bindings of the llama.cpp entry points the DSpark drafter needs (llama-cpp-python==0.3.36).

Two kinds of symbols are bound here, both from the shared library llama_cpp already loaded
(`llama_cpp.llama_cpp._lib`), so the process never holds two copies of libllama:

- the staging API of `src/llama-ext.h` (target-feature extraction, the nextn/confidence output,
  the drafter's target layers). That header has no `extern "C"`, so libllama exports these
  with Itanium C++-mangled names, e.g. `_Z30llama_set_embeddings_layer_inpP13llama_contextjb`.
  A mangled name encodes the signature, so a changed signature in another llama.cpp shows up
  here as a missing symbol rather than as silent memory corruption.
- the extended batch API of `llama.h` (`llama_batch_ext_*`, `llama_process`), C linkage.
  llama_cpp.py binds them too; we take fresh function objects (`lib[name]`) so setting our
  argtypes never changes llama_cpp's own bindings.

Every symbol is looked up once, at `load()`; a missing one raises `BindingError` naming the
pinned llama-cpp-python version, instead of an AttributeError deep inside a decode.
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass
from typing import Any

from adaspark_app.errors import BindingError

#: The llama-cpp-python release whose vendored llama.cpp these signatures were read from.
PINNED_VERSION = "0.3.36"

LLAMA_PROCESS_TYPE_DECODE = 1  # enum llama_process_type (llama.h)
GGML_TYPE_F32 = 0  # enum ggml_type, for the drafter's KV cache
LLAMA_FLASH_ATTN_TYPE_DISABLED = 0  # enum llama_flash_attn_type

_ctx_p = ctypes.c_void_p
_model_p = ctypes.c_void_p
_batch_p = ctypes.c_void_p
_float_p = ctypes.POINTER(ctypes.c_float)


class LlamaEmbd(ctypes.Structure):
    """`struct llama_embd` (llama.h): rows of input embeddings handed to a batch by value."""

    _fields_ = [
        ("data", _float_p),
        ("n_rows", ctypes.c_size_t),
        ("n_embd", ctypes.c_size_t),
    ]


LlamaPos4 = ctypes.c_int32 * 4  # llama_batch_ext_set_pos reads up to 4 slots (M-RoPE sections)

# name -> (candidate exported symbols, argtypes, restype). Mangled names are those of g++/clang
# on Linux and macOS; the MSVC spelling is tried too so a Windows build fails only if it lacks them.
_SIGNATURES: dict[str, tuple[tuple[str, ...], list[Any], Any]] = {
    # llama-ext.h
    "llama_set_embeddings_layer_inp": (
        (
            "_Z30llama_set_embeddings_layer_inpP13llama_contextjb",
            "?llama_set_embeddings_layer_inp@@YAXPEAUllama_context@@I_N@Z",
            "llama_set_embeddings_layer_inp",
        ),
        [_ctx_p, ctypes.c_uint32, ctypes.c_bool],
        None,
    ),
    "llama_get_embeddings_layer_inp": (
        (
            "_Z30llama_get_embeddings_layer_inpP13llama_contextj",
            "?llama_get_embeddings_layer_inp@@YAPEAMPEAUllama_context@@I@Z",
            "llama_get_embeddings_layer_inp",
        ),
        [_ctx_p, ctypes.c_uint32],
        _float_p,
    ),
    "llama_model_target_layer_ids": (
        (
            "_Z28llama_model_target_layer_idsPK11llama_model",
            "?llama_model_target_layer_ids@@YAPEBHPEBUllama_model@@@Z",
            "llama_model_target_layer_ids",
        ),
        [_model_p],
        ctypes.POINTER(ctypes.c_int32),
    ),
    "llama_model_target_layer_ids_n": (
        (
            "_Z30llama_model_target_layer_ids_nPK11llama_model",
            "?llama_model_target_layer_ids_n@@YAIPEBUllama_model@@@Z",
            "llama_model_target_layer_ids_n",
        ),
        [_model_p],
        ctypes.c_uint32,
    ),
    "llama_model_dflash_selector_top_k": (
        (
            "_Z33llama_model_dflash_selector_top_kPK11llama_model",
            "?llama_model_dflash_selector_top_k@@YAHPEBUllama_model@@@Z",
            "llama_model_dflash_selector_top_k",
        ),
        [_model_p],
        ctypes.c_int32,
    ),
    "llama_set_embeddings_nextn": (
        (
            "_Z26llama_set_embeddings_nextnP13llama_contextbb",
            "?llama_set_embeddings_nextn@@YAXPEAUllama_context@@_N1@Z",
            "llama_set_embeddings_nextn",
        ),
        [_ctx_p, ctypes.c_bool, ctypes.c_bool],
        None,
    ),
    "llama_get_embeddings_nextn": (
        (
            "_Z26llama_get_embeddings_nextnP13llama_context",
            "?llama_get_embeddings_nextn@@YAPEAMPEAUllama_context@@@Z",
            "llama_get_embeddings_nextn",
        ),
        [_ctx_p],
        _float_p,
    ),
    "llama_get_embeddings_nextn_ith": (
        (
            "_Z30llama_get_embeddings_nextn_ithP13llama_contexti",
            "?llama_get_embeddings_nextn_ith@@YAPEAMPEAUllama_context@@H@Z",
            "llama_get_embeddings_nextn_ith",
        ),
        [_ctx_p, ctypes.c_int32],
        _float_p,
    ),
    "llama_get_ctx_other": (
        (
            "_Z19llama_get_ctx_otherP13llama_context",
            "?llama_get_ctx_other@@YAPEAUllama_context@@PEAU1@@Z",
            "llama_get_ctx_other",
        ),
        [_ctx_p],
        _ctx_p,
    ),
    # llama.h, extended batch API (C linkage)
    "llama_batch_ext_init": (("llama_batch_ext_init",), [_ctx_p], _batch_p),
    "llama_batch_ext_free": (("llama_batch_ext_free",), [_batch_p], None),
    "llama_batch_ext_clear": (("llama_batch_ext_clear",), [_batch_p], None),
    "llama_batch_ext_add_token": (
        ("llama_batch_ext_add_token",),
        [_batch_p, ctypes.c_int32, ctypes.c_int32],
        ctypes.c_int32,
    ),
    "llama_batch_ext_add_embd": (
        ("llama_batch_ext_add_embd",),
        [_batch_p, ctypes.c_int32, LlamaEmbd],
        ctypes.c_int32,
    ),
    "llama_batch_ext_set_pos": (
        ("llama_batch_ext_set_pos",),
        [_batch_p, ctypes.c_int32, ctypes.POINTER(ctypes.c_int32)],
        ctypes.c_bool,
    ),
    "llama_batch_ext_set_output_logits": (
        ("llama_batch_ext_set_output_logits",),
        [_batch_p, ctypes.c_int32, ctypes.c_bool],
        ctypes.c_bool,
    ),
    "llama_process": (("llama_process",), [_ctx_p, ctypes.c_int, _batch_p], ctypes.c_int32),
}


@dataclass(frozen=True)
class ExtBindings:
    """The bound functions, one attribute per C name (see `_SIGNATURES`)."""

    llama_set_embeddings_layer_inp: Any
    llama_get_embeddings_layer_inp: Any
    llama_model_target_layer_ids: Any
    llama_model_target_layer_ids_n: Any
    llama_model_dflash_selector_top_k: Any
    llama_set_embeddings_nextn: Any
    llama_get_embeddings_nextn: Any
    llama_get_embeddings_nextn_ith: Any
    llama_get_ctx_other: Any
    llama_batch_ext_init: Any
    llama_batch_ext_free: Any
    llama_batch_ext_clear: Any
    llama_batch_ext_add_token: Any
    llama_batch_ext_add_embd: Any
    llama_batch_ext_set_pos: Any
    llama_batch_ext_set_output_logits: Any
    llama_process: Any

    def target_layer_ids(self, model: Any) -> list[int]:
        """The target layers a DFlash/DSpark model reads (`dflash.target_layers`), as ints."""
        n = int(self.llama_model_target_layer_ids_n(model))
        ptr = self.llama_model_target_layer_ids(model)
        if n == 0 or not ptr:
            return []
        return [int(ptr[i]) for i in range(n)]


def bind(lib: Any, version: str | None = None) -> ExtBindings:
    """Bind every symbol of `_SIGNATURES` from `lib`; BindingError names all that are missing."""
    functions: dict[str, Any] = {}
    missing: list[str] = []
    for name, (symbols, argtypes, restype) in _SIGNATURES.items():
        for symbol in symbols:
            try:
                fn = lib[symbol]
            except (AttributeError, KeyError, TypeError):
                continue
            fn.argtypes = argtypes
            fn.restype = restype
            functions[name] = fn
            break
        else:
            missing.append(f"{name} ({symbols[0]})")
    if missing:
        found = f"llama-cpp-python {version}" if version else "this libllama"
        raise BindingError(
            f"{found} lacks {len(missing)} symbol(s) the DSpark drafter needs: "
            f"{', '.join(missing)}; install llama-cpp-python=={PINNED_VERSION}"
        )
    return ExtBindings(**functions)


_lock = threading.Lock()
_cached: ExtBindings | None = None


def load() -> ExtBindings:
    """The bindings from the libllama llama_cpp loaded (cached). BindingError if unusable.

    The version must be the pinned one: the mangled names pin signatures, not behaviour
    (feature rows, block layout), which were read from 0.3.36's vendored llama.cpp.
    """
    global _cached
    with _lock:
        if _cached is not None:
            return _cached
        try:
            import llama_cpp
            import llama_cpp.llama_cpp as low
        except Exception as exc:  # ImportError, or the shared library failed to load
            raise BindingError(
                f"llama-cpp-python=={PINNED_VERSION} is not importable ({exc})"
            ) from exc
        version = getattr(llama_cpp, "__version__", "?")
        if version != PINNED_VERSION:
            raise BindingError(
                f"the DSpark drafter is built against llama-cpp-python=={PINNED_VERSION}, "
                f"found {version}; install llama-cpp-python=={PINNED_VERSION}"
            )
        _cached = bind(low._lib, version)
        return _cached
