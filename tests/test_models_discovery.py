"""Model discovery over fake folder trees in each tool's layout (real GGUF headers from gguf-py),
each with a file that is not a GGUF and a partial download, and `adaspark models` over them.
No model is loaded."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from adaspark_app.cli import main
from adaspark_app.models import discover_models, find_model
from adaspark_app.models.architectures import LLAMA_CPP_ARCHITECTURES, architecture_problem
from adaspark_app.models.discovery import hf_entries, lmstudio_entries, ollama_entries, ollama_name
from adaspark_app.models.locations import (env_model_dirs, hf_hub_cache, lmstudio_model_dirs,
                                           ollama_models_dirs)

from model_trees import GEMMA_TOKENS, hf_tree, lmstudio_tree, ollama_tree, truncate, write_gguf


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """An empty home: no tool's folders, no config file, nothing from the real environment."""
    h = tmp_path / "home"
    h.mkdir()
    monkeypatch.setenv("HOME", str(h))
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME", "ADASPARK_MODELS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("OLLAMA_MODELS", str(h / ".ollama" / "models"))  # not the system's service dir
    monkeypatch.setenv("ADASPARK_CONFIG", str(h / "no-config.toml"))
    return h


def by_name(entries):
    return {e.name: e for e in entries}


# ---------------------------------------------------------------------------------- locations
def test_hf_cache_location_follows_huggingface_hub(monkeypatch):
    assert hf_hub_cache({"HF_HUB_CACHE": "/x/hub", "HF_HOME": "/y"}) == Path("/x/hub")
    assert hf_hub_cache({"HUGGINGFACE_HUB_CACHE": "/legacy"}) == Path("/legacy")
    assert hf_hub_cache({"HF_HOME": "/y", "XDG_CACHE_HOME": "/z"}) == Path("/y/hub")
    assert hf_hub_cache({"XDG_CACHE_HOME": "/z"}) == Path("/z/huggingface/hub")
    assert hf_hub_cache({}) == Path.home() / ".cache" / "huggingface" / "hub"
    monkeypatch.setenv("ROOTY", "/r")  # huggingface_hub expands $VARS from the environment
    assert hf_hub_cache({"HF_HOME": "$ROOTY/hf"}) == Path("/r/hf/hub")


def test_ollama_location_follows_envconfig(tmp_path):
    assert ollama_models_dirs({"OLLAMA_MODELS": "/m"}) == [Path("/m")]
    dirs = ollama_models_dirs({}, home=tmp_path)
    assert dirs[0] == tmp_path / ".ollama" / "models"  # not XDG: Ollama does not use it
    assert Path("/usr/share/ollama/.ollama/models") in dirs


def test_lmstudio_locations_pointer_settings_and_legacy(tmp_path):
    assert lmstudio_model_dirs(tmp_path)[:2] == [tmp_path / ".lmstudio" / "models",
                                                 tmp_path / ".cache" / "lm-studio" / "models"]
    moved = tmp_path / "elsewhere"
    (moved).mkdir()
    (tmp_path / ".lmstudio-home-pointer").write_text(f"{moved}\n")
    (moved / "settings.json").write_text(json.dumps({"downloadsFolder": str(tmp_path / "big-disk")}))
    dirs = lmstudio_model_dirs(tmp_path)
    assert dirs[:2] == [tmp_path / "big-disk", moved / "models"]
    assert tmp_path / ".lmstudio" / "models" in dirs
    (moved / "settings.json").write_text("{" * 100_000)  # unreadable: as if it named no folder
    assert lmstudio_model_dirs(tmp_path)[0] == moved / "models"


def test_adaspark_models_env_is_pathsep_separated():
    assert env_model_dirs({"ADASPARK_MODELS": f"/a{os.pathsep}{os.pathsep}/b"}) == [Path("/a"), Path("/b")]


# ---------------------------------------------------------------------------------- each layout
def test_hf_snapshot_symlinks_named_by_repo_and_file(tmp_path):
    files = hf_tree(tmp_path / "hub")
    found = by_name(hf_entries(tmp_path / "hub"))
    good = found["acme/Tiny-GGUF/tiny-Q8_0.gguf"]
    assert good.problem is None and good.source == "hf"
    assert (good.architecture, good.quantisation, good.turn_format) == ("llama", "Q8_0", "chat template")
    assert good.size == os.path.getsize(files["good"]) and good.model_id
    assert found["acme/Tiny-GGUF/tiny-Q4_K_M.gguf"].problem == "not a GGUF file"
    assert found["acme/Tiny-GGUF/tiny-F16.gguf"].problem.startswith("truncated:")
    partial = [e for e in found.values() if "downloading" in e.name]
    assert len(partial) == 1 and partial[0].problem.startswith("partial download")
    assert not any(n.endswith("README.md") for n in found)


