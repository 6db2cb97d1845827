"""adaspark_app.native: the Q4_1 kernel patch, the runtime library directory, the choice of CPU
variant by the CPU's flags, and that an engine process really runs on the chosen library (each
variant this machine can run, with the Q4_1 identity test run under it).

The Q4_1 kernel's numerics are checked on the real model by test_engine_tree's
test_cells_written_by_a_verify_equal_plain_decode_cells (cells written by 2-, 3- and 9-row
verifies give bit-identical logits to cells written one row at a time), which runs on whatever
library the process loaded: the patched one after a normal install. The Q4_K and Q6_K kernels,
and the Q4_0/Q5_0/Q8_0 kernel of the AVX-512 VNNI variants, are checked here through ggml itself
on random weights (no model needed), per variant this machine can run, against columns computed
alone and against the stock library.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from adaspark_app import native
from adaspark_app.native import build

pytestmark = pytest.mark.long  # scheduled first (tests/conftest.py)


def _sgemm_like() -> str:
    """The parts of sgemm.cpp the patch looks for, in its order: the class anchor, the end of the
    kernels' namespace (_SWITCH_ANCHOR), then in llamafile_sgemm the one-row check (_N1_ANCHOR)
    and the stock Q8_0, Q4_0 (_CASE_ANCHOR) and Q5_0 cases' first lines, each followed by its
    stock code."""
    return ("// before\n" + build._CLASS_ANCHOR + "\n// middle\n" + build._SWITCH_ANCHOR + "// llamafile_sgemm\n"
            + build._N1_ANCHOR + build._Q0_ANCHORS["q8_0"] + "// stock code\n"
            + build._CASE_ANCHOR + "\n// stock code\n" + build._Q0_ANCHORS["q5_0"] + "// stock code\n// after\n")


def test_patch_adds_the_kernel_class_and_its_dispatch_case_once():
    text = _sgemm_like()
    out = build.patch_sgemm(text)
    assert out.count("class tinyBLAS_Q4_1_AVX") == 1
    assert out.count("case GGML_TYPE_Q4_1:") == 1
    assert out.index("class tinyBLAS_Q4_1_AVX") < out.index("//PPC Implementation")
    assert out.index("case GGML_TYPE_Q4_1:") < out.index("case GGML_TYPE_Q4_0:")
    for missing in (build._CLASS_ANCHOR, build._CASE_ANCHOR):
        with pytest.raises(build.BuildError):
            build.patch_sgemm(text.replace(missing, "// changed upstream"))


def test_runtime_dir_copies_stock_libraries_with_ours_under_every_ggml_cpu_name(tmp_path):
    stock = tmp_path / "stock"
    stock.mkdir()
    for name in ("libllama.so", "libggml.so.0", "libggml-cpu.so", "libggml-cpu.so.0", "libggml-cpu.so.0.25.3"):
        (stock / name).write_bytes(name.encode())
    ours = tmp_path / "ours.so"
    ours.write_bytes(b"patched")
    cache = tmp_path / "cache"
    d = native.runtime_dir(stock, ours, cache)
    assert sorted(p.name for p in d.iterdir() if not p.name.startswith(".")) == sorted(p.name for p in stock.iterdir())
    assert (d / "libllama.so").read_bytes() == b"libllama.so"
    assert all((d / n).read_bytes() == b"patched" for n in ("libggml-cpu.so", "libggml-cpu.so.0", "libggml-cpu.so.0.25.3"))
    assert not (d / "libggml-cpu.so").is_symlink()  # $ORIGIN must resolve to this directory
    assert native.runtime_dir(stock, ours, cache) == d  # made once
    ours.write_bytes(b"patched again")  # a rebuilt library gets a new directory
    d2 = native.runtime_dir(stock, ours, cache)
    assert d2 != d and (d2 / "libggml-cpu.so").read_bytes() == b"patched again"
    assert d.exists(), "a directory used within STALE_DAYS stays (another install may be about to load it)"
    old = os.stat(d / ".complete").st_mtime - (native.STALE_DAYS + 1) * 86400
    os.utime(d / ".complete", (old, old))
    ours.write_bytes(b"patched a third time")
    d3 = native.runtime_dir(stock, ours, cache)
    assert not d.exists() and d2.exists() and d3.exists(), "only the directory unused for STALE_DAYS goes"
    assert not [p for p in cache.iterdir() if p.name.startswith(".lib-")], "no half-made directory left"


_PROBE = """
import json, sys
from adaspark_app import native
native.activate()
from adaspark_app.engine.backend import LlamaBackend, default_model_path
b = LlamaBackend(default_model_path(), n_ctx=256, n_threads=1)
maps = open("/proc/self/maps").read()
libs = sorted({line.split()[-1] for line in maps.splitlines() if "libggml-cpu" in line})
print(json.dumps({"status": native.status(), "variant": native.variant(), "libs": libs}))
"""


def _clean_env() -> dict:
    """This environment without what an activate in this process (conftest) or the user set."""
    drop = ("LLAMA_CPP_LIB_PATH", native._MARK, native._VARIANT_MARK, native.VARIANT_ENV, "ADASPARK_STOCK_KERNELS")
    return {k: v for k, v in os.environ.items() if k not in drop}


@pytest.mark.skipif(not build.is_built(), reason="Q4_1 kernels not built (python -m adaspark_app.native.build)")
def test_importing_the_package_changes_no_environment():
    """`import adaspark_app` (and its CLI and engine modules) has no side effects: the kernels are
    put in use by native.activate(), which the entry points call, not by an import."""
    code = ("import os, adaspark_app, adaspark_app.cli, adaspark_app.engine.chat_engine\n"
            "print(os.environ.get('LLAMA_CPP_LIB_PATH'))\n"
            "from adaspark_app import native\n"
            "print(native.activate(), os.environ.get('LLAMA_CPP_LIB_PATH'))\n")
    out = subprocess.run([sys.executable, "-c", code], env=_clean_env(), capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    on_import, after = out.stdout.splitlines()
    assert on_import == "None"
    status, lib_path = after.split()
    assert status == "q4_1-tinyblas" and "/native/lib-" in lib_path  # what the import did not do


def _probe(env: dict) -> dict:
    out = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def _same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    with open(a, "rb") as fa, open(b, "rb") as fb:
        return fa.read() == fb.read()


@pytest.mark.model
@pytest.mark.skipif(not build.is_built(), reason="Q4_1 kernels not built (python -m adaspark_app.native.build)")
def test_an_engine_process_loads_the_patched_library_and_can_opt_out():
    env = _clean_env()
    got = _probe(env)
    assert got["status"] == "q4_1-tinyblas"
    best = build.best_variant(build.cpu_flags(), among=build.built_variants())
    assert got["variant"] == best
    assert len(got["libs"]) == 1 and "/native/lib-" in got["libs"][0]
    assert _same_file(got["libs"][0], build.variant_lib(best)), "the mapped libggml-cpu is not the chosen variant's build"
    stock = _probe({**env, "ADASPARK_STOCK_KERNELS": "1"})
    assert stock["status"].startswith("stock") and stock["variant"] is None and stock["libs"] != got["libs"]


# ---------------------------------------------------------------- CPU variants
# /proc/cpuinfo flag sets of real CPUs (trimmed to what matters), with the variant each runs.
_HASWELL = "fpu sse sse2 ssse3 sse4_1 sse4_2 avx f16c fma avx2 bmi1 bmi2 popcnt"
_SKX = _HASWELL + " avx512f avx512cd avx512vl avx512dq avx512bw"
_ICX = _SKX + " avx512vbmi avx512_vnni avx512ifma"
_SPR = _ICX + " avx512_bf16 avx_vnni amx_tile amx_int8 amx_bf16 avx512_fp16"
_ZEN3 = _HASWELL + " sse4a"  # AMD EPYC Milan: AVX2, no AVX-512
_ADL = _HASWELL + " avx_vnni"
_IVB = "fpu sse sse2 ssse3 sse4_1 sse4_2 avx f16c popcnt"  # no AVX2: no variant fits
_KNOWN = [(_SPR, "zen4"), (_ICX, "icelake"), (_SKX, "skylakex"), (_ADL, "alderlake"), (_ZEN3, "haswell"),
          (_HASWELL, "haswell"), (_IVB, None), ("", None)]


def test_cpu_flags_come_from_the_first_flags_line_of_proc_cpuinfo():
    text = "processor\t: 0\nmodel name\t: Some CPU\nflags\t\t: fpu avx2 fma\n\nprocessor\t: 1\nflags\t: fpu\n"
    assert build.cpu_flags(text) == {"fpu", "avx2", "fma"}
    assert build.cpu_flags("processor : 0\n") == frozenset()
    assert "sse2" in build.cpu_flags()  # this machine's real /proc/cpuinfo (any x86-64 has SSE2)


@pytest.mark.parametrize("flags,want", _KNOWN)
def test_best_variant_for_known_cpus(flags, want):
    assert build.best_variant(set(flags.split())) == want


def test_install_builds_this_cpus_variant_and_the_avx2_floor():
    assert build.install_variants(set(_SPR.split())) == ["zen4", "haswell"]
    assert build.install_variants(set(_ICX.split())) == ["icelake", "haswell"]
    assert build.install_variants(set(_ZEN3.split())) == ["haswell"]
    assert build.install_variants(set(_IVB.split())) == []


def test_each_variant_names_every_ggml_switch_with_native_off_and_needs_the_flags_of_its_switches():
    for v, feats in build.VARIANTS.items():
        args = build.variant_cmake_flags(v)
        assert args[0] == "-DGGML_NATIVE=OFF"
        assert sorted(a.split("=")[0] for a in args[1:]) == sorted(f"-DGGML_{f}" for f in build.GGML_FEATURES)
        on = {a.split("=")[0][len("-DGGML_"):] for a in args[1:] if a.endswith("=ON")}
        assert on == set(feats)
        assert "avx2" in build.required_flags(v) and "fma" in build.required_flags(v)  # the Q4_1 kernel's
    assert "avx512_bf16" in build.required_flags("zen4") and "avx512f" not in build.required_flags("haswell")
    assert len({build.source_key(v) for v in build.VARIANTS}) == len(build.VARIANTS)


def test_choose_variant_takes_the_best_built_one_the_cpu_can_run():
    built = {v: build.required_flags(v) for v in ("zen4", "haswell")}
    spr, zen3, skx = set(_SPR.split()), set(_ZEN3.split()), set(_SKX.split())
    assert native.choose_variant(built, spr)[0] == "zen4"
    assert native.choose_variant(built, zen3)[0] == "haswell"
    assert native.choose_variant(built, skx)[0] == "haswell"  # AVX-512 but no VNNI/BF16: the floor
    assert native.choose_variant({"zen4": built["zen4"]}, zen3)[0] is None  # moved to a CPU without AVX-512
    assert native.choose_variant(built, set(_IVB.split()))[0] is None
    assert native.choose_variant({}, spr)[0] is None
    # forced: taken when built and runnable, refused (naming what is missing) otherwise
    assert native.choose_variant(built, spr, forced="haswell")[0] == "haswell"
    v, why = native.choose_variant(built, zen3, forced="zen4")
    assert v is None and "avx512_bf16" in why and "avx512f" in why
    v, why = native.choose_variant(built, spr, forced="icelake")
    assert v is None and "not built" in why
    # a stamp's flags are what counts, also for a variant this version does not know
    assert native.choose_variant({"future": ["avx2", "newflag"], "haswell": built["haswell"]},
                                 spr | {"newflag"})[0] == "haswell"  # known variants first
    assert native.choose_variant({"future": ["avx2", "newflag"]}, spr | {"newflag"})[0] == "future"


_ACTIVATE_WITH_FLAGS = """
import json, sys
from adaspark_app import native
from adaspark_app.native import build
native._build.cpu_flags = lambda cpuinfo=None: frozenset(sys.argv[1].split())
print(json.dumps({"status": native.activate(), "variant": native.variant()}))
"""


@pytest.mark.skipif(not build.is_built(["haswell"]), reason="haswell variant not built")
@pytest.mark.parametrize("flags,forced,want", [
    (_ZEN3, None, "haswell"),  # the lib directory moved to an AVX2-only CPU: never the AVX-512 build
    (_SPR, "haswell", "haswell"),
    (_ZEN3, "zen4", None),  # forcing a variant this CPU cannot run keeps the stock libraries
    (_IVB, None, None),
])
def test_activate_chooses_by_the_cpus_flags(flags, forced, want):
    env = _clean_env()
    env.pop(native.VARIANT_ENV, None)
    if forced:
        env[native.VARIANT_ENV] = forced
    out = subprocess.run([sys.executable, "-c", _ACTIVATE_WITH_FLAGS, flags], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["variant"] == want
    if want:
        assert got["status"] == "q4_1-tinyblas"
    else:
        assert got["status"].startswith("stock (")


@pytest.mark.model
@pytest.mark.parametrize("variant", list(build.VARIANTS))
def test_each_variant_this_machine_can_run_loads_and_keeps_q4_1_identity(variant):
    """Forced with ADASPARK_KERNEL_VARIANT, the variant's own library is the one mapped, and the
    Q4_1 identity test (cells written by 2-, 3- and 9-row verifies equal plain decode's, bit for
    bit) passes on it, in a fresh process. The variant this suite runs on already passes that
    test in the suite itself (the forced library is the same file), so it is not run again."""
    if variant not in build.built_variants():
        pytest.skip(f"variant {variant} not built here")
    if not set(build.required_flags(variant)) <= build.cpu_flags():
        pytest.skip(f"this CPU cannot run variant {variant}")
    env = {**_clean_env(), native.VARIANT_ENV: variant}
    got = _probe(env)
    assert got["status"] == "q4_1-tinyblas" and got["variant"] == variant
    assert len(got["libs"]) == 1 and _same_file(got["libs"][0], build.variant_lib(variant))
    if native.status() == "q4_1-tinyblas" and native.variant() == variant:
        return  # test_engine_tree.py runs the identity test on this very library
    test = "tests/test_engine_tree.py::test_cells_written_by_a_verify_equal_plain_decode_cells"
    # -n0: one process for one test (the suite's addopts would start a worker per core)
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-n0", "-p", "no:cacheprovider", test],
                         env=env, capture_output=True, text=True, timeout=600,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert out.returncode == 0 and " passed" in out.stdout, out.stdout[-2000:] + out.stderr[-2000:]


# ---------------------------------------------------------------- Q4_K, Q6_K and Q0 kernels
# argv[1]: the comma-separated ggml types to multiply
_QUANT_PROBE = """
import ctypes, json, sys
import numpy as np
from benchmarks.kernels.kernel_identity import GGML_TYPES, _libs, mul_mat
base, cpu, status = _libs()
try:  # the one-row switch (bit 8: the Q0 kernel's one-row products in tiles of 8 weight rows)
    switch = ctypes.c_int.in_dll(cpu, "adaspark_one_row_kernels")
