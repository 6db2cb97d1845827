"""The trained DSpark drafter shipped for the bundled SmolLM2-135M-Instruct (`--drafter default`).

Trained by `tools/train_drafter` (self-distillation on public ShareGPT prompts); the ids of every
conversation it trained on sit beside it in `drafter-training-ids.txt.gz`, so evaluations can leave
them out.
"""

from __future__ import annotations

import importlib.resources

from ..errors import DrafterError

DEFAULT_DRAFTER_FILE = "drafter-smollm2-135m.gguf"


def default_drafter_path() -> str:
    """Path of the shipped drafter; DrafterError if this install lacks it."""
    path = importlib.resources.files("adaspark_app") / "data" / DEFAULT_DRAFTER_FILE
    if not path.is_file():
        raise DrafterError(f"the default drafter {DEFAULT_DRAFTER_FILE} is missing from this install; "
                           "pass a DSpark GGUF with --drafter")
    return str(path)
