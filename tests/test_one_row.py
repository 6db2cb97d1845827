"""The one-row kernel choice (engine/one_row.py): a seeded synthetic trial with known answers, and
on the bundled model the switch it drives (native.one_row_switch) changes no bit of a step."""

from __future__ import annotations

import hashlib
import json
import random
import subprocess
import sys

import pytest

from adaspark_app.engine.one_row import MARGIN, OURS, VEC_DOT, WARMUP_STEPS, WIDE, OneRowChooser, chooser_for
from adaspark_app.errors import ConfigError


def _run_trial(chooser: OneRowChooser, ours_s: float, vec_s: float, seed: int, noise: float = 0.05,
               drift: float = 0.0, outliers: float = 0.05, slow=lambda step: 1.0,
               wide_s: float | None = None) -> list[str]:
    """Feed the chooser steps whose time depends on its setting (plus noise, outliers, a linear
    drift and a factor ``slow(step)``; the wide tiles take ``wide_s``, else AdaSpark's kernels'
    time); returns the settings it asked for, in order."""
    rng = random.Random(seed)
    asked = []
    step = 0
    while chooser.chosen is None:
        s = chooser.setting()
        asked.append(s)
        base = {OURS: ours_s, VEC_DOT: vec_s, WIDE: ours_s if wide_s is None else wide_s}[s]
        t = base * (1 + drift * step) * (1 + rng.uniform(-noise, noise)) * slow(step)
        if rng.random() < outliers:
            t *= 3  # an outlier: the machine was busy
        chooser.record(t)
        step += 1
    return asked


@pytest.mark.parametrize("seed", range(5))
def test_trial_picks_the_faster_setting(seed):
    c = OneRowChooser()
    _run_trial(c, ours_s=0.090, vec_s=0.060, seed=seed)
    assert c.chosen == VEC_DOT and 0.6 < c.ratio < 0.75
    c = OneRowChooser()
    _run_trial(c, ours_s=0.040, vec_s=0.054, seed=seed)
    assert c.chosen == OURS and c.ratio > 1.2


@pytest.mark.parametrize("seed", range(5))
def test_a_tie_keeps_adasparks_kernels(seed):
    """vec_dot 1% faster is inside the margin: AdaSpark's kernels stay (no switch for noise)."""
    c = OneRowChooser()
    _run_trial(c, ours_s=0.050, vec_s=0.050 * (1 - MARGIN / 3), seed=seed, noise=0.01)
    assert c.chosen == OURS


@pytest.mark.parametrize("seed", range(5))
def test_slow_first_steps_after_a_load_do_not_count_against_adasparks_kernels(seed):
    """The first steps after a model load run slow (here the first 6 at 2x). They are the
    warm-up, not the trial's first block (AdaSpark's): with AdaSpark's kernels 5% faster they
    stay, where counting those steps made vec_dot look 0.84x (1 trial in 6 on Qwen2.5-1.5B)."""
    c = OneRowChooser()
    asked = _run_trial(c, ours_s=0.050, vec_s=0.0525, seed=seed, noise=0.02, outliers=0.0,
                       slow=lambda step: 2.0 if step < 6 else 1.0)
    assert asked[:WARMUP_STEPS] == [OURS] * WARMUP_STEPS
    assert c.chosen == OURS and c.ratio > 1.0
    unwarmed = OneRowChooser(warmup_steps=0)
    _run_trial(unwarmed, ours_s=0.050, vec_s=0.0525, seed=seed, noise=0.02, outliers=0.0,
               slow=lambda step: 2.0 if step < 6 else 1.0)
    assert unwarmed.chosen == OURS  # the quads hold it: the slow block sits in one quad only


