"""Bad input gets one line on stderr naming the problem and exit code 2, never a traceback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from full_disk import fill_disk, small_disk  # noqa: F401 - small_disk is a fixture


def _run(*args: str, cwd=None, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "adaspark_app.cli", *args], capture_output=True, text=True,
                          timeout=120, cwd=cwd, env=env)


def _one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    for n in needles:
        assert n in lines[0], lines[0]


def test_chat_without_a_terminal_is_one_line_not_a_hang(tmp_path):
    """`adaspark chat < /dev/null > file` (or ssh without -t) used to draw into the file and wait
    for keys for ever."""
    proc = subprocess.run([sys.executable, "-m", "adaspark_app.cli", "chat", "--store", str(tmp_path / "c.db")],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    _one_line_error(proc, "needs a terminal", "adaspark run")
    assert proc.stdout == ""


def test_json_or_toml_nested_past_the_recursion_limit_is_one_line(tmp_path):
    """A script, an import or a config file nested too deeply made the parser raise RecursionError,
    which came out as a traceback."""
    deep = tmp_path / "deep.jsonl"
    deep.write_text("[" * 200_000 + "\n")
    _one_line_error(_run("run", str(deep)), "deep.jsonl:1", "nested too deeply")
    _one_line_error(_run("store", "import", str(deep), "--store", str(tmp_path / "s.db")), "nested too deeply")
    config = tmp_path / "config.toml"
    config.write_text("a = " + "[" * 200_000 + "\n")
    proc = subprocess.run([sys.executable, "-m", "adaspark_app.cli", "models"], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "ADASPARK_CONFIG": str(config)})
    _one_line_error(proc, "config.toml", "nested too deeply")


@pytest.fixture
def good_script(tmp_path):
    p = tmp_path / "ok.jsonl"
    p.write_text(json.dumps({"id": "a", "turns": ["Hello"]}) + "\n")
    return p


def test_missing_model(good_script, tmp_path):
    _one_line_error(_run("run", str(good_script), "--model", str(tmp_path / "nope.gguf")), "not found", "nope.gguf")


def test_model_that_is_not_gguf(good_script, tmp_path):
    bad = tmp_path / "fake.gguf"
    bad.write_bytes(b"PK\x03\x04 this is a zip, not a model")
    _one_line_error(_run("run", str(good_script), "--model", str(bad)), "not a GGUF", "fake.gguf")


@pytest.mark.model
def test_a_model_llama_cpp_refuses_says_why(good_script, tmp_path, model_path):
    """A GGUF whose header llama.cpp refuses (here no key-value heads: every K weight has the
    wrong shape) said only "could not load the model file"; llama.cpp's reason was in a log
    nobody sees. Now the line gives it."""
    data = bytearray(open(model_path, "rb").read())
    key = b"llama.attention.head_count_kv\x04\x00\x00\x00"  # the key and its type, UINT32
    at = data.index(key) + len(key)
    data[at:at + 4] = (0).to_bytes(4, "little")
    bad = tmp_path / "damaged.gguf"
    bad.write_bytes(bytes(data))
    _one_line_error(_run("run", str(good_script), "--fresh-store", "--model", str(bad)),
                    "llama.cpp could not load the model file", "damaged.gguf: ", "check_tensor_dims")


@pytest.mark.model
@pytest.mark.parametrize("layers", [0, 513, 100_000])
def test_a_layer_count_llama_cpp_aborts_on_is_one_line(good_script, tmp_path, model_path, layers):
    """llama.cpp asserts 0 < block_count <= 512: such a GGUF ended the process (SIGABRT and a
    debugger's backtrace), where every other damaged header field gives an error."""
    data = bytearray(open(model_path, "rb").read())
    key = b"llama.block_count\x04\x00\x00\x00"  # the key and its type, UINT32
    at = data.index(key) + len(key)
    data[at:at + 4] = layers.to_bytes(4, "little")
    bad = tmp_path / "layers.gguf"
    bad.write_bytes(bytes(data))
    _one_line_error(_run("run", str(good_script), "--fresh-store", "--model", str(bad)),
                    f"llama.block_count is {layers}", "1 to 512")


def test_malformed_json_line_names_file_and_line(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text(json.dumps({"id": "a", "turns": ["Hi"]}) + "\n" + "{not json\n")
    _one_line_error(_run("run", str(p)), "bad.jsonl:2", "malformed JSON")


def test_conversation_without_turns(tmp_path):
    p = tmp_path / "empty.jsonl"
    p.write_text(json.dumps({"id": "x", "turns": []}) + "\n")
    _one_line_error(_run("run", str(p)), "empty.jsonl:1", "no turns")


@pytest.mark.parametrize("flag,value", [("--temperature", "abc"), ("--top-p", "2"), ("--seed", "x"),
                                        ("--top-k", "-1")])
def test_bad_sampling_values_rejected(good_script, flag, value):
    _one_line_error(_run("run", str(good_script), flag, value), flag, repr(value))


def test_unknown_arm(good_script):
    _one_line_error(_run("run", str(good_script), "--arm", "beam:4"), "unknown arm")


def test_bad_max_tokens(good_script):
    _one_line_error(_run("run", str(good_script), "--max-tokens", "zero"), "--max-tokens")


def test_missing_script(tmp_path):
    _one_line_error(_run("run", str(tmp_path / "none.jsonl")), "script not found")


@pytest.mark.parametrize("args,needle", [
    (("--n-ctx", "32"), "--n-ctx must be from 64"),  # llama.cpp aborted here (GGML_ASSERT, exit 134)
    (("--n-ctx", "63"), "--n-ctx must be from 64"),
    (("--n-ctx", "0"), "--n-ctx must be from 64"),
    (("--n-ctx", "abc"), "--n-ctx must be a whole number"),
    (("--n-ctx", str(1 << 40)), "--n-ctx must be from 64"),
    (("--threads", "0"), "--threads must be from 1"),
    (("--threads", "100000"), "--threads must be from 1"),
    (("--max-tokens", "0"), "--max-tokens must be from 1"),
])
def test_numeric_options_checked_before_llama_cpp_sees_them(good_script, args, needle):
    """Run in a child process, so a native abort would show as a signal exit and a backtrace."""
    _one_line_error(_run("run", str(good_script), *args), needle)


def test_bad_argmax_place_is_one_line(good_script, monkeypatch):
    monkeypatch.setenv("ADASPARK_ARGMAX", "gpu")
    _one_line_error(_run("run", str(good_script)), "ADASPARK_ARGMAX must be host or device, not 'gpu'")


@pytest.mark.model
@pytest.mark.parametrize("name, value, needle", [
    ("ADASPARK_KVT", "q9", "give one of 0, 1, 2, 3, 6, 7, 8, 30"),  # a ValueError traceback
    ("ADASPARK_KVT", "1,99", "ADASPARK_KVT='99'"),  # llama.cpp aborted
    ("ADASPARK_FA", "2", "give one of -1, 0, 1"),  # llama.cpp aborted
])
def test_a_bad_diagnostic_setting_is_one_line(good_script, monkeypatch, name, value, needle):
    monkeypatch.setenv(name, value)
    _one_line_error(_run("run", "--fresh-store", str(good_script)), name, needle)


def test_library_users_get_the_same_checks():
    """ChatEngine/LlamaBackend check their numbers first, with the CLI's error type, before any
    model file is opened (so this test loads no model)."""
    from adaspark_app.engine.backend import LlamaBackend
    from adaspark_app.engine.chat_engine import ChatEngine
    from adaspark_app.errors import ArgumentError

    with pytest.raises(ArgumentError, match="--n-ctx must be from 64"):
        LlamaBackend("/nonexistent.gguf", n_ctx=32)
    with pytest.raises(ArgumentError, match="n_batch must be from 64"):
        LlamaBackend("/nonexistent.gguf", n_batch=16)
    with pytest.raises(ArgumentError, match="--threads must be from 1"):
        ChatEngine(n_threads=100000)
    with pytest.raises(ArgumentError, match="--n-ctx must be a whole number"):
        ChatEngine(n_ctx=64.5)


def test_chat_has_no_hidden_arm_option():
    """`chat --arm` was parsed and ignored; it is gone, so passing it is an error, not a no-op."""
    _one_line_error(_run("chat", "--arm", "ar"), "unrecognized arguments: --arm")


@pytest.fixture
def no_config(tmp_path, monkeypatch):
    monkeypatch.setenv("ADASPARK_CONFIG", str(tmp_path / "none.toml"))  # the subprocess inherits it
    return tmp_path


@pytest.mark.parametrize("case", ["store-not-sqlite", "model-name-missing", "model-is-a-folder", "bad-config",
                                  "bad-gpu-layers", "bad-gpu-layers-config"])
def test_chat_user_errors_are_one_line_before_the_window_opens(no_config, case):
    tmp = no_config
    if case == "store-not-sqlite":
        (tmp / "chats.db").write_text("a text file\n")
        args, needles = ["chat", "--store", str(tmp / "chats.db")], ("adaspark: error:", "not an AdaSpark store")
    elif case == "model-name-missing":
        args, needles = ["chat", "--model", "nosuch:7b"], ("nosuch:7b", "nor is it a name `adaspark models` lists")
    elif case == "model-is-a-folder":
        (tmp / "m.gguf").mkdir()
        args, needles = ["chat", "--model", str(tmp / "m.gguf")], ("not a file", "m.gguf")
    elif case == "bad-gpu-layers":
        args, needles = ["chat", "--gpu-layers", "half"], ("--gpu-layers must be", "'half'")
    elif case == "bad-gpu-layers-config":
        (tmp / "none.toml").write_text("gpu_layers = -5\n")
        args, needles = ["chat"], ("none.toml", "key 'gpu_layers'", "not -5")
    else:
        (tmp / "none.toml").write_text("[sampling]\ntemperature = \"hot\"\n")
        args, needles = ["chat"], ("none.toml", "sampling.temperature")
    _one_line_error(_run(*args, cwd=tmp), *needles)


def test_a_gzip_script_reads_as_the_plain_one(tmp_path, monkeypatch):
    """SCRIPT.jsonl.gz (how scripts are kept in results folders) gives the same conversations as
    the plain file; one past the unpack limit is refused with one line."""
    import gzip

    from adaspark_app import runner
    from adaspark_app.errors import ScriptError

    lines = [{"id": "a", "turns": ["Hello", "And then?"]}, {"id": "b", "system": "Be brief.", "turns": ["Hi"]}]
    plain = tmp_path / "s.jsonl"
    plain.write_text("".join(json.dumps(x) + "\n" for x in lines))
    packed = tmp_path / "s.jsonl.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes(), mtime=0))
    strip = lambda convs: [(c.id, c.turns, c.system, c.line) for c in convs]  # noqa: E731
    assert strip(runner.load_script(str(packed))) == strip(runner.load_script(str(plain)))
    monkeypatch.setattr(runner, "GZ_LIMIT", plain.stat().st_size - 1)
    with pytest.raises(ScriptError, match="unpacks to more than"):
        runner.load_script(str(packed))


def test_a_script_larger_than_the_read_limit_is_one_line(tmp_path, monkeypatch):
    """A plain script is read whole: one past READ_LIMIT is refused, and a device that never ends
    (it was a MemoryError traceback, or the machine's memory) is one line, exit 2."""
    from adaspark_app import runner
    from adaspark_app.errors import ScriptError

    plain = tmp_path / "s.jsonl"
    plain.write_text(json.dumps({"id": "a", "turns": ["Hello"]}) + "\n")
    assert [c.id for c in runner.load_script(str(plain))] == ["a"]
    monkeypatch.setattr(runner, "READ_LIMIT", plain.stat().st_size - 1)
    with pytest.raises(ScriptError, match="s.jsonl is larger than"):
        runner.load_script(str(plain))
    _one_line_error(_run("run", "/dev/zero"), "script /dev/zero is larger than 256 MiB")


def test_a_broken_gzip_script_is_one_line(tmp_path, good_script):
    import gzip

    notgz = tmp_path / "not.jsonl.gz"
    notgz.write_bytes(b"plain text, not gzip")
    _one_line_error(_run("run", str(notgz)), "cannot read script", "not.jsonl.gz")
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(gzip.compress(good_script.read_bytes() * 50, mtime=0)[:20])
    _one_line_error(_run("run", str(cut)), "cannot read script", "cut.jsonl.gz")


@pytest.mark.model
@pytest.mark.parametrize("where", ["--out", "--log-rounds", "stdout", "bench"])
def test_a_full_disk_is_one_line_not_a_traceback(small_disk, good_script, where):
    """`run`'s replies, its round log or its standard output, or bench's report, on a full disk:
    a traceback (two, with the file's close) before; one line and exit 2 now."""
    fill_disk(small_disk)
    target = small_disk / "out"
    common = ("--fresh-store", "--max-tokens", "4")
    if where == "stdout":
        with open(target, "w") as fh:
            proc = subprocess.run([sys.executable, "-m", "adaspark_app.cli", "run", *common, str(good_script)],
                                  stdout=fh, stderr=subprocess.PIPE, text=True, timeout=120)
    elif where == "bench":
        proc = _run("bench", "--arms", "ar,adaspark", "--max-tokens", "4", "--no-progress", "--report", str(target),
                    str(good_script))
    else:
        proc = _run("run", *common, where, str(target), str(good_script))
    _one_line_error(proc, "cannot write", "No space left on device")


@pytest.mark.parametrize("line", [
    '{"id": "a", "turns": ["hi \\ud800 there"]}',
    '{"id": "a\\udfff", "turns": ["hi"]}',
    '{"id": "a", "system": "\\ud800", "turns": ["hi"]}',
], ids=["turn", "id", "system"])
def test_a_lone_surrogate_in_a_script_is_one_line(tmp_path, line):
    """JSON's \\ud800 escape spells no character: the tokenizer or the store raised
    UnicodeEncodeError, a traceback, after the model had loaded."""
    script = tmp_path / "s.jsonl"
    script.write_text(line + "\n")
    _one_line_error(_run("run", "--fresh-store", str(script)), "s.jsonl:1", "a lone surrogate \\ud")


def test_a_system_prompt_that_is_not_utf8_is_one_line(tmp_path):
    """`chat --system` with a byte that is not UTF-8 ended the chat with a traceback at the
    first message."""
    proc = _run("chat", "--store", str(tmp_path / "c.db"), "--system", os.fsdecode(b"be nice \xff"))
    _one_line_error(proc, "--system is not UTF-8 text", "\\xff")


@pytest.mark.model
def test_a_model_path_that_is_not_utf8_loads(tmp_path, good_script, model_path):
    """A file name is bytes: one that is not UTF-8 reached llama.cpp through str.encode, which
    raised UnicodeEncodeError (a traceback in `run`, an obscure line in the chat)."""
    odd = os.path.join(os.fsencode(tmp_path), b"model-\xff.gguf")
    os.symlink(model_path, odd)
    proc = _run("run", "--fresh-store", "--max-tokens", "2", "--model", os.fsdecode(odd), str(good_script))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[0])["n_tokens"] == 2


def test_version_names_the_package_the_llama_cpp_build_and_the_kernels():
    """`adaspark --version`: what a bug report needs, one fact a line, exit 0."""
    from importlib import metadata

    proc = _run("--version")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == f"adaspark {metadata.version('adaspark-app')}"
    assert lines[1].startswith(f"llama-cpp-python {metadata.version('llama-cpp-python')}, llama.cpp built for: ")
    assert lines[1].endswith(("CPU only", "GPU offload"))
    assert lines[2].startswith("CPU kernels: ") and "round pricing: " in lines[2]
    assert len(lines) == 4 and "Traceback" not in proc.stderr


@pytest.mark.parametrize("argv", [
    ("run", "{p}.jsonl", "--fresh-store"),
    ("bench", "{p}.jsonl", "--arms", "ar,adaspark"),
    ("store", "import", "{p}.json"),
    ("chat", "--model", "{p}.gguf"),
    ("models", "--paths", "{p}"),
])
def test_a_name_with_a_line_feed_is_still_a_one_line_error(tmp_path, argv):
    """A path (or a GGUF's tensor name, a model's words) holding a line feed is named with it
    escaped: the error stays one line."""
    p = str(tmp_path / "no\nsuch")
    proc = subprocess.run([sys.executable, "-m", "adaspark_app.cli", *(a.format(p=p) for a in argv)],
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
                          env={**os.environ, "ADASPARK_STORE": str(tmp_path / "s.db")})
    _one_line_error(proc, "no\\nsuch")


@pytest.mark.model
def test_a_model_whose_vocabulary_repeats_a_token_is_one_line_not_an_abort(tmp_path):
    """The bundled model with token 6 written over with token 4's bytes: llama.cpp would assert
    and end the process (SIGABRT, found by mutating the header); the refusal comes first."""
    import struct

    from adaspark_app.engine.backend import default_model_path

    data = bytearray(open(default_model_path(), "rb").read())
    at = data.index(struct.pack("<Q", 10) + b"<filename>") + 8  # token 6, as long as token 4's
    data[at:at + 10] = b"<reponame>"
    model = tmp_path / "dup.gguf"
    model.write_bytes(bytes(data))
    script = tmp_path / "s.jsonl"
    script.write_text('{"id": "a", "turns": ["Hi"]}\n')
    proc = _run("run", str(script), "--model", str(model), "--fresh-store", "--max-tokens", "2")
    _one_line_error(proc, "dup.gguf", "ids 4 and 6")


@pytest.mark.model
def test_a_model_whose_rwkv_vocabulary_would_hang_the_tokenizer_is_one_line_not_a_hang(tmp_path):
    """The bundled model's GPT-2 vocabulary relabeled rwkv: bytes 0xC2-0xC5 begin tokens but are none
    alone, and llama.cpp's RWKV tokenizer looped for ever on 'ń' (C5 84: no token goes on with 84);
    the refusal comes first (without it this run times out). It comes as the engine loads, after the
    temporary store was made: that goes too (it stayed behind for a moment in this session's work)."""
    from adaspark_app.engine.backend import default_model_path

    model = _with_key(default_model_path(), tmp_path / "m.gguf", "llama", "tokenizer.ggml.model", "str", "rwkv")
    script = tmp_path / "s.jsonl"
    script.write_text(json.dumps({"id": "a", "turns": ["Say \u0144."]}) + "\n")
    (tmp_path / "tmp").mkdir()
    proc = _run("run", str(script), "--model", str(model), "--fresh-store", "--max-tokens", "2",
                env=dict(os.environ, TMPDIR=str(tmp_path / "tmp")))
    _one_line_error(proc, "m.gguf", "RWKV vocabulary has tokens that begin with byte 0xC2")
    assert list((tmp_path / "tmp").iterdir()) == []

@pytest.mark.model
@pytest.mark.parametrize("key, vtype, value, words", [
    ("llama.rope.scaling.type", "str", "bogus", "rope.scaling.type is 'bogus'"),
    ("llama.expert_used_count", "u32", 2, "expert_used_count is 2, more than the 0 experts"),
    # ggml's RMS norm asserted at the first forward (exit 134): the file's own key, replaced
    ("llama.attention.layer_norm_rms_epsilon", "f32", float("nan"), "layer_norm_rms_epsilon is nan"),
    # layer 5 with 2 key-value heads where the weights have 3: storing its keys asserted (exit 134)
    ("llama.attention.head_count_kv", "arr", [3] * 5 + [2] + [3] * 24, "says layer 5 has 2 heads and layer 0 3"),
])
def test_a_model_whose_hyperparameters_llama_cpp_asserts_on_is_one_line_not_an_abort(tmp_path, key, vtype, value,
                                                                                      words):
    """The bundled model with one metadata key added or replaced (gguf-py's copy): llama.cpp
    asserted on each, loading or at the first forward (SIGABRT, exit 134); the refusal comes first."""
    from adaspark_app.engine.backend import default_model_path

    model = _with_key(default_model_path(), tmp_path / "m.gguf", "llama", key, vtype, value)
    script = tmp_path / "s.jsonl"
    script.write_text('{"id": "a", "turns": ["Hi"]}\n')
    proc = _run("run", str(script), "--model", str(model), "--fresh-store", "--max-tokens", "2")
    _one_line_error(proc, "m.gguf", words)


#: `adaspark run` with the header rules off (llama_aborts.header_problem finds nothing), so a file
#: they refuse stands for one whose assertion no rule knows yet
RUN_WITHOUT_HEADER_RULES = ("import sys, adaspark_app.llama_aborts as rules\n"
                            "rules.header_problem = lambda header: None\n"
                            "from adaspark_app.cli import main\n"
                            "sys.exit(main(sys.argv[1:]))\n")


@pytest.mark.model
def test_an_assertion_no_header_rule_knows_ends_run_in_one_line_not_an_abort(tmp_path):
    """The bundled model with layer 5's key-value head count changed, the rule that refuses it off:
    llama.cpp's assertion at the first forward (GGML_ASSERT in ggml.c; SIGABRT and a gdb backtrace
    before) ends the process in one line naming the check and the file, exit 2; --fresh-store's
    temporary store goes too (the exit skips every finally: it stayed behind before)."""
    from adaspark_app.engine.backend import default_model_path

    model = _with_key(default_model_path(), tmp_path / "m.gguf", "llama", "llama.attention.head_count_kv", "arr",
                      [3] * 5 + [2] + [3] * 24)
    script = tmp_path / "s.jsonl"
    script.write_text('{"id": "a", "turns": ["Hi"]}\n')
    (tmp_path / "tmp").mkdir()
    proc = subprocess.run([sys.executable, "-c", RUN_WITHOUT_HEADER_RULES, "run", str(script), "--model", str(model),
                           "--fresh-store", "--max-tokens", "2"], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, TMPDIR=str(tmp_path / "tmp")))
    _one_line_error(proc, "llama.cpp failed one of its own checks (ggml.c:", "GGML_ASSERT(", str(model))
    assert "/vendor/" not in proc.stderr  # the check's source file by name, not the build's directories
    assert list((tmp_path / "tmp").iterdir()) == []



