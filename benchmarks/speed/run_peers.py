"""AdaSpark against the peers a user would pick instead, on one SCRIPT.jsonl and one model.

Not part of the package. Every peer decodes greedily with the same threads, context and token
cap, carries its own replies as history, and is timed on the client's clock: a reply's decode
speed is its generated tokens over the time from its first to its last streamed piece of text
(prefill excluded). Tokens are counted by tokenising each peer's reply text with the model's own
tokenizer, so every peer is counted the same way. Peers run interleaved per conversation with
alternating order (as `adaspark bench` does), and the report is computed by the same code
(adaspark_app.bench.report): geometric mean of per-reply ratios against the first peer,
95% bootstrap interval over conversations, replies that hit the cap in either peer left out.

Peers (names for --peers):
  lcpp-plain           llama-cpp-python Llama.create_chat_completion(stream=True, temperature=0)
  lcpp-pld             the same with draft_model=LlamaPromptLookupDecoding(num_pred_tokens=10)
  server-plain         llama.cpp's llama-server (--server-bin), OpenAI streaming endpoint
  server-ngram-mod     llama-server --spec-type ngram-mod (its defaults)
  server-ngram-simple  llama-server --spec-type ngram-simple (its defaults)
  server-dspark        llama-server --spec-type draft-dspark -md DRAFTER (--drafter; default: ours)
  adaspark             AdaSpark's ChatEngine, arm adaspark, fresh empty store
  adaspark:ARM         AdaSpark's ChatEngine with another arm (e.g. adaspark:ar, its plain decode)
  PEER+drafter         an adaspark peer with the DSpark drafter (--drafter, default: ours); without
                       the suffix, adaspark peers take --drafter only where it is given

--gpu-layers N|all|0 puts the layers of every peer on the GPU (llama-server: -ngl); unset, each
peer keeps its own default. llama-server always runs the stock CUDA kernels, graphs and argmax
(ADASPARK_CUDA_EXACT=0, ADASPARK_CUDA_GRAPHS=0 and ADASPARK_CUDA_ARGMAX=0 in its environment), whichever
AdaSpark's peers run.

llama-server listens on 127.0.0.1 only, one server per peer, started and stopped by this script.
See README.md beside this file for the build command of llama-server.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

from adaspark_app import native
from adaspark_app.bench.report import write_report
from adaspark_app.bench.runner import (arm_order, cap_marks, device_line, machine_info, one_row_verdict,
                                       warm_page_cache)
from adaspark_app.engine.offload import ALL_LAYERS, parse_gpu_layers
from adaspark_app.errors import ArgumentError
from adaspark_app.options import add_sampling_options
from adaspark_app.options import check_sampling_options as check_sampling
from adaspark_app.runner import Conversation, load_script
from benchmarks.common import RESULTS, command_line

DEFAULT_PEERS = "lcpp-plain,lcpp-pld,adaspark"
SERVER_SPEC = {"server-plain": [], "server-ngram-mod": ["--spec-type", "ngram-mod"],
               "server-ngram-simple": ["--spec-type", "ngram-simple"],
               "server-dspark": ["--spec-type", "draft-dspark"]}  # + -md DRAFTER (--drafter, default: ours)


class Timer:
    """Client-clock timing of one streamed reply: first and last non-empty text piece."""

    def __init__(self) -> None:
        self.first: float | None = None
        self.last: float | None = None
        self.pieces: list[str] = []

    def piece(self, text: str | None) -> None:
        if text:
            now = time.perf_counter()
            if self.first is None:
                self.first = now
            self.last = now
            self.pieces.append(text)

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    @property
    def seconds(self) -> float:
        return (self.last - self.first) if self.first is not None else 0.0


class Tokenizer:
    """The model's tokenizer (vocab only), used to count every peer's reply tokens alike."""

    def __init__(self, model_path: str) -> None:
        import llama_cpp

        self._llm = llama_cpp.Llama(model_path, vocab_only=True, verbose=False)

    def count(self, text: str) -> int:
        if not text:
            return 0
        return len(self._llm.tokenize(text.encode("utf-8"), add_bos=False, special=False))


def messages_for(conv: Conversation) -> list[dict]:
    return [{"role": "system", "content": conv.system}] if conv.system else []


class LlamaCppPythonPeer:
    """llama-cpp-python's high-level API, as a Python user would call it."""

    def __init__(self, name: str, model: str, threads: int, n_ctx: int, pld: bool,
                 gpu_layers: str | int | None = None) -> None:
        import llama_cpp
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        self.name = name
        kwargs: dict[str, Any] = {}
        if pld:
            kwargs["draft_model"] = LlamaPromptLookupDecoding(num_pred_tokens=10)
            # 0.3.36 forces logits_all on with a draft model but sizes its score buffer by the
            # argument (n_batch rows when False), so it crashes past 512 tokens without this.
            kwargs["logits_all"] = True
        if gpu_layers is not None:
            kwargs["n_gpu_layers"] = parse_gpu_layers(gpu_layers)  # ALL_LAYERS (-1): every layer, as here
        self.llm = llama_cpp.Llama(model, n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads,
                                   verbose=False, **kwargs)

    def reply(self, messages: list[dict], max_tokens: int, sampling: Any = None) -> tuple[Timer, bool, dict]:
        t = Timer()
        finish = None
        knobs = _sampling_body(sampling)
        # llama-cpp-python reseeds from `seed` per call; its sampler takes the same fields
        knobs.pop("repeat_last_n", None)
        for chunk in self.llm.create_chat_completion(messages=messages, stream=True,
                                                     max_tokens=max_tokens, **knobs):
            ch = chunk["choices"][0]
            t.piece(ch.get("delta", {}).get("content"))
            finish = ch.get("finish_reason") or finish
        return t, finish == "length", {"finish_reason": finish}

    def close(self) -> None:
        self.llm.close()


