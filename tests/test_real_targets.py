"""Opt-in: on the real targets (the GGUF files people run), replies byte-identical to plain decode.

Skipped unless ADASPARK_TARGETS_DIR names a directory holding files assembled by
``python benchmarks/targets/assemble.py --dir DIR`` (qwen0.5b.gguf, qwen1.5b.gguf,
gemma270m.gguf; each target whose file is missing is skipped on its own). Run with

    ADASPARK_TARGETS_DIR=~/.cache/adaspark/targets python3 -m pytest -q -m target tests/test_real_targets.py

Two paste-and-ask prompts per target (the shortest first turns of the long-paste and pasted-code
corpora), greedy, arms `ar`, `pinned:8` (always verifies 8 rows, so multi-row kernels really
run) and `adaspark`, with the engine's self-check on.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from adaspark_app.engine.chat_engine import ChatEngine

pytestmark = [pytest.mark.target, pytest.mark.model]

TARGETS_ENV = "ADASPARK_TARGETS_DIR"
TARGETS = ("qwen0.5b", "qwen1.5b", "gemma270m")
CORPORA = Path(__file__).resolve().parents[1] / "benchmarks" / "corpora"
ARMS = ("ar", "pinned:8", "adaspark")
MAX_TOKENS = 64


def _target_path(name: str) -> Path:
    """The assembled file of target `name`, or skip the test."""
    root = os.environ.get(TARGETS_ENV)
    if not root:
        pytest.skip(f"{TARGETS_ENV} is not set (see benchmarks/targets/assemble.py)")
    path = Path(root).expanduser() / f"{name}.gguf"
    if not path.is_file():
        pytest.skip(f"{path} not assembled")
    return path


def _prompts() -> list[dict]:
    """The shortest first turn of each paste-and-ask corpus (long paste, pasted code)."""
    out = []
    for corpus in ("longpaste.jsonl", "longcode.jsonl"):
        rows = [json.loads(line) for line in (CORPORA / corpus).read_text().splitlines() if line.strip()]
        out.append(min(rows, key=lambda r: len(r["turns"][0])))
    return out


@pytest.fixture(scope="module", params=TARGETS)
def target_replies(request) -> tuple[str, dict]:
    """Per arm: (the two replies' tokens, rows the self-check verified, the widths used)."""
    path = _target_path(request.param)
    prompts = _prompts()
    out: dict[str, tuple[list[list[int]], int, dict]] = {}
    for arm in ARMS:
        eng = ChatEngine(str(path), arm=arm, n_ctx=4096, n_threads=2, self_check=True)
        try:
            tokens, widths = [], {}
            for conv in prompts:
                r = eng.generate(conv["id"], [{"role": "user", "content": conv["turns"][0]}],
                                 max_tokens=MAX_TOKENS)
                tokens.append(list(r.tokens))
                for w, n in r.widths.items():
                    widths[w] = widths.get(w, 0) + n
            out[arm] = (tokens, eng.decoder.checked_rows, widths)
        finally:
            eng.close()
    return request.param, out


def test_pinned_width_really_verifies_many_rows(target_replies):
    """pinned:8 ran multi-row verifies on this target, so the identity below covers the batch kernels."""
    name, out = target_replies
    _, checked, widths = out["pinned:8"]
    assert checked > 0, name
    assert any(int(w) > 1 for w in widths), (name, widths)


@pytest.mark.parametrize("arm", ["pinned:8", "adaspark"])
def test_replies_identical_to_ar_on_real_target(target_replies, arm):
    """Each reply's tokens equal plain decode's on the same target, byte for byte."""
    name, out = target_replies
    base, other = out["ar"][0], out[arm][0]
    assert all(base), f"{name}: ar gave an empty reply"
    same = sum(a == b for a, b in zip(base, other))
    assert same == len(base), f"{name} {arm}: {same}/{len(base)} replies identical to ar"
