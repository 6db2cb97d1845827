"""Chat prompts: the GGUF's own chat template (Jinja, sandboxed), or for a base model without one,
the turn format of its family from llama.cpp's built-in templates, or plain completion.

A base model (a GGUF with no `tokenizer.chat_template`, such as Gemma-3-270M) used to be prompted
in ChatML. Its vocabulary has no `<|im_start|>` token, so the markers became plain text it had
never seen in that role, and the reply to "What is the capital of France?" was
`assistant\\n<assistant\\n<assistant...`. Now the family's format is chosen by
`general.architecture` (`FAMILY_FORMATS`), and kept only if the format's turn markers are single
tokens of the model's vocabulary (`FORMAT_MARKERS`): a model trained on that format has them.
The format is rendered by llama.cpp itself (`llama_chat_apply_template` with the built-in name),
so the text is llama.cpp's own. Where no format fits, the prompt is the text of the turns (plain
completion) and the engine says so.

Nothing here imports llama_cpp at load: `turn_format_for` is pure (the model list uses it), and
`BuiltinTemplate` imports llama_cpp only when it renders (in the engine process).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from ..errors import ModelLoadError
from . import harmony
from .template_sandbox import compile_template, render_bounded, why

# Kept for callers that build a ChatTemplate without a source; the engine no longer falls back
# to it by itself (see chat_template_for).
CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

PLAIN = "plain"  # the turn format name for plain completion

#: general.architecture -> llama.cpp built-in template names to try, best first. The first whose
#: markers are all single tokens of the vocabulary is used (llama: Llama 3 has <|eot_id|>, SmolLM
#: and other llama-architecture models trained on ChatML have <|im_start|>, Llama 2 and Mistral
#: have neither and take [INST]). An architecture not listed gets plain completion.
FAMILY_FORMATS: dict[str, tuple[str, ...]] = {
    "gemma": ("gemma",), "gemma2": ("gemma",), "gemma3": ("gemma",), "gemma3n": ("gemma",),
    "llama": ("llama3", "chatml", "llama2"),
    "llama4": ("llama4",),
    "qwen": ("chatml",), "qwen2": ("chatml",), "qwen2moe": ("chatml",), "qwen2vl": ("chatml",),
    "qwen3": ("chatml",), "qwen3moe": ("chatml",), "qwen3next": ("chatml",),
    "qwen3vl": ("chatml",), "qwen3vlmoe": ("chatml",),
    "smollm3": ("chatml",), "internlm2": ("chatml",), "lfm2": ("chatml",), "lfm2moe": ("chatml",),
    "phi3": ("phi3",), "phimoe": ("phi3",),
    "mistral3": ("mistral-v7",),
    "command-r": ("command-r",), "cohere2": ("command-r",),
    "deepseek": ("deepseek",), "deepseek2": ("deepseek3", "deepseek2"),
    "chatglm": ("chatglm3",), "glm4": ("chatglm4",),
    "minicpm": ("minicpm",), "minicpm3": ("minicpm",),
    "exaone": ("exaone3",), "exaone4": ("exaone4",),
    "granite": ("granite",), "granitemoe": ("granite",), "granitehybrid": ("granite-4.0",),
    "orion": ("orion",),
    "rwkv6": ("rwkv-world",), "rwkv7": ("rwkv-world",),
    "bailingmoe": ("bailing",), "bailingmoe2": ("bailing2",),
    "hunyuan-moe": ("hunyuan-moe",), "hunyuan-dense": ("hunyuan-dense",),
    "gpt-oss": ("gpt-oss",), "seed_oss": ("seed_oss",), "grok": ("grok-2",),
    "pangu-embedded": ("pangu-embedded",),
}

#: Built-in template -> the turn markers that must be single tokens of the vocabulary for the
#: format to be used. Formats whose markers are ordinary text ([INST], "User:") need none.
FORMAT_MARKERS: dict[str, tuple[str, ...]] = {
    "gemma": ("<start_of_turn>", "<end_of_turn>"),
    "llama3": ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
    "llama4": ("<|header_start|>", "<|header_end|>", "<|eot|>"),
    "chatml": ("<|im_start|>", "<|im_end|>"),
    "phi3": ("<|user|>", "<|assistant|>", "<|end|>"),
    "mistral-v7": ("[SYSTEM_PROMPT]", "[INST]", "[/INST]"),
    "command-r": ("<|START_OF_TURN_TOKEN|>", "<|END_OF_TURN_TOKEN|>"),
    "deepseek3": ("<｜User｜>", "<｜Assistant｜>"),
    "chatglm4": ("<|user|>", "<|assistant|>"),
    "exaone3": ("[|user|]", "[|assistant|]", "[|endofturn|]"),
    "exaone4": ("[|user|]", "[|assistant|]", "[|endofturn|]"),
    "granite": ("<|start_of_role|>", "<|end_of_role|>", "<|end_of_text|>"),
    "granite-4.0": ("<|start_of_role|>", "<|end_of_role|>", "<|end_of_text|>"),
    "gpt-oss": ("<|start|>", "<|message|>", "<|end|>"),
    "seed_oss": ("<seed:bos>", "<seed:eos>"),
}


@dataclass(frozen=True)
class TurnFormat:
    """How a model's prompts are made: `source` is "gguf" (its own template), "builtin" (llama.cpp's
    template `name`, a base model) or "plain" (the turns' text, a base model no format fits)."""

    source: str
    name: str | None = None

    @property
    def base_model(self) -> bool:
        """The GGUF carries no chat template."""
        return self.source != "gguf"

    def label(self) -> str:
        """A short description for the model list and notices."""
        if self.source == "gguf":
            return "chat template"
        if self.source == "builtin":
            return f"base model, {self.name} turns"
        return "base model, plain completion"


def turn_format_for(chat_template: str | None, architecture: str | None,
                    is_single_token: Callable[[str], bool]) -> TurnFormat:
    """The turn format for a GGUF: its own template if it has one, else its family's built-in
    format (FAMILY_FORMATS, kept only when `is_single_token` holds for each FORMAT_MARKERS entry),
    else plain completion. Pure: the caller says which strings are single tokens."""
    if chat_template:
        return TurnFormat("gguf")
    for name in FAMILY_FORMATS.get(str(architecture or ""), ()):
        if all(is_single_token(m) for m in FORMAT_MARKERS.get(name, ())):
            return TurnFormat("builtin", name)
    return TurnFormat(PLAIN)


class ChatTemplate:
    """Renders a conversation to the prompt text the model was trained on (the GGUF's template).

    The template comes from the GGUF, untrusted: it runs in the sandbox of template_sandbox.py,
    and any error it raises, Jinja's or Python's (a division by zero, recursion without end, a
    type error, a render past its time), is a ModelLoadError naming it."""

    turn_format = TurnFormat("gguf")

    def __init__(self, source: str | None, bos_token: str = "", eos_token: str = "") -> None:
        try:
            self._template = compile_template(source or CHATML)
        except Exception as exc:  # a GGUF's text: RecursionError for deep nesting, not only TemplateError
            raise ModelLoadError(f"the model's chat template does not parse: {why(exc)}") from exc
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.harmony = harmony.is_harmony_template(source or "")
        self.folds_system = False  # the template refused a system message: it goes into the first user's

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str:
        """The prompt text (template_sandbox.render_bounded: bounded in size and time).

        A template that refuses a system message (Gemma 2's "System role not supported") gets the
        system prompt at the head of the first user message instead, as Gemma 3's own template
        puts it; a harmony template (gpt-oss) gets each earlier reply's answer without its
        thinking (harmony.py)."""
        if self.harmony:
            messages = harmony.history_messages(messages)
        if self.folds_system:
            return self._render(fold_system(messages), add_generation_prompt)
        try:
            return self._render(messages, add_generation_prompt)
        except ModelLoadError as refused:
            folded = fold_system(messages)
            if folded is messages:
                raise
            try:
                text = self._render(folded, add_generation_prompt)
            except ModelLoadError:
                raise refused from refused.__cause__
            self.folds_system = True
            return text

    def _render(self, messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        try:
            return render_bounded(lambda: self._template.generate(
                messages=messages, add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token, eos_token=self.eos_token))
        except Exception as exc:
            raise ModelLoadError(f"the model's chat template failed to render: {why(exc)}") from exc


def fold_system(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`messages` with a leading system message put at the head of the first user message (its
    text, a blank line, the user's); `messages` itself where there is nothing to fold."""
    if not messages or messages[0].get("role") != "system":
        return messages
    first = next((i for i, m in enumerate(messages) if m.get("role") == "user"), None)
    if first is None:
        return messages
    system = str(messages[0].get("content", ""))
    out = [dict(m) for m in messages[1:]]
    user = out[first - 1]
    user["content"] = f"{system}\n\n{user.get('content', '')}" if system else user.get("content", "")
    return out


def builtin_template_names() -> list[str]:
    """The names of llama.cpp's built-in chat templates (imports llama_cpp)."""
    import llama_cpp

    n = int(llama_cpp.llama_chat_builtin_templates(None, 0))
    if n <= 0:
        return []
    names = (ctypes.c_char_p * n)()
    llama_cpp.llama_chat_builtin_templates(names, n)
    return [s.decode("utf-8") for s in names if s]


def apply_builtin(name: str, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True) -> str:
    """llama.cpp's own rendering of `messages` in its built-in template `name` (imports llama_cpp).

    ModelLoadError if llama.cpp does not know the template."""
    import llama_cpp

    chat = (llama_cpp.llama_chat_message * max(1, len(messages)))()
    keep = []  # the encoded strings must outlive the call: the structs hold bare pointers
    total = 0
    for i, m in enumerate(messages):
        role, content = str(m["role"]).encode("utf-8"), str(m["content"]).encode("utf-8")
        keep += [role, content]
        chat[i].role, chat[i].content = role, content
        total += len(role) + len(content)
    size = 2 * total + 1024
    while True:
        buf = ctypes.create_string_buffer(size)
        n = llama_cpp.llama_chat_apply_template(name.encode("utf-8"), chat, len(messages),
                                                add_generation_prompt, buf, size)
        if n < 0:
            raise ModelLoadError(f"llama.cpp has no built-in chat template {name!r}")
        if n <= size:
            return buf.raw[:n].decode("utf-8", errors="replace")
        size = n + 1


class BuiltinTemplate:
    """A base model's prompts in one of llama.cpp's built-in turn formats (rendered by llama.cpp).

    llama.cpp's built-in templates leave the BOS token to the tokenizer; the engine tokenises
    prompts without adding special tokens, so `bos_text` (the BOS piece, when the vocabulary asks
    for a BOS) is put in front here, as a template's `{{ bos_token }}` would."""

    def __init__(self, name: str, bos_text: str = "") -> None:
        self.turn_format = TurnFormat("builtin", name)
        self.name = name
        self.bos_text = bos_text

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str:
        return self.bos_text + apply_builtin(self.name, messages, add_generation_prompt)


class PlainTemplate:
    """Plain completion for a base model no turn format fits: the turns' text, one paragraph each
    (BOS first when the vocabulary asks for one), so the model continues the text."""

    turn_format = TurnFormat(PLAIN)

    def __init__(self, bos_text: str = "") -> None:
        self.bos_text = bos_text

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str:
        text = "\n\n".join(str(m["content"]).strip() for m in messages if str(m["content"]).strip())
        return self.bos_text + text + ("\n\n" if add_generation_prompt and text else "")


def chat_template_for(backend: Any) -> ChatTemplate | BuiltinTemplate | PlainTemplate:
    """The template the engine prompts `backend`'s model with (engine process: calls llama.cpp).

    The GGUF's own template when it has one; else the family format (turn_format_for), checked
    against the vocabulary by tokenising each marker."""
    b = backend
    source = b.meta("tokenizer.chat_template")
    bos_piece = b.token_bytes(b.bos_token(), special=True).decode("utf-8", "replace") if b.bos_token() >= 0 else ""
    if source:
        bos = b.detokenize([b.bos_token()]) if b.bos_token() >= 0 else ""
        eos = b.token_bytes(b.eos_token(), special=True).decode("utf-8", "replace") if b.eos_token() >= 0 else ""
        return ChatTemplate(source, bos_token=bos, eos_token=eos)

    def single(marker: str) -> bool:
        return len(b.tokenize(marker, add_special=False, parse_special=True)) == 1

    fmt = turn_format_for(None, b.meta("general.architecture"), single)
    bos_text = bos_piece if _adds_bos(b) else ""
    if fmt.source == "builtin" and fmt.name in builtin_template_names():
        return BuiltinTemplate(fmt.name, bos_text)
    return PlainTemplate(bos_text)


def _adds_bos(backend: Any) -> bool:
    """Whether the vocabulary asks for a BOS token in front of a prompt (llama.cpp's rule)."""
    vocab = getattr(backend, "vocab", None)
    if vocab is None:  # a stand-in backend without a llama.cpp vocabulary: the metadata says
        return str(backend.meta("tokenizer.ggml.add_bos_token")).lower() == "true"
    import llama_cpp

    return bool(llama_cpp.llama_vocab_get_add_bos(vocab))


def turn_format_notice(fmt: TurnFormat, architecture: str | None) -> str | None:
    """The one-line notice the engine gives for a base model (None for a chat model)."""
    if fmt.source == "builtin":
        return (f"this GGUF has no chat template (a base model): prompting it in llama.cpp's "
                f"built-in '{fmt.name}' turn format, chosen by its architecture ({architecture})")
    if fmt.source == PLAIN:
        return (f"this GGUF has no chat template (a base model) and no known turn format fits its "
                f"architecture ({architecture or 'unknown'}): plain completion, the prompt is the "
                "text of the turns")
    return None
