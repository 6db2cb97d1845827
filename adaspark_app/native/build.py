"""Build AdaSpark's libggml-cpu: llama-cpp-python's own llama.cpp with a Q4_1 multi-row kernel.

The bundled model's weights are Q4_1. Stock ggml multiplies them by a batch of rows one row at a
time (``ggml_vec_dot_q4_1_q8_1`` per row and column), so on this CPU a verify of 8 rows costs
about 4.7 one-row steps and 32 rows about 16.5. ``tinyblas_q4_1.inc`` adds Q4_1 to llamafile's
tinyBLAS (tiles of up to 4 weight rows x 4 batch rows, each weight block unpacked once per tile):
8 rows then cost about 3.4 steps and 32 rows about 11.2. One-row products run it too (with AVX2
alone, tiles of 4 weight rows x 1, 1.09-1.13x ggml's vec_dot on an AMD EPYC Zen 3; with AVX-512,
1 x 1, weights prefetched), and on AVX2 alone a tile of several batch rows works out its scale
products 32 blocks ahead; every output
element is summed in the stock kernel's order (fma of d_a d_b times the block's integer dot into
a vector accumulator, fma of m_a s_b into a scalar, then the same horizontal
sum), so a row computes bit for bit alike in a one-row decode and a many-row verify; the test
``test_cells_written_by_a_verify_equal_plain_decode_cells`` checks it on the real model.
``tinyblas_k_quants.inc`` does the same for Q4_K and Q6_K x Q8_K (the Q4_K_M files people run;
stock ggml takes them one row at a time too, because ggml's tiled K-quant matmul sums in another
order and the backend turns it off): tiles of up to 2 weight rows x 4 batch rows (1 x 1 for one
batch row, rows read in memory order with a prefetch that runs on into the next row: it takes
one-row products too, 0.84-1.02x vec_dot's time on Qwen2.5-1.5B on an AMD EPYC, Zen 4), each
output computed as ``ggml_vec_dot_q4_K_q8_K`` / ``ggml_vec_dot_q6_K_q8_K``'s AVX2 path computes it.
``tinyblas_q0.inc`` replaces stock tinyBLAS's Q4_0, Q5_0 and Q8_0 x Q8_0 (most of Qwen2.5-0.5B's
weights and its output matrix) on the AVX-512 VNNI variants, for one-row products too: two
weight rows per zmm, each half the stock kernel's 8 lanes, every element computed as the stock
tinyBLAS and vec_dot kernels compute it (the same int32 lanes, fmas and horizontal sum).
``flash_attn_bf16.inc`` goes into ``ops.cpp``: attention for the BF16 K / F16 V cache on every
variant (16 lanes with AVX-512, 8 with AVX2), one code path for every batch size (ggml's
flash-attention entry tries it first).

The source is llama-cpp-python's sdist (the version this package pins): during ``pip install`` the
copy pip unpacked to build llama-cpp-python itself, if its vendor/llama.cpp is file for file the
pinned one (``pip_source``, ``VENDOR_DIGEST``), else downloaded from PyPI with the SHA-256 PyPI lists
for it (``ADASPARK_LLAMA_SDIST`` may name a local copy), under ``vendor/llama.cpp``; only
the ``ggml-cpu`` library is built, once per CPU *variant* (``VARIANTS``: ggml's own feature sets,
GGML_NATIVE off and each instruction set named), into ``adaspark_app/native/lib/<variant>/``.
The machine a lib directory lives on can change (a VM moved from an AMD EPYC to an Intel Xeon), and
a library built with ``-march=native`` on one CPU dies with SIGILL on another; so each variant's
required CPU flags go in the stamp and ``native.activate`` picks, at run time, the best built
variant whose flags ``/proc/cpuinfo`` lists (stock libraries if none). An install builds the best
variant for the installing CPU plus ``haswell`` (AVX2, the floor of every x86 server of the last
ten years), ~1 minute each on 2 cores; ``--variants`` builds others. At run time
``adaspark_app.native.activate`` points llama-cpp-python at a copy of its own libraries with the
chosen one in place of its ``libggml-cpu``. ``pip install -e .`` runs this build (setup.py); a
variant already built for this source is skipped, and if the build fails the install goes on with
the stock kernels.

    python -m adaspark_app.native.build [--force] [--jobs N] [--variants haswell,zen4]
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

# argparse, shutil, subprocess, tarfile, tempfile and urllib are imported where a build needs
# them: every start-up of the `adaspark` command reads this module's paths (native.activate),
# and those imports would cost it ~20 ms for nothing.

LLAMA_CPP_PYTHON = "0.3.36"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"  # PyPI's
#: ``source_digest`` of that sdist's vendor/llama.cpp: a source tree pip unpacked is used only if it
#: has exactly these files with these contents.
VENDOR_DIGEST = "04ca7c75cd9a6db7b85b2301a6e3867053adced77fa2df4fb7ad16f600b68a3f"
#: vendor/llama.cpp's top-level folders the ggml-cpu build never reads (vocabulary files, docs):
#: not hashed, not copied.
VENDOR_SKIP = frozenset({"models", "docs"})
HERE = Path(__file__).resolve().parent
KERNEL = HERE / "tinyblas_q4_1.inc"
#: Q4_K and Q6_K x Q8_K (the Q4_K_M files people run), summed in the stock vec_dot kernels' order.
KERNEL_K = HERE / "tinyblas_k_quants.inc"
#: Q4_0, Q5_0 and Q8_0 x Q8_0 on the AVX-512 VNNI variants, summed in the stock kernels' order.
KERNEL_Q0 = HERE / "tinyblas_q0.inc"
#: Flash attention for the BF16 K / F16 V cache, one code path for every batch size (ops.cpp).
KERNEL_FA = HERE / "flash_attn_bf16.inc"
LIB_DIR = HERE / "lib"
LIB_NAME = "libggml-cpu.so"
STAMP = LIB_DIR / "stamp.json"
#: With CUDA (the install's CMAKE_ARGS turn GGML_CUDA on): llama.cpp's CUDA backend with
#: ``cuda_exact.patch``, whose rows are batch-invariant under ADASPARK_CUDA_EXACT=1 (cuda_exact.py).
CUDA_LIB_NAME = "libggml-cuda.so"
CUDA_FILE = f"cuda/{CUDA_LIB_NAME}"

#: ggml's x86 feature switches (GGML_<name>); a variant turns on some and every other one off.
GGML_FEATURES = ("SSE42", "AVX", "AVX2", "BMI2", "AVX_VNNI", "FMA", "F16C", "AVX512", "AVX512_VBMI",
                 "AVX512_VNNI", "AVX512_BF16", "AMX_TILE", "AMX_INT8", "AMX_BF16")
#: The /proc/cpuinfo flags the code compiled with each switch may execute (ggml-cpu/CMakeLists.txt:
#: GGML_AVX512 adds -mavx512f -mavx512cd -mavx512vl -mavx512dq -mavx512bw).
CPU_FLAGS = {"SSE42": ("sse4_2",), "AVX": ("avx",), "AVX2": ("avx2",), "BMI2": ("bmi2",),
             "AVX_VNNI": ("avx_vnni",), "FMA": ("fma",), "F16C": ("f16c",),
             "AVX512": ("avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw"),
             "AVX512_VBMI": ("avx512vbmi",), "AVX512_VNNI": ("avx512_vnni",), "AVX512_BF16": ("avx512_bf16",),
             "AMX_TILE": ("amx_tile",), "AMX_INT8": ("amx_int8",), "AMX_BF16": ("amx_bf16",)}
_HASWELL = ("SSE42", "AVX", "F16C", "FMA", "AVX2", "BMI2")
#: Variants, best first, with ggml's names and feature sets (ggml/src/CMakeLists.txt,
#: GGML_CPU_ALL_VARIANTS). zen4 is AVX-512 with VBMI, VNNI and BF16: Sapphire Rapids and later
#: Xeons, AMD Zen 4/5 (the BF16 K cache's dot products use AVX512_BF16). No AMX: AdaSpark loads
#: weights without extra buffer types, so ggml's AMX code never runs. The Q4_1 kernel needs AVX2.
VARIANTS: dict[str, tuple[str, ...]] = {
    "zen4": _HASWELL + ("AVX512", "AVX512_VBMI", "AVX512_VNNI", "AVX512_BF16"),
    "icelake": _HASWELL + ("AVX512", "AVX512_VBMI", "AVX512_VNNI"),
    "skylakex": _HASWELL + ("AVX512",),
    "alderlake": _HASWELL + ("AVX_VNNI",),
    "haswell": _HASWELL,
}
#: Always built at install next to the installing CPU's own variant.
FLOOR_VARIANT = "haswell"


def required_flags(variant: str) -> list[str]:
    """The /proc/cpuinfo flags a CPU must list to run `variant`'s library."""
    return sorted({f for feat in VARIANTS[variant] for f in CPU_FLAGS[feat]})


