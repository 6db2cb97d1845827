"""`benchmarks/speed/modeled_gpu.py`: the arms on the real engine with the forward replayed at a
modeled GPU curve, beside the n-gram oracle and ngram-mod priced on the same replies."""

from __future__ import annotations

import json
import re
import subprocess

import pytest

from benchmarks.common import ROOT, module_argv
from benchmarks.cost.scripted_target import Reference, parse_curve
from benchmarks.speed.modeled_gpu import curve_cost, gap_table, headroom

BLOCK = list(range(100, 140))


def _copy_reference() -> Reference:
    """A prompt that holds a 40-token block, ending on the block's first four tokens, and a reply
    that continues the copy: after the prefill's first token, 29 tokens a chain proposes whole."""
    return Reference(prompt=[1, 2, *BLOCK, 3, 4, 5, *BLOCK[:4]], reply=BLOCK[4:34], text="", capped=False)


def _never(token: int) -> bool:
    return False


def test_oracle_takes_a_whole_copy_in_one_round_where_rows_are_free_and_none_where_they_are_dear():
    ref = _copy_reference()
    free = headroom(ref, curve_cost(parse_curve("1:1,64:1")), _never)
    dear = headroom(ref, curve_cost(parse_curve("1:1,64:1000")), _never)
    # free rows: one round of 30 rows commits the 29 tokens after the first, at one step's cost
    assert free[0] == pytest.approx(29.0)
    # rows at 16+ steps each: the oracle never drafts (plain decode); ngram-mod drafts blind and pays
    assert dear[0] == pytest.approx(1.0)
    assert dear[1] < 0.1
    # on issue 41's RTX 4090-like curve the copy is still several times plain decode
    gpu = headroom(ref, curve_cost(parse_curve("1:6.6,16:8.3,32:9.3,64:11.8")), _never)
    assert 5.0 < gpu[0] < free[0]


def test_a_reply_of_the_first_token_alone_has_no_rounds_to_price():
    ref = Reference(prompt=[1, 2, 3], reply=[7], text="", capped=True)
    assert headroom(ref, curve_cost(parse_curve("1:1,64:2")), _never) == (1.0, 1.0)


def _reply(arm: str, conv: str, speed: float, rounds: int, tokens: int = 30):
    from adaspark_app.bench.stats import MergedReply

    return MergedReply(arm=arm, conversation=conv, turn=0, category=None, speed=speed, looped=False, text="",
                       n_tokens=tokens, decode_s=tokens / speed, rounds=rounds, widths={}, measure_rounds=0)


def test_gap_table_finds_the_replies_that_carry_an_arms_lead():
    # pinned:32 leads on two of four replies (2x and 1.5x, in 2 rounds where adaspark took 3 and 4),
    # is even on one and 5% slower on the last: alone the two make (2 x 1.5)^(1/4), in all (2 x 1.5 x 0.95)^(1/4)
    merged = {}
    for conv, base, other, b_rounds, o_rounds in (("a", 10.0, 20.0, 3, 2), ("b", 10.0, 15.0, 4, 2),
                                                  ("c", 10.0, 10.0, 9, 9), ("d", 10.0, 9.5, 9, 10)):
        merged[("adaspark", conv, 0)] = _reply("adaspark", conv, base, b_rounds)
        merged[("pinned:32", conv, 0)] = _reply("pinned:32", conv, other, o_rounds)
        merged[("ar", conv, 0)] = _reply("ar", conv, 5.0, 30)
    lines = gap_table(merged, ["ar", "adaspark", "pinned:32"])
    assert f"| `pinned:32` | 2 of 4 | {3.0 ** 0.25:.3f} | {2.85 ** 0.25:.3f} | 7 | 4 | 30 |" in lines, lines
    assert not any("`ar`" in line for line in lines)
    # an arm that trails `adaspark` overall has no lead to explain
    slow = {k: (_reply(k[0], k[1], v.speed * 0.5, v.rounds) if k[0] == "pinned:32" else v) for k, v in merged.items()}
    assert gap_table(slow, ["ar", "adaspark", "pinned:32"]) == []