def test_hf_blob_missing_is_broken_not_a_crash(tmp_path):
    files = hf_tree(tmp_path / "hub")
    os.unlink(os.path.realpath(files["good"]))
    e = by_name(hf_entries(tmp_path / "hub"))["acme/Tiny-GGUF/tiny-Q8_0.gguf"]
    assert "blob is missing" in e.problem


def test_lmstudio_publisher_repo_file(tmp_path):
    lmstudio_tree(tmp_path / "models")
    found = by_name(lmstudio_entries(tmp_path / "models"))
    assert found["lmstudio-community/Tiny-GGUF/Tiny-Q8_0.gguf"].problem is None
    assert found["lmstudio-community/Tiny-GGUF/Tiny-Q4_0.gguf"].problem == "not a GGUF file"
    assert found["lmstudio-community/Tiny-GGUF/Tiny-Q6_K.gguf.part"].problem == "partial download"


def test_ollama_manifests_resolve_to_blobs_by_name_and_tag(tmp_path):
    files = ollama_tree(tmp_path / "models")
    found = by_name(ollama_entries(tmp_path / "models"))
    good = found["tiny:latest"]
    assert good.problem is None and good.path == str(files["good"]) and good.architecture == "llama"
    assert found["someone/tiny:q8"].problem is None
    assert found["junk:latest"].problem == "not a GGUF file"
    assert found["short:latest"].problem.startswith("partial download:")
    partial = [e for e in found.values() if e.name.startswith("(downloading")]
    assert len(partial) == 1 and partial[0].problem == "partial download"  # -partial-0 is not a second


def test_ollama_bad_manifests(tmp_path):
    models = tmp_path / "models"
    ollama_tree(models)
    bad = models / "manifests" / "registry.ollama.ai" / "library" / "broken" / "latest"
    bad.parent.mkdir(parents=True)
    bad.write_text("{not json")
    nolayer = models / "manifests" / "registry.ollama.ai" / "library" / "nolayer" / "1b"
    nolayer.parent.mkdir(parents=True)
    nolayer.write_text(json.dumps({"layers": [{"mediaType": "application/vnd.ollama.image.license"}]}))
    gone = models / "manifests" / "registry.ollama.ai" / "library" / "gone" / "7b"
    gone.parent.mkdir(parents=True)
    gone.write_text(json.dumps({"layers": [{"mediaType": "application/vnd.ollama.image.model",
                                            "digest": "sha256:" + "cd" * 32, "size": 10}]}))
    deep = models / "manifests" / "registry.ollama.ai" / "library" / "deep" / "latest"
    deep.parent.mkdir(parents=True)
    deep.write_text("[" * 100_000)  # nested past Python's recursion limit
    found = by_name(ollama_entries(models))
    assert found["broken:latest"].problem == "its manifest is not readable JSON"
    assert found["deep:latest"].problem == "its manifest is not readable JSON"
    assert found["nolayer:1b"].problem == "its manifest names no model layer"
    assert found["gone:7b"].problem == "its model blob is missing"


def test_ollama_names():
    assert ollama_name("registry.ollama.ai", "library", "llama3.2", "3b") == "llama3.2:3b"
    assert ollama_name("registry.ollama.ai", "someone", "m", "latest") == "someone/m:latest"
    assert ollama_name("hf.co", "org", "m", "Q4_K_M") == "hf.co/org/m:Q4_K_M"


