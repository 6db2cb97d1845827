"""The config file: TOML defaults for chat and the model list; every bad file is one line naming
the key, exit 2; options on the command line win. No model is loaded (the TUI is replaced by a
recorder of what `adaspark chat` would start it with)."""

from __future__ import annotations

from pathlib import Path

import pytest

from adaspark_app import config as config_mod
from adaspark_app.cli import main
from adaspark_app.config import Config, config_path, load_config
from adaspark_app.errors import ConfigError

from model_trees import ollama_tree


@pytest.fixture
def cfg_file(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "config.toml"
    monkeypatch.setenv("ADASPARK_CONFIG", str(path))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "home" / ".ollama" / "models"))
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "ADASPARK_MODELS"):
        monkeypatch.delenv(var, raising=False)
    return path


@pytest.fixture
def started(monkeypatch) -> dict:
    """What `adaspark chat` would start the TUI with (run_chat replaced, nothing loads)."""
    seen: dict = {}

    def fake_run_chat(model, drafter, store_path, **kwargs):
        seen.update(model=model, **kwargs)
        return 0

    import adaspark_app.ui.app as app_mod

    monkeypatch.setattr(app_mod, "run_chat", fake_run_chat)
    return seen


def test_path_env_and_platformdirs_default(monkeypatch, tmp_path):
    monkeypatch.setenv("ADASPARK_CONFIG", str(tmp_path / "c.toml"))
    assert config_path() == tmp_path / "c.toml"
    monkeypatch.delenv("ADASPARK_CONFIG")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert config_path() == tmp_path / "xdg" / "adaspark" / "config.toml"


def test_missing_file_is_no_defaults(cfg_file):
    assert load_config() == Config()


def test_every_key_read(cfg_file, tmp_path):
    cfg_file.write_text(
        'model = "tiny:latest"\nsystem = "Be terse."\nmax_tokens = 64\ntheme = "nord"\n'
        'model_folders = ["~/models", "/srv/gguf"]\n'
        "[sampling]\ntemperature = 0.7\ntop_k = 20\ntop_p = 0.9\nmin_p = 0.1\nrepeat_penalty = 1.1\n"
        "repeat_last_n = 32\nseed = 7\n")
    cfg = load_config()
    assert (cfg.model, cfg.system, cfg.max_tokens, cfg.theme) == ("tiny:latest", "Be terse.", 64, "nord")
    assert cfg.folders() == [Path.home() / "models", Path("/srv/gguf")]
    assert cfg.sampling == {"temperature": 0.7, "top_k": 20, "top_p": 0.9, "min_p": 0.1,
                            "repeat_penalty": 1.1, "repeat_last_n": 32, "seed": 7}
    assert cfg.chat_defaults() == {**cfg.sampling, "system": "Be terse.", "max_tokens": 64}


@pytest.mark.parametrize("text, key", [
    ("max_tokens = \"lots\"\n", "'max_tokens'"),
    ("max_tokens = 0\n", "'max_tokens'"),
    ("colour = \"red\"\n", "'colour'"),
    ("system = 3\n", "'system'"),
    ("model_folders = \"~/models\"\n", "'model_folders'"),
    ("model_folders = [\"\"]\n", "'model_folders[0]'"),
    ("theme = \"no-such-theme\"\n", "'theme'"),
    ("[sampling]\ntemperature = true\n", "'sampling.temperature'"),
    ("[sampling]\ntop_p = 1.5\n", "'sampling.top_p'"),
    ("[sampling]\ntop_k = -1\n", "'sampling.top_k'"),
    ("[sampling]\nwarmth = 1\n", "'sampling.warmth'"),
    ("sampling = 3\n", "'sampling'"),
    ("read_ahead = 0\n", "'read_ahead'"),
    ("read_ahead = \"no\"\n", "'read_ahead'"),
])
def test_bad_values_name_the_key(cfg_file, text, key):
    cfg_file.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config()
    assert key in str(err.value) and str(cfg_file) in str(err.value) and "\n" not in str(err.value)


def test_bad_toml_names_the_line(cfg_file):
    cfg_file.write_text("max_tokens = 64\nsystem = \"unclosed\n")
    with pytest.raises(ConfigError, match=r"not valid TOML .*line 2"):
        load_config()


