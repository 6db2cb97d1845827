"""benchmarks/ as a suite: its ledger names only paths that exist, every script imports as a module
of the package, the named held-out sets are data the runner turns into the same commands, and a
new held-out set never takes a conversation an earlier set held (in the tree or retired)."""

from __future__ import annotations

import importlib
import gzip
import json
import re
import subprocess
from pathlib import Path

import pytest

from benchmarks.common import BENCH, ROOT, SETS, read_jsonl
from benchmarks.sets import heldout_sets
from benchmarks.speed import run_set

LEDGER = BENCH / "README.md"
# a backticked path or a link target: what a reader of the ledger would open
_TICKED = re.compile(r"`([^`\s]+)`")
_LINK = re.compile(r"\]\(([^)\s#]+)")
_ROOTS = ("benchmarks/", "docs/", "tests/", "tools/", "adaspark_app/")


def named_paths(text: str) -> list[str]:
    """The checkout paths a markdown text names: backticked words and link targets that start at
    the checkout's top folders (a command's first path counts too)."""
    out = []
    for m in list(_TICKED.finditer(text)) + list(_LINK.finditer(text)):
        for word in m.group(1).split():
            word = word.rstrip(".,;:)")
            if word.startswith(_ROOTS) and not any(c in word for c in "*{}<>$"):
                out.append(word)
    return out


def missing_paths(text: str, root: Path = ROOT) -> list[str]:
    return sorted({p for p in named_paths(text) if not (root / p).exists()})


def test_the_ledger_names_only_paths_that_exist():
    text = LEDGER.read_text(encoding="utf-8")
    named = named_paths(text)
    assert len(named) > 30  # the table's scripts and result files, not a page that names nothing
    assert missing_paths(text) == []


def test_the_path_check_fails_on_a_path_that_is_not_there(tmp_path):
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "here.md").write_text("x")
    text = ("| q | `python -m benchmarks.speed.run_set X` | 1.4x | `benchmarks/here.md` |\n"
            "see [the run](benchmarks/gone/report.md) and `benchmarks/also-gone.json`.")
    assert missing_paths(text, tmp_path) == ["benchmarks/also-gone.json", "benchmarks/gone/report.md"]


def _modules() -> list[str]:
    return sorted(".".join(p.relative_to(ROOT).with_suffix("").parts) for p in BENCH.rglob("*.py")
                  if p.name != "__init__.py")


@pytest.mark.parametrize("name", [m for m in _modules() if m != "benchmarks.ui.ui_trace"])
def test_every_script_imports_as_a_module_of_the_package(name):
    """Scripts run as `python -m benchmarks.GROUP.SCRIPT` and import each other as modules
    (ui_trace is left out: importing it starts the tracer, in the chat it profiles)."""
    importlib.import_module(name)


def test_no_script_or_test_edits_the_import_path_and_no_name_is_a_stage():
    offenders = [str(p.relative_to(ROOT)) for folder in (BENCH, ROOT / "tests") for p in folder.rglob("*.py")
                 if "sys." + "path" in p.read_text(encoding="utf-8")]
    assert offenders == []
    stage = re.compile(r"^s\d{2}b?($|-|\.)")
    assert [str(p.relative_to(ROOT)) for p in BENCH.rglob("*") if stage.match(p.name)] == []


def test_every_named_set_is_a_file_of_its_count_and_kind():
    defaults, sets = run_set.load_index()
    assert sets and defaults["max_tokens"] == 128
    kinds = {"chat": "sharegpt", "paste": "sharegpt-long", "code": "sharegpt-code"}
    for name, entry in sets.items():
        rows = read_jsonl(SETS / entry["file"])
        source, kind, count, _letter = name.split("-")
        assert (source, len(rows), entry["count"]) == ("sharegpt", int(count), int(count)), name
        assert {r["category"] for r in rows} == {kinds[kind]}, name