@pytest.mark.parametrize("seed", range(5))
def test_one_busy_spell_in_one_quad_keeps_adasparks_kernels(seed):
    """Equal settings, and one spell of the machine running 1.6x slow over AdaSpark's blocks of
    the first quad and the second quad's first: the overall medians tip towards vec_dot, but a
    verdict must hold in every ABBA quad, and in the third vec_dot is not faster."""
    c = OneRowChooser(warmup_steps=0)
    busy = set(range(0, 4)) | set(range(12, 20))  # block 0 (A) and blocks 3, 4 (A A)
    _run_trial(c, ours_s=0.050, vec_s=0.050, seed=seed, noise=0.01, outliers=0.0,
               slow=lambda step: 1.6 if step in busy else 1.0)
    assert c.ratio < 1.0 - MARGIN  # the medians alone would have switched
    assert c.chosen == OURS


def test_blocks_alternate_abba_so_a_drift_hits_both_alike():
    """Steps growing 1% each (a context filling up) with equal settings: the ABBA order leaves
    the medians level, so the trial does not mistake the drift for vec_dot being slower."""
    c = OneRowChooser(block_steps=4, trial_blocks=8, warmup_steps=0)
    asked = _run_trial(c, ours_s=0.050, vec_s=0.050 * (1 - 2 * MARGIN), seed=1, noise=0.0, drift=0.01, outliers=0.0)
    blocks = [asked[i] for i in range(0, len(asked), 4)]
    assert blocks == [OURS, VEC_DOT, VEC_DOT, OURS, OURS, VEC_DOT, VEC_DOT, OURS]
    assert len(asked) == 32 and c.chosen == VEC_DOT  # 6% faster with the drift: still seen


def test_fixed_setting_never_trials_and_bad_values_are_refused(monkeypatch):
    c = OneRowChooser(fixed=VEC_DOT)
    for _ in range(100):
        assert c.setting() == VEC_DOT
        c.record(1.0)
    assert c.ratio is None and "fixed" in c.describe()
    monkeypatch.setenv("ADASPARK_ONE_ROW", "ours")
    assert OneRowChooser.from_env().chosen == OURS
    monkeypatch.setenv("ADASPARK_ONE_ROW", "learn")
    assert OneRowChooser.from_env().chosen is None
    monkeypatch.setenv("ADASPARK_ONE_ROW", "fastest")
    with pytest.raises(ConfigError, match="ADASPARK_ONE_ROW='fastest'"):
        OneRowChooser.from_env()
    for blocks in (3, 6):  # whole ABBA quads only
        with pytest.raises(ValueError):
            OneRowChooser(trial_blocks=blocks)


@pytest.mark.parametrize("seed", range(5))
def test_the_wide_tiles_get_a_second_trial_where_adasparks_kernels_won(seed):
    """With the switch (wide=True), AdaSpark's kernels winning the first trial starts a second, of
    their wide tiles against them: 23% faster (an Intel Xeon's Qwen2.5-Coder-0.5B) wins it, a tie
    keeps the narrow tiles; vec_dot winning the first ends it there."""
    c = OneRowChooser(wide=True)
    asked = _run_trial(c, ours_s=0.040, vec_s=0.054, wide_s=0.031, seed=seed)
    assert c.chosen == WIDE and c.ratio > 1.2 and 0.72 < c.wide_ratio < 0.83
    assert VEC_DOT in asked and asked.index(WIDE) > max(i for i, s in enumerate(asked) if s == VEC_DOT)
    assert c.describe().startswith("wide (vec_dot/ours 1.") and ", wide/ours 0." in c.describe()
    tie = OneRowChooser(wide=True)
    _run_trial(tie, ours_s=0.040, vec_s=0.054, wide_s=0.040 * (1 - MARGIN / 3), seed=seed, noise=0.01)
    assert tie.chosen == OURS and tie.wide_ratio is not None
    lost = OneRowChooser(wide=True)
    asked = _run_trial(lost, ours_s=0.090, vec_s=0.060, wide_s=0.030, seed=seed)
    assert lost.chosen == VEC_DOT and WIDE not in asked and lost.wide_ratio is None
    without = OneRowChooser()  # no switch for them: one trial, as before
    asked = _run_trial(without, ours_s=0.040, vec_s=0.054, wide_s=0.031, seed=seed)
    assert without.chosen == OURS and WIDE not in asked