# ---------------------------------------------------------------------------------- what is read
def test_base_model_turn_format_and_unsupported_architectures(tmp_path):
    write_gguf(tmp_path / "gemma-base.gguf", "gemma3", template=None, tokens=GEMMA_TOKENS)
    write_gguf(tmp_path / "odd-base.gguf", "gpt2", template=None)
    write_gguf(tmp_path / "future.gguf", "made-up-arch")
    write_gguf(tmp_path / "mmproj.gguf", "clip", template=None)
    write_gguf(tmp_path / "drafter.gguf", "dflash", template=None)
    found = by_name(discover_models([tmp_path], include_bundled=False, learned=False))
    assert found["gemma-base.gguf"].turn_format == "base model, gemma turns"
    assert found["gemma-base.gguf"].base_model and found["gemma-base.gguf"].problem is None
    assert found["odd-base.gguf"].turn_format == "base model, plain completion"
    assert "not supported by llama.cpp 0.3.36" in found["future.gguf"].problem
    assert "vision projector" in found["mmproj.gguf"].problem
    assert "drafter" in found["drafter.gguf"].problem


def test_a_layer_count_llama_cpp_aborts_on_is_listed_broken(tmp_path):
    """0 layers, or over 512, ended llama.cpp with an assertion when chosen; listed as broken now."""
    for layers in (0, 513, 512):
        write_gguf(tmp_path / f"layers-{layers}.gguf", layers=layers)
    found = by_name(discover_models([tmp_path], include_bundled=False, learned=False))
    assert found["layers-0.gguf"].problem == "llama.block_count is 0; llama.cpp takes 1 to 512 layers"
    assert "llama.block_count is 513" in found["layers-513.gguf"].problem
    assert found["layers-512.gguf"].problem is None


def test_a_vocabulary_llama_cpp_aborts_on_is_listed_broken(tmp_path):
    """A token written twice ended llama.cpp with an assertion (llama-vocab.cpp) when chosen."""
    write_gguf(tmp_path / "dup.gguf", tokens=["<s>", "</s>", "a", "b", "a"])
    write_gguf(tmp_path / "fine.gguf", tokens=["<s>", "</s>", "a", "b", "ab"])
    found = by_name(discover_models([tmp_path], include_bundled=False, learned=False))
    assert "one token twice, ids 2 and 4" in found["dup.gguf"].problem
    assert found["fine.gguf"].problem is None


def test_sharded_model_listed_once_by_its_first_shard(tmp_path):
    write_gguf(tmp_path / "big" / "m-00001-of-00002.gguf")
    write_gguf(tmp_path / "big" / "m-00002-of-00002.gguf")
    write_gguf(tmp_path / "cut" / "m-00001-of-00003.gguf")
    write_gguf(tmp_path / "cut" / "m-00002-of-00003.gguf")
    found = by_name(discover_models([tmp_path], include_bundled=False, learned=False))
    assert set(found) == {"big/m-00001-of-00002.gguf", "cut/m-00001-of-00003.gguf"}
    assert found["big/m-00001-of-00002.gguf"].problem is None
    assert found["cut/m-00001-of-00003.gguf"].problem == "shard 3 of 3 is missing"


def test_garbage_never_crashes(tmp_path):
    """Every kind of bad file is an entry with a reason: empty, random bytes, a GGUF cut in its
    header, an unreadable directory."""
    (tmp_path / "empty.gguf").write_bytes(b"")
    (tmp_path / "random.gguf").write_bytes(os.urandom(4096))
    cut = write_gguf(tmp_path / "cut.gguf")
    cut.write_bytes(cut.read_bytes()[:40])
    (tmp_path / "GGUF-magic-only.gguf").write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 16)
    locked = tmp_path / "locked"
    locked.mkdir()
    write_gguf(locked / "x.gguf")
    locked.chmod(0)
    try:
        found = by_name(discover_models([tmp_path], include_bundled=False, learned=False))
    finally:
        locked.chmod(0o755)
    assert found["empty.gguf"].problem == "empty file"
    assert found["random.gguf"].problem == "not a GGUF file"
    assert found["cut.gguf"].problem.startswith("corrupt GGUF")
    assert found["GGUF-magic-only.gguf"].problem.startswith("corrupt GGUF")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_or_a_device_named_gguf_is_broken_not_a_hang(tmp_path):
    """A FIFO named .gguf in a models folder blocked `adaspark models` for ever on its first read;
    now it is listed as broken without being opened, beside a link to a device, and reading either
    as a GGUF is one error."""
    import threading

    from adaspark_app.gguf_file import GGUFError, read_gguf_header

    folder = tmp_path / "models"
    folder.mkdir()
    os.mkfifo(folder / "pipe.gguf")
    (folder / "zeros.gguf").symlink_to("/dev/zero")
    write_gguf(folder / "fine.gguf")
    done: dict = {}

    def list_models() -> None:
        done["found"] = by_name(discover_models([folder], include_bundled=False, learned=False))
        for name in ("pipe.gguf", "zeros.gguf"):
            try:
                read_gguf_header(folder / name)
            except GGUFError as err:
                done[name] = str(err)

    t = threading.Thread(target=list_models, daemon=True)  # a hang fails the test instead of stopping it
    t.start()
    t.join(30)
    assert not t.is_alive(), "listing a folder with a FIFO in it did not return"
    found = done["found"]
    assert found["pipe.gguf"].problem == found["zeros.gguf"].problem == "cannot read the file (not a regular file)"
    assert found["fine.gguf"].problem is None
    assert "not a regular file" in done["pipe.gguf"] and "not a regular file" in done["zeros.gguf"]