@pytest.mark.model
@pytest.mark.parametrize("stock", [False, True])
def test_a_cxx_exception_llama_cpp_does_not_catch_ends_run_in_one_line_not_an_abort(tmp_path, stock):
    """The bundled model's GPT-2 vocabulary relabeled SentencePiece (`tokenizer.ggml.model` llama):
    llama_tokenize throws std::out_of_range for the first character no token covers, out of the C
    API, and the C++ runtime's std::terminate ended the process (ggml's gdb backtrace, SIGABRT, exit
    134). Now one line naming the exception's type and the file, exit 2, the temporary store removed;
    ADASPARK_LLAMA_LOG keeps llama.cpp's own end (the stock case: what the handler replaces)."""
    from adaspark_app.engine.backend import default_model_path

    model = _with_key(default_model_path(), tmp_path / "m.gguf", "llama", "tokenizer.ggml.model", "str", "llama")
    script = tmp_path / "s.jsonl"
    script.write_text('{"id": "a", "turns": ["Say hello."]}\n')
    (tmp_path / "tmp").mkdir()
    env = dict(os.environ, TMPDIR=str(tmp_path / "tmp"), GGML_NO_BACKTRACE="1")  # no gdb in the stock case
    if stock:
        env["ADASPARK_LLAMA_LOG"] = "1"
    proc = subprocess.run([sys.executable, "-m", "adaspark_app.cli", "run", str(script), "--model", str(model),
                           "--fresh-store", "--max-tokens", "2"], capture_output=True, text=True, timeout=120, env=env)
    if stock:
        assert proc.returncode == -signal.SIGABRT and "std::out_of_range" in proc.stderr
        return
    _one_line_error(proc, "llama.cpp stopped on an error it does not handle (std::out_of_range) with", str(model))
    assert list((tmp_path / "tmp").iterdir()) == []


