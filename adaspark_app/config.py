"""The config file: defaults for `adaspark chat` and `adaspark models`, in TOML.

Where: `$ADASPARK_CONFIG` if set, else `config.toml` in the platformdirs user config directory
(`$XDG_CONFIG_HOME/adaspark`, default `~/.config/adaspark`, on Linux). A missing file means no
defaults. Every key, all optional:

    model = "bartowski/Llama-3.2-1B-Instruct-GGUF/Llama-3.2-1B-Instruct-Q4_K_M.gguf"
                              # a GGUF path, or a name `adaspark models` lists
    system = "You are terse." # system prompt of a new conversation
    max_tokens = 512          # tokens per reply at most
    theme = "nord"            # a Textual theme name
    model_folders = ["~/models"]  # more folders `adaspark models` and the picker search
    gpu_layers = "all"        # layers on the GPU: a number, "all" or 0 (chat, run and bench)
    saved_context_mb = 2048   # disk for conversations' saved contexts (the chat's KV caches
                              # beside its store, so a reopened conversation answers without
                              # reading its history again); 0 keeps none
    read_ahead = true         # the chat reads an open conversation's history while you type
                              # (false: only when a message is sent)

    [sampling]                # as the options --temperature, --top-k, ... (same checks)
    temperature = 0.7
    top_k = 40
    top_p = 0.95
    min_p = 0.05
    repeat_penalty = 1.0
    repeat_last_n = 64
    seed = 42

The options on the command line win over the file. The file is user input: a TOML syntax error,
an unknown key, a value of the wrong type or out of range is a ConfigError naming the file and
the key (the CLI prints one line and exits 2).
"""

from __future__ import annotations

import os
import stat
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ConfigError

CONFIG_ENV = "ADASPARK_CONFIG"
CONFIG_NAME = "config.toml"
APP_NAME = "adaspark"
#: A settings file is a few hundred bytes; a larger one is refused before it is read whole.
CONFIG_MAX_BYTES = 1 << 20

# key -> (python types accepted, what to call it in a message)
_TOP_KEYS: dict[str, tuple[tuple[type, ...], str]] = {
    "model": ((str,), "a string (a GGUF path or a name from `adaspark models`)"),
    "system": ((str,), "a string"),
    "max_tokens": ((int,), "an integer"),
    "theme": ((str,), "a string (a Textual theme name)"),
    "model_folders": ((list,), "a list of folder paths"),
    "gpu_layers": ((int, str), "a number of layers or \"all\""),
    "saved_context_mb": ((int,), "an integer (MiB)"),
    "read_ahead": ((bool,), "true or false"),
    "sampling": ((dict,), "a table"),
}
_SAMPLING_KEYS: dict[str, tuple[tuple[type, ...], str]] = {
    "temperature": ((int, float), "a number"),
    "top_k": ((int,), "an integer"),
    "top_p": ((int, float), "a number"),
    "min_p": ((int, float), "a number"),
    "repeat_penalty": ((int, float), "a number"),
    "repeat_last_n": ((int,), "an integer"),
    "seed": ((int,), "an integer"),
}


@dataclass(frozen=True)
class Config:
    """The config file's values; None (or empty) where the file does not set them."""

    path: Path | None = None  # the file read (None: there was none)
    model: str | None = None
    system: str | None = None
    max_tokens: int | None = None
    theme: str | None = None
    model_folders: tuple[str, ...] = ()
    sampling: dict[str, Any] = field(default_factory=dict)
    gpu_layers: int | None = None  # parsed: a number of layers, offload.ALL_LAYERS for "all"
    saved_context_mb: int | None = None  # None: store.saved_context.DEFAULT_LIMIT_MB
    read_ahead: bool = True  # the chat reads an open conversation's history ahead of its next message

    def chat_defaults(self) -> dict[str, Any]:
        """The chat's defaults, as ui.chat_settings.default_settings takes them as `config`:
        system, max_tokens and the sampling field names (only those the file sets)."""
        out: dict[str, Any] = dict(self.sampling)
        if self.system is not None:
            out["system"] = self.system
        if self.max_tokens is not None:
            out["max_tokens"] = self.max_tokens
        return out

    def folders(self) -> list[Path]:
        """model_folders with ~ and $VARS expanded."""
        return [Path(os.path.expandvars(os.path.expanduser(f))) for f in self.model_folders]


def config_path() -> Path:
    """$ADASPARK_CONFIG, else <user config dir>/adaspark/config.toml."""
    env = os.environ.get(CONFIG_ENV)
    if env:
        return Path(env).expanduser()
    from platformdirs import user_config_dir

    return Path(user_config_dir(APP_NAME, appauthor=False)) / CONFIG_NAME


