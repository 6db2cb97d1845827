"""Opt-in: on the real targets (the GGUF files people run), replies byte-identical to plain decode.

Skipped unless ADASPARK_TARGETS_DIR names a directory holding files assembled by
``python -m benchmarks.targets.assemble --dir DIR`` (qwen0.5b.gguf, qwen1.5b.gguf,
gemma270m.gguf; each target whose file is missing is skipped on its own). Run with

    ADASPARK_TARGETS_DIR=~/.cache/adaspark/targets python3 -m pytest -q -m target tests/test_real_targets.py

Two paste-and-ask prompts per target (the shortest first turns of the long-paste and pasted-code
corpora) and one two-turn MT-Bench chat (the second reply sees the first, so a drifted first reply
shows there too), greedy, arms `ar`, `pinned:8` and `pinned:16` (always verify 8 or 16 rows: the
widths where ggml's tiled K-quant matmul would take over, so the batch kernels really run) and
`adaspark`, with the engine's self-check on. The self-check compares an emitted token with its
row's argmax in the batch that verified it, so it cannot see a batch computing a row differently
from a one-row step; ``test_rows_verified_in_a_batch_equal_one_row_steps`` checks that directly,
logits bit for bit, at 16 rows. Those batches run AdaSpark's Q4_K/Q6_K multi-row kernels
(``adaspark_app/native/tinyblas_k_quants.inc``); ``test_the_k_quant_batch_kernels_are_the_ones_tested``
checks that the library in use has them.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from adaspark_app.engine.chat_engine import ChatEngine
from benchmarks.common import read_jsonl

pytestmark = [pytest.mark.target, pytest.mark.model]

TARGETS_ENV = "ADASPARK_TARGETS_DIR"
TARGETS = ("qwen0.5b", "qwen1.5b", "gemma270m")
CORPORA = Path(__file__).resolve().parents[1] / "benchmarks" / "corpora"
ARMS = ("ar", "pinned:8", "pinned:16", "adaspark")
CHAT = "mt-bench-81"  # a two-turn chat (writing), both turns asked
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


def _rows(corpus: str) -> list[dict]:
    return read_jsonl(CORPORA / corpus)


def _prompts() -> list[dict]:
    """The shortest first turn of each paste-and-ask corpus (long paste, pasted code), as
    one-turn conversations, then the two-turn chat CHAT."""
    out = []
    for corpus in ("longpaste.jsonl.gz", "longcode.jsonl.gz"):
        conv = min(_rows(corpus), key=lambda r: len(r["turns"][0]))
        out.append({**conv, "turns": conv["turns"][:1]})
    out.append(next(r for r in _rows("mtbench.jsonl.gz") if r["id"] == CHAT))
    return out


@pytest.fixture(scope="module", params=TARGETS)
def target_replies(request) -> tuple[str, dict]:
    """Per arm: (the two replies' tokens, rows the self-check verified, the widths used)."""
    path = _target_path(request.param)
    prompts = _prompts()
    out: dict[str, tuple[list[list[int]], int, dict]] = {}
    for arm in ARMS:
        eng = ChatEngine(str(path), arm=arm, n_ctx=4096, self_check=True)
        try:
            tokens, widths = [], {}
            for conv in prompts:
                messages: list[dict] = []
                for turn in conv["turns"]:  # later turns see this arm's own earlier replies
                    messages.append({"role": "user", "content": turn})
                    r = eng.generate(conv["id"], messages, max_tokens=MAX_TOKENS)
                    messages.append({"role": "assistant", "content": r.text})
                    tokens.append(list(r.tokens))
                    for w, n in r.widths.items():
                        widths[w] = widths.get(w, 0) + n
            out[arm] = (tokens, eng.decoder.counters.checked_rows, widths)
        finally:
            eng.close()
    return request.param, out


@pytest.mark.parametrize("arm,width", [("pinned:8", 8), ("pinned:16", 16)])
def test_pinned_width_really_verifies_many_rows(target_replies, arm, width):
    """pinned:N ran N-row verifies on this target, so the identity below covers the batch kernels."""
    name, out = target_replies
    _, checked, widths = out[arm]
    assert checked > 0, name
    assert widths.get(width, widths.get(str(width), 0)) > 0, (name, widths)


@pytest.mark.parametrize("arm", ["pinned:8", "pinned:16", "adaspark"])
def test_replies_identical_to_ar_on_real_target(target_replies, arm):
    """Each reply's tokens equal plain decode's on the same target, byte for byte."""
    name, out = target_replies
    base, other = out["ar"][0], out[arm][0]
    assert all(base), f"{name}: ar gave an empty reply"
    same = sum(a == b for a, b in zip(base, other))
    assert same == len(base), f"{name} {arm}: {same}/{len(base)} replies identical to ar"


@pytest.mark.parametrize("name", TARGETS)
def test_rows_verified_in_a_batch_equal_one_row_steps(name):
    """16 rows verified as one batch give the logits of the same rows decoded one at a time, bit
    for bit, after a 300-token prefill (benchmarks/kernels/row_identity.py's check): the
    property that makes every arm's reply equal `ar`'s, tested without the luck of a near tie."""
    from benchmarks.kernels.row_identity import compare

    from adaspark_app.engine.backend import LlamaBackend

    path = _target_path(name)
    b = LlamaBackend(str(path), n_ctx=1024)
    try:
        text = "\n\n".join(r["turns"][0] for r in _rows("longpaste.jsonl.gz")[:3])
        res = compare(b, b.tokenize(text)[:301], 16)
    finally:
        b.close()
    same = [r["row"] for r in res if r["identical"]]
    assert len(same) == 16, f"{name}: rows identical {same}, max diffs {[r['max_abs_diff'] for r in res]}"


def test_the_k_quant_batch_kernels_are_the_ones_tested():
    """The identity tests above say something about AdaSpark's Q4_K/Q6_K multi-row kernels only if
    those ran: this process's libggml-cpu is a variant built with them, and ggml's tiled K-quant
    matmul (another summation order) is off."""
    if not os.environ.get(TARGETS_ENV):
        pytest.skip(f"{TARGETS_ENV} is not set (see benchmarks/targets/assemble.py)")
    import llama_cpp  # noqa: F401 - maps libggml-cpu (native.activate ran in conftest)

    from adaspark_app import native
    from adaspark_app.engine import backend

    backend._llama()  # what every engine does before its first decode
    assert os.environ.get(backend.TILED_MM_ENV) == "0"
    maps = Path("/proc/self/maps").read_text().splitlines()
    libs = sorted({line.split()[-1] for line in maps if "libggml-cpu" in line})
    assert native.status() == "q4_1-tinyblas" and len(libs) == 1, (native.status(), libs)
    assert b"tinyBLAS_K_AVX2" in Path(libs[0]).read_bytes(), f"{libs[0]} has no K-quant multi-row kernel"


@pytest.mark.parametrize("name", TARGETS)
def test_prompts_tokenised_by_pieces_equal_their_whole_tokenisation(name):
    """Each target's vocabulary and chat template (an SPM one in Gemma's): prompts tokenised a piece
    at a time, cut at the template's markers, equal the whole prompt's tokens."""
    from test_prompt_tokens import check_grown_prompts

    with ChatEngine(str(_target_path(name)), arm="ar", n_ctx=4096) as engine:
        whole = check_grown_prompts(engine)
        assert engine.prompts.markers and engine.prompts.reused > whole // 2


@pytest.mark.parametrize("key, vtype, value, words", [
    ("gemma3.attention.sliding_window_pattern", "u32", 1, "none of its 18 layers sliding-window"),
    ("gemma3.rope.dimension_count", "u32", 0, "rope.dimension_count is 0"),
    ("gemma3.rope.dimension_count", "u32", 255, "rope.dimension_count is 255"),
    ("gemma3.attention.layer_norm_rms_epsilon", "f32", -1.0, "layer_norm_rms_epsilon is -1.0"),
])
def test_a_gemma_whose_window_rope_or_norm_llama_cpp_cannot_run_is_one_line(tmp_path, key, vtype, value, words):
    """Gemma-3-270M with one value set: a pattern that makes no layer sliding-window (llama.cpp
    asserted making the cache, exit 134), a rope of 0 dimensions (its first forward never ended),
    an odd one and a negative norm epsilon (ggml asserted at the first forward); refused first."""
    import subprocess
    import sys

    import gguf
    from gguf.scripts.gguf_new_metadata import MetadataDetails, copy_with_new_metadata

    types = {"u32": gguf.GGUFValueType.UINT32, "f32": gguf.GGUFValueType.FLOAT32}
    model = tmp_path / "g.gguf"
    copy_with_new_metadata(gguf.GGUFReader(str(_target_path("gemma270m")), "r"),
                           gguf.GGUFWriter(str(model), arch="gemma3"), {key: MetadataDetails(types[vtype], value)}, [])
    script = tmp_path / "s.jsonl"
    script.write_text('{"id": "a", "turns": ["Hi"]}\n')
    proc = subprocess.run([sys.executable, "-m", "adaspark_app.cli", "run", str(script), "--model", str(model),
                           "--fresh-store", "--max-tokens", "2"], capture_output=True, text=True, timeout=120)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip() and "no chat template" not in ln]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-500:]
    assert words in lines[0]