def test_learned_state_on_this_device_is_shown(tmp_path):
    from adaspark_app.store import LearnedKey, Store
    from adaspark_app.store.fingerprint import _cpu_name, model_fingerprint
    import platform

    a = write_gguf(tmp_path / "models" / "a.gguf", name="a")
    write_gguf(tmp_path / "models" / "b.gguf", name="b")
    store_path = tmp_path / "s.db"
    fp = model_fingerprint(a)
    with Store.open(store_path) as store:
        store.save_learned(LearnedKey(fp["id"], "dev1"), {"x": 1}, None,
                           {"model": fp, "device": {"cpu": _cpu_name(), "machine": platform.machine()}})
        store.save_learned(LearnedKey(fp["id"] + "0", "dev2"), {"x": 1}, None,
                           {"model": {}, "device": {"cpu": "another cpu", "machine": "x"}})
    found = by_name(discover_models([tmp_path / "models"], include_bundled=False, store_path=store_path))
    assert found["a.gguf"].learned is True and found["b.gguf"].learned is False
    absent = by_name(discover_models([tmp_path / "models"], include_bundled=False,
                                     store_path=tmp_path / "none.db"))
    assert absent["a.gguf"].learned is False and not (tmp_path / "none.db").exists()


def test_architecture_table_matches_the_vendored_llama_cpp():
    src = Path("/tmp/sdist/llama_cpp_python-0.3.36/vendor/llama.cpp/src/llama-arch.cpp")
    if not src.is_file():
        pytest.skip("llama-cpp-python 0.3.36 sources not unpacked here")
    import re

    text = src.read_text()
    block = text[text.index("LLM_ARCH_NAMES"):]
    names = set(re.findall(r'"([^"]+)"', block[:block.index("};")])) - {"unknown"}
    assert names == set(LLAMA_CPP_ARCHITECTURES)
    assert architecture_problem("gemma3") is None and architecture_problem("llama") is None


# ---------------------------------------------------------------------------------- all at once
@pytest.fixture
def every_tree(home, tmp_path, monkeypatch):
    hf_tree(home / ".cache" / "huggingface" / "hub")
    lmstudio_tree(home / ".lmstudio" / "models")
    ollama_tree(home / ".ollama" / "models")
    extra = tmp_path / "extra"
    write_gguf(extra / "mine.gguf", name="mine")
    truncate(write_gguf(extra / "cut.gguf"), keep=200)
    monkeypatch.setenv("ADASPARK_MODELS", str(extra))
    return home


def test_discover_models_lists_every_source_in_order(every_tree):
    entries = discover_models()
    sources = [e.source for e in entries]
    assert sources == sorted(sources, key=["bundled", "hf", "lmstudio", "ollama", "folder"].index)
    found = by_name(entries)
    assert found["SmolLM2-135M-Instruct (bundled)"].problem is None
    for name in ("acme/Tiny-GGUF/tiny-Q8_0.gguf", "lmstudio-community/Tiny-GGUF/Tiny-Q8_0.gguf",
                 "tiny:latest", "someone/tiny:q8", "mine.gguf"):
        assert found[name].problem is None, name
    assert found["cut.gguf"].problem.startswith("truncated")
    assert find_model("TINY:LATEST", entries) is found["tiny:latest"]


def test_hf_home_and_hub_cache_are_honoured(home, tmp_path, monkeypatch):
    hf_tree(tmp_path / "hf-home" / "hub", repo="org/FromHome")
    hf_tree(tmp_path / "direct", repo="org/FromHubCache")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    assert "org/FromHome/tiny-Q8_0.gguf" in by_name(discover_models(include_bundled=False))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "direct"))
    names = by_name(discover_models(include_bundled=False))
    assert "org/FromHubCache/tiny-Q8_0.gguf" in names and "org/FromHome/tiny-Q8_0.gguf" not in names


