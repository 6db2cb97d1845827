"""Header values llama.cpp aborts on: the process ends in a GGML_ASSERT (or, for a rope of no
dimensions, never finishes its first forward) instead of returning an error, so each is refused
here, in one line, before llama.cpp sees the file.

Every rule is one of llama-cpp-python 0.3.36's assertions, read off its llama.cpp (the loader, the
architectures' `load_arch_hparams` and graph builders, ggml's CPU ops), not guessed; a value of the
wrong type is left to llama.cpp, which refuses it with an error of its own. The header is
`gguf_file.read_gguf_header`'s, read with ``skip_arrays`` (per-layer arrays of numbers are kept).
"""

from __future__ import annotations

from typing import Any

from adaspark_app.gguf_file import LAYER_ARRAY, GGUFHeader

#: llama.cpp asserts 0 < n_layer <= this (llama-model.cpp): an abort, not an error; the header
#: reader keeps arrays of numbers up to it (a value per layer)
LLAMA_MAX_LAYERS = LAYER_ARRAY


def vocab_problem(header: GGUFHeader) -> str | None:
    """Why llama.cpp would abort on this file's vocabulary (a token written twice: it asserts that
    every token maps to one id, llama-vocab.cpp, and the process ends) or hang on it (an RWKV
    vocabulary where a byte begins tokens but is none alone: ``gguf_file.rwkv_lone_start``), or None."""
    if header.repeated_token is not None:
        a, b = header.repeated_token
        return f"its vocabulary has one token twice, ids {a} and {b}; llama.cpp needs each token once"
    if header.rwkv_lone_start is not None:
        return (f"its RWKV vocabulary has tokens that begin with byte 0x{header.rwkv_lone_start:02X} but no token of "
                "that byte alone; llama.cpp's tokenizer would loop for ever on text with it")
    return None


#: llama.cpp's rope scaling types by name (LLAMA_ROPE_SCALING_TYPES, llama-model.cpp); another name
#: is an assertion, not an error.
ROPE_SCALING_TYPES = ("none", "linear", "yarn", "longrope")
LLAMA_MAX_EXPERTS = 1024  # llama-hparams.h
#: architectures whose loader turns an expert count of 0 or 1 into no experts first (llama-model.cpp)
_EXPERTS_DROPPED_BELOW_2 = ("hunyuan-dense", "hunyuan_vl")


def _whole(v: Any) -> int | None:
    """An int metadata value (not a bool), else None: a value of another type llama.cpp refuses
    with an error of its own."""
    return v if isinstance(v, int) and not isinstance(v, bool) else None


#: Architectures whose graph asserts, at the top of its builder, that the attention head size is
#: the rope dimension count (`GGML_ASSERT(n_embd_head == n_rot)`) and, for all but two, the key
#: size: read off llama-cpp-python 0.3.36's src/models/*.cpp, not guessed (minimax and nemotron
#: have the line commented out: their rope covers part of a head). llama.cpp checks neither when
#: it loads the file, so a wrong count ended the process at the first forward.
_HEAD_IS_ROPE = frozenset((
    "apertus", "arcee", "arctic", "baichuan", "chameleon", "codeshell", "cogvlm", "cohere2moe", "dbrx", "deci",
    "deepseek", "dots1", "dream", "ernie4_5", "ernie4_5-moe", "exaone", "exaone-moe", "falcon", "granite",
    "granite_swa", "graniteswitch", "grok", "grovemoe", "hunyuan-moe", "hunyuan_vl", "hy_v3", "internlm2", "jais2",
    "llada", "llada-moe", "maincoder", "mistral3", "olmo", "olmoe", "orion", "paddleocr", "pangu-embedded", "plamo",
    "pockettts", "qwen2", "qwen2moe", "qwen2vl", "qwen3", "qwen3moe", "qwen3vl", "qwen3vlmoe", "rnd1", "seed_oss",
    "smollm3", "starcoder2", "talkie", "xverse"))
_HEAD_KEY_NOT_ASSERTED = frozenset(("exaone-moe", "talkie"))


def _default_head(kv: dict[str, Any], arch: str) -> int | None:
    """The head size llama.cpp takes where the header gives no key or value length: the
    embedding over layer 0's head count (a per-layer array's first); None where either is missing."""
    n_embd = _whole(kv.get(f"{arch}.embedding_length"))
    heads = kv.get(f"{arch}.attention.head_count")
    n_head = _whole(heads[0]) if isinstance(heads, list) and heads else _whole(heads)
    return n_embd // n_head if n_embd and n_head else None


