"""adaspark_app.bench.runner / report: interleaving, stores per arm, report files (no model)."""

from __future__ import annotations

import json

import pytest

from adaspark_app.bench import commands, runner
from adaspark_app.engine.events import ReplyResult
from adaspark_app.errors import ArgumentError
from adaspark_app.runner import Conversation


def test_arm_order_alternates_between_consecutive_conversations():
    arms = ["ar", "chain:4", "adaspark"]
    assert runner.arm_order(arms, 0) == arms
    assert runner.arm_order(arms, 1) == arms[::-1]
    assert runner.arm_order(arms, 2) == arms


def test_schedule_alternates_across_repeats_and_runs_every_arm_once_per_conversation():
    plan = runner.schedule(3, ["a", "b"], repeats=2)
    assert [(r, i) for r, i, _ in plan] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    orders = [o for _, _, o in plan]
    assert orders == [["a", "b"], ["b", "a"], ["a", "b"], ["b", "a"], ["a", "b"], ["b", "a"]]
    # each arm runs first exactly as often as it runs last (balanced drift)
    assert sum(o[0] == "a" for o in orders) == sum(o[0] == "b" for o in orders)


def test_arm_labels_validate_and_disambiguate_repeated_arms():
    assert runner.arm_labels(["ar", "ar", "CHAIN:4"]) == [("ar", "ar"), ("ar#2", "ar"),
                                                           ("chain:4", "chain:4")]
    with pytest.raises(ArgumentError):
        runner.arm_labels(["ar", "bogus"])
    with pytest.raises(ArgumentError):
        runner.arm_labels(["ar"])


def test_drafter_suffix_marks_the_arms_that_run_with_the_drafter(monkeypatch):
    assert runner.arm_labels(["ar", "adaspark", "Adaspark+drafter"]) == [
        ("ar", "ar"), ("adaspark", "adaspark"), ("adaspark+drafter", "adaspark+drafter")]
    with pytest.raises(ArgumentError):
        runner.arm_labels(["ar", "adaspark+bogus"])
    made = []
    monkeypatch.setattr("adaspark_app.engine.chat_engine.ChatEngine",
                        lambda **kw: made.append((kw["arm"], kw["drafter_path"])))
    cfg = runner.BenchConfig(script="s", arms=["ar", "adaspark+drafter"], drafter="d.gguf")
    runner._default_engine_factory(cfg, "ar", None)
    runner._default_engine_factory(cfg, "adaspark+drafter", None)
    cfg_all = runner.BenchConfig(script="s", arms=["ar", "adaspark"], drafter="d.gguf")
    runner._default_engine_factory(cfg_all, "adaspark", None)
    assert made == [("ar", None), ("adaspark", "d.gguf"), ("adaspark", "d.gguf")]


SPEED = {"ar": 100.0, "chain:4": 150.0}


class FakeEngine:
    def __init__(self, arm, store):
        self.arm, self.store, self.closed = arm, store, False

    def close(self):
        self.closed = True


def fake_run(calls):
    def run_conversation(engine, conv, max_tokens, on_round=None):
        calls.append((conv.id, engine.arm))
        out = []
        for t, _ in enumerate(conv.turns):
            n = max_tokens if conv.id == "loops" else 10
            out.append(ReplyResult(
                conversation=conv.id, turn=t, text=f"reply {t}", n_tokens=n,
                decode_s=n / SPEED[engine.arm], prefill_s=0.01, prompt_tokens=5, context=50,
                rounds=n, widths={1: n} if engine.arm == "ar" else {1: 2, 5: n - 2}, measure_rounds=0,
                rows_by_source={}, accepted_by_source={}, looped=conv.id == "loops", stopped=False,
                arm=engine.arm, tokens=list(range(n))))
        return out
    return run_conversation


