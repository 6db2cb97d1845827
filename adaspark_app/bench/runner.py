"""`adaspark bench`: run several arms over one script, interleaved, and report the comparison.

Protocol (the paper's §4.1, on one machine):
- every arm has its own ChatEngine (its own llama.cpp model) and its own learned store, fresh and
  empty by default, so learning from empty is part of what is measured; an arm's engine is made
  once and reused over the conversations, so it keeps learning as it would in serving;
- each arm carries its own replies as history (a reply's history is its own);
- arms run interleaved per conversation, the order alternating: conversation i runs the arms in
  the given order and conversation i+1 in reverse, so slow drift of the machine (heat, other
  load) falls on every arm alike instead of on whichever runs last;
- with --repeats R the whole script runs R times, alternation continuing across passes; a reply's
  speed is then the mean over its repeats.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from .. import native
from ..native import pricing
from ..errors import ArgumentError, ScriptError
from ..hard_exit import TemporaryDir
from ..output_paths import make_output_dir, open_output
from ..wording import printable
from . import stats


def arm_order(arms: Sequence[str], index: int) -> list[str]:
    """The order the arms run in for the `index`-th conversation run: given order on even
    indices, reversed on odd ones."""
    return list(arms) if index % 2 == 0 else list(reversed(arms))


def schedule(n_conversations: int, arms: Sequence[str], repeats: int = 1) -> list[tuple[int, int, list[str]]]:
    """Every (repeat, conversation index, arm order) in run order. The alternation index runs on
    across repeats, so with an odd number of conversations a second pass starts reversed."""
    plan = []
    for r in range(repeats):
        for i in range(n_conversations):
            plan.append((r, i, arm_order(arms, r * n_conversations + i)))
    return plan


DRAFTER_SUFFIX = "+drafter"


def arm_labels(arm_specs: Sequence[str]) -> list[tuple[str, str]]:
    """(label, arm string) per requested arm. Arms are validated and normalised; a repeated arm
    (an A/A run, which shows the machine's noise) gets a `#2`, `#3` ... label. An arm ending in
    `+drafter` runs with `--drafter`; when any arm has the suffix, the others run without it
    (so `--arms ar,adaspark,adaspark+drafter` compares the drafter's worth in one run)."""
    from ..engine.arms import parse_arm

    out, seen = [], {}
    for spec in arm_specs:
        if not spec.strip():
            raise ArgumentError("--arms has an empty entry")
        base, plus, extra = spec.strip().partition("+")
        if plus and extra.strip().lower() != DRAFTER_SUFFIX[1:]:
            raise ArgumentError(f"arm {spec!r}: the only suffix is {DRAFTER_SUFFIX}")
        arm = str(parse_arm(base)) + (DRAFTER_SUFFIX if plus else "")
        seen[arm] = seen.get(arm, 0) + 1
        label = arm if seen[arm] == 1 else f"{arm}#{seen[arm]}"
        out.append((label, arm))
    if len(out) < 2:
        raise ArgumentError("--arms needs at least two arms: the first is the base of every ratio")
    return out


def _safe(label: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in label)


def cpu_label(cpuinfo: str) -> str:
    """The CPU as /proc/cpuinfo's first processor names it, with its family and model numbers where
    it gives them: on these VMs "AMD EPYC" alone covers a Zen 3 (family 25, model 1; AVX2) and a
    Zen 4 (family 25, model 17; AVX-512), whose speeds differ. "" where it names no model."""
    fields: dict[str, str] = {}
    for line in cpuinfo.split("\n\n", 1)[0].splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    name = fields.get("model name", "")
    family, model = fields.get("cpu family"), fields.get("model")
    return f"{name} (family {family}, model {model})" if name and family and model else name


CPUINFO = Path("/proc/cpuinfo")


def cpu_name() -> str:
    """This machine's CPU as ``cpu_label`` names it from /proc/cpuinfo, else as Python's platform
    module does; "" where neither names one. Reports and the benchmark scripts say this (the store's
    device fingerprint keeps its own reading: its ids hash the name as it always was)."""
    try:
        with open(CPUINFO, encoding="utf-8", errors="replace") as fp:
            label = cpu_label(fp.read())
    except OSError:
        label = ""
    return label or platform.processor() or ""


def machine_info(n_threads: int | None = None) -> dict[str, Any]:
    """What the numbers ran on: they are only comparable within one machine and one run."""
    cpu = cpu_name()
    try:
        from importlib.metadata import version

        llama_version = version("llama-cpp-python")
    except Exception:  # not installed: the report still says so
        llama_version = None
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    return {
        "loadavg_1_5_15": load,  # other processes on the machine skew every timing
        "platform": platform.platform(),
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "python": sys.version.split()[0],
        "llama_cpp_python": llama_version,
        "kernels": native.status(),
        "pricing": pricing.status(),  # the round's pricing: C, or numpy (why)
        "n_threads": n_threads,
    }


def device_line(engine: Any) -> str | None:
    """Where an engine's arms ran, for a report: ``CPU``, or on a GPU its name, the layers on it
    and the CUDA kernels (stock, or batch-invariant to N rows); None for an engine without a backend."""
    offload = getattr(getattr(engine, "backend", None), "offload", None)
    if offload is None:
        return None
    if not offload.on_gpu:
        return offload.describe()
    return f"{engine.device_label}, CUDA kernels {engine.cuda_kernels}"


def warm_page_cache(paths: Sequence[str | None], block: int = 1 << 22) -> None:
    """Read model files once so the first arm's first reply does not pay the disk reads that
    every later arm gets for free from the page cache (the engines mmap the same file)."""
    for path in paths:
        if not path:
            continue
        try:
            with open(path, "rb") as fp:
                while fp.read(block):
                    pass
        except OSError:
            pass  # the engine reports an unreadable model with its own clear error


@dataclass
class BenchConfig:
    script: str
    arms: list[str]
    model: str | None = None
    drafter: str | None = None
    max_tokens: int = 1024
    repeats: int = 1
    report_dir: str = "bench-report"
    store_dir: str | None = None
    n_threads: int | None = None
    gpu_layers: int | None = None  # None: the engine's default (engine/offload.py)
    n_ctx: int = 4096
    keep_capped: bool = False  # a fixed-length run: replies reaching the cap are kept, not left out
    extra: dict = field(default_factory=dict)
    sampling: Any = None  # SamplingSettings (seed resolved) for every arm's replies; None: greedy


def cap_marks(reached_cap: bool, keep_capped: bool) -> dict[str, bool]:
    """A record's `looped`/`capped` marks: a reply that reached the token cap is left out as a loop,
    or, in a fixed-length comparison (keep_capped), kept and marked `capped`."""
    return {"looped": bool(reached_cap) and not keep_capped, "capped": bool(reached_cap) and keep_capped}


def reply_to_record(result: Any, label: str, category: str | None, repeat: int,
                    keep_capped: bool = False) -> dict:
    """An OUT.jsonl-style dict of one ReplyResult, labelled with the bench arm and repeat.

    With keep_capped, a reply that reached the cap is marked `capped` instead of `looped`, so
    fixed-length comparisons (every reply cut at N tokens) keep it."""
    d = result.to_json() if hasattr(result, "to_json") else dict(result)
    if keep_capped and d.get("looped"):
        d.update(cap_marks(True, keep_capped))
    d.pop("tokens", None)  # token ids are large and not needed by the report
    d["engine_arm"] = d.get("arm")
    d["arm"] = label
    d["repeat"] = repeat
    d["category"] = category
    return d


class CalibrationTally:
    """Per reply (by turn), the pricing model's expected accepted tokens against the target's,
    over the priced rounds that verified more than one row (a cold-start measurement round is
    run to time a width, not priced to win, so it is left out)."""

    def __init__(self) -> None:
        self.by_turn: dict[int, dict[str, float]] = {}

    @staticmethod
    def counts(ev: Any) -> bool:
        """Whether a RoundEvent is a priced tree round the calibration counts."""
        return not (ev.prefill or ev.measured or ev.width <= 1 or ev.priced_by == "none")

    def __call__(self, ev: Any) -> None:
        if not self.counts(ev):
            return
        t = self.by_turn.setdefault(int(ev.turn), {"rounds": 0, "expected": 0.0, "accepted": 0})
        t["rounds"] += 1
        t["expected"] += float(ev.expected_accepted)
        t["accepted"] += int(ev.accepted)

    def pop(self, turn: int) -> dict[str, float]:
        return self.by_turn.pop(int(turn), {"rounds": 0, "expected": 0.0, "accepted": 0})


def one_row_verdict(engine: Any) -> str | None:
    """The one-row kernel verdict of an engine's backend (engine/one_row.py), for the report: two
    arms whose plain steps run different kernels differ in speed for no reason of their own."""
    chooser = getattr(getattr(engine, "backend", None), "one_row", None)
    return chooser.describe() if chooser is not None else None


def _default_engine_factory(config: BenchConfig, arm: str, store: Any) -> Any:
    from ..engine.chat_engine import ChatEngine

    base, plus, _ = arm.partition("+")
    with_drafter = bool(plus) or not any(a.strip().endswith(DRAFTER_SUFFIX) for a in config.arms)
    return ChatEngine(model_path=config.model, drafter_path=config.drafter if with_drafter else None,
                      store=store, arm=base, n_threads=config.n_threads, n_ctx=config.n_ctx,
                      gpu_layers=config.gpu_layers)


def _default_store_factory(path: Path) -> Any:
    from ..store import Store

    return Store.open(str(path))


def _default_run_conversation(engine, conv, max_tokens, on_round=None, sampling=None):
    from ..runner import run_conversation

    return run_conversation(engine, conv, max_tokens, on_round=on_round, sampling=sampling)


def _load_script(path: str):
    from ..runner import load_script

    return load_script(path)


class _ProgressEngine:
    """Delegates to an engine and reports each finished reply, so the progress bar (and its
    estimate of time left) moves per reply rather than per conversation."""

    def __init__(self, engine: Any, on_reply: Callable[[], None]) -> None:
        self._engine = engine
        self._on_reply = on_reply
        self.replies = 0

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        result = self._engine.generate(*args, **kwargs)
        self.replies += 1
        self._on_reply()
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)


def run_bench(
    config: BenchConfig,
    *,
    engine_factory: Callable[[BenchConfig, str, Any], Any] | None = None,
    store_factory: Callable[[Path], Any] | None = None,
    run_conversation: Callable[..., list] | None = None,
    conversations: list | None = None,
    progress: bool = True,
    console: Any = None,
) -> dict:
    """Run the bench and write the report into config.report_dir; returns the report dict.

    The factories exist so the orchestration can be tested without a model; the CLI uses the
    real ChatEngine, Store and runner. replies.jsonl is appended reply by reply, so an
    interrupted run keeps what it measured; on Ctrl-C the report is written from the replies
    done so far and KeyboardInterrupt is re-raised.
    """
    from .report import write_report

    real_engines = engine_factory is None
    engine_factory = engine_factory or _default_engine_factory
    store_factory = store_factory or _default_store_factory
    run_conversation = run_conversation or _default_run_conversation
    if config.max_tokens < 1:
        raise ArgumentError("--max-tokens must be at least 1")
    if config.repeats < 1:
        raise ArgumentError("--repeats must be at least 1")
    if config.n_threads is not None and config.n_threads < 1:
        raise ArgumentError("--threads must be at least 1")
    labels = arm_labels(config.arms)
    if any(arm.endswith(DRAFTER_SUFFIX) for _, arm in labels) and not config.drafter:
        raise ArgumentError(f"an arm with {DRAFTER_SUFFIX} needs --drafter")
    convs = conversations if conversations is not None else _load_script(config.script)
    if not convs:
        raise ScriptError(f"{config.script}: no conversations")
    out_dir = make_output_dir(config.report_dir, "the report folder (--report)")
    if config.store_dir is not None:
        make_output_dir(config.store_dir, "the stores' folder (--store-dir)")
    replies_path = out_dir / "replies.jsonl"
    open_output(replies_path, "the report's replies").close()  # emptied: this run's replies only

    plan = schedule(len(convs), [label for label, _ in labels], config.repeats)
    total_replies = sum(len(c.turns) for c in convs) * len(labels) * config.repeats
    records: list[dict] = []
    started = time.time()
    meta = {
        "script": str(config.script),
        "arms": [label for label, _ in labels],
        "base_arm": labels[0][0],
        "model": config.model,
        "drafter": config.drafter,
        "max_tokens": config.max_tokens,
        "repeats": config.repeats,
        "conversations": len(convs),
        "turns": sum(len(c.turns) for c in convs),
        "store": "fresh per arm" if config.store_dir is None else f"{config.store_dir}/<arm>.db",
        "order": "interleaved per conversation, alternating",
        "machine": machine_info(config.n_threads),
        "command": config.extra.get("command"),
        "sampling": config.sampling.to_json() if config.sampling is not None else None,
    }

    engines: dict[str, Any] = {}

    def finish(interrupted: bool) -> dict:
        try:
            meta["machine"]["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
        except OSError:
            pass
        meta["elapsed_s"] = round(time.time() - started, 2)
        meta["interrupted"] = interrupted
        meta["replies_done"] = len(records)
        meta["one_row"] = {label: v for label, e in engines.items() if (v := one_row_verdict(e)) is not None}
        meta["replies_planned"] = total_replies
        return write_report(records, meta, out_dir)

    if real_engines:
        from ..engine.backend import default_model_path

        warm_page_cache([config.model or default_model_path(), config.drafter])
    with ExitStack() as stack:
        if config.store_dir is None:
            store_root = Path(stack.enter_context(TemporaryDir(prefix="adaspark-bench-")))  # a stop at once too
        else:
            store_root = Path(config.store_dir).expanduser()  # made above, before any engine
        shown: set[str] = set()
        for label, arm in labels:
            store = store_factory(store_root / f"{_safe(label)}.db")
            if hasattr(store, "close"):
                stack.callback(store.close)
            engine = engine_factory(config, arm, store)
            if hasattr(engine, "close"):
                stack.callback(engine.close)  # LIFO: each engine closes before its store
            engines[label] = engine
            threads = getattr(getattr(engine, "backend", None), "n_threads", None)
            if isinstance(threads, int):
                meta["machine"]["n_threads"] = threads
            device = device_line(engine)
            if device is not None:
                meta["machine"]["device"] = device
            for note in getattr(engine, "notices", None) or ():  # each once, not once per arm
                if note not in shown:
                    shown.add(note)
                    print(f"adaspark: note: {printable(note)}", file=sys.stderr)

        prog = None
        if progress:
            from rich.markup import escape
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                       TimeElapsedColumn, TimeRemainingColumn)

            prog = stack.enter_context(Progress(
                TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                TextColumn("replies"), TimeElapsedColumn(), TextColumn("left"),
                TimeRemainingColumn(), console=console, transient=False))
            task = prog.add_task("bench", total=total_replies)
        try:
            with open(replies_path, "a", encoding="utf-8") as fp:
                for repeat, ci, order in plan:
                    conv = convs[ci]
                    for label in order:
                        engine = engines[label]
                        if prog is not None:
                            prog.update(task, description=escape(printable(f"{label} · {conv.id}")[:48]))  # ids: text, not markup
                            engine = _ProgressEngine(engine, lambda: prog.advance(task, 1))
                        # every arm draws with the same settings and seed: replies are comparable
                        tally = CalibrationTally()
                        results = (run_conversation(engine, conv, config.max_tokens, on_round=tally)
                                   if config.sampling is None
                                   else run_conversation(engine, conv, config.max_tokens, on_round=tally,
                                                         sampling=config.sampling))
                        for res in results:
                            rec = reply_to_record(res, label, conv.category, repeat, config.keep_capped)
                            rec["calibration"] = tally.pop(res.turn)
                            records.append(rec)
                            fp.write(json.dumps(rec, ensure_ascii=False) + "\n")
                        fp.flush()
                        if prog is not None:  # replies not seen through generate() (none, normally)
                            prog.advance(task, len(conv.turns) - engine.replies)
        except KeyboardInterrupt:
            finish(True)
            raise
    return finish(False)


def report_from_replies(replies_path: str, out_dir: str, meta: dict | None = None) -> dict:
    """Recompute a report from a replies.jsonl (of `adaspark bench` or of the peers script)."""
    from .report import write_report

    with open(replies_path, encoding="utf-8") as fp:
        records = [json.loads(line) for line in fp if line.strip()]
    if meta is None:
        arms: list[str] = []
        for r in records:
            if r["arm"] not in arms:
                arms.append(r["arm"])
        meta = {"arms": arms, "base_arm": arms[0] if arms else None, "source": replies_path}
    return write_report(records, meta, Path(out_dir))


__all__ = ["arm_order", "schedule", "arm_labels", "run_bench", "BenchConfig", "machine_info",
           "report_from_replies", "stats"]