except ValueError:  # the stock library
    switch = None
rng = np.random.default_rng(7)
# 37 and 38 rows: the tiles' remainders too (4-row tiles leave 1 and 2 rows)
weights = {rows: rng.standard_normal((rows, 512)).astype(np.float32) * 0.05 for rows in (37, 38)}
x = rng.standard_normal((13, 512)).astype(np.float32)
out = {"status": status}
for name in sys.argv[1].split(","):
    for rows, w in weights.items():
        for n in (2, 3, 5, 8, 13):
            for threads in (1, 2):
                batched = mul_mat(base, cpu, GGML_TYPES[name], w, x[:n], threads)
                alone = np.stack([mul_mat(base, cpu, GGML_TYPES[name], w, x[j:j + 1], threads)[0] for j in range(n)])
                wide = alone
                if switch is not None:
                    switch.value = 15
                    wide = np.stack([mul_mat(base, cpu, GGML_TYPES[name], w, x[j:j + 1], threads)[0]
                                     for j in range(n)])
                    switch.value = 7
                out[f"{name} m={rows} n={n} t={threads}"] = {
                    "batched": batched.tobytes().hex(), "alone": alone.tobytes().hex(),
                    "wide": wide.tobytes().hex(), "err": float(np.abs(batched - x[:n] @ w.T).max())}
