"""Command-line options shared by `adaspark chat`, `run` and `bench`: the sampling flags, read and
checked in one place (values by engine.sampling.SamplingSettings)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .config import Config
    from .engine.sampling import SamplingSettings

# flag -> help; values are parsed and checked by engine.sampling.SamplingSettings (one place)
SAMPLING_FLAGS = {
    "--temperature": "0 decodes greedily (default for run and bench; chat: the GGUF's general.sampling.temp, "
                     "else llama.cpp's 0.8)",
    "--top-k": "keep the K most likely tokens, 0 is off (default 40)",
    "--top-p": "keep the smallest set with probability mass >= P, in (0, 1], 1 is off (default 0.95)",
    "--min-p": "keep tokens with probability >= P times the top one's, in [0, 1], 0 is off (default 0.05)",
    "--repeat-penalty": "divide (multiply, if negative) the logits of recent tokens, > 0, 1 is off (default 1.0)",
    "--repeat-last-n": "how many recent tokens the repeat penalty sees, 0 is off (default 64)",
    "--seed": "any integer; the same seed gives the same reply with every arm (default: random, recorded)",
}


def add_sampling_options(p: argparse.ArgumentParser) -> None:
    """The sampling options (llama.cpp's meaning and order: penalties, top-k, top-p, min-p, temperature)."""
    g = p.add_argument_group("sampling (lossless: the same seed gives the same reply with every arm)")
    for flag, text in SAMPLING_FLAGS.items():
        g.add_argument(flag, dest=flag[2:].replace("-", "_"), default=None, metavar="X", help=text)


def check_sampling_options(args: argparse.Namespace, defaults: dict | None = None,
                           resolve_seed: bool = True) -> "SamplingSettings":
    """The options as SamplingSettings (ArgumentError, one line, on any bad value); unset ones take
    `defaults`, then llama.cpp's. resolve_seed: draw the random seed now, so every reply of a run
    or bench records and uses the same one."""
    from .engine.sampling import settings_from  # numpy: not imported at the command's start-up

    values = {flag[2:].replace("-", "_"): getattr(args, flag[2:].replace("-", "_"), None) for flag in SAMPLING_FLAGS}
    settings = settings_from(values, defaults)
    if resolve_seed and not settings.greedy:
        settings = settings.resolved()
    args.sampling = settings
    return settings


GPU_LAYERS_HELP = ("layers on the GPU: a number, 'all' or 0 (the CPU only); default: all where llama.cpp "
                   "was built for a GPU, else the CPU (config file: gpu_layers)")


def add_gpu_layers_option(p: argparse.ArgumentParser) -> None:
    """`--gpu-layers N|all|0` (engine/offload.py)."""
    p.add_argument("--gpu-layers", dest="gpu_layers", default=None, metavar="N|all", help=GPU_LAYERS_HELP)


def check_gpu_layers_option(args: argparse.Namespace, config: "Config | None" = None) -> int | None:
    """`--gpu-layers` if given, else the config file's `gpu_layers` (`config` if the command has
    read the file already), checked: the layers to pass the engine (None: its default). A bad
    value is an ArgumentError or a ConfigError (one line, exit 2)."""
    from .engine.offload import parse_gpu_layers

    if getattr(args, "gpu_layers", None) is not None:
        return parse_gpu_layers(args.gpu_layers)
    if config is None:
        from .config import load_config

        config = load_config()
    return config.gpu_layers
