"""One error type per failure a user can cause; the CLI turns each into a one-line message, exit 2."""

from __future__ import annotations


class AdaSparkError(Exception):
    """Base of every user-facing error. str(err) is the one-line message shown to the user."""

    exit_code = 2


class ModelLoadError(AdaSparkError):
    """A model or drafter file is missing, unreadable or not a usable GGUF."""


class DrafterError(AdaSparkError):
    """A drafter file is not a DSpark drafter for this target (wrong arch, vocabulary, layers)."""


class ContextOverflowError(AdaSparkError):
    """The conversation no longer fits in the context window."""


class ScriptError(AdaSparkError):
    """A SCRIPT.jsonl line is malformed; the message names the file and line."""


class ArgumentError(AdaSparkError):
    """A command-line option is invalid (unknown arm, sampling options, bad numbers)."""


class StoreError(AdaSparkError):
    """The learned store is not ours, is from a newer schema, or is corrupt. Never modified."""


class OutputError(AdaSparkError):
    """A file or folder a command writes (--out, --log-rounds, --report, --store-dir) cannot be written."""


class BindingError(AdaSparkError):
    """The installed llama-cpp-python lacks a symbol this build needs."""


class MessageTooLongError(ContextOverflowError):
    """One message (with the system prompt) leaves no room for a reply in the context: not sent."""

    def __init__(self, tokens: int, n_ctx: int, reply_min: int) -> None:
        self.tokens, self.n_ctx, self.reply_min = tokens, n_ctx, reply_min
        super().__init__(
            f"message is {tokens} tokens (with the system prompt and the turn format); the context "
            f"holds {n_ctx} and a reply needs at least {reply_min}: shorten the message or pass a larger --n-ctx")

    def __reduce__(self):  # picklable across the engine process boundary, with its numbers
        return (type(self), (self.tokens, self.n_ctx, self.reply_min))


class ConfigError(AdaSparkError):
    """The config file is not valid TOML, or a key in it is unknown, of the wrong type or out of range
    (or an ADASPARK_* environment setting has a value it does not take)."""