def server_gpu_layers(gpu_layers: str | int) -> str:
    """llama-server's -ngl for AdaSpark's --gpu-layers value (checked as `adaspark` checks it):
    'all' is every layer (999, above any model's block count)."""
    n = parse_gpu_layers(gpu_layers)
    return "999" if n == ALL_LAYERS else str(n)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerPeer:
    """llama.cpp's llama-server on 127.0.0.1, streamed through its OpenAI chat endpoint."""

    def __init__(self, name: str, server_bin: str, model: str, threads: int, n_ctx: int,
                 log_dir: Path, drafter: str | None = None, gpu_layers: str | int | None = None) -> None:
        self.name = name
        self.port = _free_port()
        self.cmd = [server_bin, "-m", model, "--host", "127.0.0.1", "--port", str(self.port),
                    "-t", str(threads), "-tb", str(threads), "-c", str(n_ctx), "-np", "1",
                    "--jinja", *SERVER_SPEC[name]]
        if os.environ.get("ADASPARK_SERVER_REPACK") != "1":
            # ggml's repack/AMX weight buffers crash on the first multi-row batch on CPUs with
            # AMX (exit -11); AdaSpark loads without them too (use_extra_bufts = False)
            self.cmd.append("--no-repack")
        if name == "server-dspark":
            self.cmd += ["-md", str(drafter), "-td", str(threads), "-tbd", str(threads)]
        if gpu_layers is not None:
            self.cmd += ["-ngl", server_gpu_layers(gpu_layers)]
            if name == "server-dspark":
                self.cmd += ["-ngld", server_gpu_layers(gpu_layers)]
        self.log = open(log_dir / f"{name}.log", "w")
        # the peer a GPU user runs: llama.cpp's own kernels and CUDA graphs, also where the library it
        # loads carries AdaSpark's batch-invariant ones, a graph per width and the one-launch argmax
        # (native/cuda_exact.patch)
        env = {**os.environ, "ADASPARK_CUDA_EXACT": "0", "ADASPARK_CUDA_GRAPHS": "0", "ADASPARK_CUDA_ARGMAX": "0"}
        self.proc = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        deadline = time.time() + 120
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{name}: llama-server exited ({self.proc.returncode}); see {self.log.name}")
            try:
                c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.3)
        self.close()
        raise RuntimeError(f"{name}: llama-server not healthy after 120 s")

    def _events(self, body: dict) -> Iterator[dict]:
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        c.request("POST", "/v1/chat/completions", body=json.dumps(body),
                  headers={"Content-Type": "application/json"})
        resp = c.getresponse()
        if resp.status != 200:
            raise RuntimeError(f"{self.name}: HTTP {resp.status}: {resp.read()[:300]!r}")
        for raw in resp:
            line = raw.decode("utf-8").strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            yield json.loads(data)

    def reply(self, messages: list[dict], max_tokens: int, sampling: Any = None) -> tuple[Timer, bool, dict]:
        t = Timer()
        finish, timings = None, None
        body = {"messages": messages, "stream": True, "max_tokens": max_tokens, "cache_prompt": True,
                **_sampling_body(sampling)}
        for ev in self._events(body):
            if ev.get("choices"):
                ch = ev["choices"][0]
                t.piece((ch.get("delta") or {}).get("content"))
                finish = ch.get("finish_reason") or finish
            timings = ev.get("timings") or timings
        return t, finish == "length", {"finish_reason": finish, "server_timings": timings}

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()


