"""A conversation's own settings: system prompt, model, max tokens and sampling.

Plain data (no Textual): the CLI builds the defaults, the store keeps one per conversation
(`Store.create_conversation(settings=...)`, the `settings` column, JSON), the chat screen sends
them with every reply and the settings dialog edits them. Every value goes through the checks
the CLI applies (`engine.limits.check_max_tokens`, `engine.sampling.SamplingSettings`), so the
dialog, the options and a stored conversation accept exactly the same values.

Layers, later ones winning: llama.cpp's sampling defaults, the GGUF's recommended sampling
(`sampling.chat_defaults`), the config file's chat section (`config` in `default_settings`: the
hook for `adaspark_app/config.py`), the command-line options; a conversation then keeps its own
copy, which the dialog edits.
"""

from __future__ import annotations

import secrets
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Mapping

from ..engine import limits
from ..engine.sampling import GREEDY, SamplingSettings
from ..errors import AdaSparkError, ArgumentError

DEFAULT_MAX_TOKENS = 512  # per reply; the engine stops earlier at the end-of-generation token
SAMPLING_FIELDS = ("temperature", "top_k", "top_p", "min_p", "repeat_penalty", "repeat_last_n", "seed")
SETTINGS_VERSION = 1  # of the stored JSON; a newer one is read field by field all the same


@dataclass(frozen=True)
class ChatSettings:
    """What applies to a conversation's replies.

    system: the system prompt (None or blank: none; the model's template may then add its own).
    model: the model's label as shown; model_path: the GGUF it was started with (None: the
    bundled model). seed None in `sampling`: each reply draws a fresh random seed (recorded).
    """

    system: str | None = None
    max_tokens: int = DEFAULT_MAX_TOKENS
    sampling: SamplingSettings = field(default_factory=lambda: GREEDY)
    model: str | None = None
    model_path: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "max_tokens", limits.check_max_tokens(self.max_tokens))
        system = self.system if isinstance(self.system, str) and self.system.strip() else None
        object.__setattr__(self, "system", system)
        if not isinstance(self.sampling, SamplingSettings):
            raise ArgumentError("sampling must be a SamplingSettings")

    # ------------------------------------------------------------------ for the engine
    def messages(self, turns: list[dict[str, str]]) -> list[dict[str, str]]:
        """What the engine is sent: the system prompt first (if any), then the turns."""
        head = [{"role": "system", "content": self.system}] if self.system else []
        return [*head, *turns]

    def reply_sampling(self) -> SamplingSettings:
        """The settings one reply is drawn with (the seed stays unset if it is: the engine then
        draws a random one and reports it)."""
        return self.sampling

    def regenerate_sampling(self, previous_seed: int | None) -> SamplingSettings:
        """The settings for a regenerated reply: always a seed other than the previous reply's.

        A conversation with a fixed seed S regenerates with the previous reply's seed + 1 (S+1,
        then S+2, ...: reproducible); one without draws a fresh random seed. Greedy settings are
        returned unchanged (temperature 0 has no seed: the same reply comes back)."""
        s = self.sampling
        if s.greedy:
            return s
        if s.seed is not None:
            base = previous_seed if previous_seed is not None else s.seed
            return replace(s, seed=int(base) + 1)
        seed = secrets.randbits(63)
        while seed == previous_seed:
            seed = secrets.randbits(63)
        return replace(s, seed=seed)

    # ------------------------------------------------------------------ storage
    def to_json(self) -> dict[str, Any]:
        """The stored form (the `settings` column); the system prompt has its own column."""
        return {"version": SETTINGS_VERSION, "max_tokens": self.max_tokens, "sampling": asdict(self.sampling),
                "model_path": self.model_path}

    @classmethod
    def from_stored(cls, row: Mapping[str, Any] | None, defaults: "ChatSettings") -> tuple["ChatSettings", list[str]]:
        """A stored conversation's settings (`Store.get_conversation`'s row), and what was wrong.

        A store may be imported, old or hand-edited: a missing value takes `defaults`' one, and a
        value that does not pass the CLI's checks is dropped for the default with a sentence in
        the returned problems (the chat screen shows them), never an exception."""
        problems: list[str] = []
        if not row:
            return defaults, problems
        if row.get("settings_error"):
            problems.append(str(row["settings_error"]))
        stored = row.get("settings") if isinstance(row.get("settings"), Mapping) else {}
        # The system prompt is the conversation's own, also when it has none: a default given
        # later (--system, the config) applies to new conversations only.
        system = row.get("system") if isinstance(row.get("system"), str) else None
        max_tokens = defaults.max_tokens
        if "max_tokens" in stored:
            try:
                max_tokens = limits.check_max_tokens(stored["max_tokens"])
            except AdaSparkError as err:
                problems.append(f"max tokens: {err}")
        values = dict(asdict(defaults.sampling))
        raw = stored.get("sampling")
        if isinstance(raw, Mapping):
            for name in SAMPLING_FIELDS:
                if name not in raw:
                    continue
                trial = {**values, name: raw[name]}
                try:
                    SamplingSettings(**trial)
                except AdaSparkError as err:
                    problems.append(str(err))
                    continue
                values = trial
        elif raw is not None:
            problems.append("its stored sampling settings are not an object")
        model_path = stored.get("model_path") if isinstance(stored.get("model_path"), str) else None
        model = row.get("model") if isinstance(row.get("model"), str) else defaults.model
        if not stored:
            model_path = defaults.model_path
        return cls(system=system, max_tokens=max_tokens, sampling=SamplingSettings(**values),
                   model=model, model_path=model_path), problems

    # ------------------------------------------------------------------ the dialog
    def form_values(self) -> dict[str, str]:
        """The settings as the dialog's text fields show them."""
        s = self.sampling
        return {"system": self.system or "", "max_tokens": str(self.max_tokens),
                "temperature": f"{s.temperature:g}", "top_k": str(s.top_k), "top_p": f"{s.top_p:g}",
                "min_p": f"{s.min_p:g}", "repeat_penalty": f"{s.repeat_penalty:g}",
                "repeat_last_n": str(s.repeat_last_n), "seed": "" if s.seed is None else str(s.seed)}

    def with_form(self, values: Mapping[str, str]) -> "ChatSettings":
        """These settings with the dialog's fields applied; ArgumentError (the CLI's message for
        the same value) on the first invalid one. A blank seed means "random per reply"."""
        sampling: dict[str, Any] = {}
        for name in SAMPLING_FIELDS:
            text = str(values.get(name, "")).strip()
            if name == "seed" and not text:
                sampling[name] = None
                continue
            sampling[name] = text
        max_tokens = limits.check_max_tokens(str(values.get("max_tokens", "")).strip())
        system = values.get("system")
        return replace(self, system=system if system is not None else self.system, max_tokens=max_tokens,
                       sampling=SamplingSettings(**sampling))

    # ------------------------------------------------------------------ the header
    def label(self) -> str:
        """A compact line for the header: 'T 0.8 · top-p 0.95 · max 512 tok · system prompt'."""
        s = self.sampling
        parts = ["greedy"] if s.greedy else [f"T {s.temperature:g}", f"top-p {s.top_p:g}"]
        if not s.greedy and s.seed is not None:
            parts.append(f"seed {s.seed}")
        parts.append(f"max {self.max_tokens} tok")
        parts.append("system prompt" if self.system else "no system prompt")
        return " · ".join(parts)


