"""Host time per round on real rounds: what a round costs besides the target's forward.

It times whole rounds of the engine on a real script: for each round, wall time less the verify (llama_decode and the
argmax), so it includes the n-gram index, the candidate tree, the acceptance model, the
scheduler and the KV bookkeeping. Rounds are grouped by kind:

- ``plain``: a one-token step that built no tree (every `ar` round; `adaspark` rounds the draft
  gate skipped or with nothing to propose);
- ``tree, width 1``: `adaspark` built and priced a tree, then the chooser verified the anchor alone;
- ``tree, wider``: a drafted round.

With ``--parts``, the host time of tree rounds is split by the round's steps (Decoder.round):
``start`` (the n-gram index takes the committed tokens), ``gate``, ``propose`` (the sources'
drafts, the candidate set), ``price`` (q, Q, the best-first order, S(n)), ``choose`` (the
scheduler), ``select``, ``verify, host`` (the layout, the batch, the accepted path: the step less
llama_decode and the argmax), ``commit`` (KV cells, the drafter's features), ``learn`` (the
acceptance model, the cost and rate learners), ``finish`` and ``other`` (the rest of the round).

With ``--cache``, the pricing of every tree round (the candidate set and Eq. (6)'s q, the
largest step) is replayed after the run twice: back to back, with the CPU caches warm, and after
streaming 100 MB through them, as the target's forward does on the CPU between two rounds. On a
GPU the forward leaves the CPU's caches alone, so the warm figure is the one a GPU host pays.

With ``--scripted``, the target's forward is replayed (``scripted_target.py``): each arm commits
the reply a real `ar` run of the same conversation gave (checked), while every forward waits the
time of a modeled GPU curve (``--curve ROWS:MS,...``; default issue 41's RTX 4090 8B figures)
spinning on the host. The round's host code then runs with warm caches, as on a GPU host, and
at the round mix such a curve makes; the host share is of that modeled round time. With
``--overlap`` a third engine, ``adaspark, overlapped``, runs the forward as a GPU does: llama_decode
returns at once and the wait is at the logits' read, so the decoder's acceptance learning runs
during the forward (``Decoder.learn``).

With ``--events``, each round's event is handled as in the chat (the reply's handler makes the
text and the event, ``worker.EventBatcher`` batches them, pickled as for the pipe to the UI), and
the time between two rounds of a reply is reported: on an overlapping forward that handler runs
during the next forward (``Decoder.later``).

Engines run interleaved per conversation in one process. With ``--no-reuse`` a third engine runs
`adaspark` with the acceptance model's learning recomputing the round's design and estimates
instead of reusing the pricing (`AcceptanceModel._as_priced`), i.e. the code before that reuse.

With ``--against REV`` the last `adaspark` engine (the overlapped one with ``--overlap``) gets a
twin built from another revision's package (``git archive``, imported beside this one as
``adaspark_at_REV``, with this checkout's kernels): the host time of two versions of the code,
interleaved per conversation in one process, not two runs that differ by the machine's drift.

With ``--temperature T`` every reply is sampled (seed ``--seed``, llama.cpp's other defaults), so the
host time holds each drawn token's processed distribution (engine/sampling.py); every engine's
replies must still be `ar`'s.

    python -m benchmarks.cost.round_host_time SCRIPT.jsonl [--limit 10] [--max-tokens 128] [--no-reuse] [--parts]
        [--cache] [--scripted [--curve 1:6.6,16:8.3,32:9.3,64:11.8] [--overlap]] [--events] [--against REV]
        [--temperature T [--seed S]] [--out FILE.md]
"""

from __future__ import annotations

import argparse
import atexit
import importlib
import importlib.util
import io
import math
import os
import pickle
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np