def _head_problem(kv: dict[str, Any], arch: str) -> str | None:
    """The head size against the rope dimensions and the key size, for ``_HEAD_IS_ROPE``'s
    architectures, as llama.cpp's hparams compute them for layer 0; None where a sliding window or
    compressed attention gives layers sizes of their own (not checked here)."""
    if arch not in _HEAD_IS_ROPE:
        return None
    if any(k.startswith(arch + ".") and ("sliding_window" in k or "_swa" in k or k.endswith("_mla")) for k in kv):
        return None
    head = _default_head(kv, arch)
    if head is None:
        return None
    head_k = _whole(kv.get(f"{arch}.attention.key_length", head))
    head_v = _whole(kv.get(f"{arch}.attention.value_length", head))
    n_rot = _whole(kv.get(f"{arch}.rope.dimension_count", head_k))
    if None in (head_k, head_v, n_rot):
        return None
    if head_v != n_rot:
        return (f"{arch}.rope.dimension_count is {n_rot} but its attention heads are {head_v} wide; "
                f"llama.cpp's {arch} graph needs the two equal")
    if head_v != head_k and arch not in _HEAD_KEY_NOT_ASSERTED:
        return (f"{arch}.attention.key_length is {head_k} but its heads' values are {head_v} wide; "
                f"llama.cpp's {arch} graph needs the two equal")
    return None


def header_problem(header: GGUFHeader) -> str | None:
    """Why llama.cpp would abort on this header, its hyperparameters' or its vocabulary's, or None:
    the one check the loader (``backend.check_llama_aborts``) and ``adaspark models`` make."""
    return hparams_problem(header.kv) or vocab_problem(header)


def hparams_problem(kv: dict[str, Any]) -> str | None:
    """Why llama.cpp's ``load_hparams`` would abort on this header (a GGML_ASSERT: the process
    ends with a backtrace, no error comes back), or None: the layer count (``layer_count_problem``),
    the next-token-prediction layers past it, the experts and their groups out of step, or a rope
    scaling type it does not know; and, asserted at the first forward, a norm's epsilon below 0
    or NaN, a sliding-window pattern with no sliding layer, a rope dimension count that is 0, odd
    or wider than the head, a head size that is not the rope dimension count
    (``_head_problem``), and per-layer head counts that differ (``_layer_heads_problem``). Each
    rule is the assertion's, in its order; a value of the wrong type is left to llama.cpp, which
    refuses it with an error."""
    problem = layer_count_problem(kv)
    arch = kv.get("general.architecture")
    layers = _whole(kv.get(f"{arch}.block_count")) if isinstance(arch, str) else None
    if problem or layers is None:
        return problem
    nextn = _whole(kv.get(f"{arch}.nextn_predict_layers", 0))
    if nextn is not None and nextn > layers:
        return f"{arch}.nextn_predict_layers is {nextn}, more than its {layers} layers"
    experts = _whole(kv.get(f"{arch}.expert_count", 0))
    used = kv.get(f"{arch}.expert_used_count", 0)
    used_max = max((_whole(u) or 0 for u in used), default=0) if isinstance(used, list) else _whole(used)
    groups = _whole(kv.get(f"{arch}.expert_group_count", 0))
    group_used = _whole(kv.get(f"{arch}.expert_group_used_count", 0))
    if arch in _EXPERTS_DROPPED_BELOW_2 and experts is not None and experts <= 1:
        experts, used_max = 0, 0
    if None not in (experts, used_max, groups, group_used):
        e = f"{arch}.expert_count is {experts}"
        if experts > LLAMA_MAX_EXPERTS:
            return f"{e}; llama.cpp takes at most {LLAMA_MAX_EXPERTS}"
        if used_max > experts:
            return f"{arch}.expert_used_count is {used_max}, more than the {experts} experts"
        if experts > 0 and used_max == 0:
            return f"{e} but {arch}.expert_used_count is 0"
        if experts > 0 and groups >= experts:
            return f"{arch}.expert_group_count is {groups}, not fewer than the {experts} experts"
        if experts > 0 and groups > 1 and (experts % groups or not 0 < group_used < groups):
            return (f"{e} in {groups} groups, {group_used} used; llama.cpp needs groups that divide the "
                    "experts and at least one group unused")
        if experts == 0 and groups:
            return f"{arch}.expert_group_count is {groups} with no experts"
    rope = kv.get(f"{arch}.rope.scaling.type")
    if isinstance(rope, str) and rope not in ROPE_SCALING_TYPES:
        return f"{arch}.rope.scaling.type is {rope[:40]!r}; llama.cpp knows {', '.join(ROPE_SCALING_TYPES)}"
    return (_norm_problem(kv, arch) or _swa_problem(kv, arch, layers) or _rope_dims_problem(kv, arch)
            or _head_problem(kv, arch) or _layer_heads_problem(kv, arch, layers))


