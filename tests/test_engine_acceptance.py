"""The acceptance model on real rounds of the bundled model (n-gram only, no drafter): after the
first request, the fitted model's log loss is below the head-based estimate's (§3.3 guard)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from adaspark_app.engine.chat_engine import ChatEngine

pytestmark = pytest.mark.model  # every test here loads the bundled model

LONGPASTE = Path(__file__).parent.parent / "benchmarks" / "corpora" / "longpaste.jsonl"


def test_fitted_log_loss_beats_head_estimate_on_requests_after_the_first(model_path):
    """Requests that paste a long text and ask about it (public ShareGPT turns); the labels are
    the target's own verify outcomes. Both estimates are scored on each round before either
    learns from it (request_log_loss), so this compares predictions, not fits. The fitted model
    prices chain nodes by their proposal class's precision and learns bucket deviations; the
    head-based estimate prices every n-gram node at one p_src with a per-request offset. With
    one p_src in both (the model before class precision) the two were within 0.5% here.

    The width is pinned (16 rows), so which nodes are verified, and so the outcome, is a function
    of the model's outputs alone: under `adaspark` the widths follow measured verify times, and
    the test failed at random in a loaded run. Measured here: fitted/head 0.90 at 16 rows, 0.91
    at 8."""
    prompts = [json.loads(line)["turns"][0] for line in LONGPASTE.read_text().splitlines()[:8]]
    eng = ChatEngine(model_path, arm="pinned:16", n_ctx=4096, n_threads=2)
    fit = head = 0.0
    nodes = 0
    try:
        for i, text in enumerate(prompts):
            eng.generate(f"c{i}", [{"role": "user", "content": text}], max_tokens=96)
            f, h, n = eng.decoder.acceptance.request_log_loss()
            eng.reset_conversation()
            if i == 0 or n == 0:
                continue
            fit += f * n
            head += h * n
            nodes += n
        priced_by = eng.decoder.acceptance.priced_by
    finally:
        eng.close()
    assert nodes > 100, nodes  # the requests really verified n-gram candidates
    assert fit < 0.96 * head, (fit / nodes, head / nodes)
    assert priced_by == "fitted"  # and the guard handed pricing to it
