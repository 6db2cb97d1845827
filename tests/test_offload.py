"""`--gpu-layers` and the GPU's part of the device fingerprint, on a CPU-only build (CI has no
GPU): the rules are pure functions of the build's answer to llama_supports_gpu_offload(), and the
CLI's fallback runs the real engine on the bundled model."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from adaspark_app.engine.offload import (ALL_LAYERS, Offload, build_can_offload, cuda_kernels,
                                         cuda_kernels_notice, parse_gpu_layers, parse_nvidia_smi, plan_offload)
from adaspark_app.errors import ArgumentError
from adaspark_app.store.fingerprint import _short_hash, device_fingerprint


@pytest.mark.parametrize("given,layers", [("all", ALL_LAYERS), ("ALL", ALL_LAYERS), ("0", 0), ("12", 12),
                                          (12, 12), (-1, ALL_LAYERS), (None, None)])
def test_gpu_layers_values(given, layers):
    assert parse_gpu_layers(given) == layers


@pytest.mark.parametrize("given", ["x", "-3", "1.5", "", True, 10**6])
def test_bad_gpu_layers_are_one_line_naming_the_option(given):
    with pytest.raises(ArgumentError, match=r"^--gpu-layers must be a number of layers .* or 'all', not ") as err:
        parse_gpu_layers(given)
    assert "\n" not in str(err.value)


def test_every_layer_on_the_gpu_by_default_where_the_build_can_offload():
    assert plan_offload(None, True) == Offload(ALL_LAYERS)
    assert plan_offload(0, True) == Offload(0) and not plan_offload(0, True).on_gpu
    assert plan_offload(20, True) == Offload(20)
    assert plan_offload(20, True).describe() == "20 layers on the GPU"


def test_a_cpu_build_runs_on_the_cpu_and_says_so_only_when_gpu_layers_were_asked():
    assert plan_offload(None, False) == Offload(0)
    assert plan_offload(0, False) == Offload(0)
    for asked in (ALL_LAYERS, 20):
        plan = plan_offload(asked, False)
        assert plan.n_gpu_layers == 0 and plan.describe() == "CPU"
        assert "running on the CPU" in plan.notice and "\n" not in plan.notice


def test_nvidia_smi_answer_names_the_gpu():
    text = "NVIDIA H200, 9.0, 580.65.06\nNVIDIA H200, 9.0, 580.65.06\n"
    assert parse_nvidia_smi(text) == {"name": "NVIDIA H200", "compute_capability": "9.0", "driver": "580.65.06"}
    assert parse_nvidia_smi("") is None
    assert parse_nvidia_smi("NVIDIA-SMI has failed because it couldn't communicate with the driver") is None


def test_a_cpu_device_keeps_its_id_and_each_gpu_setting_is_its_own_device():
    cpu = device_fingerprint(2, "llama-cpp-python 0.3.36; CPU : AVX2 = 1")
    legacy = {k: cpu[k] for k in ("kind", "backend", "cpu", "gpu", "machine", "system", "n_threads", "llama_build")}
    assert cpu["id"] == _short_hash(legacy)  # the fields (and so the id) a CPU device had before GPUs
    assert device_fingerprint(2, "llama-cpp-python 0.3.36; CPU : AVX2 = 1", gpu_layers=0) == cpu
    info = "llama-cpp-python 0.3.36; CUDA : ARCHS = 900"
    h200 = dict(gpu="NVIDIA H200", gpu_layers=ALL_LAYERS, gpu_detail={"compute_capability": "9.0", "driver": "580.65.06"})
    base = device_fingerprint(2, info, **h200)
    assert base["backend"] == "cuda" and base["gpu_layers"] == ALL_LAYERS
    assert base["name"].startswith("NVIDIA H200 (compute capability 9.0, driver 580.65.06), all layers on it")
    others = [dict(h200, gpu="NVIDIA RTX 4090"), dict(h200, gpu_layers=20),
              dict(h200, gpu_detail={"compute_capability": "9.0", "driver": "590.1"})]
    ids = {base["id"], cpu["id"]} | {device_fingerprint(2, info, **o)["id"] for o in others}
    assert len(ids) == 5  # another GPU, layer split or driver never shares a cost table
    stock, exact = ({**h200["gpu_detail"], "kernels": cuda_kernels(rows)} for rows in (None, 64))
    assert stock["kernels"] == "stock" and exact["kernels"] == "batch-invariant to 64 rows"
    assert (device_fingerprint(2, info, **dict(h200, gpu_detail=stock))["id"]
            != device_fingerprint(2, info, **dict(h200, gpu_detail=exact))["id"])  # the kernels set the curve
    # so do the CUDA graphs: a graph per width prices a verify and the step after it otherwise
    graphs = {**h200["gpu_detail"], "kernels": cuda_kernels(64, True)}
    assert graphs["kernels"] == "batch-invariant to 64 rows, a CUDA graph per width"
    assert cuda_kernels(None, False) == "stock" and cuda_kernels(None, True) == "stock, a CUDA graph per width"
    # and where greedy tokens are taken: logits copied to the host cost a wide verify more
    on_gpu = {**h200["gpu_detail"], "kernels": cuda_kernels(64, True, tokens_on_device=True)}
    assert on_gpu["kernels"] == "batch-invariant to 64 rows, a CUDA graph per width, greedy tokens on the GPU"
    assert (device_fingerprint(2, info, **dict(h200, gpu_detail=on_gpu))["id"]
            != device_fingerprint(2, info, **dict(h200, gpu_detail=graphs))["id"])
    assert (device_fingerprint(2, info, **dict(h200, gpu_detail=graphs))["id"]
            != device_fingerprint(2, info, **dict(h200, gpu_detail=exact))["id"])
    # and whether a verify's argmaxes are one kernel or a kernel per row (only where tokens are on the GPU)
    one = {**h200["gpu_detail"], "kernels": cuda_kernels(64, True, tokens_on_device=True, argmax_one_launch=True)}
    assert one["kernels"].endswith("greedy tokens on the GPU in one launch")
    assert (device_fingerprint(2, info, **dict(h200, gpu_detail=one))["id"]
            != device_fingerprint(2, info, **dict(h200, gpu_detail=on_gpu))["id"])
    assert cuda_kernels(64, True, tokens_on_device=False, argmax_one_launch=True) == graphs["kernels"]


def test_a_gpu_whose_kernels_may_round_a_verify_otherwise_says_so_in_one_line():
    for rows, why in ((None, "stock CUDA kernels"), (0, "ADASPARK_CUDA_EXACT=0"), (16, "only to 16 rows")):
        note = cuda_kernels_notice(rows, 64)
        assert note is not None and why in note and "\n" not in note
    assert cuda_kernels_notice(64, 64) is None


@pytest.mark.model
def test_run_with_gpu_layers_on_a_cpu_build_prints_one_notice_and_replies_as_on_the_cpu(tmp_path):
    """`adaspark run --gpu-layers all` on this (CPU-only) build: exit 0, one notice, and the very
    replies `--gpu-layers 0` gives; a bad value or config key is one line, exit 2."""
    assert not build_can_offload(), "this test is for a CPU-only llama.cpp build"
    script = tmp_path / "s.jsonl"
    script.write_text(json.dumps({"id": "a", "turns": ["Name three rivers in Europe."]}) + "\n")

    def run(*extra: str, config: str | None = None) -> tuple[subprocess.CompletedProcess, list[str]]:
        out = tmp_path / "out.jsonl"
        env = None
        if config is not None:
            (tmp_path / "config.toml").write_text(config)
            env = {**os.environ, "ADASPARK_CONFIG": str(tmp_path / "config.toml")}
        p = subprocess.run([sys.executable, "-m", "adaspark_app.cli", "run", str(script), "--max-tokens", "24",
                            "--fresh-store", "--out", str(out), *extra], capture_output=True, text=True,
                           timeout=300, env=env)
        texts = [json.loads(line)["text"] for line in out.read_text().splitlines()] if p.returncode == 0 else []
        return p, texts

    cpu, cpu_texts = run("--gpu-layers", "0")
    assert cpu.returncode == 0 and "note" not in cpu.stderr, cpu.stderr
    for extra, config in ((("--gpu-layers", "all"), None), ((), 'gpu_layers = "all"\n'),
                          (("--gpu-layers", "12"), 'gpu_layers = 0\n')):
        p, texts = run(*extra, config=config)
        assert p.returncode == 0, p.stderr
        notes = [line for line in p.stderr.splitlines() if line.strip()]
        assert len(notes) == 1 and "cannot offload to a GPU" in notes[0] and "running on the CPU" in notes[0], notes
        assert texts == cpu_texts and texts[0].strip()
    bad, _ = run("--gpu-layers", "most")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--gpu-layers must be" in bad.stderr
    bad, _ = run(config="gpu_layers = true\n")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "key 'gpu_layers'" in bad.stderr, bad.stderr


@pytest.mark.model
def test_the_cache_types_follow_where_the_layers_run_and_the_context_size_holds_on_both(model_path):
    """A GPU gets an F16 K and V cache (the one pair every CUDA attention kernel reads unconverted);
    the CPU keeps K in BF16 (bit-identical verify rows), also when GPU layers were asked of a
    CPU-only build. The two pairs take the same bytes per token, so the context-size estimate
    (engine/context_size.py) holds on either device."""
    from adaspark_app.engine.backend import (GGML_TYPE_BF16, GGML_TYPE_F16, GPU_KV_TYPES, LlamaBackend,
                                             kv_cache_types)
    from adaspark_app.engine.context_size import kv_bytes_per_token
    from adaspark_app.gguf_file import read_gguf_header

    assert kv_cache_types(True) == GPU_KV_TYPES == (GGML_TYPE_F16, GGML_TYPE_F16)
    assert kv_cache_types(False) == (GGML_TYPE_BF16, GGML_TYPE_F16)
    assert not build_can_offload()
    b = LlamaBackend(model_path, n_ctx=256, gpu_layers="all")
    try:
        assert not b.offload.on_gpu and b.kv_types == kv_cache_types(False)
    finally:
        b.close()
    kv = read_gguf_header(model_path).kv
    cpu = kv_bytes_per_token(kv)
    assert cpu and kv_bytes_per_token(kv, *GPU_KV_TYPES) == cpu


@pytest.mark.model
@pytest.mark.parametrize("can_offload, gpu_layers, drafter_layers", [(True, None, ALL_LAYERS), (True, 0, 0),
                                                                     (False, "all", 0)])
def test_the_drafter_goes_where_the_targets_layers_go_and_reports_name_the_device(model_path, monkeypatch, can_offload, gpu_layers,
                                                      drafter_layers):
    """The DSpark drafter's layers follow the target's offload (llama-server's -ngld does the same):
    all on a GPU where the target's are, none on the CPU. This CPU-only build is told it can offload
    (llama.cpp then finds no GPU and runs every layer on the CPU), so the choice is seen here."""
    from adaspark_app.bench.runner import device_line
    from adaspark_app.engine import backend
    from adaspark_app.engine.chat_engine import ChatEngine
    from adaspark_app.engine.dspark import DSparkDrafter

    monkeypatch.setattr(backend, "build_can_offload", lambda: can_offload)
    seen = []
    load = DSparkDrafter._load

    def spy(self, n_threads, n_gpu_layers):
        seen.append(n_gpu_layers)
        return load(self, n_threads, n_gpu_layers)

    monkeypatch.setattr(DSparkDrafter, "_load", spy)
    eng = ChatEngine(model_path, drafter_path="default", n_ctx=512, gpu_layers=gpu_layers)
    try:
        assert eng.drafter_name and seen == [drafter_layers]
        # and a report names the device the arms ran on: here no nvidia-smi and no patched library;
        # where layers go to a GPU, greedy tokens are taken there by default
        assert device_line(eng) == ("GPU, all layers on the GPU, CUDA kernels stock, greedy tokens on the GPU"
                                    if drafter_layers else "CPU")
        assert eng.backend.argmax_on_device == bool(drafter_layers)
        if drafter_layers:  # told every layer goes to a GPU that is not there, it still drafts and replies
            assert eng.generate("c", [{"role": "user", "content": "Count: one two three"}], max_tokens=4).n_tokens > 0
    finally:
        eng.close()