def test_a_set_runs_as_the_commands_the_shell_steps_ran(capsys, monkeypatch):
    """The dry run of the latest paste set gives the commands the old per-stage shell steps ran
    (run_peers with every arm against llama-server, 128 tokens, capped replies kept), with the set
    and the report at their new paths."""
    monkeypatch.setenv("ADASPARK_TARGETS", "/targets")
    assert run_set.main(["sharegpt-paste-16-c", "--cold", "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    arms = "adaspark:ar,adaspark,adaspark:pinned:4,adaspark:pinned:8,server-ngram-mod,server-plain"
    assert lines[0] == ("python -m benchmarks.speed.run_peers benchmarks/sets/sharegpt-paste-16-c.jsonl.gz "
                        f"--model /targets/qwen0.5b.gguf --peers {arms} --max-tokens 128 --keep-capped "
                        "--out benchmarks/results/speed/qwen0.5b-paste/sharegpt-paste-16-c")
    assert lines[1].endswith("--model /targets/qwen1.5b.gguf --peers " + arms +
                             " --max-tokens 128 --keep-capped --out benchmarks/results/speed/qwen1.5b-paste/sharegpt-paste-16-c")
    assert lines[2].startswith("adaspark run benchmarks/sets/sharegpt-paste-16-c.jsonl.gz --model /targets/qwen0.5b.gguf "
                               "--arm adaspark --max-tokens 128 --fresh-store --out ")
    assert lines[3].startswith("python -m benchmarks.cold_start.cold_start ")
    assert lines[3].endswith(" > benchmarks/results/cold_start/qwen0.5b-sharegpt-paste-16-c-1.txt")
    assert len(lines) == 6
    # the bundled model runs without --model; --model filters
    assert run_set.main(["sharegpt-chat-12-f", "--model", "smollm2", "--dry-run"]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    assert "--model" not in line and line.endswith("--out benchmarks/results/speed/smollm2-chat/sharegpt-chat-12-f")
    assert run_set.main(["no-such-set", "--dry-run"]) == 2
    assert run_set.main(["sharegpt-chat-12-j", "--dry-run"]) == 2  # drawn, not run yet: nothing to do


def _set(path: Path, ids: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"id": i, "category": "sharegpt-long", "turns": ["x"]}) + "\n" for i in ids),
                    encoding="utf-8")


def test_a_new_held_out_set_takes_no_conversation_a_set_held(tmp_path):
    """A conversation in a committed set (any part of it) or in the retired list is excluded;
    the rest of ShareGPT is not. Replies files are outputs, not sets."""
    _set(tmp_path / "benchmarks" / "sets" / "sharegpt-paste-2-a.jsonl", ["longpaste-AAA_3", "sharegpt-BBB_0"])
    _set(tmp_path / "benchmarks" / "results" / "run" / "replies.jsonl", ["longpaste-RRR_0"])
    retired = tmp_path / "used-ids.txt"
    retired.write_text("# retired sets\nCCC\n\nDDD  # a comment\n", encoding="utf-8")
    held = heldout_sets.held_conversations(tmp_path / "benchmarks", retired)
    assert held == {"AAA", "BBB", "CCC", "DDD"}
    items = [{"id": i} for i in ("AAA_0", "BBB_7", "CCC_1", "DDD_0", "EEE_0", "RRR_0")]
    assert [i["id"] for i in heldout_sets.unused(items, held)] == ["EEE_0", "RRR_0"]


def test_the_sets_that_left_the_tree_stay_held():
    """The retired list keeps every conversation the sets held before they moved to
    benchmarks/sets/ (314 of them), and the sets in the tree are among what is held."""
    retired = heldout_sets.retired_conversations()
    assert len(retired) >= 314
    held = heldout_sets.held_conversations()
    for path in SETS.glob("*.jsonl"):
        for line in path.read_text(encoding="utf-8").splitlines():
            assert heldout_sets.conversation_key(json.loads(line)["id"]) in held
    assert retired <= held


def test_the_tracked_tree_stays_under_30_MB():
    """Every GPU call carries the checkout within its 64 MiB (benchmarks/gpu/stage.py sizes the
    model's and the CUDA build's parts by what the checkout leaves), so the tree stays small."""
    names = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, check=True).stdout
    size = sum((ROOT / n).lstat().st_size for n in names.decode().split("\0") if n and (ROOT / n).exists())
    assert 25_000_000 < size < 30_000_000  # the shipped drafter alone is 25.8 MB


def test_the_readme_names_only_paths_that_exist_and_no_file_outside_the_checkout():
    """Every checkout path the user's README names (picture, docs, sets, tools) exists, and it
    names no file outside the project (no ../ path, no home or machine path)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    named = named_paths(text)
    assert "docs/chat.svg" in named and "benchmarks/README.md" in named
    assert missing_paths(text) == []
    assert not re.search(r"(\.\./|~/|/work/|/root/|/tmp/)", text)


def test_the_readme_is_a_users_page():
    """About 150 lines at most, the install near the top, and the test command in it."""
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 150
    install = next(i for i, line in enumerate(lines) if line.strip() == INSTALL)
    assert install < 30
    assert "adaspark chat" in lines and TEST in lines


INSTALL = """CMAKE_ARGS="-DLLAVA_BUILD=OFF" python3 -m pip install -e '.[dev]'"""
TEST = "python3 -m pytest -q"


def test_ci_runs_the_readmes_install_and_test_commands_and_nothing_else():
    """.ci/run (a clean clone's CI) installs exactly as the README says and runs its tests."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert INSTALL in readme and TEST in readme
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()]
    commands = [c for c in ci if c and not c.startswith(("#", "set ", "cd "))]
    assert commands == [INSTALL, TEST]