class AdaSparkPeer:
    """AdaSpark's ChatEngine in this process, with a fresh store; timed on the on_round stream."""

    def __init__(self, name: str, arm: str, model: str, drafter: str | None, threads: int,
                 n_ctx: int, store_dir: Path, gpu_layers: str | int | None = None) -> None:
        from adaspark_app.engine.chat_engine import ChatEngine
        from adaspark_app.store import Store

        self.name = name
        self.store = Store.open(str(store_dir / f"{name.replace(':', '_').replace('+', '_')}.db"))
        self.engine = ChatEngine(model_path=model, drafter_path=drafter, store=self.store, arm=arm,
                                 n_threads=threads, n_ctx=n_ctx, gpu_layers=gpu_layers)

    def reply_conv(self, conv_id: str, messages: list[dict], max_tokens: int, turn: int,
                   sampling: Any = None):
        t = Timer()
        res = self.engine.generate(conv_id, messages, max_tokens=max_tokens,
                                   on_round=lambda ev: t.piece(ev.text), turn=turn, sampling=sampling)
        extra = {"engine_n_tokens": res.n_tokens, "engine_decode_s": res.decode_s,
                 "rounds": res.rounds, "widths": {str(k): v for k, v in res.widths.items()},
                 "measure_rounds": res.measure_rounds,
                 "prompt_length": res.prompt_length}  # the report's context band
        return t, res.looped, extra, res.text

    def close(self) -> None:
        self.engine.close()
        if hasattr(self.store, "close"):
            self.store.close()


def _sampling_body(sampling: Any) -> dict:
    """The request fields for `sampling` (a SamplingSettings; None or temperature 0: greedy) in
    llama-server's and llama-cpp-python's names. Their default sampler chain applies penalties,
    top-k, top-p, min-p, then temperature (DRY, typical-p, XTC, top-n-sigma off), the order
    AdaSpark uses, so the settings mean the same; the draws differ (each engine its own RNG)."""
    if sampling is None or sampling.greedy:
        return {"temperature": 0.0, "top_k": 1, "seed": 0}
    return {"temperature": sampling.temperature, "top_k": sampling.top_k, "top_p": sampling.top_p,
            "min_p": sampling.min_p, "repeat_penalty": sampling.repeat_penalty,
            "repeat_last_n": sampling.repeat_last_n, "seed": sampling.seed}