def test_a_run_hung_inside_llama_cpp_ends_at_the_second_ctrl_c(tmp_path):
    """Gemma-3-270M with a rope of 0 dimensions and the header rules off: the first forward never
    ends (ggml's rope loop), and neither one SIGINT nor any number of them ended `adaspark run`
    before (kill -9 did); the second now ends it at once, exit 130, one line."""
    import signal
    import subprocess
    import sys
    import time

    import gguf
    from gguf.scripts.gguf_new_metadata import MetadataDetails, copy_with_new_metadata
    from test_cli_errors import RUN_WITHOUT_HEADER_RULES

    model = tmp_path / "g.gguf"
    copy_with_new_metadata(gguf.GGUFReader(str(_target_path("gemma270m")), "r"), gguf.GGUFWriter(str(model), arch="gemma3"),
                           {"gemma3.rope.dimension_count": MetadataDetails(gguf.GGUFValueType.UINT32, 0)}, [])
    script = tmp_path / "s.jsonl"
    script.write_text('{"id": "a", "turns": ["Hi"]}\n')
    proc = subprocess.Popen([sys.executable, "-c", RUN_WITHOUT_HEADER_RULES, "run", str(script), "--model", str(model),
                             "--fresh-store", "--max-tokens", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        time.sleep(15)  # loaded, and inside the first forward
        assert proc.poll() is None
        proc.send_signal(signal.SIGINT)
        time.sleep(2)
        assert proc.poll() is None  # the hang holds the first
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) == 130
        assert "adaspark: interrupted (a second Ctrl+C: stopped at once)" in proc.stderr.read()
    finally:
        proc.kill()


def test_a_qwen_whose_rope_dimensions_are_not_its_head_size_is_one_line_not_an_abort(tmp_path):
    """Qwen2.5-Coder-0.5B with `qwen2.rope.dimension_count` 32 (its heads are 64 wide) added:
    llama.cpp loaded it and its qwen2 graph asserted at the first forward (exit 134); refused first."""
    import subprocess
    import sys

    import gguf
    from gguf.scripts.gguf_new_metadata import MetadataDetails, copy_with_new_metadata

    reader = gguf.GGUFReader(str(_target_path("qwen0.5b")), "r")
    model = tmp_path / "q.gguf"
    copy_with_new_metadata(reader, gguf.GGUFWriter(str(model), arch="qwen2"),
                           {"qwen2.rope.dimension_count": MetadataDetails(gguf.GGUFValueType.UINT32, 32)}, [])
    script = tmp_path / "s.jsonl"
    script.write_text('{"id": "a", "turns": ["Hi"]}\n')
    proc = subprocess.run([sys.executable, "-m", "adaspark_app.cli", "run", str(script), "--model", str(model),
                           "--fresh-store", "--max-tokens", "2"], capture_output=True, text=True, timeout=300)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-500:]
    assert "rope.dimension_count is 32 but its attention heads are 64 wide" in lines[0]
