"""The acceptance model on real rounds of the bundled model (n-gram only, no drafter): after the
first request, pricing chain nodes by their class precision beats the one p_src (§3.3)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from adaspark_app.engine.chat_engine import ChatEngine

pytestmark = pytest.mark.model  # every test here loads the bundled model

LONGPASTE = Path(__file__).parent.parent / "benchmarks" / "corpora" / "longpaste.jsonl"


def _paste_log_losses(model_path, prompts):
    """(fitted, head-based) log loss per labelled node over the requests after the first, and the
    number of labelled nodes: each estimate scored on each round before either learns from it."""
    eng = ChatEngine(model_path, arm="pinned:16", n_ctx=4096, n_threads=2)
    fit = head = 0.0
    nodes = 0
    try:
        for i, text in enumerate(prompts):
            eng.generate(f"c{i}", [{"role": "user", "content": text}], max_tokens=96)
            f, h, n = eng.decoder.learners.acceptance.request_log_loss()
            eng.reset_conversation()
            if i == 0 or n == 0:
                continue
            fit += f * n
            head += h * n
            nodes += n
    finally:
        eng.close()
    assert nodes > 100, nodes  # the requests really verified n-gram candidates
    return fit / nodes, head / nodes, nodes


def test_class_precision_beats_one_p_src_in_both_estimates(model_path, monkeypatch):
    """Requests that paste a long text and ask about it (public ShareGPT turns); the labels are
    the target's own verify outcomes, and each estimate is scored on each round before either
    learns from it (request_log_loss), so this compares predictions, not fits.

    Both estimates price a chain node by its proposal class's precision on the committed text
    (ng_prec). Run once with that precision withheld (every n-gram node at the one p_src, the
    paper's pricing) and once with it: with it, both log losses fall. Measured here: 0.90 of the
    one-p_src loss for the fitted model at 16 rows, 0.91 at 8, before the head-based estimate took
    it too. And the fitted model, which learns bucket deviations on top, stays within 2% of the
    head-based estimate (it was within 0.5% with one p_src in both).

    The width is pinned (16 rows), so which nodes are verified, and so the outcome, is a function
    of the model's outputs alone: under `adaspark` the widths follow measured verify times, and
    the test failed at random in a loaded run."""
    prompts = [json.loads(line)["turns"][0] for line in LONGPASTE.read_text().splitlines()[:8]]
    fit, head, _ = _paste_log_losses(model_path, prompts)
    from adaspark_app.learn.precision import SourcePrecision

    monkeypatch.setattr(SourcePrecision, "for_nodes", lambda self, c: np.full(len(c), np.nan))
    fit_one, head_one, _ = _paste_log_losses(model_path, prompts)
    assert fit < 0.96 * fit_one, (fit, fit_one)
    assert head < 0.96 * head_one, (head, head_one)
    assert fit < 1.02 * head, (fit, head)