@pytest.mark.model
def test_round_host_time_splits_tree_rounds_into_steps_that_add_up(model_path):
    """`round_host_time --parts` on the real engine: every tree round has each step's time, and
    the steps (the verify's llama.cpp time left out) never add up to more than the round's host
    time, so no step is counted twice and none holds the forward."""
    from adaspark_app.engine.chat_engine import ChatEngine
    from benchmarks.cost.round_host_time import PARTS, _cache_table, _capture_pricing, _instrument_parts

    eng = ChatEngine(model_path, arm="pinned:8", n_ctx=1024)
    rows: list[dict[str, float]] = []
    _instrument_parts(eng, rows)
    priced: list[tuple] = []
    _capture_pricing(eng, priced)  # `--cache`: the pricing of every tree round, replayed after the run
    try:
        text = "The quick brown fox jumps over the lazy dog near the river bank at dawn."
        eng.generate("c", [{"role": "user", "content": f"Repeat exactly: {text} {text}"}], max_tokens=48)
    finally:
        eng.close()
    assert rows, "no tree round was timed"
    for r in rows:
        assert set(PARTS) <= set(r) and all(r[p] >= 0 for p in PARTS), r
        assert r["other"] > -1e-4, r  # the parts fit inside the round
        assert r["verify, host"] < r["wall"] and sum(r[p] for p in PARTS) < r["wall"]
    assert len(priced) == len(rows)  # one captured pricing per tree round
    table = _cache_table(priced)
    micros = [float(line.split("|")[2]) for line in table if line.startswith(("| warm", "| cold"))]
    assert len(micros) == 2 and all(m > 0 for m in micros), table


@pytest.mark.model
def test_gpu_engine_check_reports_identity_and_cost_per_width_from_the_real_engine(model_path, tmp_path):
    """`benchmarks/gpu/engine_check.py` (the engine part of the GPU run) on this CPU build: the
    placement is named, a tree arm's replies are compared with `ar`'s token for token (identical
    here, where rows are bit-identical), and its verify cost per width comes from its own rounds."""
    from benchmarks.gpu.engine_check import main

    text = "The quick brown fox jumps over the lazy dog near the river bank at dawn."
    script = tmp_path / "s.jsonl"
    script.write_text(json.dumps({"id": "copy", "turns": [f"Repeat exactly: {text} {text}"]}) + "\n")
    out_json, out_md = tmp_path / "engine.json", tmp_path / "engine.md"
    main(["--model", model_path, "--script", str(script), "--limit", "1", "--max-tokens", "40",
          "--arms", "ar,pinned:8,adaspark@serial", "--out-json", str(out_json), "--out", str(out_md)])
    ar, tree, serial = json.loads(out_json.read_text())
    assert ar["placement"]["offload"] == "CPU" and tree["tokens"] == ar["tokens"] and ar["tokens"][0]
    assert max(int(w) for w in tree["verify_ms"]) > 1 and set(ar["verify_ms"]) == {"1"}
    assert "| pinned:8 | 1/1 |" in out_md.read_text() and "| adaspark@serial | 1/1 |" in out_md.read_text()
    assert serial["tokens"] == ar["tokens"] and not serial["forward_overlaps"] and serial["host_parts"]
    assert serial["host_us"]["rounds"] > 0 and serial["host_us"]["between_median"] > 0
    assert "| adaspark@serial | False |" in out_md.read_text()