def test_bench_interleaves_uses_a_store_per_arm_and_writes_every_report_file(tmp_path):
    convs = [Conversation("c0", ["hi", "more"], category="chat"),
             Conversation("c1", ["code"], category="code"),
             Conversation("loops", ["again"], category="chat")]
    calls, engines, stores = [], [], []

    def engine_factory(config, arm, store):
        engines.append(FakeEngine(arm, store))
        return engines[-1]

    def store_factory(path):
        stores.append(path)
        return {"path": path}

    cfg = runner.BenchConfig(script="inline", arms=["ar", "chain:4"], max_tokens=16,
                             report_dir=str(tmp_path / "rep"))
    report = runner.run_bench(cfg, engine_factory=engine_factory, store_factory=store_factory,
                              run_conversation=fake_run(calls), conversations=convs, progress=False)
    assert calls == [("c0", "ar"), ("c0", "chain:4"), ("c1", "chain:4"), ("c1", "ar"),
                     ("loops", "ar"), ("loops", "chain:4")]
    assert len(engines) == 2 and len(set(stores)) == 2  # one engine and one store per arm
    assert all(e.closed for e in engines)
    assert not stores[0].parent.exists()  # fresh temporary stores are cleaned up
    for name in ("report.md", "report.json", "replies.jsonl", "speed_ratio_by_category.png",
                 "width_shares.png"):
        assert (tmp_path / "rep" / name).stat().st_size > 0, name
    for png in ("speed_ratio_by_category.png", "width_shares.png"):
        assert (tmp_path / "rep" / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = json.loads((tmp_path / "rep" / "report.json").read_text())
    overall = data["summary"]["comparisons"]["chain:4"]["overall"]
    assert overall["geomean_ratio"] == pytest.approx(1.5)
    assert overall["excluded_looped"] == 1 and overall["replies"] == 3
    assert data["headline"]["chain:4"]["ci95"][0] <= 1.5 <= data["headline"]["chain:4"]["ci95"][1]
    assert data["summary"]["arms"]["ar"]["width_shares"] == {"1": 1.0}
    assert report["meta"]["replies_done"] == 8
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "1.500x" in md and "chat" in md and "code" in md
    lines = (tmp_path / "rep" / "replies.jsonl").read_text().splitlines()
    assert len(lines) == 8 and "tokens" not in json.loads(lines[0])


def test_bench_keeps_named_stores_in_store_dir(tmp_path):
    stores = []
    cfg = runner.BenchConfig(script="inline", arms=["ar", "ar"], max_tokens=4,
                             report_dir=str(tmp_path / "rep"), store_dir=str(tmp_path / "stores"))
    runner.run_bench(cfg, engine_factory=lambda c, a, s: FakeEngine(a, s),
                     store_factory=lambda p: stores.append(p) or p,
                     run_conversation=fake_run([]), conversations=[Conversation("c0", ["x"])],
                     progress=False)
    assert [p.name for p in stores] == ["ar.db", "ar_2.db"]
    data = json.loads((tmp_path / "rep" / "report.json").read_text())
    assert data["summary"]["comparisons"]["ar#2"]["overall"]["identical_share"] == 1.0


def test_interrupted_bench_writes_partial_report(tmp_path):
    def run_conversation(engine, conv, max_tokens, on_round=None):
        if conv.id == "c1":
            raise KeyboardInterrupt
        return fake_run([])(engine, conv, max_tokens)

    cfg = runner.BenchConfig(script="inline", arms=["ar", "chain:4"], max_tokens=4,
                             report_dir=str(tmp_path / "rep"))
    with pytest.raises(KeyboardInterrupt):
        runner.run_bench(cfg, engine_factory=lambda c, a, s: FakeEngine(a, s),
                         store_factory=lambda p: p, run_conversation=run_conversation,
                         conversations=[Conversation("c0", ["x"]), Conversation("c1", ["y"])],
                         progress=False)
    data = json.loads((tmp_path / "rep" / "report.json").read_text())
    assert data["meta"]["interrupted"] is True and data["meta"]["replies_done"] == 2


def test_bad_options_are_argument_errors(tmp_path):
    for kw in ({"max_tokens": 0}, {"repeats": 0}, {"arms": ["ar"]}):
        cfg = runner.BenchConfig(script="inline", arms=kw.pop("arms", ["ar", "chain:4"]),
                                 report_dir=str(tmp_path), **kw)
        with pytest.raises(ArgumentError):
            runner.run_bench(cfg, conversations=[Conversation("c", ["x"])], progress=False)


def test_cli_parser_accepts_the_contract_options():
    import argparse

    p = argparse.ArgumentParser()
    commands.add_parser(p.add_subparsers(dest="command"))
    args = p.parse_args(["bench", "s.jsonl", "--arms", "ar,adaspark", "--max-tokens", "16",
                         "--repeats", "2", "--report", "out", "--store-dir", "st", "--model", "m.gguf",
                         "--drafter", "d.gguf"])
    assert (args.script, args.arms, args.max_tokens, args.repeats, args.report, args.store_dir) == \
        ("s.jsonl", "ar,adaspark", 16, 2, "out", "st")
    assert "--max-tokens 16" in commands.command_line(args)
    assert "--keep-capped" not in commands.command_line(args)
    capped = p.parse_args(["bench", "s.jsonl", "--arms", "ar,adaspark", "--keep-capped"])
    assert "--keep-capped" in commands.command_line(capped)  # the report records a fixed-length run
    assert args.func is commands.run


def test_report_can_be_recomputed_from_replies(tmp_path):
    cfg = runner.BenchConfig(script="inline", arms=["ar", "chain:4"], max_tokens=4,
                             report_dir=str(tmp_path / "rep"))
    runner.run_bench(cfg, engine_factory=lambda c, a, s: FakeEngine(a, s), store_factory=lambda p: p,
                     run_conversation=fake_run([]), conversations=[Conversation("c0", ["x", "y"])],
                     progress=False)
    again = runner.report_from_replies(str(tmp_path / "rep" / "replies.jsonl"), str(tmp_path / "again"))
    assert again["headline"]["chain:4"]["geomean_ratio"] == pytest.approx(1.5)
    assert (tmp_path / "again" / "width_shares.png").exists()


def test_cli_bench_user_errors_exit_2_with_one_line(tmp_path, capsys):
    from adaspark_app import cli

    missing = tmp_path / "missing.jsonl"
    assert cli.main(["bench", str(missing), "--arms", "ar,adaspark", "--report", str(tmp_path / "r"),
                     "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "missing.jsonl" in err and "Traceback" not in err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "turns": ["hi"]}\n{"id": "b"\n')
    assert cli.main(["bench", str(bad), "--arms", "ar,adaspark", "--report", str(tmp_path / "r"),
                     "--no-progress"]) == 2
    assert f"{bad}:2" in capsys.readouterr().err
    assert cli.main(["bench", str(bad), "--arms", "ar,warp:9", "--no-progress"]) == 2
    assert "warp:9" in capsys.readouterr().err


class GeneratingEngine(FakeEngine):
    """Answers through generate(), like ChatEngine; remembers the history it was given."""

    def __init__(self, arm, store):
        super().__init__(arm, store)
        self.seen = []

    def generate(self, conversation_id, messages, max_tokens=512, on_round=None, turn=0, cancel=None):
        self.seen.append([m["content"] for m in messages])
        n = 8
        return ReplyResult(conversation=conversation_id, turn=turn, text=f"{self.arm} says {turn}",
                           n_tokens=n, decode_s=n / SPEED[self.arm], prefill_s=0.0, prompt_tokens=1,
                           context=10, rounds=n, widths={1: n}, measure_rounds=0, rows_by_source={},
                           accepted_by_source={}, looped=False, stopped=False, arm=self.arm)


def test_each_arm_carries_its_own_replies_and_progress_counts_every_reply(tmp_path):
    import io

    from rich.console import Console

    engines = {}

    def factory(config, arm, store):
        engines[arm] = GeneratingEngine(arm, store)
        return engines[arm]

    buf = io.StringIO()
    cfg = runner.BenchConfig(script="inline", arms=["ar", "chain:4"], max_tokens=8,
                             report_dir=str(tmp_path / "rep"))
    runner.run_bench(cfg, engine_factory=factory, store_factory=lambda p: p,
                     conversations=[Conversation("c0", ["q1", "q2"])], progress=True,
                     console=Console(file=buf, width=120, force_terminal=False))
    assert engines["ar"].seen[1] == ["q1", "ar says 0", "q2"]
    assert engines["chain:4"].seen[1] == ["q1", "chain:4 says 0", "q2"]
    assert "4/4" in buf.getvalue()


def test_the_machine_line_names_the_cpus_family_and_model():
    """A report's CPU: the first processor's model name with its family and model numbers (two
    "AMD EPYC" machines, a Zen 3 and a Zen 4, run different kernels); a name alone where the
    numbers are missing, and "" where /proc/cpuinfo names no model (machine_info then asks platform)."""
    from adaspark_app.bench.runner import cpu_label

    def processor(name: str, family: str, model: str) -> str:
        return f"processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: {family}\nmodel\t\t: {model}\nmodel name\t: {name}\n"

    zen3 = processor("AMD EPYC", "25", "1") + "\n" + processor("AMD EPYC", "25", "17")  # the first one counts
    assert cpu_label(zen3) == "AMD EPYC (family 25, model 1)"
    assert cpu_label(processor("Intel(R) Xeon(R) Processor", "6", "207")) == "Intel(R) Xeon(R) Processor (family 6, model 207)"
    assert cpu_label("processor\t: 0\nmodel name\t: Some CPU\n") == "Some CPU"
    assert cpu_label("processor\t: 0\nCPU implementer\t: 0x41\n") == ""