def run_one(peer: Any, conv: Conversation, max_tokens: int, tok: Tokenizer,
            keep_capped: bool = False, sampling: Any = None) -> list[dict]:
    """Every turn of `conv` on `peer`, its own replies carried as history. keep_capped: a reply
    that reached max_tokens is kept (marked `capped`) instead of left out as a loop."""
    messages = messages_for(conv)
    out = []
    for turn, user in enumerate(conv.turns):
        messages.append({"role": "user", "content": user})
        try:
            if isinstance(peer, AdaSparkPeer):
                t, looped, extra, text = peer.reply_conv(conv.id, messages, max_tokens, turn, sampling)
            else:
                t, looped, extra = peer.reply(messages, max_tokens, sampling)
                text = t.text
        except Exception as exc:  # a peer's own failure: recorded, left out of the ratios, counted
            print(f"{peer.name} {conv.id} turn {turn}: {exc!r}", file=sys.stderr, flush=True)
            t, looped, text = Timer(), False, ""
            extra = {"error": repr(exc)[:300]}
        messages.append({"role": "assistant", "content": text})
        n = tok.count(text)
        # n tokens over the span first..last piece: the first piece arrives with prefill, so a
        # reply of one piece has no decode interval and is left out by the statistics.
        out.append({"arm": peer.name, "conversation": conv.id, "turn": turn, "category": conv.category,
                    "n_tokens": n, "decode_s": t.seconds, **cap_marks(looped, keep_capped), "text": text,
                    "rounds": extra.pop("rounds", 0), "widths": extra.pop("widths", {}),
                    "measure_rounds": extra.pop("measure_rounds", 0), **extra})
    return out


def make_peer(name: str, args: argparse.Namespace, tmp: Path) -> Any:
    if name == "lcpp-plain":
        return LlamaCppPythonPeer(name, args.model, args.threads, args.n_ctx, pld=False, gpu_layers=args.gpu_layers)
    if name == "lcpp-pld":
        return LlamaCppPythonPeer(name, args.model, args.threads, args.n_ctx, pld=True, gpu_layers=args.gpu_layers)
    if name in SERVER_SPEC:
        if not args.server_bin or not Path(args.server_bin).exists():
            raise SystemExit(f"{name} needs --server-bin (a llama-server binary; see README.md)")
        drafter = None
        if name == "server-dspark":
            from adaspark_app.engine.default_drafter import default_drafter_path
            drafter = default_drafter_path() if args.drafter in (None, "default") else args.drafter
        return ServerPeer(name, args.server_bin, args.model, args.threads, args.n_ctx, Path(args.out), drafter,
                          args.gpu_layers)
    base, plus = name.removesuffix("+drafter"), name.endswith("+drafter")
    if base == "adaspark" or base.startswith("adaspark:"):
        arm = base.split(":", 1)[1] if ":" in base else "adaspark"
        drafter = (args.drafter or "default") if plus else args.drafter
        return AdaSparkPeer(name, arm, args.model, drafter, args.threads, args.n_ctx, tmp, args.gpu_layers)
    raise SystemExit(f"unknown peer {name!r}")