print(json.dumps(out))
"""


def _quant_products(env: dict, types: tuple[str, ...]) -> dict:
    out = subprocess.run([sys.executable, "-c", _QUANT_PROBE, ",".join(types)], env=env, capture_output=True,
                         text=True, timeout=120,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_patch_adds_the_k_quant_kernels_and_their_dispatch_cases_once():
    text = _sgemm_like()
    out = build.patch_sgemm(text)
    assert out.count("class tinyBLAS_K_AVX2") == 1
    for case in ("case GGML_TYPE_Q4_K:", "case GGML_TYPE_Q6_K:"):
        assert out.count(case) == 1 and out.index(case) < out.index("case GGML_TYPE_Q4_0:")
    assert out.index("class tinyBLAS_K_AVX2") < out.index("//PPC Implementation")


@pytest.mark.parametrize("variant", list(build.VARIANTS))
def test_k_quant_and_q4_1_batches_equal_columns_alone_and_the_stock_kernels(variant):
    """Q4_K and Q6_K x Q8_K, and Q4_1 x Q8_1, through ggml itself (random weights, no model), on each variant this
    machine can run: a column of a 2- to 13-column product equals the same column computed alone
    (this kernel too since it takes one-row products), bit for bit, on 1 and 2 threads, and both
    equal what the stock library computes (its vec_dot for a column alone); the variant's library
    really holds the kernel (else this would compare stock with stock)."""
    if variant not in build.built_variants():
        pytest.skip(f"variant {variant} not built here")
    if not set(build.required_flags(variant)) <= build.cpu_flags():
        pytest.skip(f"this CPU cannot run variant {variant}")
    lib = build.variant_lib(variant).read_bytes()
    assert b"tinyBLAS_K_AVX2" in lib and b"tinyBLAS_Q4_1_AVX" in lib
    env = {**_clean_env(), "GGML_CPU_TILED_MM": "0"}  # the backend's setting
    types = ("Q4_K", "Q6_K", "Q4_1")
    ours = _quant_products({**env, native.VARIANT_ENV: variant}, types)
    stock = _quant_products({**env, "ADASPARK_STOCK_KERNELS": "1"}, types)
    assert ours.pop("status") == "q4_1-tinyblas" and stock.pop("status").startswith("stock")
    assert len(ours) == 60  # 3 types x 2 row counts x 5 batch sizes x 2 thread counts
    for key, got in ours.items():
        assert got["batched"] == got["alone"], f"{key}: a batched column differs from the column alone"
        assert got["batched"] == stock[key]["batched"], f"{key}: differs from the stock library's product"
        assert got["alone"] == stock[key]["alone"], f"{key}: a column alone differs from the stock vec_dot's"
        assert got["err"] < 1.0, f"{key}: far from the float product ({got['err']})"


def test_patch_puts_the_q0_kernel_inside_the_stock_q0_cases():
    text = _sgemm_like()
    out = build.patch_sgemm(text)
    assert out.count("class tinyBLAS_Q0_ZMM") == 1 and out.index("class tinyBLAS_Q0_ZMM") < out.index("//PPC Implementation")
    for a in ("q8_0", "q4_0", "q5_0"):
        case = out.index(f"case GGML_TYPE_{a.upper()}:")
        ours = out.index(f"tinyBLAS_Q0_ZMM<block_{a}> tb", case)
        # ours first in its case (compiled in only where ADASPARK_Q0_ZMM is 1), the stock code after it
        assert out.index("#if ADASPARK_Q0_ZMM", case) < ours < out.index("// stock code", case)
        assert out.count(f"tinyBLAS_Q0_ZMM<block_{a}> tb") == 1
    # one-row products: the Q0 kernel takes them where it is compiled in, the K-quant kernel too
    assert build._N1_ANCHOR not in out and out.count("if (n < 2 && !(n == 1 && Ctype == GGML_TYPE_F32") == 1
    assert out.count("(ADASPARK_Q0_ZMM && (adaspark_one_row & 4) && Btype == GGML_TYPE_Q8_0") == 1
    assert out.count("(ADASPARK_K_ONE_ROW && (adaspark_one_row & 2) && Btype == GGML_TYPE_Q8_K") == 1
    assert out.count("(ADASPARK_Q4_1_ONE_ROW && (adaspark_one_row & 1) && Btype == GGML_TYPE_Q8_1") == 1
    # the run-time switch: defined once, outside the kernels' anonymous namespace, before its reader
    switch = out.index("int adaspark_one_row_kernels = 7;")
    assert out.count("int adaspark_one_row_kernels") == 1
    assert out.index("} // namespace") < switch < out.index("__atomic_load_n(&adaspark_one_row_kernels")
    # its readers: the one-row check, and each Q0 case for the wide tiles' bit
    assert out.count("__atomic_load_n(&adaspark_one_row_kernels") == 4
    assert out.count("tb.wide_one_row = (__atomic_load_n(&adaspark_one_row_kernels, __ATOMIC_RELAXED) & 8) != 0;") == 3
    for missing in (*build._Q0_ANCHORS.values(), build._N1_ANCHOR, build._SWITCH_ANCHOR):
        with pytest.raises(build.BuildError):
            build.patch_sgemm(text.replace(missing, "// changed upstream"))


@pytest.mark.parametrize("variant", list(build.VARIANTS))
def test_q0_batches_equal_columns_alone_and_the_stock_kernels(variant):
    """Q4_0, Q5_0 and Q8_0 x Q8_0 through ggml itself (random weights, no model), on each variant
    this machine can run: a column of a 2- to 13-column product (AdaSpark's zmm kernel on the
    AVX-512 VNNI variants, stock tinyBLAS elsewhere) equals the same column computed alone (the
    zmm kernel too on the VNNI variants), bit for bit, on 1 and 2 threads, and both equal the
    stock library's (its tinyBLAS for the batch, its vec_dot for a column alone); a column alone
    in the wide tiles (the switch's bit 8: 8 weight rows a tile) equals it too; the VNNI
    variants' libraries really hold the kernel."""
    if variant not in build.built_variants():
        pytest.skip(f"variant {variant} not built here")
    if not set(build.required_flags(variant)) <= build.cpu_flags():
        pytest.skip(f"this CPU cannot run variant {variant}")
    has_kernel = {"AVX512", "AVX512_VNNI"} <= set(build.VARIANTS[variant])
    assert (b"tinyBLAS_Q0_ZMM" in build.variant_lib(variant).read_bytes()) == has_kernel
    env = {**_clean_env(), "GGML_CPU_TILED_MM": "0"}  # the backend's setting
    types = ("Q4_0", "Q5_0", "Q8_0")
    ours = _quant_products({**env, native.VARIANT_ENV: variant}, types)
    stock = _quant_products({**env, "ADASPARK_STOCK_KERNELS": "1"}, types)
    assert ours.pop("status") == "q4_1-tinyblas" and stock.pop("status").startswith("stock")
    assert len(ours) == 60  # 3 types x 2 row counts x 5 batch sizes x 2 thread counts
    for key, got in ours.items():
        assert got["batched"] == got["alone"], f"{key}: a batched column differs from the column alone"
        assert got["batched"] == stock[key]["batched"], f"{key}: differs from the stock library's product"
        assert got["alone"] == stock[key]["alone"], f"{key}: a column alone differs from the stock vec_dot's"
        assert got["wide"] == got["alone"], f"{key}: a column alone in the wide tiles differs"
        assert got["err"] < 1.0, f"{key}: far from the float product ({got['err']})"


_STOCK_ROWS_PROBE = """
import hashlib, json, sys
from adaspark_app import native
native.activate()
from adaspark_app.engine.backend import LlamaBackend, default_model_path
b = LlamaBackend(default_model_path(), n_ctx=512, n_threads=int(sys.argv[1]))
text = "def fib(n):\\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\\n" * 8 + "Explain this code."
toks = b.tokenize(text)[:160]
n = len(toks) - 1
b.prefill(toks[:-1], 0, argmax=False)
chain, one = [toks[-1]], []
for i in range(6):
    out = b.verify([chain[-1]], [n + i], [(0,)])
    one.append(hashlib.sha256(b.logits_rows(1)[0].tobytes()).hexdigest())
    chain.append(int(out.argmax[0]))
b.seq_rm(0, n, -1)
b.verify(chain[:6], list(range(n, n + 6)), [(0,)] * 6)
batch = [hashlib.sha256(r.tobytes()).hexdigest() for r in b.logits_rows(6)]
print(json.dumps({"status": native.status(), "variant": native.variant(), "one": one, "batch": batch}))
"""


def _stock_rows(env: dict, threads: int) -> dict:
    out = subprocess.run([sys.executable, "-c", _STOCK_ROWS_PROBE, str(threads)], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.model
def test_bundled_model_rows_equal_the_stock_librarys():
    """On the bundled model (Q4_1 layers: AdaSpark's Q4_1 kernel; its tied Q8_0 output matrix:
    the Q0 kernel on the VNNI variants, for one-row steps too) 6 one-row steps and the same 6 rows
    verified as one batch give logits bit-identical to the stock library's, on 1 and 2 threads:
    the batch-vs-alone tests compare a kernel with itself where it also takes one-row products.
    On this CPU's own variant only: the stock library is compiled for this CPU, and a lesser
    variant's other code may sum otherwise (here icelake, with the Q0 kernel, and skylakex,
    without, give the same logits as each other and differ from it at the first step: zen4 adds
    only AVX512_BF16 to icelake, used by the BF16 K cache's dot products; haswell differs too)."""
    variant = build.best_variant(build.cpu_flags(), among=build.built_variants())
    if variant is None or variant != build.best_variant(build.cpu_flags()):
        pytest.skip("this CPU's own variant is not built here")
    if not {"AVX512", "AVX512_VNNI"} <= set(build.VARIANTS[variant]):
        pytest.skip(f"variant {variant} has no Q0 kernel")
    env = _clean_env()
    for threads in (1, 2):
        # with ggml's own attention: AdaSpark's attention kernel sums otherwise by design
        # (tests/test_native_attention.py checks it against a float64 reference)
        ours = _stock_rows({**env, native.VARIANT_ENV: variant, "ADASPARK_STOCK_ATTENTION": "1"}, threads)
        stock = _stock_rows({**env, "ADASPARK_STOCK_KERNELS": "1"}, threads)
        assert ours["variant"] == variant and stock["status"].startswith("stock")
        assert ours["one"] == stock["one"], f"{threads} thread(s): a one-row step differs from the stock library's"
        assert ours["batch"] == stock["batch"], f"{threads} thread(s): a verified row differs from the stock library's"
        assert ours["batch"] == ours["one"], f"{threads} thread(s): a verified row differs from its one-row step"


def _unpacked(tmp_path, version: str, files: dict[str, str]):
    """A folder laid out as pip unpacks llama-cpp-python's sdist to build it: pip-install-*/NAME_*/."""
    root = tmp_path / "pip-install-abc" / "llama-cpp-python_0123"
    (root / "llama_cpp").mkdir(parents=True)
    (root / "llama_cpp" / "__init__.py").write_text(f'__version__ = "{version}"\n')
    vendor = root / "vendor" / "llama.cpp"
    for rel, text in files.items():
        (vendor / rel).parent.mkdir(parents=True, exist_ok=True)
        (vendor / rel).write_text(text)
    return vendor


TREE = {"CMakeLists.txt": "project(x)\n", "ggml/src/ggml-cpu/ops.cpp": "int f();\n", "models/vocab.gguf": "GGUF"}


def test_a_source_pip_unpacked_is_used_only_when_it_is_the_pinned_one(tmp_path, monkeypatch):
    """The install builds the kernels from the llama-cpp-python source pip unpacked (no second
    download) only when its version is the pinned one and its files hash to VENDOR_DIGEST; a tree
    with one byte changed, or another version, is not used (the build then downloads the sdist)."""
    vendor = _unpacked(tmp_path, build.LLAMA_CPP_PYTHON, TREE)
    monkeypatch.setattr(build, "VENDOR_DIGEST", build.source_digest(vendor))
    assert build.pip_source(tmp_path) == vendor
    (vendor / "ggml/src/ggml-cpu/ops.cpp").write_text("int f(); // changed\n")
    assert build.pip_source(tmp_path) is None
    other = tmp_path / "other"
    vendor2 = _unpacked(other, "0.3.35", TREE)
    monkeypatch.setattr(build, "VENDOR_DIGEST", build.source_digest(vendor2))
    assert build.pip_source(other) is None


def test_the_source_digest_skips_what_the_kernel_build_never_reads(tmp_path):
    """Vocabulary files and docs (VENDOR_SKIP) are neither hashed nor copied; every other file is,
    by name and content."""
    vendor = _unpacked(tmp_path, build.LLAMA_CPP_PYTHON, TREE)
    assert build.source_files(vendor) == ["CMakeLists.txt", "ggml/src/ggml-cpu/ops.cpp"]
    before = build.source_digest(vendor)
    (vendor / "models/vocab.gguf").write_text("changed")
    assert build.source_digest(vendor) == before
    (vendor / "CMakeLists.txt").rename(vendor / "CMakeLists2.txt")
    assert build.source_digest(vendor) != before