@pytest.mark.model
def test_gpu_graph_check_runs_each_mode_in_its_own_process_and_compares_their_bits(model_path, tmp_path):
    """`benchmarks/gpu/graph_check.py` on this CPU build: one process per mode, each cycle's forwards
    the same bits (the cycle is rolled back), the modes' logits compared; a missing model is one
    line and exit 2."""
    from benchmarks.gpu.graph_check import main

    out_json, out_md = tmp_path / "graphs.json", tmp_path / "graphs.md"
    rc = main(["--model", model_path, "--widths", "3,2", "--cycles", "2", "--context", "24", "--modes", "stock,width",
               "--out-json", str(out_json), "--out", str(out_md)])
    assert rc == 0
    res = json.loads(out_json.read_text())[model_path]
    assert set(res) == {"stock", "width"}
    for r in res.values():
        assert r["on_gpu"] is False and r["graphs_by_width"] is None and list(r["widths"]) == ["2", "3"]
        for row in r["widths"].values():
            assert all(row["digests"].values()) and row["ms"]["verify"] > 0 and row["repeated_ms"] > 0
    # rows of other widths compute other logits; the same width, the same bits in both processes
    assert res["stock"]["widths"]["2"]["digests"] == res["width"]["widths"]["2"]["digests"]
    assert res["stock"]["widths"]["2"]["digests"]["verify"] != res["stock"]["widths"]["3"]["digests"]["verify"]
    text = out_md.read_text()
    assert "| 3 | `width` |" in text and "Logits the same bits in every mode: yes (2 of 2 widths)" in text
    assert main(["--model", str(tmp_path / "missing.gguf")]) == 2
    assert main(["--verdict", str(out_json)]) == 0  # this run leaves a graph per width in use


def test_graph_check_verdict_keeps_a_graph_per_width_only_when_it_ran_and_kept_every_bit(tmp_path, capsys):
    """run.sh falls back to stock graphs on the verdict: a graph per width that never finished, failed,
    or computed other bits in a cycle or another mode than the rest is not used after it."""
    from benchmarks.gpu.graph_check import main, unsound

    def run(verify: str = "a") -> dict:
        return {"widths": {"2": {"digests": {"verify": verify, "after 1": "b"}}}}

    ok = {"m.gguf": {"stock": run(), "width": run(), "none": run()}}
    assert unsound(ok) is None
    assert unsound({"m.gguf": {"stock": run()}}) == "no graph-per-width run finished"
    assert "segfault" in unsound({"m.gguf": {"stock": run(), "width": {"error": "rc -11: segfault"}}})
    assert "the modes' logits differ at 2 rows" in unsound({"m.gguf": {"stock": run(), "width": run("z")}})
    assert "a cycle's logits differed" in unsound({"m.gguf": {"stock": run(), "width": run(None)}})
    f = tmp_path / "graphs.json"
    f.write_text(json.dumps({"m.gguf": {"stock": run(), "width": run("z")}}))
    assert main(["--verdict", str(f)]) == 1 and "differ" in capsys.readouterr().err
    f.write_text(json.dumps(ok))
    assert main(["--verdict", str(f)]) == 0
    assert main(["--verdict", str(tmp_path / "missing.json")]) == 2


@pytest.mark.model
def test_gpu_argmax_check_times_both_ways_and_compares_their_tokens(model_path, tmp_path):
    """`benchmarks/gpu/argmax_check.py` on this CPU build: both ways run in alternating blocks, every
    row gets the same token either way, and the verdict leaves tokens on the device; a missing model
    is one line and exit 2."""
    from benchmarks.gpu.argmax_check import main

    out_json, out_md = tmp_path / "argmax.json", tmp_path / "argmax.md"
    rc = main(["--model", model_path, "--widths", "3,1", "--blocks", "2", "--cycles", "2", "--context", "40",
               "--out-json", str(out_json), "--out", str(out_md)])
    assert rc == 0
    r = json.loads(out_json.read_text())[model_path]
    assert r["on_gpu"] is False and r["device_available"] and r["steady"] == {"host": True, "device": True}
    assert list(r["widths"]) == ["1", "3"]
    for w, row in r["widths"].items():
        assert row["host_ms"] > 0 and row["device_ms"] > 0 and row["same_tokens"] == int(w) and row["scan_ms"] > 0
    assert "| 3 |" in out_md.read_text() and "| 3 of 3, - |" in out_md.read_text()
    assert "one launch: not timed (no CUDA library with AdaSpark's patch mapped)" in out_md.read_text()
    assert main(["--model", str(tmp_path / "missing.gguf")]) == 2
    assert main(["--verdict", str(out_json)]) == 0


@pytest.mark.model
def test_gpu_argmax_check_reports_a_device_way_that_cannot_run(model_path, tmp_path, monkeypatch):
    """Where the backend's probe at load finds no device token, the check times the host way alone,
    says so, and its verdict leaves the engine to take tokens on the host by itself."""
    import llama_cpp

    from benchmarks.gpu.argmax_check import main

    monkeypatch.setattr(llama_cpp, "llama_get_sampled_token_ith", lambda ctx, i: -1)
    out_json, out_md = tmp_path / "argmax.json", tmp_path / "argmax.md"
    assert main(["--model", model_path, "--widths", "2", "--blocks", "2", "--cycles", "1", "--context", "24",
                 "--out-json", str(out_json), "--out", str(out_md)]) == 0
    r = json.loads(out_json.read_text())[model_path]
    assert not r["device_available"] and r["steady"] == {"host": True}
    assert r["widths"]["2"]["device_ms"] is None and r["widths"]["2"]["host_ms"] > 0
    text = out_md.read_text()
    assert "the device way did not run here" in text and "| 2 |" in text and "| - | - | - |" in text
    assert main(["--verdict", str(out_json)]) == 0