def test_models_command_table_names_them_and_exits_0(every_tree, capsys):
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].split()[:4] == ["NAME", "SOURCE", "ARCH", "QUANT"]
    row = next(line for line in lines if line.startswith("tiny:latest "))
    assert "ollama" in row and "Q8_0" in row and row.rstrip().endswith("ok")
    row = next(line for line in lines if line.startswith("acme/Tiny-GGUF/tiny-Q8_0.gguf "))
    assert "hugging face" in row and "chat" in row
    row = next(line for line in lines if line.startswith("acme/Tiny-GGUF/tiny-Q4_K_M.gguf "))
    assert "broken: not a GGUF file" in row
    assert "lmstudio-community/Tiny-GGUF/Tiny-Q6_K.gguf.part" in out
    assert "SmolLM2-135M-Instruct (bundled)" in out
    assert "usable" in lines[-1] and "broken" in lines[-1]


def test_models_command_json(every_tree, capsys):
    assert main(["models", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    found = {r["name"]: r for r in rows}
    assert found["someone/tiny:q8"]["source"] == "ollama" and found["someone/tiny:q8"]["broken"] is False
    assert found["junk:latest"]["broken"] is True and found["junk:latest"]["problem"] == "not a GGUF file"
    assert found["acme/Tiny-GGUF/tiny-Q8_0.gguf"]["revision"] == "0123abcd"


def test_models_command_reads_config_folders(home, tmp_path, capsys):
    write_gguf(tmp_path / "cfg-models" / "from-config.gguf")
    (home / "no-config.toml").write_text(f'model_folders = ["{tmp_path / "cfg-models"}"]\n')
    assert main(["models"]) == 0
    assert "from-config.gguf" in capsys.readouterr().out


def test_models_command_with_a_bad_config_is_one_line_exit_2(home, capsys):
    (home / "no-config.toml").write_text("model_folders = \"not a list\"\n")
    assert main(["models"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "model_folders" in err[0]


def test_models_command_notes_a_named_folder_it_cannot_search(home, tmp_path, monkeypatch, capsys):
    write_gguf(tmp_path / "good" / "found.gguf")
    a_file = tmp_path / "models.txt"
    a_file.write_text("not a folder")
    monkeypatch.setenv("ADASPARK_MODELS", os.pathsep.join([str(tmp_path / "good"), str(tmp_path / "gone"),
                                                           str(a_file)]))
    assert main(["models"]) == 0  # the list still comes, with what was found
    out, err = capsys.readouterr()
    assert "found.gguf" in out
    notes = err.strip().splitlines()
    assert notes == [f"adaspark: note: model folder {tmp_path / 'gone'}: no such folder; not searched",
                     f"adaspark: note: model folder {a_file}: not a folder; not searched"]


def test_models_command_with_a_store_that_is_not_one_is_one_line_exit_2(home, tmp_path, capsys):
    bad = tmp_path / "notes.db"
    bad.write_text("my notes, not a database\n")
    assert main(["models", "--store", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(bad) in err[0] and "not an AdaSpark store" in err[0]
    assert bad.read_text() == "my notes, not a database\n"  # left untouched


def test_run_and_bench_take_a_name_adaspark_models_lists(home, tmp_path, capsys):
    from adaspark_app.config import resolve_model_arg

    ollama_tree(home / ".ollama" / "models")
    assert resolve_model_arg("tiny:latest") == str(by_name(discover_models())["tiny:latest"].path)
    assert resolve_model_arg(str(tmp_path)) == str(tmp_path)  # a path is taken as it is
    script = tmp_path / "s.jsonl"
    script.write_text(json.dumps({"id": "a", "turns": ["Hi"]}) + "\n")
    # a listed name that is broken: the name was looked up (a path would say "not found")
    for argv in (["run", str(script), "--model", "junk:latest"],
                 ["bench", str(script), "--arms", "ar", "--model", "junk:latest", "--report", str(tmp_path / "r")]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "junk:latest cannot be used: not a GGUF file" in err[0], err
    assert main(["run", str(script), "--model", "no-such:model"]) == 2
    assert "nor is it a name `adaspark models` lists" in capsys.readouterr().err
