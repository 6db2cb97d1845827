"""The models a user already has: discovery over the Hugging Face cache, LM Studio, Ollama, the
bundled model and named folders (discovery.py), each entry's header facts (entry.py), and the
`adaspark models` command (command.py). Nothing here imports llama_cpp."""

from .discovery import BUNDLED_NAME, BUNDLED_TITLE, discover_models, find_model
from .entry import ModelEntry, human_size

__all__ = ["BUNDLED_NAME", "BUNDLED_TITLE", "ModelEntry", "discover_models", "find_model", "human_size"]
