"""Names of GGUF's file types and tensor types, without importing gguf-py.

The store's model fingerprint names a model's quantisation (`store/fingerprint.py`), and every
engine process computes it at start-up: importing gguf-py for two enum lookups took 67 ms of the
engine's ~0.66 s of CPU to ready. These tables are gguf-py's `LlamaFileType` and
`GGMLQuantizationType` as of gguf 0.17 (`tests/test_gguf_types.py` checks them against the
installed gguf-py); a value they lack is looked up in gguf-py itself, so a newer type is named
as gguf-py names it.
"""

from __future__ import annotations

from typing import Any

#: gguf.LlamaFileType: general.file_type
FILE_TYPES: dict[int, str] = {
    0: "ALL_F32", 1: "MOSTLY_F16", 2: "MOSTLY_Q4_0", 3: "MOSTLY_Q4_1", 7: "MOSTLY_Q8_0", 8: "MOSTLY_Q5_0",
    9: "MOSTLY_Q5_1", 10: "MOSTLY_Q2_K", 11: "MOSTLY_Q3_K_S", 12: "MOSTLY_Q3_K_M", 13: "MOSTLY_Q3_K_L",
    14: "MOSTLY_Q4_K_S", 15: "MOSTLY_Q4_K_M", 16: "MOSTLY_Q5_K_S", 17: "MOSTLY_Q5_K_M", 18: "MOSTLY_Q6_K",
    19: "MOSTLY_IQ2_XXS", 20: "MOSTLY_IQ2_XS", 21: "MOSTLY_Q2_K_S", 22: "MOSTLY_IQ3_XS", 23: "MOSTLY_IQ3_XXS",
    24: "MOSTLY_IQ1_S", 25: "MOSTLY_IQ4_NL", 26: "MOSTLY_IQ3_S", 27: "MOSTLY_IQ3_M", 28: "MOSTLY_IQ2_S",
    29: "MOSTLY_IQ2_M", 30: "MOSTLY_IQ4_XS", 31: "MOSTLY_IQ1_M", 32: "MOSTLY_BF16", 36: "MOSTLY_TQ1_0",
    37: "MOSTLY_TQ2_0", 38: "MOSTLY_MXFP4_MOE", 39: "MOSTLY_NVFP4", 40: "MOSTLY_Q1_0", 1024: "GUESSED",
}

#: gguf.GGMLQuantizationType: a tensor's ggml type
TENSOR_TYPES: dict[int, str] = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 9: "Q8_1", 10: "Q2_K",
    11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K", 16: "IQ2_XXS", 17: "IQ2_XS", 18: "IQ3_XXS",
    19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S", 23: "IQ4_XS", 24: "I8", 25: "I16", 26: "I32",
    27: "I64", 28: "F64", 29: "IQ1_M", 30: "BF16", 34: "TQ1_0", 35: "TQ2_0", 39: "MXFP4", 40: "NVFP4",
    41: "Q1_0",
}


def _name(value: Any, table: dict[int, str], enum: str) -> str | None:
    """`table`'s name of `value`, else gguf-py's enum `enum`'s, else None."""
    try:
        v = int(value)
    except (ValueError, TypeError):
        return None
    if v in table:
        return table[v]
    import gguf

    try:
        return getattr(gguf, enum)(v).name
    except ValueError:
        return None


def file_type_name(value: Any) -> str | None:
    """gguf-py's name of a general.file_type value (``MOSTLY_Q4_1``), or None if it has none."""
    return _name(value, FILE_TYPES, "LlamaFileType")


def tensor_type_name(value: Any) -> str | None:
    """gguf-py's name of a ggml tensor type (``Q4_K``), or None if it has none."""
    return _name(value, TENSOR_TYPES, "GGMLQuantizationType")
