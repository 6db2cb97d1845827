"""The acceptance model on real rounds of the bundled model (n-gram only, no drafter): after the
first request, pricing chain nodes by their class precision beats the one p_src (§3.3)."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest

from adaspark_app.engine.chat_engine import ChatEngine
from benchmarks.common import read_jsonl

pytestmark = [pytest.mark.model, pytest.mark.long]  # every test here loads the bundled model

LONGPASTE = Path(__file__).parent.parent / "benchmarks" / "corpora" / "longpaste.jsonl.gz"
# A paste learned from, not scored (paste 17, 396 tokens), then three short ones that are scored
# (pastes 1, 2 and 4; 332-413 tokens): a paste's prefill is most of its cost, so the long ones are
# left out for time. On these four the fitted loss was 0.90 of the one-p_src loss over 141 labelled
# nodes (0.90 on the corpus's first six; 0.83 with the 1,196-token paste 0 as the first, in 1.5x the time).
PASTES = (17, 1, 2, 4)


def _paste_log_losses(model_path, prompts):
    """(fitted, head-based) log loss per labelled node over the requests after the first, priced
    with the class precision (the engine's own model) and without it (a shadow model fed the same
    rounds with every ng_prec withheld, so every n-gram node at the one p_src): each estimate
    scored on each round before it learns from it, so this compares predictions, not fits."""
    from adaspark_app.learn.acceptance import AcceptanceModel

    eng = ChatEngine(model_path, arm="pinned:16", n_ctx=4096)
    acc = eng.decoder.learners.acceptance
    shadow = AcceptanceModel()
    own_learn, own_begin = acc.learn, acc.begin_request

    def learn(cands, context, p_src, labels):
        withheld = copy.copy(cands)
        withheld.ng_prec = np.full(len(cands), np.nan)
        shadow.learn(withheld, context, p_src, labels)
        own_learn(cands, context, p_src, labels)

    def begin_request():
        shadow.begin_request()
        own_begin()

    acc.learn, acc.begin_request = learn, begin_request
    sums = {"with": [0.0, 0.0], "one": [0.0, 0.0]}
    nodes = 0
    try:
        for i, text in enumerate(prompts):
            eng.generate(f"c{i}", [{"role": "user", "content": text}], max_tokens=96)
            f, h, n = acc.request_log_loss()
            f1, h1, n1 = shadow.request_log_loss()
            eng.reset_conversation()
            assert n1 == n  # the same labelled nodes
            if i == 0 or n == 0:
                continue
            for key, (a, b) in (("with", (f, h)), ("one", (f1, h1))):
                sums[key][0] += a * n
                sums[key][1] += b * n
            nodes += n
    finally:
        eng.close()
    assert nodes > 100, nodes  # the requests really verified n-gram candidates
    return ({k: (v[0] / nodes, v[1] / nodes) for k, v in sums.items()}, nodes)


def test_class_precision_beats_one_p_src_in_both_estimates(model_path):
    """Requests that paste a long text and ask about it (public ShareGPT turns); the labels are
    the target's own verify outcomes.

    Both estimates price a chain node by its proposal class's precision on the committed text
    (ng_prec). A shadow model scored on the very same rounds has that precision withheld (every
    n-gram node at the one p_src, the paper's pricing): with it, both log losses fall. Measured
    here (two runs, one per pricing, before the shadow): 0.90 of the one-p_src loss for the
    fitted model at 16 rows, 0.91 at 8. And the fitted model, which learns bucket deviations on
    top, stays within 2% of the head-based estimate.

    The width is pinned (16 rows), so which nodes are verified, and so the outcome, is a function
    of the model's outputs alone: under `adaspark` the widths follow measured verify times, and
    the test failed at random in a loaded run."""
    rows = read_jsonl(LONGPASTE)
    prompts = [rows[i]["turns"][0] for i in PASTES]
    losses, _ = _paste_log_losses(model_path, prompts)
    (fit, head), (fit_one, head_one) = losses["with"], losses["one"]
    print(f"fitted {fit:.4f} / {fit_one:.4f} = {fit / fit_one:.3f}; head {head:.4f} / {head_one:.4f} = "
          f"{head / head_one:.3f}; fitted / head {fit / head:.3f}")
    assert fit < 0.96 * fit_one, (fit, fit_one)
    assert head < 0.96 * head_one, (head, head_one)
    assert fit < 1.02 * head, (fit, head)
