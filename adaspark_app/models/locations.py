"""Where other tools keep their GGUF files, resolved as each tool resolves it.

- Hugging Face hub cache (huggingface_hub's constants): `$HF_HUB_CACHE`, else the legacy
  `$HUGGINGFACE_HUB_CACHE`, else `$HF_HOME/hub`, where HF_HOME defaults to
  `$XDG_CACHE_HOME/huggingface` and XDG_CACHE_HOME to `~/.cache`; `~` and `$VARS` are expanded.
- LM Studio: its home is the directory named in `~/.lmstudio-home-pointer` when that exists,
  else `~/.lmstudio`; older releases kept `~/.cache/lm-studio` (a fixed path: LM Studio does not
  read XDG_CACHE_HOME). Models live in `<home>/models`, or in the `downloadsFolder` of
  `<home>/settings.json` when the user moved them.
- Ollama (envconfig): `$OLLAMA_MODELS`, else `~/.ollama/models`; Ollama does not follow XDG. The
  Linux service install runs as the `ollama` user, whose models are in
  `/usr/share/ollama/.ollama/models`; that is looked at too when OLLAMA_MODELS is not set.
- `$ADASPARK_MODELS`: folders separated by os.pathsep, beside those of the config file.

Every function only computes paths; nothing here reads a model.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

from .. import json_input

MODELS_ENV = "ADASPARK_MODELS"
OLLAMA_SERVICE_MODELS = Path("/usr/share/ollama/.ollama/models")


def _expand(value: str) -> Path:
    return Path(os.path.expandvars(os.path.expanduser(value)))


def hf_hub_cache(env: Mapping[str, str] | None = None) -> Path:
    """The Hugging Face hub cache directory, as huggingface_hub computes it."""
    env = os.environ if env is None else env
    if env.get("HF_HUB_CACHE"):
        return _expand(env["HF_HUB_CACHE"])
    if env.get("HUGGINGFACE_HUB_CACHE"):
        return _expand(env["HUGGINGFACE_HUB_CACHE"])
    if env.get("HF_HOME"):
        return _expand(env["HF_HOME"]) / "hub"
    xdg = env.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
    return _expand(xdg) / "huggingface" / "hub"


def lmstudio_model_dirs(home: Path | None = None) -> list[Path]:
    """LM Studio's model folders that may exist, best first, without repeats."""
    home = Path.home() if home is None else home
    homes: list[Path] = []
    pointer = home / ".lmstudio-home-pointer"
    try:
        named = pointer.read_text(encoding="utf-8").strip().splitlines()
        if named and named[0].strip():
            homes.append(_expand(named[0].strip()))
    except (OSError, UnicodeDecodeError):
        pass
    homes += [home / ".lmstudio", home / ".cache" / "lm-studio"]
    dirs: list[Path] = []
    for h in homes:
        moved = _settings_models_dir(h)
        for d in ([moved] if moved else []) + [h / "models"]:
            if d not in dirs:
                dirs.append(d)
    return dirs


def _settings_models_dir(lm_home: Path) -> Path | None:
    """The `downloadsFolder` LM Studio's settings.json names, if it names one."""
    try:
        data = json_input.loads((lm_home / "settings.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError, RecursionError):
        return None
    value = data.get("downloadsFolder") if isinstance(data, dict) else None
    return _expand(value) if isinstance(value, str) and value.strip() else None


def ollama_models_dirs(env: Mapping[str, str] | None = None, home: Path | None = None) -> list[Path]:
    """Ollama's models directories: $OLLAMA_MODELS alone when set, else the user's and the
    Linux service's."""
    env = os.environ if env is None else env
    value = env.get("OLLAMA_MODELS", "").strip().strip("\"'")
    if value:
        return [_expand(value)]
    home = Path.home() if home is None else home
    return [home / ".ollama" / "models", OLLAMA_SERVICE_MODELS]


def env_model_dirs(env: Mapping[str, str] | None = None) -> list[Path]:
    """The folders named in $ADASPARK_MODELS (os.pathsep between them; empty parts ignored)."""
    env = os.environ if env is None else env
    return [_expand(part) for part in env.get(MODELS_ENV, "").split(os.pathsep) if part.strip()]