#: The norms' epsilon keys: ggml's norm, RMS norm and group norm assert an epsilon of 0 or more
#: (ggml-cpu/ops.cpp), so a negative or NaN one ended the process at the first forward.
_EPSILON_KEYS = ("attention.layer_norm_epsilon", "attention.layer_norm_rms_epsilon",
                 "attention.group_norm_epsilon")


def _norm_problem(kv: dict[str, Any], arch: str) -> str | None:
    for key in _EPSILON_KEYS:
        eps = kv.get(f"{arch}.{key}")
        if isinstance(eps, float) and not eps >= 0.0:
            return f"{arch}.{key} is {eps}; llama.cpp's norms need an epsilon of 0 or more"
    return None


#: Architectures that turn sliding-window attention on and then take its layers from
#: `attention.sliding_window_pattern` (read off their load_arch_hparams), by when they turn it on:
#: always, or where the header's `attention.sliding_window` is above 0. With the window on and not
#: one layer sliding, llama.cpp asserts when it makes the cache (`hparams.is_swa_any()`).
_SWA_ALWAYS = frozenset(("cohere2", "cohere2moe", "dots3note", "exaone-moe", "gemma-embedding", "gemma2",
                         "gemma3n", "gemma4", "gemma4-assistant", "gpt-oss", "granite_swa", "maple", "mimo2",
                         "muse-glimmer", "spark2_5", "step35"))
_SWA_IF_WINDOW = frozenset(("afmoe", "dflash", "gemma3", "laguna", "mellum", "modern-bert", "olmo2", "plamo3",
                            "smallthinker"))
#: those that read a whole-number pattern (every n-th layer dense), and of them the ones whose
#: dense layer comes first in each n (``set_swa_pattern``'s ``dense_first``); the rest take an array
_SWA_EVERY_N = frozenset(("afmoe", "cohere2", "cohere2moe", "exaone-moe", "exaone4", "gemma-embedding", "gemma2",
                          "gemma3", "gemma3n", "gpt-oss", "laguna", "llama4", "mellum", "modern-bert",
                          "muse-glimmer", "olmo2", "plamo3", "smallthinker"))
_SWA_DENSE_FIRST = frozenset(("cohere2moe", "laguna", "modern-bert", "smallthinker"))


def _swa_on(kv: dict[str, Any], arch: str) -> bool:
    """Whether llama.cpp's loader turns the sliding window on for this header (llama4's and
    exaone4's rules too), for the architectures whose layers the pattern picks."""
    window = kv.get(f"{arch}.attention.sliding_window")
    if arch in _SWA_ALWAYS:
        return True
    if arch in _SWA_IF_WINDOW:
        return _whole(window) is not None and window > 0
    if arch == "llama4":
        return window is None or window != 0
    if arch == "exaone4":
        return kv.get(f"{arch}.block_count") == 64
    return False


def _swa_problem(kv: dict[str, Any], arch: str, layers: int) -> str | None:
    """A sliding-window pattern that leaves no layer sliding where the window is on."""
    pattern = kv.get(f"{arch}.attention.sliding_window_pattern")
    if pattern is None or not _swa_on(kv, arch):
        return None
    key = f"{arch}.attention.sliding_window_pattern"
    if isinstance(pattern, list):
        numbers = all(isinstance(v, (int, float)) for v in pattern)  # bools too; other types: an error
        if pattern and numbers and not any(pattern[:layers]):
            return f"{key} makes none of its {layers} layers sliding-window; llama.cpp needs one at least"
        return None
    n = _whole(pattern)
    if n is None or arch not in _SWA_EVERY_N:
        return None
    if arch in _SWA_DENSE_FIRST:
        sliding = n == 0 or (n >= 2 and layers >= 2)  # layer il slides where il % n != 0
    else:
        sliding = n != 1  # layer il slides where il % n < n - 1
    if not sliding:
        return f"{key} is {n}: none of its {layers} layers sliding-window; llama.cpp needs one at least"
    return None


#: Architectures whose graph has no rope (llama_model_rope_type's LLAMA_ROPE_TYPE_NONE).
_NO_ROPE = frozenset(("arwkv7", "bloom", "clip", "glm5-next", "gpt2", "gptj", "jais", "jamba", "jina-bert-v2",
                      "kimi-k3", "kimi-linear", "mamba", "mamba2", "mpt", "nemotron_h", "nemotron_h_moe", "refact",
                      "rwkv6", "rwkv6qwen2", "rwkv7", "t5", "t5encoder", "wavtokenizer-dec"))