@pytest.mark.model
def test_a_drafter_whose_hyperparameters_llama_cpp_asserts_on_is_one_line_not_an_abort(tmp_path):
    """The shipped drafter with an unknown rope scaling type: llama.cpp loads drafters through
    the same load_hparams and asserted (exit 134); the check sits where every load goes."""
    from adaspark_app.engine.default_drafter import default_drafter_path

    drafter = _with_key(default_drafter_path(), tmp_path / "d.gguf", "dflash", "dflash.rope.scaling.type", "str",
                        "bogus")
    script = tmp_path / "s.jsonl"
    script.write_text('{"id": "a", "turns": ["List the days of the week."]}\n')
    proc = _run("run", str(script), "--drafter", str(drafter), "--fresh-store", "--max-tokens", "4")
    _one_line_error(proc, "d.gguf", "rope.scaling.type is 'bogus'")


def _with_key(src, dst, arch: str, key: str, vtype: str, value):
    """A copy of the GGUF `src` at `dst` with one metadata key added or replaced (gguf-py's copy)."""
    import gguf
    from gguf.scripts.gguf_new_metadata import MetadataDetails, copy_with_new_metadata

    types = {"str": gguf.GGUFValueType.STRING, "u32": gguf.GGUFValueType.UINT32, "f32": gguf.GGUFValueType.FLOAT32,
             "arr": gguf.GGUFValueType.ARRAY}
    copy_with_new_metadata(gguf.GGUFReader(str(src), "r"), gguf.GGUFWriter(str(dst), arch=arch),
                           {key: MetadataDetails(types[vtype], value)}, [])
    return dst
