"""Chat prompts from the GGUF's own chat template, rendered in Jinja's sandbox (untrusted input)."""

from __future__ import annotations

from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ..errors import ModelLoadError

# Used only when a GGUF carries no template: ChatML, which most small instruct models follow.
CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


class ChatTemplate:
    """Renders a conversation to the prompt text the model was trained on."""

    def __init__(self, source: str | None, bos_token: str = "", eos_token: str = "") -> None:
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise_exception
        try:
            self._template = env.from_string(source or CHATML)
        except TemplateError as exc:
            raise ModelLoadError(f"the model's chat template does not parse: {exc}") from exc
        self.bos_token = bos_token
        self.eos_token = eos_token

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str:
        try:
            return self._template.render(
                messages=messages, add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token, eos_token=self.eos_token)
        except TemplateError as exc:
            raise ModelLoadError(f"the model's chat template failed to render: {exc}") from exc