@pytest.mark.model
def test_modeled_gpu_runs_the_arms_on_the_replayed_replies_and_refuses_bad_input(tmp_path):
    text = "The quick brown fox jumps over the lazy dog near the river bank at dawn."
    script = tmp_path / "s.jsonl"
    script.write_text(json.dumps({"id": "copy", "turns": [f"Repeat exactly: {text} {text}", "Again, please."]}) + "\n")
    out = tmp_path / "gpu.md"
    run = subprocess.run(module_argv("benchmarks.speed.modeled_gpu", str(script), "--max-tokens", "32",
                                     "--arms", "ar,adaspark,pinned:4", "--curve", "1:0.5,64:1.0", "--warm-up", str(script),
                                     "--host-argmax", "49152:25", "--out", str(out)),
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    report = out.read_text()
    assert "Replies that differ from `ar`'s: 0 " in report, report
    assert f"Each engine first served `{script}` (1 conversations, untimed)" in report, report
    assert "Tokens taken the host way: after each forward its rows' logits (49152 tokens a row) cross at 25 GB/s" in report
    found = {m.group(2): m for m in re.finditer(
        r"^\| multi-turn chat \| (\d+) \| `(adaspark|pinned:4)` \| ([\d.]+) \[([\d.]+), ([\d.]+)\] \| ([\d.]+) ",
        report, re.M)}
    assert set(found) == {"adaspark", "pinned:4"}, report
    for m in found.values():
        assert int(m.group(1)) == 2  # both turns, capped or not
        assert float(m.group(4)) <= float(m.group(3)) <= float(m.group(5))
        assert float(m.group(6)) > 1.0  # the copy pays for the oracle at a flat curve
    # the cost model's learned price of a plain step sits on the modeled curve (0.5 ms a row)
    one = re.search(r"^\| 1 \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|$", report, re.M)
    assert one is not None and float(one.group(2)) == 0.5 and 0.9 < float(one.group(3)) < 1.5, report
    # on this CPU's own forward, with `adaspark` beside its variants: without the chain-end credit,
    # without the backoff followers, backing off to the last 2 tokens only
    cpu = subprocess.run(module_argv("benchmarks.speed.modeled_gpu", str(script), "--max-tokens", "32",
                                     "--arms", "ar,adaspark", "--cpu", "--no-chain-end", "--no-backoff", "--backoff-2",
                                     "--out", str(out)),
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert cpu.returncode == 0, cpu.stderr[-2000:]
    report = out.read_text()
    assert report.startswith("# Speed on this CPU") and "Replies that differ from `ar`'s: 0 " in report, report
    rows = re.findall(r"^\| multi-turn chat \| 2 \| `(adaspark(?:@[a-z0-9-]+)?)` \| [\d.]+ .* \| - \| - \| - \|$",
                      report, re.M)
    assert rows == ["adaspark", "adaspark@no-chain-end", "adaspark@no-backoff", "adaspark@backoff-2"], report
    assert "--no-chain-end --no-backoff --backoff-2" in report  # the command says how to run it again
    assert "learned / modeled" not in report  # no curve: no learned-price table
    for argv, said in ((("--arms", "adaspark"), "must include ar"), (("--arms", "ar,nonsense"), "nonsense"),
                       (("--curve", "16:8,1:6"), "rows must increase"),
                       (("--host-argmax", "151936"), "give VOCAB:GBPS"), (("--host-argmax", "151936:0"), "positive rate"),
                       (("--cpu", "--host-argmax", "151936:25"), "not with --cpu"),
                       (("--warm-up", str(tmp_path / "missing.jsonl")), "missing.jsonl"),
                       (("--model", str(tmp_path / "missing.gguf")), "missing.gguf: no such file")):
        bad = subprocess.run(module_argv("benchmarks.speed.modeled_gpu", str(script), *argv),
                             cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert bad.returncode == 2 and said in bad.stderr and "Traceback" not in bad.stderr, (argv, bad.stderr)
        assert len(bad.stderr.strip().splitlines()) == 1