def test_argmax_check_verdict_keeps_device_tokens_only_when_they_ran_steady_and_agreed(tmp_path, capsys):
    """run.sh takes greedy tokens on the host after the verdict when a model failed, the device's
    tokens changed between forwards, or differed from the host's on a row."""
    from benchmarks.gpu.argmax_check import main, unsound

    def run(same: int = 4, steady: bool = True, available: bool = True) -> dict:
        return {"device_available": available, "steady": {"host": True, "device": steady},
                "widths": {"4": {"host_ms": 2.0, "device_ms": 1.0, "same_tokens": same, "scan_ms": 0.1}}}

    assert unsound({"m.gguf": run()}) is None
    assert unsound({"m.gguf": {**run(available=False), "widths": {"4": {"same_tokens": None}}}}) is None
    assert unsound({}) == "no model measured"
    assert "segfault" in unsound({"m.gguf": {"error": "rc -11: segfault"}})
    assert "changed between forwards" in unsound({"m.gguf": run(steady=False)})
    assert "1 of 4 rows got another token" in unsound({"a.gguf": run(), "m.gguf": run(same=3)})
    f = tmp_path / "argmax.json"
    f.write_text(json.dumps({"m.gguf": run(same=3)}))
    assert main(["--verdict", str(f)]) == 1 and "another token" in capsys.readouterr().err
    f.write_text(json.dumps({"m.gguf": run()}))
    assert main(["--verdict", str(f)]) == 0
    assert main(["--verdict", str(tmp_path / "missing.json")]) == 2


@pytest.mark.model
def test_gpu_argmax_check_times_the_one_launch_way_where_the_patched_library_has_its_switch(
        model_path, tmp_path, monkeypatch):
    """With a patched CUDA library mapped (its switch stood in for: this CPU build has none), the
    device way runs twice, a kernel per row and one launch, the switch set before each block and set
    back after; both ways' tokens are compared with the host's and reported."""
    from adaspark_app.native import cuda_exact
    from benchmarks.gpu.argmax_check import main

    switch = {"on": True, "set": []}

    def set_argmax(on: bool) -> bool:
        switch["on"] = bool(on)
        switch["set"].append(switch["on"])
        return switch["on"]

    monkeypatch.setattr(cuda_exact, "library_argmax", lambda lib=None: switch["on"])
    monkeypatch.setattr(cuda_exact, "set_library_argmax", set_argmax)
    out_json, out_md = tmp_path / "argmax.json", tmp_path / "argmax.md"
    assert main(["--model", model_path, "--widths", "2", "--blocks", "2", "--cycles", "1", "--context", "24",
                 "--out-json", str(out_json), "--out", str(out_md)]) == 0
    r = json.loads(out_json.read_text())[model_path]
    assert r["one_launch_available"] and r["steady"] == {"host": True, "device": True, "one_launch": True}
    row = r["widths"]["2"]
    assert row["one_launch_ms"] > 0 and row["same_tokens_one_launch"] == 2 == row["same_tokens"]
    # one block per way in turn, then the block order reversed; the switch as it was at the end
    assert switch["set"] == [False, False, True, True, False, False, True]
    assert "| 2 of 2, 2 of 2 |" in out_md.read_text()