from adaspark_app import native
from adaspark_app.bench.stats import bootstrap_interval, geometric_mean
from adaspark_app.engine.chat_engine import ChatEngine
from adaspark_app.engine.worker import EventBatcher
from adaspark_app.learn import acceptance
from adaspark_app.learn.acceptance import _design
from adaspark_app.native import pricing
from adaspark_app.runner import load_script, run_conversation
from benchmarks.common import cpu_model, emit_report
from benchmarks.cost.scripted_target import ScriptedTarget, add_run_arguments, parse_curve, reference_replies, \
    replay_conversation

KINDS = ("plain", "tree, width 1", "tree, wider")


def _engine(arm: str, reuse: bool = True, engine_class: type = ChatEngine) -> ChatEngine:
    eng = engine_class(None, arm=arm, n_ctx=4096, n_threads=2)
    if not reuse:
        acc = eng.decoder.learners.acceptance

        def recompute(cands, context, p_src):
            acc._priced = None
            d = _design(cands, context, p_src)
            return d, acc._fitted(d, len(cands)), acc._head(d)

        acc._as_priced = recompute
    return eng


def _package_at(rev: str) -> str:
    """Another revision's engine, importable beside this one: its ``adaspark_app`` (``git archive``,
    without the drafter's data) in a temporary folder as the package ``adaspark_at_<rev>``, every
    reference to ``adaspark_app`` in it renamed, this checkout's kernels linked in (its C pricing is
    built there on first use, as for a checkout that moved on). Returns the package's name;
    ValueError (one line) when git cannot give the revision."""
    root = Path(__file__).resolve().parents[2]
    name = "adaspark_at_" + re.sub(r"\W", "_", rev)
    res = subprocess.run(["git", "-C", str(root), "archive", rev, "adaspark_app", ":(exclude)adaspark_app/data"],
                         capture_output=True)
    if res.returncode != 0:
        raise ValueError(f"--against {rev}: {res.stderr.decode(errors='replace').strip().splitlines()[-1]}")
    tmp = Path(tempfile.mkdtemp(prefix="adaspark-at-"))
    atexit.register(shutil.rmtree, tmp, True)
    with tarfile.open(fileobj=io.BytesIO(res.stdout)) as tar:
        tar.extractall(tmp, filter="data")
    pkg = tmp / name
    (tmp / "adaspark_app").rename(pkg)
    for f in pkg.rglob("*.py"):
        f.write_text(f.read_text(encoding="utf-8").replace("adaspark_app", name), encoding="utf-8")
    lib, own = root / "adaspark_app" / "native" / "lib", pkg / "native" / "lib"
    own.mkdir(parents=True, exist_ok=True)
    for entry in (lib.iterdir() if lib.is_dir() else ()):
        if entry.name != "pricing":  # its own pricing source: its own build
            (own / entry.name).symlink_to(entry)
    spec = importlib.util.spec_from_file_location(name, pkg / "__init__.py", submodule_search_locations=[str(pkg)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its submodules import from here
    spec.loader.exec_module(module)
    return name


def _engine_at(package: str) -> ChatEngine:
    """`adaspark` as ``_engine`` makes it, from the package ``_package_at`` made."""
    return _engine("adaspark", engine_class=importlib.import_module(f"{package}.engine.chat_engine").ChatEngine)


def _sampling_for(eng: ChatEngine, temperature: float, seed: int) -> object | None:
    """The replies' sampling settings, of the engine's own package (another revision's twin checks
    for its own class); None (greedy) at temperature 0."""
    if temperature <= 0:
        return None
    package = type(eng).__module__.split(".")[0]
    return importlib.import_module(f"{package}.engine.sampling").SamplingSettings(temperature=temperature, seed=seed)


def _event_batcher() -> EventBatcher:
    """The chat's engine process's handling of round events (``worker.EventBatcher``), a batch
    pickled as its pipe would pickle it, and nothing written."""
    return EventBatcher(lambda events, times: pickle.dumps((events, times)))


def _host_so_far(rec: dict[str, list[tuple[float, float]]], between: list[float]) -> tuple[float, int]:
    """(host seconds of the rounds so far and the time between them, rounds so far)."""
    return sum(h for k in KINDS for h, _ in rec[k]) + sum(between), sum(len(rec[k]) for k in KINDS)


NUMPY_PRICING = ", numpy pricing"


AT_REV = ", at "


def _base_of(name: str) -> str:
    """The engine a variant is compared with: a numpy-pricing twin with its C-pricing engine, another
    revision's twin with this revision's engine, every other variant with plain `adaspark`."""
    if name.endswith(NUMPY_PRICING):
        return name[:-len(NUMPY_PRICING)]
    if AT_REV in name:
        return name[:name.index(AT_REV)]
    return "adaspark"


def _ratio_table(per_conv: dict[str, dict[str, float]], events: bool) -> list[str]:
    """Each `adaspark` variant's host time per round over its base's (``_base_of``): the geometric
    mean over conversations of the ratio of their means, with a 95% bootstrap interval."""
    rows = []
    for name, conv in per_conv.items():
        if name in ("ar", "adaspark") or not conv:
            continue
        base_name = _base_of(name)
        base = per_conv.get(base_name, {})
        ratios = {cid: v / base[cid] for cid, v in conv.items() if cid in base and v > 0 and base[cid] > 0}
        if not ratios:
            continue
        gm = geometric_mean(ratios.values())
        lo, hi = bootstrap_interval({cid: [math.log(x)] for cid, x in ratios.items()})
        rows.append(f"| {name} / {base_name} | {gm:.3f} [{lo:.3f}, {hi:.3f}] | {len(ratios)} |")
    if not rows:
        return []
    what = "host time per round, the time between rounds included" if events else "host time per round"
    return ["", f"The {what}, each engine against another (geometric mean over conversations of the ratio of "
            "their means, 95% bootstrap interval over conversations):", "",
            "| engines | ratio | conversations |", "|---|---|---|", *rows]


def _instrument(eng: ChatEngine, rec: dict[str, list[tuple[float, float]]],
                between: list[float] | None = None) -> None:
    """Time every round (host time, wall time) by kind; with `between`, also the time from one
    round's end to the next one's start in a reply (the reply loop and the round's event)."""
    dec = eng.decoder
    orig = dec.round
    last_end = [0.0]

    def timed(budget=None):
        t0 = time.perf_counter()
        if between is not None and dec.request_round > 0:
            between.append(t0 - last_end[0])
        oc = orig(budget=budget)
        last_end[0] = time.perf_counter()
        wall = last_end[0] - t0
        kind = "plain" if oc.priced_by == "none" else (
            "tree, width 1" if oc.width == 1 else "tree, wider")
        rec[kind].append((wall - oc.verify_s, wall))
        return oc

    dec.round = timed


PARTS = ("start", "gate", "propose", "price", "choose", "select", "verify, host", "commit", "learn", "finish")


def _instrument_parts(eng: ChatEngine, rows: list[dict[str, float]]) -> None:
    """Time each step of every tree round (seconds per part, one dict per round); call after
    `_instrument`, so the whole round's wall time is there to take the parts from."""
    dec, pol = eng.decoder, eng.decoder.policy
    cur: dict[str, float] = {}

    def wrap(obj, attr: str, part: str, less_verify: bool = False) -> None:
        orig = getattr(obj, attr)

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            out = orig(*args, **kwargs)
            dt = time.perf_counter() - t0
            cur[part] = cur.get(part, 0.0) + dt - (out.verify_s if less_verify else 0.0)
            return out

        setattr(obj, attr, timed)

    for obj, attr, part in ((dec, "_start", "start"), (pol, "gate", "gate"), (pol, "propose", "propose"),
                            (dec, "price", "price"), (pol, "choose", "choose"), (dec, "select", "select"),
                            (dec, "commit", "commit"), (dec, "learn", "learn"), (dec, "_finish", "finish")):
        wrap(obj, attr, part)
    wrap(dec, "verify", "verify, host", less_verify=True)
    whole = dec.round

    def timed_round(budget=None):
        cur.clear()
        t0 = time.perf_counter()
        oc = whole(budget=budget)
        wall = time.perf_counter() - t0
        if oc.priced_by != "none":  # a tree round (plain rounds are one step)
            rows.append({**cur, "other": wall - oc.verify_s - sum(cur.values()), "wall": wall})
        return oc

    dec.round = timed_round


def _capture_pricing(eng: ChatEngine, seen: list[tuple]) -> None:
    """Keep each tree round's candidates, context and p_src, for `_cache_table`'s replay."""
    dec = eng.decoder
    orig = dec.price

    def price(cands, use_drafter, r):
        tree = orig(cands, use_drafter, r)
        seen.append((cands, r.context, tree.p_src))
        return tree

    dec.price = price


def _cache_table(seen: list[tuple]) -> list[str]:
    """Replay the captured rounds' pricing (candidate set, class precision, Eq. (6)) with warm
    caches and after streaming 100 MB through them; median microseconds of each."""
    from adaspark_app.engine.candidates import candidate_set
    from adaspark_app.learn.acceptance import AcceptanceModel
    from adaspark_app.learn.precision import SourcePrecision

    acc, prec, big = AcceptanceModel(), SourcePrecision(), np.ones(100_000_000 // 8)
    medians = {}
    for label, flush in (("warm (back to back)", False), ("cold (100 MB streamed before each)", True)):
        ts = []
        for cands, context, p_src in seen:
            if flush:
                big.sum()
            t0 = time.perf_counter()
            cset = candidate_set(cands, prec)
            acc.q_both(cset, context, p_src)
            ts.append(time.perf_counter() - t0)
        medians[label] = float(np.median(ts)) * 1e6
    lines = [f"The pricing of the {len(seen)} tree rounds, replayed (candidate set, class precision, Eq. (6)):", "",
             "| CPU caches | median us |", "|---|---|"]
    lines += [f"| {k} | {v:.0f} |" for k, v in medians.items()]
    cold, warm = medians["cold (100 MB streamed before each)"], medians["warm (back to back)"]
    lines += ["", f"Cold / warm: {cold / warm:.2f}x."]
    return lines


def _parts_table(name: str, rows: list[dict[str, float]]) -> list[str]:
    lines = [f"Tree rounds of `{name}`, host time by step ({len(rows)} rounds):", "",
             "| step | median us | mean us | share of the host time |", "|---|---|---|---|"]
    host_total = sum(sum(v for k, v in r.items() if k != "wall") for r in rows)
    for part in (*PARTS, "other"):
        xs = np.array([r.get(part, 0.0) for r in rows]) * 1e6
        lines.append(f"| {part} | {np.median(xs):.0f} | {xs.mean():.0f} | {xs.sum() / 1e6 / host_total:.1%} |")
    host = np.array([sum(v for k, v in r.items() if k != "wall") for r in rows]) * 1e6
    lines.append(f"| all | {np.median(host):.0f} | {host.mean():.0f} | 100% |")
    return lines


def main() -> None:
    native.activate()  # the Q4_1 kernels, if built, before anything imports llama_cpp
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_run_arguments(ap, 10, "with --scripted: the modeled forward time, ROWS:MS,...")
    ap.add_argument("--no-reuse", action="store_true", help="add an engine without the pricing reuse")
    ap.add_argument("--parts", action="store_true", help="split the tree rounds' host time by step")
    ap.add_argument("--cache", action="store_true", help="replay the pricing with warm and with flushed CPU caches")
    ap.add_argument("--scripted", action="store_true",
                    help="replay real `ar` replies through a target whose forward takes a modeled GPU time")
    ap.add_argument("--events", action="store_true",
                    help="take each round's event as the chat's engine process does, and time the work between rounds")
    ap.add_argument("--overlap", action="store_true",
                    help="with --scripted: add `adaspark` with the forward overlapping the host, as on a GPU")
    ap.add_argument("--numpy-pricing", action="store_true",
                    help="add a twin of each `adaspark` engine that prices its rounds with the numpy code, not C")
    ap.add_argument("--against", metavar="REV", default=None,
                    help="add a twin of the last `adaspark` engine built from git revision REV's code")
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="sample every reply at this temperature, llama.cpp's other defaults (0: greedy)")
    ap.add_argument("--seed", type=int, default=7, help="with --temperature: the replies' seed (default 7)")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    if a.overlap and not a.scripted:
        ap.error("--overlap needs --scripted (a real forward overlaps only on a GPU)")
    if a.temperature < 0:
        ap.error("--temperature must be >= 0")
    if a.temperature > 0 and a.scripted:
        ap.error("--temperature needs the real forward: --scripted replays greedy replies")
    try:
        curve = parse_curve(a.curve)
    except ValueError as e:
        ap.error(str(e))
    convs = list(load_script(a.script))[: a.limit]
    refs = reference_replies(convs, a.max_tokens) if a.scripted else None
    arms = {"ar": _engine("ar"), "adaspark": _engine("adaspark")}
    if a.no_reuse:
        arms["adaspark, no reuse"] = _engine("adaspark", reuse=False)
    if a.overlap:
        arms["adaspark, overlapped"] = _engine("adaspark")
    if a.against:
        try:
            package = _package_at(a.against)
        except ValueError as e:
            ap.error(str(e))
        twin = [n for n in arms if n.startswith("adaspark")][-1]
        arms[f"{twin}{AT_REV}{a.against}"] = _engine_at(package)
    if a.numpy_pricing:
        if acceptance.PRICING is None:
            ap.error(f"--numpy-pricing compares with the C pricing, which is not in use here: {pricing.status()}")
        for name in [n for n in arms if n.startswith("adaspark") and AT_REV not in n]:
            arms[name + NUMPY_PRICING] = _engine("adaspark", reuse=not name.endswith("no reuse"))
    recs = {name: {k: [] for k in KINDS} for name in arms}
    between: dict[str, list[float]] = {}
    parts: dict[str, list[dict[str, float]]] = {}
    priced: list[tuple] = []
    for name, eng in arms.items():
        if a.parts and eng.decoder.policy.drafts:
            parts[name] = []
            _instrument_parts(eng, parts[name])  # inside _instrument's timing: both see the same rounds
        between[name] = []
        _instrument(eng, recs[name], between[name])
        if a.cache and name == "adaspark":
            _capture_pricing(eng, priced)
    scripted = {name: ScriptedTarget(eng.backend, curve, overlap="overlapped" in name) for name, eng in arms.items()} if a.scripted else {}
    c_pricing = acceptance.PRICING
    names = list(arms)
    differ = 0
    batcher = _event_batcher() if a.events else None
    per_conv: dict[str, dict[str, float]] = {name: {} for name in names}
    texts: dict[str, dict[str, list[str]]] = {name: {} for name in names}
    for i, c in enumerate(convs):
        k = i % len(names)
        for name in names[k:] + names[:k]:
            eng = arms[name]
            acceptance.PRICING = None if name.endswith(NUMPY_PRICING) else c_pricing
            before = _host_so_far(recs[name], between[name])
            on_round = batcher.add if batcher is not None else None
            on_reply = (lambda _: batcher.flush()) if batcher is not None else None
            if refs is None:
                replies = run_conversation(eng, c, a.max_tokens, on_round=on_round, on_reply=on_reply,
                                           sampling=_sampling_for(eng, a.temperature, a.seed))
                texts[name][c.id] = [r.text for r in replies]
            else:
                replies = replay_conversation(eng, scripted[name], c, refs[i], a.max_tokens, on_round, on_reply)
                differ += sum(r.text != ref.text for r, ref in zip(replies, refs[i]))
            eng.reset_conversation()
            after = _host_so_far(recs[name], between[name])
            if after[1] > before[1]:  # host seconds per round, the reply loop between rounds included
                per_conv[name][c.id] = (after[0] - before[0]) / (after[1] - before[1])
        print(f"{i + 1}/{len(convs)} {c.id}", flush=True)
    if batcher is not None:
        batcher.close()
    for eng in arms.values():
        eng.close()
    cmd = f"python -m benchmarks.cost.round_host_time {a.script} --limit {a.limit} --max-tokens {a.max_tokens}"
    cmd += " --no-reuse" if a.no_reuse else ""
    cmd += " --parts" if a.parts else ""
    cmd += " --cache" if a.cache else ""
    cmd += f" --scripted --curve {a.curve}" if a.scripted else ""
    cmd += " --overlap" if a.overlap else ""
    cmd += " --events" if a.events else ""
    cmd += " --numpy-pricing" if a.numpy_pricing else ""
    cmd += f" --against {a.against}" if a.against else ""
    cmd += f" --temperature {a.temperature:g} --seed {a.seed}" if a.temperature > 0 else ""
    differ += sum(texts[name] != texts["ar"] for name in names[1:]) if refs is None else 0
    how = ("Host time = round wall time less the verify (llama_decode + argmax); "
           + (f"every reply sampled at T {a.temperature:g}, seed {a.seed}, llama.cpp's other defaults (the "
              "processed distribution is host time); " if a.temperature > 0 else "greedy; ")
           + (f"every engine's replies the same as `ar`'s." if differ == 0 else
              f"{differ} engines' replies differ from `ar`'s: a defect.") if not a.scripted else
           f"Scripted target: every forward waits the modeled time of the curve {a.curve} (rows:ms) spinning "
           "on the host, and each arm commits the reply of a real `ar` run "
           f"({'every reply the same' if differ == 0 else f'{differ} replies differed: a defect'}); host time = "
           "round wall time less the forward (its modeled time and the argmax)"
           + ("; `adaspark, overlapped`: the forward overlapping the host as on a GPU (work done during it is hidden)."
              if a.overlap else "."))
    lines = [f"# Host time per round on `{a.script}` (first {len(convs)} conversations, {a.max_tokens} tokens)", "",
             f"`{cmd}`", "",
             f"Machine: {cpu_model()} ({platform.machine()}, {len(os.sched_getaffinity(0))} cores), Python {platform.python_version()}, "
             f"pricing: {pricing.status()}" + (" (and numpy in the engines so named)" if a.numpy_pricing else "") + ". "
             + how, "",
             "| engine | round kind | rounds | median host us | mean host us | host share of the engine's round time |",
             "|---|---|---|---|---|---|"]
    for name in names:
        total_wall = sum(w for k in KINDS for _, w in recs[name][k])
        for k in KINDS:
            xs = recs[name][k]
            if not xs:
                continue
            host = np.array([h for h, _ in xs]) * 1e6
            lines.append(f"| {name} | {k} | {len(xs)} | {np.median(host):.0f} | {host.mean():.0f} | "
                         f"{host.sum() / 1e6 / total_wall:.2%} |")
        every = np.array([h for k in KINDS for h, _ in recs[name][k]]) * 1e6
        lines.append(f"| {name} | all | {every.size} | {np.median(every):.0f} | {every.mean():.0f} | "
                     f"{every.sum() / 1e6 / total_wall:.2%} |")
    if a.events:
        lines += ["", "Between two rounds of a reply (the reply loop, the round's text and event: "
                  "`ChatEngine._generate`'s handler, the events batched and pickled as the chat's engine process sends them):", "",
                  "| engine | gaps | median us | mean us |", "|---|---|---|---|"]
        for name in names:
            xs = np.array(between[name]) * 1e6
            if xs.size:
                lines.append(f"| {name} | {xs.size} | {np.median(xs):.0f} | {xs.mean():.0f} |")
    lines += _ratio_table(per_conv, a.events)
    for name, rows in parts.items():
        if rows:
            lines += ["", *_parts_table(name, rows)]
    if priced:
        lines += ["", *_cache_table(priced)]
    emit_report(lines, a.out)


if __name__ == "__main__":
    main()
