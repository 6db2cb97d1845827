"""The model architectures llama.cpp knows, and those that are not chat models.

`LLAMA_CPP_ARCHITECTURES` is `LLM_ARCH_NAMES` of llama.cpp as vendored in llama-cpp-python 0.3.36
(`vendor/llama.cpp/src/llama-arch.cpp`), the version this project pins: a GGUF whose
general.architecture is not here cannot load. Kept as data so that `adaspark models` needs no
llama.cpp (the UI process never imports it); tests/test_models_discovery.py compares it with
the vendored source when that is at hand. Whether a known architecture's file really loads
(its tensors, its hyperparameters) is only known at load time.
"""

from __future__ import annotations

LLAMA_CPP_VERSION = "0.3.36"

LLAMA_CPP_ARCHITECTURES: frozenset[str] = frozenset({
    "clip", "llama", "llama4", "deci", "falcon", "grok", "gpt2", "gptj", "gptneox", "mpt",
    "baichuan", "starcoder", "refact", "bert", "modern-bert", "nomic-bert", "nomic-bert-moe",
    "neo-bert", "jina-bert-v2", "jina-bert-v3", "eurobert", "bloom", "stablelm", "qwen", "qwen2",
    "qwen2moe", "qwen2vl", "qwen3", "qwen3moe", "qwen3next", "qwen3vl", "qwen3vlmoe", "qwen35",
    "qwen35moe", "qwen4exp", "phi2", "phi3", "phimoe", "plamo", "plamo2", "plamo3", "codeshell",
    "orion", "internlm2", "minicpm", "minicpm3", "gemma", "gemma2", "gemma3", "gemma3n", "gemma4",
    "gemma4-assistant", "gemma-embedding", "starcoder2", "mamba", "mamba2", "maple", "jamba",
    "falcon-h1", "xverse", "command-r", "cohere2", "cohere2moe", "dbrx", "olmo", "olmo2", "olmoe",
    "muse-glimmer", "openelm", "arctic", "deepseek", "deepseek2", "deepseek2-ocr", "deepseek32",
    "deepseek4", "chatglm", "glm4", "glm4moe", "glm-dsa", "bitnet", "t5", "t5encoder", "jais",
    "jais2", "nemotron", "nemotron_h", "nemotron_h_moe", "exaone", "exaone4", "exaone-moe",
    "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7", "granite", "granitemoe", "granitehybrid",
    "graniteswitch", "granite_swa", "chameleon", "wavtokenizer-dec", "plm", "bailingmoe",
    "bailingmoe2", "bailingmoe3", "dots1", "dots3note", "arcee", "afmoe", "laguna", "ernie4_5",
    "ernie4_5-moe", "hunyuan-moe", "hunyuan-dense", "hunyuan_vl", "hy_v3", "hy_v4", "smollm3",
    "gpt-oss", "lfm2", "lfm2moe", "dream", "smallthinker", "llada", "llada-moe", "seed_oss",
    "grovemoe", "apertus", "minimax-01", "hrm_text", "minimax-m2", "minimax-m3", "cogvlm", "rnd1",
    "pangu-embedded", "mistral3", "eagle3", "dflash", "mistral4", "paddleocr", "mimo2", "step35",
    "spark2_5", "llama-embed", "maincoder", "kimi-linear", "kimi-k3", "glm5-next", "talkie",
    "mellum", "nanbeige", "qwen3tts", "pockettts", "(unknown)",})

#: Architectures llama.cpp loads that are not models to chat with: why each is not offered.
NOT_CHAT_MODELS: dict[str, str] = {
    "clip": "a vision projector (mmproj), not a language model",
    "dflash": "a DSpark drafter, not a chat model (use it with --drafter)",
    "eagle3": "an EAGLE-3 drafter, not a chat model",
    "wavtokenizer-dec": "an audio decoder, not a language model",
    "t5encoder": "an encoder only, it cannot generate",
    "gemma4-assistant": "a drafter head, not a chat model",
    **{arch: "an embedding model, it cannot generate" for arch in (
        "bert", "modern-bert", "nomic-bert", "nomic-bert-moe", "neo-bert", "jina-bert-v2",
        "jina-bert-v3", "eurobert", "gemma-embedding", "llama-embed")},
}


def architecture_problem(arch: str | None) -> str | None:
    """Why a GGUF of this architecture cannot be chatted with here, or None if it can."""
    if not arch:
        return "no general.architecture in its metadata"
    if arch not in LLAMA_CPP_ARCHITECTURES:
        return f"architecture {arch!r} is not supported by llama.cpp {LLAMA_CPP_VERSION}"
    return NOT_CHAT_MODELS.get(arch)
