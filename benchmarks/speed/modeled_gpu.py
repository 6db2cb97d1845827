"""Speed on a modeled GPU: the engine's real host code, the target's forward at a GPU's cost curve.

No GPU has been lent to a session yet, so issue 41's speed bars (`adaspark` at least 2.0x its own
`ar` on paste-and-ask and 1.4x on multi-turn chat, at least 60% of the n-gram oracle's gain) are
estimated here, on this CPU, with the scripted target (``benchmarks/cost/scripted_target.py``):

- every arm commits the reply a real `ar` run of the target gave (checked, reply by reply): the
  bundled model, or ``--model GGUF``;
- each forward of n rows takes the curve's time (``--curve``, default issue 41's RTX 4090 8B
  figures), spinning on the host, overlapped as on a GPU: llama_decode returns at once and the
  wait is at the logits' read, so the engine's deferred learning runs during it;
- everything else is the engine as it ships: the n-gram index, the tree, the acceptance model,
  the cost model learning the modeled curve from its own timings, the chooser, the batch.

Arms run interleaved per conversation (the order rotates), each engine on a fresh in-memory store
that learns over the whole set, as a new user's would; with ``--warm-up SCRIPT`` each engine first
serves another script untimed, as a user's store that has learned. Replies reaching ``--max-tokens`` are kept
(a fixed-length comparison) and counted. Beside the arms, on the same `ar` replies and the same
curve (no host time): the n-gram oracle (it knows how far each copy of the conversation's own text
runs, 64 rows at most, and pays nothing for misses) and llama.cpp's ``ngram-mod`` rule
(``benchmarks/oracle/ngram_mod_replay.py``). `adaspark`'s share of the oracle's gain is
(adaspark/ar - 1) / (oracle - 1). For each arm that leads `adaspark`, the report says where the lead
comes from (``gap_table``): the replies it ran 10% faster or more, the lead they make alone and the
rounds they took.

With ``--no-chain-end`` an arm `adaspark@no-chain-end` runs beside them: `adaspark` scoring widths
by Eq. (7) alone, without the credit for a chain that ends inside the tree
(``WidthScheduler._credit_chain_end``). With ``--no-backoff`` an arm `adaspark@no-backoff`:
`adaspark` whose n-gram index proposes nothing where no passage and no follower of the last 3
tokens do (``NgramIndex``'s ``backoff``); with ``--backoff-2`` one `adaspark@backoff-2` whose
index backs off to the last 2 tokens' follower only. With ``--cpu`` the forward is this CPU's
own, not the curve: the same arms as a CPU user runs them, to check that a rule made for the GPU costs the
CPU nothing (no oracle column and no learned-price table then).

With ``--host-clock`` an arm `adaspark@host-clock` runs beside them: `adaspark` whose cost model
scales the verify prices of rounds without the drafter by D, the round's host time, as it does on
the CPU (``VerifyCostModel.host_clock``); on a GPU that clock says nothing of the device.

What this cannot say: how a real GPU's curve steps (the learner's job; ``benchmarks/gpu/run.sh``
measures it), the GPU host's own speed, and a 7B model's text (the replies are the bundled
model's).

    python -m benchmarks.speed.modeled_gpu SET.jsonl [--limit N] [--max-tokens 128]
        [--arms ar,adaspark,pinned:4,pinned:16] [--curve 1:6.6,16:8.3,32:9.3,64:11.8 | --cpu] [--host-clock]
        [--no-chain-end] [--no-backoff] [--backoff-2] [--model GGUF] [--warm-up SCRIPT] [--host-argmax VOCAB:GBPS] [--out FILE.md]

With ``--host-argmax VOCAB:GBPS`` every arm takes its tokens the host way (``ADASPARK_ARGMAX=host``):
each forward's rows' logits cross to the host at GBPS (modeled) and numpy scans them (real, read
cold); without it, the device way (the engine's default on a GPU), at no cost past the forward.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from adaspark_app import native
from adaspark_app.bench.stats import MergedReply, ReplyRecord, bootstrap_interval, compare, geometric_mean, \
    merge_repeats
from adaspark_app.engine.arms import parse_arm
from adaspark_app.engine.chat_engine import ChatEngine
from adaspark_app.engine.events import RoundEvent
from adaspark_app.errors import AdaSparkError
from adaspark_app.learn.cost import VerifyCostModel
from adaspark_app.runner import load_script, run_conversation
from benchmarks.common import cpu_model, emit_report
from benchmarks.cost.scripted_target import GRAPH_MODES, Reference, ScriptedTarget, add_run_arguments, curve_ms, \
    parse_curve, parse_host_argmax, reference_replies, replay_conversation
from benchmarks.oracle.ngram_mod_replay import group_of, oracle_width, positions, simulate

DEFAULT_ARMS = "ar,adaspark,pinned:4,pinned:16"
HOST_CLOCK_ARM = "adaspark@host-clock"
NO_CHAIN_END_ARM = "adaspark@no-chain-end"
NO_BACKOFF_ARM = "adaspark@no-backoff"
BACKOFF_2_ARM = "adaspark@backoff-2"
VARIANTS = (HOST_CLOCK_ARM, NO_CHAIN_END_ARM, NO_BACKOFF_ARM, BACKOFF_2_ARM)  # `adaspark` with one rule changed, beside it
GROUPS = ("paste-and-ask", "multi-turn chat")
WIDTH_BINS = ((4, "2-4"), (8, "5-8"), (16, "9-16"), (32, "17-32"), (64, "33-64"))


def _engine(arm: str, model: str | None = None) -> ChatEngine:
    """The arm's engine; a variant (``VARIANTS``) is `adaspark` with one rule changed:
    ``HOST_CLOCK_ARM`` keeps scaling the verify prices of rounds without the drafter by their D
    (host time), as on the CPU, where the forward runs on the (modeled) GPU; ``NO_CHAIN_END_ARM``
    scores widths by Eq. (7) alone, without the chain-end credit (``WidthScheduler._credit_chain_end``);
    ``NO_BACKOFF_ARM``'s n-gram index proposes nothing where a passage and the last 3 tokens do not
    (no follower of the last 2: ``NgramIndex``'s ``backoff``); ``BACKOFF_2_ARM``'s backs off to the
    last 2 tokens' follower only, not to the last token's."""
    eng = ChatEngine(model, arm="adaspark" if arm in VARIANTS else arm, n_ctx=4096, n_threads=2)
    if arm == HOST_CLOCK_ARM:
        dec = eng.decoder
        start = dec.start_reply

        def start_reply(prompt, **kw):
            out = start(prompt, **kw)
            dec.learners.cost.host_clock = True
            return out

        dec.start_reply = start_reply
    if arm == NO_CHAIN_END_ARM:
        eng.decoder.learners.scheduler.credits_chain_end = False  # the greedy band's, the one these runs use
    if arm in (NO_BACKOFF_ARM, BACKOFF_2_ARM):  # before its first reply builds the index
        eng.decoder.sources.ngram.backoff = () if arm == NO_BACKOFF_ARM else (2,)
    return eng


def _serve(eng: ChatEngine, target: ScriptedTarget | None, conv, refs: Sequence[Reference], max_tokens: int,
           on_round: Callable[[RoundEvent], None] | None = None) -> list:
    """One conversation through ``eng``: replayed at the modeled curve, or on this CPU's own forward."""
    if target is None:
        return run_conversation(eng, conv, max_tokens, on_round=on_round)
    return replay_conversation(eng, target, conv, refs, max_tokens, on_round=on_round)


def curve_cost(curve: Sequence[tuple[int, float]]) -> Callable[[int], float]:
    """A width's modeled forward time over one row's."""
    one = curve_ms(1, curve)
    return lambda w: curve_ms(w, curve) / one


def headroom(ref: Reference, cost: Callable[[int], float], stop: Callable[[int], bool]) -> tuple[float, float]:
    """(oracle, ngram-mod) speed over plain decode on one reply at the curve's costs: the rounds
    after the prefill's first token, priced by ``cost`` with no host time."""
    prompt, reply = ref.prompt + ref.reply[:1], ref.reply[1:]
    if not reply:
        return 1.0, 1.0
    seq = positions(prompt, reply, stop)
    oracle = simulate(seq, reply, lambda p, r, pos, prev: (oracle_width(p[2], r, pos, cost, 0.0, ref.capped), p[2]),
                      cost, 0.0, ref.capped)[0]
    mod = simulate(seq, reply, lambda p, r, pos, prev: (len(p[4]) + 1, p[4]), cost, 0.0, ref.capped)[0]
    return oracle, mod


def calibration_table(events: list[RoundEvent]) -> list[str]:
    """`adaspark`'s tree rounds by verified width: the draft tokens the acceptance model expected
    (S(n) of the verified nodes) against those accepted; cold and split measurements left out."""
    bins: dict[str, list[float]] = {}
    for e in events:
        if e.prefill or e.width <= 1 or e.measured:
            continue
        key = next(label for top, label in WIDTH_BINS if e.width <= top)
        b = bins.setdefault(key, [0, 0.0, 0])
        b[0] += 1
        b[1] += e.expected_accepted
        b[2] += e.accepted
    if not bins:
        return []
    lines = ["", "`adaspark`'s tree rounds: draft tokens the acceptance model expected against those accepted "
             "(below 1: it underprices the tree):", "", "| verified rows | rounds | expected | accepted | expected / accepted |",
             "|---|---|---|---|---|"]
    for _, label in WIDTH_BINS:
        if label in bins:
            n, e, acc = bins[label]
            lines.append(f"| {label} | {n} | {e:.0f} | {acc} | {e / acc:.2f} |" if acc else f"| {label} | {n} | {e:.0f} | 0 | - |")
    return lines


def prices_table(cost: VerifyCostModel, curve: Sequence[tuple[int, float]], prompts: list[list[int]]) -> list[str]:
    """What `adaspark`'s cost model learned by the end of the run, beside the modeled curve: each
    priced width's verify price at the median prompt's context over its modeled time."""
    context = int(sorted(len(p) for p in prompts)[len(prompts) // 2]) if prompts else 512
    priced = cost.prices(context)
    if not priced:
        return []
    lines = ["", f"What `adaspark` learned, at the median prompt's context ({context} tokens): each offered width's "
             "price (Proposition 2: a wider class that costs less prices the narrower ones) beside the curve:", "",
             "| rows | learned ms | modeled ms | learned / modeled |", "|---|---|---|---|"]
    for w, sec in priced.items():
        ms = curve_ms(w, curve)
        lines.append(f"| {w} | {sec * 1e3:.2f} | {ms:.2f} | {sec * 1e3 / ms:.3f} |")
    return lines


LEAD = 1.1  # a reply an arm ran this much faster than `adaspark` counts toward its lead (gap_table)


def gap_table(merged: Mapping[tuple[str, str, int], MergedReply], arms: Sequence[str]) -> list[str]:
    """Where each arm's lead over `adaspark` comes from: the replies it ran at least LEAD times
    as fast, the lead they make alone (the geometric mean over every paired reply, the others
    counted even) beside the whole lead, and the rounds and tokens of those replies in each arm.
    A lead carried by a few short replies (a copy verified whole in one round where `adaspark`
    took two or three) says something other than one spread over every reply."""
    lines: list[str] = []
    for arm in arms:
        if arm in ("ar", "adaspark"):
            continue
        pairs = [(merged[(arm, c, t)], b) for (a, c, t), b in sorted(merged.items())
                 if a == "adaspark" and (arm, c, t) in merged]
        logs = [(math.log(x.speed / b.speed), x, b) for x, b in pairs if x.speed and b.speed]
        lead = [(lr, x, b) for lr, x, b in logs if lr >= math.log(LEAD)]
        whole = math.exp(sum(lr for lr, _, _ in logs) / len(logs)) if logs else 1.0
        if whole <= 1.0 or not lead:
            continue
        alone = math.exp(sum(lr for lr, _, _ in lead) / len(logs))
        lines.append(f"| `{arm}` | {len(lead)} of {len(logs)} | {alone:.3f} | {whole:.3f} | "
                     f"{sum(b.rounds for _, _, b in lead)} | {sum(x.rounds for _, x, _ in lead)} | "
                     f"{sum(b.n_tokens for _, _, b in lead) / len(lead):.0f} |")
    if not lines:
        return []
    return ["", f"Where an arm's lead over `adaspark` comes from: the replies it ran at least {LEAD:g}x as fast, the "
            "lead they make alone (geometric mean over every reply, the others counted even) beside the whole "
            "lead, and the rounds those replies took in each:", "",
            "| arm | replies | their lead | whole lead | rounds, `adaspark` | rounds, the arm | tokens per reply |",
            "|---|---|---|---|---|---|---|", *lines]


def _gm_interval(by_conv: dict[str, list[float]]) -> tuple[float, float, float]:
    """Geometric mean of per-reply values and its 95% bootstrap interval over conversations."""
    vals = [v for vs in by_conv.values() for v in vs]
    lo, hi = bootstrap_interval({c: [math.log(v) for v in vs] for c, vs in by_conv.items()})
    return geometric_mean(vals), lo, hi


def main() -> None:
    native.activate()  # the CPU kernels, if built, before anything imports llama_cpp
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_run_arguments(ap, 0, "the modeled forward time, ROWS:MS,... linear between")
    ap.add_argument("--arms", default=DEFAULT_ARMS, help="comma-separated arms; `ar` is the base (default %(default)s)")
    ap.add_argument("--host-clock", action="store_true",
                    help=f"add `{HOST_CLOCK_ARM}`: `adaspark` with D's host clock scaling its verify prices, as on the CPU")
    ap.add_argument("--no-chain-end", action="store_true",
                    help=f"add `{NO_CHAIN_END_ARM}`: `adaspark` scoring widths by Eq. (7) alone, without the chain-end credit")
    ap.add_argument("--no-backoff", action="store_true",
                    help=f"add `{NO_BACKOFF_ARM}`: `adaspark` whose n-gram index has no follower of the last 2 tokens")
    ap.add_argument("--backoff-2", action="store_true",
                    help=f"add `{BACKOFF_2_ARM}`: `adaspark` whose n-gram index backs off to the last 2 tokens only")
    ap.add_argument("--cpu", action="store_true",
                    help="the forward is this CPU's own, not the curve: the same arms as a CPU user runs them "
                         "(no oracle, no learned-price table)")
    ap.add_argument("--model", metavar="GGUF", default=None,
                    help="the target whose `ar` replies are replayed (with --cpu: which runs), default the bundled model")
    ap.add_argument("--warm-up", metavar="SCRIPT", default=None,
                    help="each engine first serves SCRIPT, untimed: the measured set then runs on a store that has "
                         "learned (a user's), not a fresh one")
    ap.add_argument("--graphs", choices=[m for m in GRAPH_MODES if m], default=None,
                    help="model CUDA graphs: the curve is a replayed graph's time, a forward without one costs "
                         "--ungraphed-ms more (host-bound); `stock`: llama.cpp's one graph per context, `width`: "
                         "a graph per width (ADASPARK_CUDA_GRAPHS=1); default: every forward costs the curve")
    ap.add_argument("--ungraphed-ms", type=float, default=0.6,
                    help="with --graphs: what a forward without a graph costs over the curve (default %(default)s)")
    ap.add_argument("--host-argmax", metavar="VOCAB:GBPS", default=None,
                    help="take tokens the host way (ADASPARK_ARGMAX=host): after each forward its rows' logits of "
                         "VOCAB tokens cross at GBPS GB/s (modeled) and numpy scans them (real); default: the "
                         "device way, no cost past the forward")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    try:
        curve = parse_curve(a.curve)
        host_argmax = parse_host_argmax(a.host_argmax) if a.host_argmax else None
        if host_argmax and a.cpu:
            raise ValueError("--host-argmax models the curve's forwards: not with --cpu")
        arms = [x.strip() for x in a.arms.split(",") if x.strip()]
        for arm in arms:
            if arm not in VARIANTS:
                parse_arm(arm)
        convs = load_script(a.script)
        warm = load_script(a.warm_up) if a.warm_up else []
        if a.model and not Path(a.model).is_file():
            raise ValueError(f"--model {a.model}: no such file")
        if a.graphs and (a.cpu or not a.ungraphed_ms > 0):
            raise ValueError("--graphs models the curve's forwards: not with --cpu, and --ungraphed-ms must be above 0")
    except (ValueError, AdaSparkError) as e:
        print(f"modeled_gpu: {e}", file=sys.stderr)
        sys.exit(2)
    if "ar" not in arms:
        print("modeled_gpu: --arms must include ar, the base of every ratio", file=sys.stderr)
        sys.exit(2)
    if a.max_tokens < 2:
        print("modeled_gpu: --max-tokens must be at least 2", file=sys.stderr)
        sys.exit(2)
    convs = convs[: a.limit] if a.limit > 0 else convs
    t0 = time.time()
    print(f"reference `ar` replies of {len(convs)} conversations ...", flush=True)
    refs = reference_replies(convs, a.max_tokens, model=a.model)
    for flag, variant in ((a.host_clock, HOST_CLOCK_ARM), (a.no_chain_end, NO_CHAIN_END_ARM),
                          (a.no_backoff, NO_BACKOFF_ARM), (a.backoff_2, BACKOFF_2_ARM)):
        if flag and variant not in arms:
            arms.append(variant)
    engines = {arm: _engine(arm, a.model) for arm in arms}
    targets = {arm: None if a.cpu else ScriptedTarget(eng.backend, curve, overlap=True, graphs=a.graphs,
                                                      ungraphed_ms=a.ungraphed_ms, host_argmax=host_argmax)
               for arm, eng in engines.items()}
    if warm:
        print(f"warm-up: `ar` replies of {len(warm)} conversations, then each arm serves them untimed ...", flush=True)
        warm_refs = reference_replies(warm, a.max_tokens, model=a.model)
        for arm, eng in engines.items():
            for c, turns in zip(warm, warm_refs):
                _serve(eng, targets[arm], c, turns, a.max_tokens)
                eng.reset_conversation()
    records: list[ReplyRecord] = []
    priced: dict[str, list[RoundEvent]] = {"adaspark": []}  # `adaspark`'s round events: priced against accepted
    differ = 0
    for i, c in enumerate(convs):
        k = i % len(arms)
        for arm in arms[k:] + arms[:k]:
            eng = engines[arm]
            replies = _serve(eng, targets[arm], c, refs[i], a.max_tokens,
                             on_round=priced[arm].append if arm == "adaspark" else None)
            for t, r in enumerate(replies):
                differ += int(r.text != refs[i][t].text)
                records.append(ReplyRecord(arm=arm, conversation=c.id, turn=t, n_tokens=r.n_tokens,
                                           decode_s=r.decode_s, category=c.category, text=r.text, rounds=r.rounds,
                                           widths=dict(r.widths)))
            eng.reset_conversation()
        print(f"{i + 1}/{len(convs)} {c.id}", flush=True)
    stop = engines["ar"].backend.is_control
    cost = curve_cost(curve)
    room: dict[str, dict[str, dict[str, list[float]]]] = {g: {"oracle": defaultdict(list), "ngram-mod": defaultdict(list)}
                                                          for g in (*GROUPS, "all")}
    for c, turns in ([] if a.cpu else zip(convs, refs)):  # --cpu: no curve, no oracle priced at it
        for ref in turns:
            o, m = headroom(ref, cost, stop)
            for g in (group_of(c.category or ""), "all"):
                room[g]["oracle"][c.id].append(o)
                room[g]["ngram-mod"][c.id].append(m)
    learned = engines["adaspark"].decoder.learners.cost if "adaspark" in engines else None
    price_lines = prices_table(learned, curve, [ref.prompt for turns in refs for ref in turns]) if learned and not a.cpu else []
    for eng in engines.values():
        eng.close()

    cmd = (f"python -m benchmarks.speed.modeled_gpu {a.script} --max-tokens {a.max_tokens} --arms "
           f"{','.join(x for x in arms if x not in VARIANTS)}" + (" --cpu" if a.cpu else f" --curve {a.curve}"))
    cmd += f" --limit {a.limit}" if a.limit > 0 else ""
    cmd += " --host-clock" if a.host_clock else ""
    cmd += " --no-chain-end" if a.no_chain_end else ""
    cmd += " --no-backoff" if a.no_backoff else ""
    cmd += " --backoff-2" if a.backoff_2 else ""
    cmd += f" --model {a.model}" if a.model else ""
    cmd += f" --warm-up {a.warm_up}" if a.warm_up else ""
    cmd += f" --graphs {a.graphs} --ungraphed-ms {a.ungraphed_ms:g}" if a.graphs else ""
    cmd += f" --host-argmax {a.host_argmax}" if a.host_argmax else ""
    capped = sum(ref.capped for turns in refs for ref in turns)
    n_replies = sum(len(turns) for turns in refs)
    where = ("on this CPU" if a.cpu else "on a modeled GPU")
    target = f"`{Path(a.model).name}`" if a.model else "the bundled model"
    forward = (f"Every forward is this CPU's own (`--cpu`), {target}'s: the arms as a CPU user runs them. " if a.cpu else
               f"{target[0].upper() + target[1:]}'s `ar` replies replayed; every forward takes the modeled time of the "
               f"curve {a.curve} (rows:ms), overlapped as on a GPU; the host code is the engine's own. ")
    if a.graphs:
        share = {arm: t.ungraphed / max(1, len(t.forwards)) for arm, t in targets.items() if t is not None}
        forward += (f"CUDA graphs modeled (`{a.graphs}`: " + ("llama.cpp's one graph per context" if a.graphs == "stock"
                    else "a graph per width") + f"): the curve is a replayed graph's time, a forward without one "
                    f"costs {a.ungraphed_ms:g} ms more with the host busy launching it; forwards without a graph: "
                    + ", ".join(f"`{arm}` {100 * v:.0f}%" for arm, v in share.items())
                    + " (the oracle and ngram-mod are priced at the curve alone). ")
    if host_argmax:
        forward += (f"Tokens taken the host way: after each forward its rows' logits ({host_argmax[0]} tokens a row) "
                    f"cross at {host_argmax[1]:g} GB/s (modeled) and numpy scans them, read cold (real); the oracle "
                    "and ngram-mod pay neither. ")
    elif not a.cpu:
        forward += "Tokens taken on the device: nothing past the forward. "
    lines = [f"# Speed {where}: `{a.script}` ({len(convs)} conversations, {n_replies} replies, {a.max_tokens} tokens)",
             "", f"`{cmd}`", "",
             f"Machine: {cpu_model()} ({platform.machine()}, {len(os.sched_getaffinity(0))} cores), Python "
             f"{platform.python_version()}. " + forward +
             f"Replies that differ from `ar`'s: {differ} (a defect if not 0). Replies that reached the cap: {capped} of "
             f"{n_replies} (kept). "
             + (f"Each engine first served `{a.warm_up}` ({len(warm)} conversations, untimed), so the stores had "
                "learned. " if warm else "Fresh stores. ")
             + f"Wall time {time.time() - t0:.0f} s.", "",
             "Speed over `ar` (geometric mean of per-reply ratios, 95% bootstrap interval over conversations)"
             + ("; no curve, so no oracle or ngram-mod priced at it." if a.cpu else
                "; the oracle and ngram-mod on the same replies at the curve's costs, with no host time; share: the "
                "arm's gain over the oracle's."), "",
             "| group | replies | arm | over `ar` | oracle | share of the oracle's gain | ngram-mod (modeled) |",
             "|---|---|---|---|---|---|---|"]
    by_group = {g: [r for r in records if group_of(r.category or "") == g] for g in GROUPS}
    if sum(1 for g in GROUPS if by_group[g]) > 1:
        by_group["all"] = records
    for g, recs in by_group.items():
        if not recs:
            continue
        merged = merge_repeats(recs)
        room_cols = "| - | - | - |"  # on this CPU's forward (--cpu): no curve to price the oracle at
        o = None
        if room[g]["oracle"]:
            o, olo, ohi = _gm_interval(room[g]["oracle"])
            m, mlo, mhi = _gm_interval(room[g]["ngram-mod"])
        for arm in arms:
            if arm == "ar":
                continue
            cmp = compare(merged, arm, "ar")
            if cmp.ratio is None:
                continue
            if o is not None:
                share = (cmp.ratio - 1.0) / (o - 1.0) if o > 1.0 else float("nan")
                room_cols = f"| {o:.3f} [{olo:.3f}, {ohi:.3f}] | {share:.0%} | {m:.3f} [{mlo:.3f}, {mhi:.3f}] |"
            lines.append(f"| {g} | {cmp.replies} | `{arm}` | {cmp.ratio:.3f} [{cmp.ci_low:.3f}, {cmp.ci_high:.3f}] "
                         + room_cols)
    others = [arm for arm in arms if arm not in ("ar", "adaspark")]
    if "adaspark" in arms and others:
        lines += ["", "Each other arm over `adaspark`, paired per reply (geometric mean, 95% bootstrap interval over "
                  "conversations):", "", "| group | arm | over `adaspark` |", "|---|---|---|"]
        for g, recs in by_group.items():
            merged = merge_repeats(recs)
            for arm in others:
                cmp = compare(merged, arm, "adaspark")
                if cmp.ratio is not None:
                    lines.append(f"| {g} | `{arm}` | {cmp.ratio:.3f} [{cmp.ci_low:.3f}, {cmp.ci_high:.3f}] |")
        lines += gap_table(merge_repeats(records), arms)
    lines += calibration_table(priced["adaspark"])
    lines += ["", "Rounds by verified width (every reply):", "", "| arm | tokens per round | widths (share of rounds) |",
              "|---|---|---|"]
    for arm in arms:
        rs = [r for r in records if r.arm == arm]
        widths: dict[int, int] = defaultdict(int)
        for r in rs:
            for w, n in r.widths.items():
                widths[w] += n
        rounds = sum(widths.values())
        tokens = sum(r.n_tokens for r in rs)
        top = sorted(widths.items(), key=lambda kv: -kv[1])[:6]
        lines.append(f"| `{arm}` | {tokens / max(rounds, 1):.2f} | "
                     + ", ".join(f"{w}: {n / rounds:.0%}" for w, n in sorted(top)) + " |")
    lines += price_lines
    emit_report(lines, a.out)


if __name__ == "__main__":
    main()