def test_argmax_check_verdict_on_one_launch_keeps_it_only_where_its_tokens_agreed_and_it_was_not_slower(
        tmp_path, capsys):
    """run.sh sets ADASPARK_CUDA_ARGMAX=0 after this verdict when the one-launch tokens changed
    between forwards, differed from the host's, or took longer than a kernel per row."""
    from benchmarks.gpu.argmax_check import ONE_LAUNCH_SLACK, main, one_launch_unsound

    def run(same: int = 8, steady: bool = True, one_ms: float = 1.0, available: bool = True) -> dict:
        return {"device_available": True, "one_launch_available": available,
                "steady": {"host": True, "device": True, "one_launch": steady},
                "widths": {"1": {"device_ms": 0.5, "one_launch_ms": 9.0, "same_tokens_one_launch": 1},
                           "8": {"device_ms": 1.0, "one_launch_ms": one_ms, "same_tokens_one_launch": same}}}

    assert one_launch_unsound({"m.gguf": run()}) is None
    assert one_launch_unsound({"m.gguf": run(one_ms=ONE_LAUNCH_SLACK - 0.001)}) is None  # one row: not judged
    assert one_launch_unsound({"m.gguf": run(available=False, same=0)}) is None  # no switch: nothing to judge
    assert one_launch_unsound({}) == "no model measured"
    assert "segfault" in one_launch_unsound({"m.gguf": {"error": "rc -11: segfault"}})
    assert "changed between forwards" in one_launch_unsound({"m.gguf": run(steady=False)})
    assert "3 of 8 rows got another token" in one_launch_unsound({"a.gguf": run(), "m.gguf": run(same=5)})
    assert "1.100x the stock device way" in one_launch_unsound({"m.gguf": run(one_ms=1.1)})
    f = tmp_path / "argmax.json"
    f.write_text(json.dumps({"m.gguf": run(one_ms=1.1)}))
    assert main(["--verdict-one-launch", str(f)]) == 1 and "1.100x" in capsys.readouterr().err
    f.write_text(json.dumps({"m.gguf": run()}))
    assert main(["--verdict-one-launch", str(f)]) == 0
    assert main(["--verdict-one-launch", str(tmp_path / "missing.json")]) == 2