def main(argv: list[str] | None = None) -> int:
    from adaspark_app.engine.backend import default_model_path

    native.activate()  # the Q4_1 kernels, if built, before anything imports llama_cpp
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("script")
    ap.add_argument("--peers", default=DEFAULT_PEERS, help=f"comma-separated, first is the base (default {DEFAULT_PEERS})")
    ap.add_argument("--model", default=None)
    ap.add_argument("--drafter", default=None, help="DSpark drafter for the adaspark peers")
    ap.add_argument("--server-bin", default=os.environ.get("LLAMA_SERVER_BIN"))
    ap.add_argument("--max-tokens", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--n-ctx", type=int, default=4096)
    ap.add_argument("--gpu-layers", default=None, metavar="N|all",
                    help="layers on the GPU for every peer (llama-server: -ngl); default: each peer's own")
    ap.add_argument("--limit", type=int, default=None, help="first N conversations only")
    ap.add_argument("--keep-capped", action="store_true",
                    help="keep replies that reach --max-tokens (a fixed-length comparison)")
    ap.add_argument("--out", default=str(RESULTS / "speed" / "peers"))
    add_sampling_options(ap)  # as `adaspark run`: unset, greedy
    args = ap.parse_args(argv)
    sampling = check_sampling(args)  # the seed drawn once, so every peer and reply shares it
    sampling = None if sampling.greedy else sampling
    args.model = args.model or default_model_path()
    # a TERM (or an INT, ignored by background jobs) unwinds through `finally`, which stops
    # the llama-server processes this script started
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:  # once, as `adaspark` reads it: every peer then gets None, ALL_LAYERS or a count
        args.gpu_layers = parse_gpu_layers(args.gpu_layers)
    except ArgumentError as e:
        ap.error(str(e))
    names = [p.strip() for p in args.peers.split(",") if p.strip()]
    convs = load_script(args.script)[: args.limit]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    machine0 = machine_info(args.threads)
    warm_page_cache([args.model, args.drafter])
    tok = Tokenizer(args.model)
    records: list[dict] = []
    started = time.time()
    total = sum(len(c.turns) for c in convs) * len(names)
    with tempfile.TemporaryDirectory(prefix="adaspark-peers-") as tmpd:
        tmp = Path(tmpd)
        peers = {}
        try:
            for n in names:
                peers[n] = make_peer(n, args, tmp)
            with open(out / "replies.jsonl", "w", encoding="utf-8") as fp:
                for i, conv in enumerate(convs):
                    for n in arm_order(names, i):
                        for rec in run_one(peers[n], conv, args.max_tokens, tok, args.keep_capped, sampling):
                            records.append(rec)
                            fp.write(json.dumps(rec, ensure_ascii=False) + "\n")
                        fp.flush()
                    print(f"[{len(records)}/{total}] {conv.id} done, {time.time() - started:.0f} s",
                          file=sys.stderr, flush=True)
        finally:
            one_row = {n: v for n, p in peers.items()
                       if (v := one_row_verdict(getattr(p, "engine", None))) is not None}
            device = next((d for p in peers.values() if (d := device_line(getattr(p, "engine", None)))), None)
            for p in peers.values():
                p.close()
    meta = {
        "script": args.script, "arms": names, "base_arm": names[0], "model": args.model,
        "drafter": args.drafter, "max_tokens": args.max_tokens, "repeats": 1,
        "sampling": sampling.to_json() if sampling is not None else "greedy",
        "conversations": len(convs), "turns": sum(len(c.turns) for c in convs),
        "store": "adaspark peers: fresh empty store", "order": "interleaved per conversation, alternating",
        "machine": {**machine0, "loadavg_at_end": [round(x, 2) for x in os.getloadavg()],
                    **({"device": f"{device} (AdaSpark's peers)"} if device else {})},
        "elapsed_s": round(time.time() - started, 1), "one_row": one_row,
        "command": command_line("benchmarks.speed.run_peers", argv),
        "timing": "client clock: first to last streamed text piece; tokens by re-tokenising the reply text",
        "server_cmds": {n: " ".join(p.cmd[:1] + ["-m", "MODEL"] + p.cmd[3:]) for n, p in peers.items()
                        if isinstance(p, ServerPeer)},
    }
    report = write_report(records, meta, out)
    for arm, h in report["headline"].items():
        if h["geomean_ratio"] is not None:
            print(f"{arm} / {names[0]}: {h['geomean_ratio']:.3f}x [{h['ci95'][0]:.3f}, {h['ci95'][1]:.3f}] "
                  f"({h['replies']} replies)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
