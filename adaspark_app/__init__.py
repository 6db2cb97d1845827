"""AdaSpark: terminal chat with lossless speculative decoding on llama.cpp."""

from .native import activate as _activate_kernels

_activate_kernels()  # before anything imports llama_cpp: the Q4_1 multi-row kernels, if built
