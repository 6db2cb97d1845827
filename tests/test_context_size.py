"""The chat's default context (engine/context_size.py): training context, free memory, the maximum."""

from __future__ import annotations

import subprocess
import sys

import pytest

from adaspark_app.engine.context_size import (FALLBACK_N_CTX, MAX_CHAT_N_CTX, choose_n_ctx, default_chat_n_ctx,
                                              kv_bytes_per_token, mem_available)
from adaspark_app.engine.limits import MIN_N_CTX

SMOLLM2 = {"general.architecture": "llama", "llama.block_count": 30, "llama.context_length": 8192,
           "llama.embedding_length": 576, "llama.attention.head_count": 9, "llama.attention.head_count_kv": 3}
PER_TOKEN = 30 * 3 * (64 * 2 + 64 * 2)  # layers x KV heads x (K BF16 + V F16) x head dim 64


def test_kv_bytes_per_token_known_answers():
    assert kv_bytes_per_token(SMOLLM2) == PER_TOKEN == 23040
    # explicit key/value lengths win over embedding/heads (Gemma 3 has 256-wide heads)
    gemma = {"general.architecture": "gemma3", "gemma3.block_count": 18, "gemma3.embedding_length": 640,
             "gemma3.attention.head_count": 4, "gemma3.attention.head_count_kv": 1,
             "gemma3.attention.key_length": 256, "gemma3.attention.value_length": 256}
    assert kv_bytes_per_token(gemma) == 18 * 1 * (256 * 2 + 256 * 2)
    # per-layer KV heads (a list), one layer without attention
    mixed = {"general.architecture": "x", "x.block_count": 3, "x.embedding_length": 128,
             "x.attention.head_count": 2, "x.attention.head_count_kv": [2, 0, 1]}
    assert kv_bytes_per_token(mixed) == (2 + 0 + 1) * (64 * 2 + 64 * 2)
    # other cache types: F32 K and Q8_0 V
    assert kv_bytes_per_token(SMOLLM2, k_type=0, v_type=8) == 30 * 3 * (64 * 4 + 64 * 34 / 32)
    assert kv_bytes_per_token({"general.architecture": "llama"}) is None
    assert kv_bytes_per_token({}) is None


def test_choose_n_ctx_known_answers():
    plenty = 64 << 30
    c = choose_n_ctx(SMOLLM2, plenty)
    assert (c.n_ctx, c.reason, c.trained) == (8192, "training context", 8192)
    # 100 MB free: half of it over 23040 bytes a token is 2170 tokens, rounded down to 2048
    c = choose_n_ctx(SMOLLM2, 100_000_000)
    assert (c.n_ctx, c.reason, c.memory_cap) == (2048, "free memory", 2170)
    c = choose_n_ctx({**SMOLLM2, "llama.context_length": 131072}, plenty)
    assert (c.n_ctx, c.reason) == (MAX_CHAT_N_CTX, "the chat maximum")
    no_train = {k: v for k, v in SMOLLM2.items() if k != "llama.context_length"}
    assert choose_n_ctx(no_train, plenty).n_ctx == FALLBACK_N_CTX
    assert choose_n_ctx(no_train, plenty).reason == "fallback"
    assert choose_n_ctx(SMOLLM2, None).n_ctx == 8192  # no /proc/meminfo: no memory cap
    assert choose_n_ctx(SMOLLM2, 1000).n_ctx == MIN_N_CTX  # never below what llama.cpp needs
    assert choose_n_ctx({**SMOLLM2, "llama.context_length": 200}, plenty).n_ctx == 200  # below 256: kept


def test_mem_available_reads_meminfo(tmp_path):
    p = tmp_path / "meminfo"
    p.write_text("MemTotal:       24684084 kB\nMemFree:        20877504 kB\nMemAvailable:   23032780 kB\n")
    assert mem_available(str(p)) == 23032780 * 1024
    p.write_text("MemTotal: 1 kB\n")
    assert mem_available(str(p)) is None
    assert mem_available(str(tmp_path / "none")) is None


def test_bundled_model_default(model_path):
    c = default_chat_n_ctx(model_path)  # reads the header only: no model is loaded
    assert c.trained == 8192 and c.kv_bytes_per_token == PER_TOKEN
    assert c.n_ctx <= 8192 and c.n_ctx % 256 == 0


def test_chat_n_ctx_is_checked_before_anything_starts():
    proc = subprocess.run([sys.executable, "-m", "adaspark_app.cli", "chat", "--n-ctx", "10"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "--n-ctx" in lines[0] and "10" in lines[0], proc.stderr


@pytest.mark.model
def test_engine_config_without_n_ctx_opens_the_models_default(model_path):
    """`adaspark chat` without --n-ctx leaves EngineConfig.n_ctx None: the engine process opens the
    loaded model's own default (so a model picked later gets its own)."""
    from adaspark_app.engine.worker import EngineConfig

    engine = EngineConfig(model_path=model_path, n_ctx=None)()
    try:
        assert engine.backend.n_ctx == default_chat_n_ctx(model_path).n_ctx
    finally:
        engine.close()


def test_the_drafters_kv_counts_in_the_memory_cap(model_path, monkeypatch):
    from adaspark_app.engine import context_size
    from adaspark_app.engine.default_drafter import default_drafter_path

    # the shipped drafter: 1 layer x 3 KV heads x (64 + 64) x 4 bytes (F32 K and V, as dspark.py makes it)
    assert context_size.drafter_kv_bytes_per_token(default_drafter_path()) == 1 * 3 * (64 * 4 + 64 * 4) == 1536
    # 100 MB free: without a drafter 2170 tokens fit (-> 2048); with it 50e6 // (23040 + 1536) = 2034 (-> 1792)
    monkeypatch.setattr(context_size, "mem_available", lambda: 100_000_000)
    alone = default_chat_n_ctx(model_path)
    with_drafter = default_chat_n_ctx(model_path, "default")
    assert (alone.n_ctx, alone.memory_cap) == (2048, 2170)
    assert (with_drafter.n_ctx, with_drafter.memory_cap) == (1792, 2034)
    assert with_drafter.kv_bytes_per_token == PER_TOKEN + 1536