def cpu_flags(cpuinfo: str | None = None) -> frozenset[str]:
    """This CPU's feature flags, from the first ``flags`` line of /proc/cpuinfo (or `cpuinfo`);
    empty when unknown (no variant then fits)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return frozenset()
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def best_variant(flags: frozenset[str] | set[str], among: list[str] | None = None) -> str | None:
    """The first variant of VARIANTS (best first), restricted to `among`, whose required flags
    are all in `flags`; None if none fits."""
    for name in VARIANTS:
        if (among is None or name in among) and set(required_flags(name)) <= set(flags):
            return name
    return None


def install_variants(flags: frozenset[str] | set[str]) -> list[str]:
    """The variants an install builds: the best one for this CPU, and the AVX2 floor."""
    best = best_variant(flags)
    return [] if best is None else list(dict.fromkeys([best, FLOOR_VARIANT]))
SGEMM = "ggml/src/ggml-cpu/llamafile/sgemm.cpp"
OPS = "ggml/src/ggml-cpu/ops.cpp"
# ggml's flash attention entry: AdaSpark's kernel goes before it and is tried first in it
_FA_ANCHOR = """static void ggml_compute_forward_flash_attn_ext_f16(
        const ggml_compute_params * params,
        ggml_tensor * dst) {
"""
_FA_CALL = """    if (adaspark_flash_attn_bf16(params, dst)) {
        return;
    }
"""

# (anchor in sgemm.cpp, text put in its place): the kernel class after the x86 tinyBLAS classes,
# and the kernels' cases of llamafile_sgemm's dispatch (_CASE, one per _KERNEL_CASES entry).
_CLASS_ANCHOR = "#endif // __AVX__\n\n//PPC Implementation"
_CASE_ANCHOR = """    case GGML_TYPE_Q4_0: {
        if (Btype != GGML_TYPE_Q8_0)
            return false;"""
_CASE_TEMPLATE = """    case GGML_TYPE_{atype}: {{
#if defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
        if (Btype != GGML_TYPE_{btype})
            return false;
        {cls} tb{{
            k, (const block_{a} *)A, lda,
            (const block_{b} *)B, ldb,
            (float *)C, ldc,
            params->ith, params->nth}};
        tb.matmul(m, n);
        return true;
#else
        return false;
#endif
    }}

"""
# (weight type, activation type, kernel class): one dispatch case each, from the template above
_KERNEL_CASES = (("q4_1", "q8_1", "tinyBLAS_Q4_1_AVX<float>"),
                 ("q4_K", "q8_K", "tinyBLAS_K_AVX2<block_q4_K>"),
                 ("q6_K", "q8_K", "tinyBLAS_K_AVX2<block_q6_K>"))
_CASE = "".join(_CASE_TEMPLATE.format(atype=a.upper(), btype=bt.upper(), cls=cls, a=a, b=bt)
                for a, bt, cls in _KERNEL_CASES)
# The Q0 kernel goes inside the stock Q8_0, Q4_0 and Q5_0 cases (the labels exist already), right
# after their activation-type check; it is compiled in only where tinyblas_q0.inc defines
# ADASPARK_Q0_ZMM to 1 (the AVX-512 VNNI variants), so the others keep the stock tinyBLAS_Q0_AVX.
_Q0_ANCHORS = {a: f"    case GGML_TYPE_{a.upper()}: {{\n        if (Btype != GGML_TYPE_Q8_0)\n{sp}return false;\n"
               for a, sp in (("q8_0", " " * 11), ("q4_0", " " * 12), ("q5_0", " " * 12))}
# llamafile_sgemm leaves one-row products to ggml's vec_dot; the Q4_1 and K-quant kernels (every
# AVX2 variant) and, on the VNNI variants, the Q0 kernel take them too: the same bits as vec_dot,
# so the one-row step is cheaper without changing a row.
_N1_ANCHOR = "#if !defined(__MMA__)\n    if (n < 2)\n        return false;\n#endif\n"
# Which families take one-row products is a run-time switch, ``adaspark_one_row_kernels`` (bit 1
# Q4_1, 2 Q4_K/Q6_K, 4 Q4_0/Q5_0/Q8_0; all set by default): vec_dot is faster on some CPUs
# (engine/one_row.py times both and sets it between decodes, never during one). Bit 8 runs the
# Q0 kernel's one-row products in tiles of 8 weight rows (tinyblas_q0.inc's wide_one_row).
_N1 = """#if !defined(__MMA__)
    const int adaspark_one_row = __atomic_load_n(&adaspark_one_row_kernels, __ATOMIC_RELAXED);
    if (n < 2 && !(n == 1 && Ctype == GGML_TYPE_F32 &&
                   ((ADASPARK_Q0_ZMM && (adaspark_one_row & 4) && Btype == GGML_TYPE_Q8_0 &&
                     (Atype == GGML_TYPE_Q4_0 || Atype == GGML_TYPE_Q5_0 || Atype == GGML_TYPE_Q8_0)) ||
                    (ADASPARK_K_ONE_ROW && (adaspark_one_row & 2) && Btype == GGML_TYPE_Q8_K &&
                     (Atype == GGML_TYPE_Q4_K || Atype == GGML_TYPE_Q6_K)) ||
                    (ADASPARK_Q4_1_ONE_ROW && (adaspark_one_row & 1) && Btype == GGML_TYPE_Q8_1 &&
                     Atype == GGML_TYPE_Q4_1))))
        return false;
#endif
"""
# The switch itself, after the kernels' anonymous namespace: exported, so that the Python side
# finds it in the library llama.cpp loaded (native.one_row_switch).
_SWITCH_ANCHOR = "} // namespace\n"
_SWITCH = """} // namespace

// AdaSpark: the kernel families whose one-row products run AdaSpark's kernels (the rest: vec_dot,
// the same bits), and bit 8: the Q0 kernel's one-row products in tiles of 8 weight rows; set
// between decodes only (every thread of a product must read the same value)
extern "C" __attribute__((visibility("default"))) int adaspark_one_row_kernels = 7;
"""
_Q0_TEMPLATE = """#if ADASPARK_Q0_ZMM
        {{
            tinyBLAS_Q0_ZMM<block_{a}> tb{{
                k, (const block_{a} *)A, lda,
                (const block_q8_0 *)B, ldb,
                (float *)C, ldc,
                params->ith, params->nth}};
            tb.wide_one_row = (__atomic_load_n(&adaspark_one_row_kernels, __ATOMIC_RELAXED) & 8) != 0;
            tb.matmul(m, n);
            return true;
        }}
#endif
"""


class BuildError(RuntimeError):
    """The patched library could not be built (the stock kernels stay in use)."""


def source_key(variant: str | None = None) -> str:
    """Identifies what a library is built from: the pinned version, the kernel's text and the
    variant's feature set."""
    h = hashlib.sha256(LLAMA_CPP_PYTHON.encode())
    h.update(KERNEL.read_bytes())
    h.update(KERNEL_K.read_bytes())
    h.update(KERNEL_Q0.read_bytes())
    h.update((_CASE_ANCHOR + _CASE + _Q0_TEMPLATE + "".join(_Q0_ANCHORS.values()) + _N1_ANCHOR + _N1).encode())
    h.update((_SWITCH_ANCHOR + _SWITCH).encode())
    h.update(KERNEL_FA.read_bytes())
    h.update((_FA_ANCHOR + _FA_CALL).encode())
    if variant is not None:
        h.update(("variant:" + variant + ":" + ",".join(VARIANTS[variant])).encode())
    return h.hexdigest()[:16]


def cuda_cmake_flags(cmake_args: str | None = None) -> list[str] | None:
    """The CUDA build's CMake switches, from CMAKE_ARGS (the same variable that made
    llama-cpp-python's build a CUDA one): GGML_CUDA on and every CUDA-related switch given there
    (architectures, toolkit, compiler); None when CMAKE_ARGS does not turn GGML_CUDA on."""
    import shlex

    args = shlex.split(os.environ.get("CMAKE_ARGS", "") if cmake_args is None else cmake_args)
    on = [a for a in args if a.upper().replace(" ", "") in ("-DGGML_CUDA=ON", "-DGGML_CUDA=1", "-DGGML_CUDA=TRUE")]
    if not on:
        return None
    keep = [a for a in args if a.startswith(("-DCMAKE_CUDA", "-DCUDAToolkit", "-DGGML_CUDA_")) and a not in on]
    return ["-DGGML_CUDA=ON", *keep]


def _cuda_exact():
    """native/cuda_exact.py, also where setup.py loads this file alone (no package to import from)."""
    try:
        from .cuda_exact import apply
    except ImportError:
        import importlib.util

        spec = importlib.util.spec_from_file_location("_adaspark_cuda_exact", HERE / "cuda_exact.py")
        alone = sys.modules.setdefault(spec.name, importlib.util.module_from_spec(spec))
        spec.loader.exec_module(alone)  # registered first: its dataclass looks itself up there
        return alone
    return sys.modules[apply.__module__]


def cuda_key(flags: list[str]) -> str:
    """Identifies what the CUDA library is built from: the pinned version, the patch, its switches."""
    h = hashlib.sha256(LLAMA_CPP_PYTHON.encode())
    h.update(_cuda_exact().PATCH.read_bytes())
    h.update(" ".join(flags).encode())
    return h.hexdigest()[:16]


def built_cuda(flags: list[str] | None = None) -> bool:
    """Whether the CUDA library is built (from this patch, and with ``flags`` if given)."""
    e = read_stamp().get("cuda")
    return (isinstance(e, dict) and (LIB_DIR / CUDA_FILE).is_file()
            and (flags is None or e.get("key") == cuda_key(flags)))


def read_stamp() -> dict:
    """stamp.json: {"llama_cpp_python": version, "variants": {name: {"key", "flags", "file",
    "built_on"}}, and with CUDA "cuda": {"key", "file", "cmake", "build_seconds"}}; {} when
    missing, unreadable or of the one-library layout before variants."""
    try:
        stamp = json.loads(STAMP.read_text())
    except (OSError, ValueError):
        return {}
    return stamp if isinstance(stamp, dict) and isinstance(stamp.get("variants"), dict) else {}


def built_variants() -> list[str]:
    """The variants whose library is built from this source, best first."""
    got = read_stamp().get("variants", {})
    return [v for v in VARIANTS if v in got and got[v].get("key") == source_key(v)
            and (LIB_DIR / got[v].get("file", "")).is_file()]


def variant_lib(variant: str) -> Path:
    """Where `variant`'s library is (built or not)."""
    return LIB_DIR / variant / LIB_NAME


def is_built(variants: list[str] | None = None) -> bool:
    """Whether every one of `variants` (default: what an install on this CPU builds) is built."""
    want = install_variants(cpu_flags()) if variants is None else variants
    have = built_variants()
    return bool(want) and all(v in have for v in want)


def patch_sgemm(text: str) -> str:
    """sgemm.cpp with the Q4_1, Q4_K, Q6_K and Q0 kernel classes and their dispatch cases added."""
    if (text.count(_CLASS_ANCHOR) != 1 or text.count(_CASE_ANCHOR) != 1
            or any(text.count(a) != 1 for a in (*_Q0_ANCHORS.values(), _N1_ANCHOR, _SWITCH_ANCHOR))):
        raise BuildError("sgemm.cpp does not look like llama-cpp-python 0.3.36's: the patch does not apply")
    text = text.replace(_CLASS_ANCHOR, "#endif // __AVX__\n" + KERNEL.read_text() + KERNEL_K.read_text()
                        + KERNEL_Q0.read_text() + "\n//PPC Implementation")
    text = text.replace(_CASE_ANCHOR, _CASE + _CASE_ANCHOR)
    for a, anchor in _Q0_ANCHORS.items():
        text = text.replace(anchor, anchor + _Q0_TEMPLATE.format(a=a))
    return text.replace(_N1_ANCHOR, _N1).replace(_SWITCH_ANCHOR, _SWITCH)


def patch_ops(text: str) -> str:
    """ops.cpp with AdaSpark's flash attention tried first for the BF16 K / F16 V cache."""
    if text.count(_FA_ANCHOR) != 1:
        raise BuildError("ops.cpp does not look like llama-cpp-python 0.3.36's: the patch does not apply")
    return text.replace(_FA_ANCHOR, KERNEL_FA.read_text() + "\n" + _FA_ANCHOR + _FA_CALL)


def _sdist(dest: Path) -> Path:
    """llama-cpp-python's sdist: ``ADASPARK_LLAMA_SDIST`` if set, else downloaded from PyPI's
    simple index; its SHA-256 must be SDIST_SHA256 either way."""
    import urllib.request

    local = os.environ.get("ADASPARK_LLAMA_SDIST")
    if local:
        path = Path(local)
        if not path.is_file():
            raise BuildError(f"ADASPARK_LLAMA_SDIST={local} is not a file")
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
    else:
        name = f"llama_cpp_python-{LLAMA_CPP_PYTHON}.tar.gz"
        path = dest / name
        try:
            req = urllib.request.Request("https://pypi.org/simple/llama-cpp-python/",
                                         headers={"Accept": "application/vnd.pypi.simple.v1+json"})
            with urllib.request.urlopen(req, timeout=60) as r:
                files = json.load(r)["files"]
            url = next(f["url"] for f in files if f["filename"] == name)
            h = hashlib.sha256()
            with urllib.request.urlopen(url, timeout=600) as r, open(path, "wb") as out:
                for block in iter(lambda: r.read(1 << 20), b""):
                    h.update(block)
                    out.write(block)
        except (OSError, ValueError, KeyError, StopIteration) as e:
            raise BuildError(f"could not download llama-cpp-python {LLAMA_CPP_PYTHON}'s source: {e}") from None
        digest = h.hexdigest()
    if digest != SDIST_SHA256:
        raise BuildError(f"llama-cpp-python's sdist has SHA-256 {digest}, expected {SDIST_SHA256}")
    return path


def source_files(root: Path) -> list[str]:
    """The regular files under `root` (a vendor/llama.cpp tree) outside VENDOR_SKIP, as sorted
    POSIX paths relative to it."""
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel = Path(dirpath).relative_to(root)
        if not rel.parts:
            dirnames[:] = [d for d in dirnames if d not in VENDOR_SKIP]
        for f in filenames:
            path = Path(dirpath) / f
            if path.is_file() and not path.is_symlink():
                files.append(path.relative_to(root).as_posix())
    return sorted(files)


def source_digest(root: Path) -> str:
    """One SHA-256 over the names and contents of ``source_files(root)``."""
    h = hashlib.sha256()
    for rel in source_files(root):
        h.update(rel.encode() + b"\0")
        h.update(hashlib.sha256((root / rel).read_bytes()).digest())
    return h.hexdigest()


def pip_source(tmp_root: Path | None = None) -> Path | None:
    """The vendor/llama.cpp of the llama-cpp-python source that pip unpacked to build it in this
    same install, if it is the pinned one (``VENDOR_DIGEST``), else None.

    ``pip install`` unpacks each sdist under its temporary folder (``pip-install-*/NAME_*``) and
    removes it only when the whole install ends, after this package's build has run; reusing it
    spares fetching the 77 MB sdist a second time.
    """
    import tempfile

    base = tmp_root or Path(tempfile.gettempdir())
    for cand in sorted(base.glob("pip-install-*/llama-cpp-python_*/vendor/llama.cpp")):
        try:
            init = (cand.parent.parent / "llama_cpp" / "__init__.py").read_text()
            if f'__version__ = "{LLAMA_CPP_PYTHON}"' in init and source_digest(cand) == VENDOR_DIGEST:
                return cand
        except OSError:
            continue
    return None


def _run(cmd: list[str], log: Path) -> None:
    import subprocess

    with open(log, "ab") as fp:
        rc = subprocess.run(cmd, stdout=fp, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        raise BuildError(f"{' '.join(cmd[:3])} ... failed (exit {rc}); see {log}")


def variant_cmake_flags(variant: str) -> list[str]:
    """CMake switches for `variant`: GGML_NATIVE off, each of ggml's x86 features on or off."""
    on = set(VARIANTS[variant])
    return ["-DGGML_NATIVE=OFF"] + [f"-DGGML_{f}={'ON' if f in on else 'OFF'}" for f in GGML_FEATURES]


def _write_stamp(variants: dict, cuda: dict | None = None) -> None:
    tmp = STAMP.with_suffix(".tmp")
    stamp: dict = {"llama_cpp_python": LLAMA_CPP_PYTHON, "variants": variants}
    if cuda:
        stamp["cuda"] = cuda
    tmp.write_text(json.dumps(stamp, indent=1) + "\n")
    os.replace(tmp, STAMP)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return "unknown"


def build(force: bool = False, jobs: int | None = None, say=print, variants: list[str] | None = None,
          cuda: list[str] | None = None) -> Path:
    """Build the patched libggml-cpu of each of `variants` not yet built (default: this CPU's best
    variant and the AVX2 floor), and with `cuda` (CMake switches; default ``cuda_cmake_flags()``,
    None without CUDA) the patched libggml-cuda; returns LIB_DIR, which holds
    ``<variant>/libggml-cpu.so``, ``cuda/libggml-cuda.so`` and the stamp recording each one's key
    (and a variant's required CPU flags)."""
    import shutil
    import tarfile
    import tempfile
    import time

    if variants is None:
        variants = install_variants(cpu_flags())
        if not variants:
            raise BuildError("this CPU has no AVX2 (or /proc/cpuinfo is unreadable): the stock kernels stay in use")
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise BuildError(f"unknown kernel variant(s) {', '.join(unknown)}; known: {', '.join(VARIANTS)}")
    cuda = cuda_cmake_flags() if cuda is None else cuda
    todo = [v for v in variants if force or v not in built_variants()]
    todo_cuda = bool(cuda) and (force or not built_cuda(cuda))
    if not todo and not todo_cuda:
        return LIB_DIR
    if sys.platform != "linux":
        raise BuildError("the patched kernels are built on Linux only")
    cmake = shutil.which("cmake")
    if cmake is None:
        raise BuildError("cmake is not installed")
    jobs = jobs or os.cpu_count() or 2
    LIB_DIR.mkdir(parents=True, exist_ok=True)
    log = LIB_DIR / "build.log"
    log.write_text("")
    stamp = {v: e for v, e in read_stamp().get("variants", {}).items() if v in built_variants()}
    cuda_entry = read_stamp().get("cuda") if built_cuda() else None
    with tempfile.TemporaryDirectory(prefix="adaspark-kernels-") as tmp:
        tmp_path = Path(tmp)
        src = tmp_path / "llama.cpp"
        unpacked = None if os.environ.get("ADASPARK_LLAMA_SDIST") else pip_source()
        if unpacked is not None:
            say(f"adaspark: building the multi-row kernels from the llama-cpp-python {LLAMA_CPP_PYTHON} source "
                f"pip unpacked ({unpacked})")
            for rel in source_files(unpacked):
                (src / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(unpacked / rel, src / rel)
        else:
            say(f"adaspark: downloading llama-cpp-python {LLAMA_CPP_PYTHON}'s source for the multi-row kernels")
            tar = _sdist(tmp_path)
            root = f"llama_cpp_python-{LLAMA_CPP_PYTHON}/vendor/llama.cpp/"
            with tarfile.open(tar) as tf:
                members = [m for m in tf.getmembers() if m.name.startswith(root)
                           and m.name[len(root):].split("/", 1)[0] not in VENDOR_SKIP]
                tf.extractall(tmp_path, members=members, filter="data")
            src = tmp_path / root
        sgemm = src / SGEMM
        sgemm.write_text(patch_sgemm(sgemm.read_text()))
        ops = src / OPS
        ops.write_text(patch_ops(ops.read_text()))
        for n, variant in enumerate(todo, 1):
            t0 = time.monotonic()
            out = tmp_path / f"build-{variant}"
            say(f"adaspark: building libggml-cpu with the multi-row kernels (Q4_1, Q4_K, Q6_K, Q4_0/Q5_0/Q8_0) and "
                f"the attention kernel, variant {variant} ({n} of {len(todo)}, "
                f"{jobs} jobs, about a minute)")
            _build_library(cmake, src, out, variant_cmake_flags(variant), "ggml-cpu", variant_lib(variant), jobs, log,
                           f"variant {variant}")
            stamp[variant] = {"key": source_key(variant), "flags": required_flags(variant),
                              "file": f"{variant}/{LIB_NAME}", "built_on": _cpu_model(),
                              "build_seconds": round(time.monotonic() - t0, 1)}
            _write_stamp(stamp, cuda_entry)  # after each variant: one built survives a failure of the next
        if todo_cuda:
            cuda_entry = _build_cuda(src, tmp_path / "build-cuda", cmake, jobs, cuda, log, say)
            _write_stamp(stamp, cuda_entry)
    old = LIB_DIR / LIB_NAME  # the one-library layout before variants (built with -march=native)
    if old.is_file():
        old.unlink()
    return LIB_DIR


def _build_library(cmake: str, src: Path, out: Path, flags: list[str], target: str, dest: Path, jobs: int,
                   log: Path, what: str) -> None:
    """Configure `src` into `out` with `flags` (tools, tests and network off), build `target` alone
    and put its library at `dest` (written beside it, then renamed: a reader never sees half)."""
    import shutil

    with open(log, "a") as fp:
        fp.write(f"=== {what}: {' '.join(flags)}\n")
    _run([cmake, "-S", str(src), "-B", str(out), "-DCMAKE_BUILD_TYPE=Release", *flags,
          "-DBUILD_SHARED_LIBS=ON", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
          "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_TOOLS=OFF", "-DLLAMA_BUILD_SERVER=OFF"], log)
    _run([cmake, "--build", str(out), "--target", target, "-j", str(jobs)], log)
    name = f"lib{target}.so"
    built = sorted(p for p in out.rglob(name + "*") if p.is_file() and not p.is_symlink())
    if not built:
        raise BuildError(f"the build of {what} made no {name}; see {log}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(built[-1], dest.with_suffix(".so.tmp"))
    os.replace(dest.with_suffix(".so.tmp"), dest)


def _build_cuda(src: Path, out: Path, cmake: str, jobs: int, flags: list[str], log: Path, say) -> dict:
    """libggml-cuda with cuda_exact.patch, from the source tree `src` (patched in place)."""
    import time

    cuda_exact = _cuda_exact()
    t0 = time.monotonic()
    try:
        cuda_exact.apply(src)
    except cuda_exact.PatchError as e:
        raise BuildError(str(e)) from None
    say(f"adaspark: building libggml-cuda with the batch-invariant kernels ({jobs} jobs; as long as "
        f"llama-cpp-python's own CUDA compile)")
    _build_library(cmake, src, out, flags, "ggml-cuda", LIB_DIR / CUDA_FILE, jobs, log, "cuda")
    return {"key": cuda_key(flags), "file": CUDA_FILE, "cmake": flags,
            "build_seconds": round(time.monotonic() - t0, 1)}


def main() -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--force", action="store_true", help="rebuild even if built")
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--variants", default=None,
                    help=f"comma-separated, of {', '.join(VARIANTS)} (default: this CPU's best and {FLOOR_VARIANT})")
    a = ap.parse_args()
    try:
        path = build(force=a.force, jobs=a.jobs,
                     variants=a.variants.split(",") if a.variants else None)
    except BuildError as e:
        print(f"adaspark: {e}", file=sys.stderr)
        return 1
    print(f"adaspark: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