def test_not_utf8_and_a_directory(cfg_file):
    cfg_file.write_bytes(b"system = \"\xff\xfe\"\n")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_config()
    cfg_file.unlink()
    cfg_file.mkdir()
    with pytest.raises(ConfigError, match="not a regular file"):
        load_config()


def test_a_fifo_a_device_or_a_huge_file_as_config_is_one_error_not_a_hang(tmp_path, monkeypatch):
    """A config path that is a FIFO blocked every command on its read, one linked to /dev/zero
    filled the memory; each is refused before it is read, as is a file far larger than settings."""
    import os
    import threading

    fifo, zeros, huge = tmp_path / "fifo.toml", tmp_path / "zeros.toml", tmp_path / "huge.toml"
    os.mkfifo(fifo)
    zeros.symlink_to("/dev/zero")
    huge.write_bytes(b"# " + b"x" * config_mod.CONFIG_MAX_BYTES + b"\n")
    errors: dict = {}

    def load_each() -> None:
        for path in (fifo, zeros, huge):
            monkeypatch.setenv("ADASPARK_CONFIG", str(path))
            try:
                load_config()
            except ConfigError as err:
                errors[path.name] = str(err)

    t = threading.Thread(target=load_each, daemon=True)  # a hang fails the test instead of stopping it
    t.start()
    t.join(30)
    assert not t.is_alive(), "reading the config did not return"
    assert errors["fifo.toml"].endswith("fifo.toml: not a regular file")
    assert errors["zeros.toml"].endswith("zeros.toml: not a regular file")
    assert f"over {config_mod.CONFIG_MAX_BYTES} bytes" in errors["huge.toml"]


@pytest.mark.parametrize("command", [["chat"], ["models"]])
def test_cli_bad_config_one_line_exit_2(cfg_file, command, capsys):
    cfg_file.write_text("[sampling]\nmin_p = 3\n")
    assert main(command) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "sampling.min_p" in err[0] and "Traceback" not in err[0]


def test_chat_takes_its_defaults_from_the_config(cfg_file, started):
    cfg_file.write_text('system = "Answer in French."\nmax_tokens = 48\n[sampling]\ntemperature = 0.3\nseed = 11\n')
    assert main(["chat"]) == 0
    assert started["system"] == "Answer in French." and started["max_tokens"] == 48
    assert started["sampling"].temperature == 0.3 and started["sampling"].seed == 11


def test_chat_reads_ahead_unless_the_config_says_not(cfg_file, started):
    assert main(["chat"]) == 0 and started["read_ahead"] is True
    cfg_file.write_text("read_ahead = false\n")
    assert load_config().read_ahead is False
    assert main(["chat"]) == 0 and started["read_ahead"] is False


def test_chat_options_win_over_the_config(cfg_file, started):
    cfg_file.write_text('system = "Answer in French."\nmax_tokens = 48\n[sampling]\ntemperature = 0.3\n')
    assert main(["chat", "--system", "Answer in German.", "--max-tokens", "20", "--temperature", "0"]) == 0
    assert started["system"] == "Answer in German." and started["max_tokens"] == 20
    assert started["sampling"].temperature == 0.0


def test_chat_model_by_a_discovered_name(cfg_file, tmp_path, started):
    files = ollama_tree(tmp_path / "home" / ".ollama" / "models")
    cfg_file.write_text('model = "tiny:latest"\n')
    assert main(["chat"]) == 0
    assert started["model"] == str(files["good"])


def test_chat_model_name_not_found_is_one_line(cfg_file, capsys, started):
    cfg_file.write_text('model = "nothing:here"\n')
    assert main(["chat"]) == 2
    err = capsys.readouterr().err.strip()
    assert "nothing:here" in err and "not found" in err and not started


def test_resolve_model_refuses_a_broken_entry(cfg_file, tmp_path):
    ollama_tree(tmp_path / "home" / ".ollama" / "models")
    with pytest.raises(Exception, match="cannot be used: not a GGUF file"):
        config_mod.resolve_model("junk:latest")


def test_chat_model_option_takes_a_discovered_name_and_wins_over_the_config(cfg_file, tmp_path, started):
    files = ollama_tree(tmp_path / "home" / ".ollama" / "models")
    cfg_file.write_text('model = "tiny:latest"\n')
    assert main(["chat", "--model", "someone/tiny:q8"]) == 0
    assert started["model"] == str(files["user"])
