"""AdaSpark's flash attention for the BF16 K / F16 V cache (native/flash_attn_bf16.inc), through
ggml itself on random inputs (no model): accurate, and a row's bits independent of its batch."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from adaspark_app import native
from adaspark_app.native import build
from test_native import _clean_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (q heads, KV heads, head dim, cells, rows): SmolLM2-135M, Qwen2.5-0.5B at a long context,
# Gemma-3-270M (dim 256, one KV head), and a dim that is not a multiple of 32 (the path without
# the 32-wide BF16 dot)
SHAPES = ((9, 3, 64, 700, 7), (14, 2, 64, 1500, 9), (4, 1, 256, 300, 5), (6, 2, 80, 100, 3))

_PROBE = """
import json, sys
from benchmarks.kernels.attention_check import check
from adaspark_app import native
out = {"status": native.activate(), "cases": []}
for heads, kv, dim, cells, rows in %r:
    for threads in (1, 2):
        r = check(heads, kv, dim, cells, rows, seed=heads + cells, threads=threads)
        out["cases"].append({"shape": [heads, kv, dim, cells, rows], "threads": threads, **r})
print(json.dumps(out))
""" % (SHAPES,)


def _run(env: dict) -> dict:
    out = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_patch_puts_the_kernel_before_ggmls_entry_and_tries_it_first():
    text = "// before\n" + build._FA_ANCHOR + "    // ggml's body\n}\n"
    out = build.patch_ops(text)
    assert out.count("static bool adaspark_flash_attn_bf16(") == 2  # the vector one (AVX-512, AVX2) and the fallback
    assert out.count(build._FA_ANCHOR) == 1
    assert out.index("adaspark_flash_attn_bf16(") < out.index(build._FA_ANCHOR)
    assert out.index(build._FA_ANCHOR + build._FA_CALL) < out.index("    // ggml's body")
    with pytest.raises(build.BuildError):
        build.patch_ops("// not ops.cpp\n")


@pytest.mark.parametrize("variant", list(build.VARIANTS))
def test_attention_rows_equal_alone_and_the_float64_reference(variant):
    """On each variant this machine can run (16 lanes with AVX-512, 8 with AVX2: haswell runs the
    AVX2 code on any CPU): every row of a batch (tree-shaped mask, 1 and 2 threads) equals the same
    row computed alone, and with 64 hidden cells added to the range, bit for bit; and the output
    is within 1e-5 of a float64 reference on the same BF16/F16 inputs (ggml's own kernel, which
    sums V in FP16, is ~2e-3 off: so this fails if the AdaSpark kernel is not the one in use)."""
    if variant not in build.built_variants():
        pytest.skip(f"variant {variant} not built here")
    if not set(build.required_flags(variant)) <= build.cpu_flags():
        pytest.skip(f"this CPU cannot run variant {variant}")
    got = _run({**_clean_env(), native.VARIANT_ENV: variant})
    assert got["status"] == "q4_1-tinyblas"
    assert b"adaspark_flash_attn_bf16" in build.variant_lib(variant).read_bytes()
    assert len(got["cases"]) == 2 * len(SHAPES)
    for case in got["cases"]:
        label = f"{variant} {case['shape']} threads {case['threads']}"
        assert case["rows_equal_alone"] == case["rows"], f"{label}: a row differs from the row alone"
        assert case["rows_equal_padded"] == case["rows"], f"{label}: hidden cells changed a row"
        assert case["max_abs_error"] < 1e-5, f"{label}: error {case['max_abs_error']}"


def test_stock_attention_is_what_the_accuracy_bound_tells_apart():
    """The 1e-5 bound above can fail: ggml's stock kernel misses it on the same inputs."""
    got = _run({**_clean_env(), "ADASPARK_STOCK_KERNELS": "1"})
    assert got["status"].startswith("stock")
    assert max(c["max_abs_error"] for c in got["cases"]) > 1e-4