def default_settings(model_path: str | None = None, *, model: str | None = None, system: str | None = None,
                     max_tokens: Any = None, sampling: Mapping[str, Any] | None = None,
                     config: Mapping[str, Any] | None = None, gguf_defaults: bool = True) -> ChatSettings:
    """`adaspark chat`'s settings for a new conversation.

    Layers, later ones winning: llama.cpp's sampling defaults, the GGUF's recommended ones
    (`gguf_defaults`), `config` (the config file's chat section: keys system, max_tokens and
    the sampling field names, e.g. {"temperature": 0.7}), then the options (`system`,
    `max_tokens`, `sampling`: option values, None = not given). ArgumentError, the CLI's one
    line, on a bad value."""
    from ..engine.sampling import chat_defaults

    layers: dict[str, Any] = chat_defaults(model_path) if gguf_defaults else {}
    conf = dict(config or {})
    for name in SAMPLING_FIELDS:
        if conf.get(name) is not None:
            layers[name] = conf[name]
    for name, value in (sampling or {}).items():
        if value is not None:
            layers[name] = value
    chosen_system = system if system is not None else conf.get("system")
    chosen_max = max_tokens if max_tokens is not None else conf.get("max_tokens", DEFAULT_MAX_TOKENS)
    if chosen_system is not None and not isinstance(chosen_system, str):
        raise ArgumentError(f"system must be text, got {chosen_system!r}")
    return ChatSettings(system=chosen_system, max_tokens=limits.check_max_tokens(chosen_max),
                        sampling=SamplingSettings(**layers), model=model, model_path=model_path)


def overridden(settings: ChatSettings, *, system: str | None = None, max_tokens: Any = None,
               sampling: Mapping[str, Any] | None = None) -> ChatSettings:
    """`settings` with the options the user gave (None = not given): `chat --continue` keeps the
    conversation's stored settings except what the command line says."""
    values = {k: v for k, v in (sampling or {}).items() if v is not None}
    out = settings
    if values:
        out = replace(out, sampling=SamplingSettings(**{**asdict(out.sampling), **values}))
    if system is not None:
        out = replace(out, system=system)
    if max_tokens is not None:
        out = replace(out, max_tokens=limits.check_max_tokens(max_tokens))
    return out


def resume_last(store: Any, *, model: str | None = None, system: str | None = None, max_tokens: Any = None,
                sampling: Mapping[str, Any] | None = None) -> tuple[str, ChatSettings, list[str]]:
    """`chat --continue`: the store's most recently updated conversation, its settings with the
    options the user gave on top (saved back to it when there are any), and the problems met in
    its stored settings. ArgumentError when the store has no conversation, or when the model the
    conversation was held with is gone and no --model was given."""
    import os

    row = store.last_conversation()
    if row is None:
        raise ArgumentError(f"--continue: no conversation in {store.path} yet (start one with `adaspark chat`)")
    from ..engine.sampling import chat_defaults

    stored = row.get("settings") if isinstance(row.get("settings"), Mapping) else {}
    stored_path = stored.get("model_path") if isinstance(stored.get("model_path"), str) else None
    model_path = model or stored_path
    if model is None and stored_path is not None and not os.path.isfile(stored_path):
        raise ArgumentError(f"--continue: the last conversation was held with {stored_path}, which is not "
                            "there any more; pass --model to continue it with another model")
    base = ChatSettings(sampling=SamplingSettings(**chat_defaults(model_path)), model_path=model_path)
    settings, problems = ChatSettings.from_stored(row, base)
    settings = overridden(settings, system=system, max_tokens=max_tokens, sampling=sampling)
    if model is not None:
        settings = replace(settings, model_path=model)
    given = (system is not None or max_tokens is not None or model is not None
             or any(v is not None for v in (sampling or {}).values()))
    if given:
        store.set_conversation_settings(row["id"], settings.system, settings.to_json())
    return row["id"], settings, problems
