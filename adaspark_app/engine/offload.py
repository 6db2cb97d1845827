"""Which of the model's layers go to a GPU: `--gpu-layers N|all|0` and what the build can do.

When the llama.cpp build can offload (a CUDA build of llama-cpp-python), every layer goes to the
GPU unless told otherwise, as Ollama and LM Studio do. `--gpu-layers` on `chat`, `run` and `bench`
overrides it, and so does `gpu_layers` in the config file (the option wins over the file). A
CPU-only build asked for GPU layers runs on the CPU and says so in one notice. Nothing here needs a
GPU: the build's answer to llama_supports_gpu_offload() is passed in, so the rules are tested on
the CPU.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from ..errors import ArgumentError

#: llama.cpp's n_gpu_layers for "every layer" (a negative value).
ALL_LAYERS = -1
#: The most layers a number may name (far above any model's block count).
MAX_GPU_LAYERS = 100_000


def parse_gpu_layers(value: object, what: str = "--gpu-layers") -> int | None:
    """`all` (or llama.cpp's -1) -> ALL_LAYERS, a whole number 0..MAX_GPU_LAYERS -> itself, None ->
    None (the default); anything else is an ArgumentError of one line."""
    if value is None:
        return None
    if isinstance(value, str) and value.strip().lower() == "all":
        return ALL_LAYERS
    if isinstance(value, bool):
        value = str(value)
    try:
        n = int(value) if isinstance(value, int) else int(str(value).strip(), 10)
    except ValueError:
        n = None
    if n is None or not (0 <= n <= MAX_GPU_LAYERS or n == ALL_LAYERS):
        raise ArgumentError(f"{what} must be a number of layers 0..{MAX_GPU_LAYERS} (0: the CPU only) "
                            f"or 'all', not {value!r}")
    return n


@dataclass(frozen=True)
class Offload:
    """What llama.cpp is given (``n_gpu_layers``) and why."""

    n_gpu_layers: int  # 0: the CPU only; ALL_LAYERS: every layer; N: the first N layers
    notice: str | None = None  # one line for the user, when a request could not be met

    @property
    def on_gpu(self) -> bool:
        return self.n_gpu_layers != 0

    def describe(self) -> str:
        """`all layers on the GPU`, `12 layers on the GPU` or `CPU`."""
        return f"{layers_text(self.n_gpu_layers)} on the GPU" if self.on_gpu else "CPU"


def layers_text(n_gpu_layers: int) -> str:
    """`all layers` (ALL_LAYERS, or any negative count as llama.cpp reads it) or `12 layers`."""
    return "all layers" if n_gpu_layers < 0 else f"{int(n_gpu_layers)} layers"


def plan_offload(requested: int | None, can_offload: bool) -> Offload:
    """The layers to offload: every one by default where the build can, none where it cannot
    (with a notice if some were asked for), else what was asked."""
    if not can_offload:
        if requested not in (None, 0):
            return Offload(0, "this llama.cpp build cannot offload to a GPU (it was built for the CPU "
                              "only): running on the CPU")
        return Offload(0)
    return Offload(ALL_LAYERS if requested is None else requested)


def build_can_offload() -> bool:
    """Whether the loaded llama.cpp can put layers on a GPU (llama_supports_gpu_offload)."""
    import llama_cpp

    return bool(llama_cpp.llama_supports_gpu_offload())


def cuda_kernels(exact_rows: int | None, graphs: bool | None = None,
                 tokens_on_device: bool = False, argmax_one_launch: bool | None = None) -> str:
    """The CUDA kernels in use, for the device fingerprint and reports: ``batch-invariant to N
    rows`` (AdaSpark's patched library with ADASPARK_CUDA_EXACT on), else ``stock``; from
    ``native.cuda_exact.library_rows()``. With ``graphs`` (``library_graphs()``: the patched
    library replays a CUDA graph per batch shape), ``, a CUDA graph per width`` follows; with
    ``tokens_on_device`` (``LlamaBackend.argmax_on_device``: a greedy row's argmax taken in the
    forward, its logits never copied), ``, greedy tokens on the GPU``, and ``in one launch`` after it
    with ``argmax_one_launch`` (``library_argmax()``: a verify's argmaxes are one kernel). Each
    changes what a verify costs, and so which cost table prices it."""
    kernels = f"batch-invariant to {exact_rows} rows" if exact_rows else "stock"
    if graphs:
        kernels += ", a CUDA graph per width"
    if not tokens_on_device:
        return kernels
    return f"{kernels}, greedy tokens on the GPU" + (" in one launch" if argmax_one_launch else "")


def cuda_kernels_notice(exact_rows: int | None, widest: int) -> str | None:
    """One line for the user when the GPU's kernels may round a verify's rows otherwise than a
    plain step's (None when every width up to ``widest`` is batch-invariant)."""
    if exact_rows is None:
        why = "llama.cpp's stock CUDA kernels"
    elif exact_rows == 0:
        why = "ADASPARK_CUDA_EXACT=0 (the stock CUDA kernels)"
    elif exact_rows < widest:
        why = f"CUDA kernels batch-invariant only to {exact_rows} rows"
    else:
        return None
    return (f"{why}: a row can round otherwise in a verify than in a plain step, so a reply may leave "
            f"plain decode's after a near tie (the README's CUDA install builds AdaSpark's batch-invariant kernels)")


#: nvidia-smi's query for the fields the store's device fingerprint keeps.
NVIDIA_SMI_QUERY = ["nvidia-smi", "--query-gpu=name,compute_cap,driver_version", "--format=csv,noheader"]


def parse_nvidia_smi(text: str) -> dict | None:
    """The first GPU of nvidia-smi's CSV answer to NVIDIA_SMI_QUERY as {name, compute_capability,
    driver}; None if the text holds no such line."""
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3 and all(parts):
            return {"name": parts[0], "compute_capability": parts[1], "driver": parts[2]}
    return None


@functools.lru_cache(maxsize=1)
def gpu_identity() -> dict | None:
    """The GPU the layers go to, as parse_nvidia_smi gives it (llama.cpp's CUDA backend uses the
    first device by default); None without nvidia-smi or an answer from it."""
    import shutil
    import subprocess

    if shutil.which(NVIDIA_SMI_QUERY[0]) is None:
        return None
    try:
        out = subprocess.run(NVIDIA_SMI_QUERY, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return parse_nvidia_smi(out.stdout) if out.returncode == 0 else None