def test_curve_learn_prices_a_stepped_curve_as_measured_and_its_widths_pay(tmp_path):
    """`benchmarks/cost/curve_learn.py` on a probe's JSON of a GPU-like stepped curve (flat to 8
    rows, then a step per 8 more; two contexts): the learned price of each measured width the
    scheduler verified is within 10% of the measured time, and its decode rate is within 3% of the
    best pinned width's in each band, above plain decode."""
    from benchmarks.cost.curve_learn import load_curve, run

    widths = [1, 2, 4, 8, 12, 16, 24, 32, 48, 64]
    step = {n: 1.0 + 0.35 * ((n - 1) // 8) for n in widths}
    probe = {"curves": {str(c): {"one_row_ms": ms, "ratio": {str(n): r * (1.0 + c / 20000) for n, r in step.items()}}
                        for c, ms in ((512, 6.5), (2048, 7.0))}}
    path = tmp_path / "probe.json"
    path.write_text(json.dumps(probe))
    curve, table = load_curve(path)
    assert curve(16, 512) == pytest.approx(table[512][16]) and curve(10, 512) == pytest.approx(
        (table[512][8] + table[512][12]) / 2)  # linear between measured widths
    assert table[512][1] < curve(1, 1280) < table[2048][1]  # and between contexts
    both = tmp_path / "probes.json"  # run.sh's gathering: {shape: {mode: probe}}
    both.write_text(json.dumps({"q7": {"exact": probe, "stock": {"curves": {}}}}))
    assert load_curve(both, "q7/exact")[1] == table
    packed = tmp_path / "probes.json.gz"  # as committed where the tree needs the room
    packed.write_bytes(gzip.compress(both.read_bytes(), mtime=0))
    assert load_curve(packed, "q7/exact")[1] == table
    with pytest.raises(ValueError, match="no probe 'q7/fast'"):
        load_curve(both, "q7/fast")
    lines = run(path, "paste", requests=2, rounds=150)
    text = "\n".join(lines)
    checked = 0
    for section in text.split("## Context ")[1:]:
        priced = {int(r[1]): (float(r[2]), float(r[3])) for r in (line.split("|") for line in section.splitlines()
                  if line.startswith("| ") and not line.startswith("| width")) if r[2].strip() and r[3].strip()}
        rate = next(line for line in section.splitlines() if line.startswith("Decode rate"))
        vs_pinned, vs_plain = (float(x) for x in re.findall(r"([0-9.]+)x (?:the best pinned|plain decode)", rate))
        assert vs_pinned >= 0.97 and vs_plain > 1.0, rate
        used = {int(w): int(n) for w, n in (x.split(": ") for x in rate.split("verified: ")[1].rstrip(".").split(", "))}
        for w in (w for w, n in used.items() if n >= 20 and w in priced):  # the widths it relied on
            meas, learned = priced[w]
            assert abs(learned / meas - 1) < 0.10, (w, meas, learned)
            checked += 1
    assert checked >= 3, text


@pytest.mark.model
def test_round_host_time_scripted_replays_ar_and_adds_the_overlapped_engine(tmp_path):
    """`round_host_time --scripted --overlap --events`: real `ar` replies replayed through the
    modeled GPU forward; every arm commits them exactly, the overlapped engine is reported beside
    the others, and the time between rounds (the reply's events) for each. A malformed curve is
    one line and exit 2."""
    from benchmarks.common import module_argv

    text = "The quick brown fox jumps over the lazy dog near the river bank at dawn."
    script = tmp_path / "s.jsonl"
    script.write_text(json.dumps({"id": "copy", "turns": [f"Repeat exactly: {text} {text}", "Again, please."]}) + "\n")
    out = tmp_path / "host.md"
    run = subprocess.run(module_argv("benchmarks.cost.round_host_time", str(script), "--limit", "1", "--max-tokens", "32",
                                     "--scripted", "--overlap", "--events", "--curve", "1:0.5,64:1.0", "--out", str(out)),
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    report = out.read_text()
    assert "(every reply the same)" in report and "| adaspark, overlapped | all |" in report and "| ar | all |" in report
    between = {line.split("|")[1].strip(): int(line.split("|")[2]) for line in report.splitlines()
               if line.startswith("| ") and line.count("|") == 5 and line.split("|")[2].strip().isdigit()}
    assert set(between) == {"ar", "adaspark", "adaspark, overlapped"} and min(between.values()) > 0, report
    bad = subprocess.run(module_argv("benchmarks.cost.round_host_time", str(script), "--scripted", "--curve", "16:8,1:6"),
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "rows must increase" in bad.stderr and "Traceback" not in bad.stderr


def test_the_machine_names_its_cpu_family_and_model(monkeypatch, tmp_path):
    """"AMD EPYC" alone is a Zen 3 or a Zen 4 (other kernels, other replies): reports add the numbers,
    read from the first processor of /proc/cpuinfo, as `adaspark bench` reports do."""
    from adaspark_app.bench import runner
    from benchmarks import common

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\n"
                       "model name\t: AMD EPYC\n\nprocessor\t: 1\ncpu family\t: 6\nmodel\t\t: 207\n")
    monkeypatch.setattr(runner, "CPUINFO", cpuinfo)
    assert common.cpu_model() == "AMD EPYC (family 25, model 17)"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Some CPU\n")
    assert common.cpu_model() == "Some CPU"
    monkeypatch.setattr(runner, "CPUINFO", tmp_path / "missing")
    monkeypatch.setattr(runner.platform, "processor", lambda: "")
    assert common.cpu_model() == "unknown"


@pytest.mark.model
def test_reopen_ttft_reads_the_history_from_disk_or_ahead_and_every_way_replies_the_same(tmp_path):
    """`reopen_ttft` on the bundled model: the saved way's replies read the history from disk, the
    ahead way's read it before the message; the report gives their ratios and says every way
    replied the same (its exit code 0)."""
    from benchmarks.speed.reopen_ttft import main

    turns = ["Here is my list:\n" + "\n".join(f"Item {i}: a box of {i * 7 % 23} marbles." for i in range(50)),
             "Which item has the most marbles?"]
    script = tmp_path / "set.jsonl"
    script.write_text(json.dumps({"id": "c1", "turns": turns}) + "\n")
    out = tmp_path / "report.md"
    assert main([str(script), "--limit", "1", "--repeats", "3", "--first-tokens", "8", "--reply-tokens", "4",
                 "--n-ctx", "1024", "--ways", "saved,prefill,ahead", "--out", str(out)]) == 0
    report = out.read_text()
    assert "Replies identical every way: 1 of 1." in report
    head = next(line for line in report.splitlines() if line.startswith("| conversation |")).split("|")
    row = next(line for line in report.splitlines() if line.startswith("| c1 |")).split("|")
    cell = {h.strip(): v.strip() for h, v in zip(head, row)}
    prompt = int(cell["prompt tokens"])
    for way in ("saved", "ahead"):
        given = int(cell[f"{way}: tokens given"])
        assert given >= 256 and prompt - given < 64, (way, cell)
        assert f"prefill / {way}, time to first token:" in report
    assert float(cell["reading ahead ms"]) > 0
    with pytest.raises(SystemExit):
        main([str(script), "--ways", "saved,ahead"])  # no base to compare with
    with pytest.raises(SystemExit):
        main([str(script), "--ways", "saved,prefill", "--after-reply"])  # nothing read from disk in a chat going on
    # a follow-up: the cache holds the first reply; reading ahead gives the turn's end and the next's start
    assert main([str(script), "--limit", "1", "--repeats", "2", "--first-tokens", "8", "--reply-tokens", "4",
                 "--n-ctx", "1024", "--ways", "prefill,ahead", "--after-reply", "--out", str(out)]) == 0
    report = out.read_text()
    assert report.startswith("# Time to first token of a follow-up") and "Replies identical every way: 1 of 1." in report
    head = next(line for line in report.splitlines() if line.startswith("| conversation |")).split("|")
    row = next(line for line in report.splitlines() if line.startswith("| c1 |")).split("|")
    assert 0 < int(dict(zip(head, row))[" ahead: tokens given "]) < 16
    # a first message pasted but its last 40 characters: the paste read as a draft while they are typed
    assert main([str(script), "--limit", "1", "--repeats", "2", "--reply-tokens", "4", "--n-ctx", "1024",
                 "--ways", "prefill,ahead", "--typed", "40", "--out", str(out)]) == 0
    report = out.read_text()
    assert report.startswith("# Time to first token of a pasted text and 40 characters") and "1 of 1." in report
    row = dict(zip(next(line for line in report.splitlines() if line.startswith("| conversation |")).split("|"),
                   next(line for line in report.splitlines() if line.startswith("| c1 |")).split("|")))
    assert 256 < int(row[" ahead: tokens given "]) and int(row[" prompt tokens "]) - int(row[" ahead: tokens given "]) < 32
    with pytest.raises(SystemExit):
        main([str(script), "--ways", "prefill,ahead", "--typed", "40", "--after-reply"])


@pytest.mark.model
def test_prompt_tokens_times_both_ways_per_turn_and_finds_them_alike(tmp_path):
    """`benchmarks.cost.prompt_tokens`: every turn's window and tokens the same both ways (exit 0),
    the ratio and the rows by prompt size in the report; `--ttft` replies the same both ways."""
    from benchmarks.cost.prompt_tokens import main

    out = tmp_path / "report.md"
    for lines, extra in ((120, []), (40, ["--ttft", "--reply-tokens", "2"])):  # past 4 KB: pieces cut
        paste = "Here is my list:\n" + "\n".join(f"Item {i}: a box of {i * 7 % 23} marbles." for i in range(lines))
        (tmp_path / "set.jsonl").write_text(json.dumps({"id": "c1", "turns": [paste, "Which is largest?"]}) + "\n")
        assert main([str(tmp_path / "set.jsonl"), "--n-ctx", "2048", "--max-tokens", "64", "--reply-chars", "800",
                     "--out", str(out), *extra]) == 0
        report = out.read_text()
        assert "different between the ways: 0 of 2" in report and "**whole / pieces," in report
        assert any(line.startswith("| 1000-1999 | ") or line.startswith("| 0-999 | ") for line in report.splitlines())


@pytest.mark.model
def test_ngram_begin_times_both_ways_at_each_length(tmp_path):
    """`benchmarks.cost.ngram_begin`: a row per history length, both ways timed (no speed asserted)."""
    from benchmarks.cost.ngram_begin import main

    out = tmp_path / "ngram.md"
    assert main(["--lengths", "200,400", "--repeats", "2", "--out", str(out)]) == 0
    rows = [line.split("|") for line in out.read_text().splitlines() if line.startswith("| 200 ") or line.startswith("| 400 ")]
    assert [int(r[1]) for r in rows] == [200, 400] and all(float(r[2]) > 0 and float(r[3]) > 0 for r in rows)


@pytest.mark.model
def test_engine_load_compares_a_header_walked_once_with_once_per_reader(tmp_path):
    """`benchmarks.cost.engine_load`: the kept way walks the model's header once per load, the
    other once per reader (the context size, the layer check, the fingerprint), and the report
    gives their ratio."""
    from benchmarks.cost.engine_load import main

    out = tmp_path / "load.md"
    assert main(["--pairs", "2", "--out", str(out)]) == 0
    report = out.read_text()
    assert "header walks per load: kept [1], walked [3]" in report
    assert "Walked / kept: **" in report


@pytest.mark.model
def test_width_steps_compares_a_few_rows_with_a_one_row_step_in_each_reply(tmp_path):
    """`benchmarks.cost.width_steps` on the bundled model: each reply of a pinned arm has one-row
    steps and 2-row verifies, and the report gives their ratio with an interval."""
    from benchmarks.cost.width_steps import main

    out = tmp_path / "steps.md"
    assert main(["--limit", "2", "--widths", "2", "--max-tokens", "48", "--out", str(out)]) == 0
    report = out.read_text()
    assert "set: `benchmarks/corpora/longpaste.jsonl.gz`" in report
    row = next(line for line in report.splitlines() if line.startswith("| 2 |"))
    assert row.split("|")[2].strip() in ("1", "2") and "x [" in row