def load_config(path: str | os.PathLike | None = None) -> Config:
    """Read and check the config file (the default path when None). A missing file is an empty
    Config; anything wrong in it is a ConfigError naming the key."""
    p = Path(path).expanduser() if path is not None else config_path()
    try:
        st = p.stat()
        if not stat.S_ISREG(st.st_mode):  # a FIFO would block the read, a device never end it
            raise ConfigError(f"config file {p}: not a regular file")
        if st.st_size > CONFIG_MAX_BYTES:
            raise ConfigError(f"config file {p}: over {CONFIG_MAX_BYTES} bytes, not a settings file")
        raw = p.read_bytes()
    except FileNotFoundError:
        return Config()
    except OSError as exc:
        raise ConfigError(f"config file {p}: cannot read it ({exc.strerror or exc})") from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"config file {p}: not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {p}: not valid TOML ({exc})") from None
    except RecursionError:
        raise ConfigError(f"config file {p}: nested too deeply, not a settings file") from None
    return _checked(p, data)


def _checked(p: Path, data: dict[str, Any]) -> Config:
    def fail(key: str, what: str) -> ConfigError:
        return ConfigError(f"config file {p}: key '{key}' {what}")

    def typed(key: str, value: Any, spec: tuple[tuple[type, ...], str]) -> Any:
        types, word = spec
        # TOML booleans are Python bools, which are ints: never take one for a number
        if isinstance(value, bool) != (bool in types) or not isinstance(value, types):
            raise fail(key, f"must be {word}, not {_toml_type(value)}")
        return value

    for key in data:
        if key not in _TOP_KEYS:
            raise fail(key, f"is not a setting (known: {', '.join(_TOP_KEYS)})")
    values = {k: typed(k, v, _TOP_KEYS[k]) for k, v in data.items()}

    sampling = values.pop("sampling", {})
    for key, value in sampling.items():
        if key not in _SAMPLING_KEYS:
            raise fail(f"sampling.{key}", f"is not a sampling setting (known: {', '.join(_SAMPLING_KEYS)})")
        typed(f"sampling.{key}", value, _SAMPLING_KEYS[key])
    if sampling:
        from .engine.sampling import SamplingSettings
        from .errors import ArgumentError

        for key, value in sampling.items():  # each alone, so the message names its key
            try:
                SamplingSettings(**{key: value})
            except ArgumentError as err:
                raise fail(f"sampling.{key}", f"is out of range: {_option_text(err)}") from None

    if "saved_context_mb" in values and not 0 <= values["saved_context_mb"] <= 1 << 30:
        raise fail("saved_context_mb", f"must be from 0 to {1 << 30} (MiB), not {values['saved_context_mb']}")
    if "max_tokens" in values and values["max_tokens"] < 1:
        raise fail("max_tokens", f"must be at least 1, not {values['max_tokens']}")
    folders = values.pop("model_folders", [])
    for i, f in enumerate(folders):
        if not isinstance(f, str) or not f.strip():
            raise fail(f"model_folders[{i}]", f"must be a folder path (a non-empty string), not {_toml_type(f)}")
    for key in ("model", "theme"):
        if key in values and not values[key].strip():
            raise fail(key, "is empty")
    if "gpu_layers" in values:
        from .engine.offload import parse_gpu_layers
        from .errors import ArgumentError

        try:  # kept parsed: the engine takes the number of layers (offload.ALL_LAYERS for "all")
            values["gpu_layers"] = parse_gpu_layers(values["gpu_layers"])
        except ArgumentError as err:
            raise fail("gpu_layers", _option_text(err)) from None
    if "theme" in values:
        from textual.theme import BUILTIN_THEMES

        if values["theme"] not in BUILTIN_THEMES:
            raise fail("theme", f"names no theme: {values['theme']!r} (themes: {', '.join(BUILTIN_THEMES)})")
    return Config(path=p, model_folders=tuple(folders), sampling=dict(sampling), **values)


def _toml_type(value: Any) -> str:
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, int):
        return f"an integer ({value})"
    if isinstance(value, float):
        return f"a number ({value})"
    if isinstance(value, str):
        return f"a string ({value!r})"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a table"
    return type(value).__name__


def _option_text(err: Exception) -> str:
    """SamplingSettings' message without its leading option name (the key is named already)."""
    text = str(err)
    return text.split(" ", 1)[1] if text.startswith("--") and " " in text else text


def resolve_model(spec: str, folders: list[Path] | None = None) -> str:
    """A model given by path or by a name `adaspark models` lists, as a path (ModelLoadError if
    neither, or if the named entry is broken)."""
    from .errors import ModelLoadError

    p = Path(os.path.expanduser(spec))
    if p.exists():
        return str(p)
    from .models import discover_models, find_model

    entry = find_model(spec, discover_models(folders or [], learned=False))
    if entry is None:
        raise ModelLoadError(f"model file not found: {spec} (nor is it a name `adaspark models` lists)")
    if entry.broken:
        raise ModelLoadError(f"model {spec} cannot be used: {entry.problem}")
    return entry.path


def resolve_model_arg(spec: str) -> str:
    """`--model` of `run` and `bench` (as `chat` takes it): a path, else a name `adaspark models`
    lists, the config file's model folders searched too. The config file is only read when
    `spec` is not a path (a bad file is then a ConfigError, one line)."""
    if Path(os.path.expanduser(spec)).exists():
        return str(Path(os.path.expanduser(spec)))
    return resolve_model(spec, load_config().folders())