def _rope_dims_problem(kv: dict[str, Any], arch: str) -> str | None:
    """A rope dimension count the rope op cannot take: ggml asserts it even and at most the head
    (the key size), and with 0 its CPU loop never ends (the first forward hangs). Checked only where
    the header gives the count; the head bound is left out where attention is compressed (MLA)."""
    if arch in _NO_ROPE:
        return None
    head_k = _whole(kv.get(f"{arch}.attention.key_length", _default_head(kv, arch)))
    mla = any((k.startswith(arch + ".") and k.endswith("_mla")) or k == f"{arch}.attention.kv_lora_rank" for k in kv)
    n_rot = _whole(kv.get(f"{arch}.rope.dimension_count"))
    head_swa = _whole(kv.get(f"{arch}.attention.key_length_swa", head_k))
    n_rot_swa = _whole(kv.get(f"{arch}.rope.dimension_count_swa", n_rot))
    for key, rot, head in (("rope.dimension_count", n_rot, head_k), ("rope.dimension_count_swa", n_rot_swa, head_swa)):
        if rot is None:
            continue
        if rot == 0 or rot % 2:
            return f"{arch}.{key} is {rot}; llama.cpp's rope needs an even count above 0"
        if head and rot > head and not mla:
            return f"{arch}.{key} is {rot}, more than its {head}-wide heads; llama.cpp's rope takes at most the head"
    return None


#: Architectures whose head counts may differ by layer: their tensors are sized layer by layer
#: (their load_arch_tensors reads each layer's count, so a count that does not fit is llama.cpp's
#: error), a key-value head count of 0 marks a recurrent layer (hybrid and recurrent models), or
#: they keep no key-value cache (llm_arch_is_recurrent, llm_arch_is_hybrid, create_memory's
#: no-cache list, and the models that set is_recr_impl), and t5, whose cross-attention is not read here.
_HEADS_MAY_VARY = frozenset((
    "arwkv7", "bailingmoe3", "bert", "deci", "deepseek4", "dots3note", "dream", "eurobert", "falcon-h1",
    "gemma-embedding", "gemma4", "gemma4-assistant", "glm5-next", "granitehybrid", "jamba", "jina-bert-v2",
    "jina-bert-v3", "kimi-k3", "kimi-linear", "laguna", "lfm2", "lfm2moe", "llada", "llada-moe", "mamba", "mamba2",
    "mimo2", "minimax-01", "modern-bert", "nanbeige", "nemotron_h", "nemotron_h_moe", "neo-bert", "nomic-bert",
    "nomic-bert-moe", "openelm", "plamo2", "plamo3", "qwen35", "qwen35moe", "qwen3next", "qwen4exp", "rnd1", "rwkv6",
    "rwkv6qwen2", "rwkv7", "spark2_5", "step35", "t5", "t5encoder", "wavtokenizer-dec"))
#: Of the others, those whose graph reads each layer's query head count (granite's builders).
_GRAPH_QUERY_HEADS_PER_LAYER = frozenset(("granite", "granite_swa", "graniteswitch"))


def _layer_heads_problem(kv: dict[str, Any], arch: str, layers: int) -> str | None:
    """A per-layer head-count array whose layers differ, where llama.cpp sizes the weights by
    layer 0's count: the key-value cache takes each layer's own key-value count (so a layer that
    differs fails an assertion storing its keys at the first forward), and granite's graph each
    layer's query count. The key-value count defaults to the query heads' array where the header
    has none. An array not one per layer, or not of whole numbers, is llama.cpp's own error."""
    if arch in _HEADS_MAY_VARY:
        return None
    heads_key, kv_key = f"{arch}.attention.head_count", f"{arch}.attention.head_count_kv"
    checks = [(kv_key, kv[kv_key]) if kv_key in kv else (heads_key, kv.get(heads_key))]
    if arch in _GRAPH_QUERY_HEADS_PER_LAYER:
        checks.append((heads_key, kv.get(heads_key)))
    for key, counts in checks:
        if not (isinstance(counts, list) and len(counts) == layers and all(_whole(c) is not None for c in counts)):
            continue
        for il, count in enumerate(counts):
            if count != counts[0]:
                return (f"{key} says layer {il} has {count} heads and layer 0 {counts[0]}; llama.cpp sizes "
                        f"every layer of {arch} by layer 0's count")
    return None


def layer_count_problem(kv: dict[str, Any]) -> str | None:
    """Why llama.cpp would abort on this header's `{arch}.block_count` (0, or past 512: the
    process ended with GGML_ASSERT instead of a message), or None."""
    arch = kv.get("general.architecture")
    layers = kv.get(f"{arch}.block_count") if isinstance(arch, str) else None
    if layers is None:
        return None
    if isinstance(layers, bool) or not isinstance(layers, int) or not 1 <= layers <= LLAMA_MAX_LAYERS:
        return f"{arch}.block_count is {layers!r}; llama.cpp takes 1 to {LLAMA_MAX_LAYERS} layers"
    return None