def test_the_second_trial_says_so_while_it_runs(monkeypatch):
    c = OneRowChooser(wide=True, warmup_steps=0, block_steps=1, trial_blocks=4)
    for _ in range(4):
        c.record(0.04 if c.setting() == OURS else 0.05)
    assert c.chosen is None and c.describe() == "learning (wide, 0/4 blocks)"
    monkeypatch.setenv("ADASPARK_ONE_ROW", "wide")
    assert OneRowChooser.from_env().chosen == WIDE


def test_engines_of_one_model_and_thread_count_share_one_trial(tmp_path, monkeypatch):
    """A bench's arms are engines of one model: one trial, one verdict for all of them."""
    monkeypatch.delenv("ADASPARK_ONE_ROW", raising=False)
    model, other = tmp_path / "m.gguf", tmp_path / "n.gguf"
    model.write_bytes(b"GGUF")
    other.write_bytes(b"GGUF")
    link = tmp_path / "link.gguf"
    link.symlink_to(model)
    a = chooser_for(str(model), 2)
    assert chooser_for(str(link), 2) is a  # the same file by another name
    assert chooser_for(str(model), 1) is not a and chooser_for(str(other), 2) is not a
    _run_trial(a, ours_s=0.090, vec_s=0.060, seed=0)  # steps of the first engine decide it
    assert chooser_for(str(model), 2).chosen == VEC_DOT
    monkeypatch.setenv("ADASPARK_ONE_ROW", "ours")  # a fixed setting is per engine, never shared
    fixed = chooser_for(str(model), 2)
    assert fixed is not a and fixed.chosen == OURS and a.chosen == VEC_DOT


_PROBE = r"""
import hashlib, json, sys
from adaspark_app import native
native.activate()
from adaspark_app.engine.backend import LlamaBackend
from adaspark_app.engine.one_row import OURS, VEC_DOT, WIDE, OneRowChooser
b = LlamaBackend(sys.argv[1], n_ctx=512, n_threads=int(sys.argv[2]))
switch = native.one_row_switch()
toks = b.tokenize("The quick brown fox jumps over the lazy dog. " * 6)
b.prefill(toks[:40], 0)
out = {"switch": None if switch is None else switch.value, "steps": {}}
for setting in (OURS, VEC_DOT, WIDE, OURS):
    b.one_row = OneRowChooser(fixed=setting)
    rows = []
    for i in range(40, 46):
        b.verify([toks[i]], [i], [(0,)])
        rows.append(hashlib.sha256(b.logits_rows(1).tobytes()).hexdigest())
        seen = switch.value if switch is not None else None
    b.seq_rm(0, 40, -1)
    out["steps"].setdefault(setting, []).append({"rows": rows, "switch": seen})
print(json.dumps(out))
"""


@pytest.mark.model
@pytest.mark.parametrize("threads", (1, 2))
def test_one_row_steps_are_bit_identical_on_either_setting(model_path, threads):
    """Six one-row steps on the bundled model (Q4_1 layers, a Q8_0 output matrix) with AdaSpark's
    kernels, then with vec_dot, then with the wide tiles, then AdaSpark's again: the same logits
    bit for bit, and the switch the backend drives is the mapped library's (its value follows the
    setting)."""
    from test_native import _clean_env

    got = subprocess.run([sys.executable, "-c", _PROBE, model_path, str(threads)], env=_clean_env(),
                         capture_output=True, text=True, timeout=300)
    assert got.returncode == 0, got.stderr[-2000:]
    out = json.loads(got.stdout.strip().splitlines()[-1])
    if out["switch"] is None:
        pytest.skip("the patched kernels are not in use here (stock libraries)")
    ours, vec, wide = out["steps"][OURS], out["steps"][VEC_DOT][0], out["steps"][WIDE][0]
    assert [o["switch"] for o in ours] == [7, 7] and vec["switch"] == 0 and wide["switch"] == 15
    assert ours[0]["rows"] == vec["rows"] == wide["rows"] == ours[1]["rows"]
    assert len(set(vec["rows"])) == 6  # six different steps, not one row hashed six times
