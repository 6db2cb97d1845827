"""Shared fixtures: the real bundled model, public prompts, an isolated store path; and the
guard that keeps tests not marked `model` from loading one."""

from __future__ import annotations

import collections
import json
import os
from pathlib import Path

import pytest

from adaspark_app import native

# Before any test imports llama_cpp: the suite runs on the Q4_1 kernels a normal install runs on
# (child processes inherit LLAMA_CPP_LIB_PATH).
native.activate()

# Textual's Pilot settles the app after each key press and pause by sleeping in steps of
# SLEEP_GRANULARITY (20 ms) until a step used next to no CPU (under a twentieth of it): at least one
# step, usually two, per key. On a worker's one core those sleeps were a fifth of the chat tests'
# wall time, idle. Steps of 5 ms settle the same way (the same rule, a finer clock) and the tests
# wait for what they check with `ui_fakes.wait_until` anyway: test_ui_chat and test_ui_conversation
# ran in 0.85x the time on one core. The app itself never calls wait_for_idle.
import textual._wait as _textual_wait  # noqa: E402

_textual_wait.SLEEP_GRANULARITY = 0.005
_textual_wait.SLEEP_IDLE = _textual_wait.SLEEP_GRANULARITY / 20.0

DATA = Path(__file__).parent / "data"


def _compile_bytecode() -> None:
    """With PYTHONDONTWRITEBYTECODE set (this machine sets it), no process caches the checkout's
    bytecode, and the suite starts some 200 Python processes (engine processes, the CLI), each of
    which then compiles the package from source: the subprocess-heavy tests took 1.1-1.5x longer in
    a fresh clone. So the controller compiles `adaspark_app`, `benchmarks` and the tests' helpers
    once (~0.6 s), into the usual `__pycache__` folders (gitignored), as Python would itself."""
    import compileall
    import sys

    if not sys.dont_write_bytecode or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    root = Path(__file__).resolve().parent.parent
    for folder in ("adaspark_app", "benchmarks", "tests"):
        compileall.compile_dir(root / folder, quiet=2)


def pytest_configure(config):
    """Under pytest-xdist (the `-n` in pyproject.toml), each worker runs on its own share of the
    cores, and so does everything it starts (engine processes, `adaspark run`): the engine's
    default thread count follows the affinity (limits.default_threads), so two workers' llama.cpp
    threads never wait on each other's spinning threads."""
    _compile_bytecode()
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if not worker.startswith("gw") or count < 2 or not hasattr(os, "sched_setaffinity"):
        return
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) >= count:
        os.sched_setaffinity(0, cores[int(worker[2:]) % count::count])
FORBID_MODEL = "ADASPARK_FORBID_MODEL"  # LlamaBackend refuses to load while it is set


def pytest_collection_modifyitems(config, items):
    """The order files run in under xdist (`--no-loadscope-reorder` keeps it): files marked `long`
    first, then the other files that load the model, then the rest, each group in falling order of
    test count; a file's tests stay together and in order. The long files start at once and the
    short ones fill in at the end, so no worker idles while another finishes a long file."""
    def has(marker: str) -> set:
        return {item.path for item in items if item.get_closest_marker(marker) is not None}

    long, loads = has("long"), has("model")
    count = collections.Counter(item.path for item in items)
    items.sort(key=lambda item: (item.path not in long, item.path not in loads, -count[item.path], str(item.path)))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """A test not marked `model` may not load one, in this process or in a child: LlamaBackend
    raises while ADASPARK_FORBID_MODEL is set. It is set around the whole protocol (setup, call,
    teardown), so a module-scoped fixture that loads the model under an unmarked test fails too,
    and `pytest -m "not model"` provably loads no model."""
    before = os.environ.get(FORBID_MODEL)
    if item.get_closest_marker("model") is None:
        os.environ[FORBID_MODEL] = "1"
    else:
        os.environ.pop(FORBID_MODEL, None)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(FORBID_MODEL, None)
        else:
            os.environ[FORBID_MODEL] = before


@pytest.fixture(autouse=True)
def _isolated_store(tmp_path, monkeypatch):
    """Every test gets its own store file through ADASPARK_STORE: nothing touches the user's."""
    monkeypatch.setenv("ADASPARK_STORE", str(tmp_path / "adaspark-test.db"))
    # nor the user's config file (adaspark_app/config.py): none, unless a test writes this one
    monkeypatch.setenv("ADASPARK_CONFIG", str(tmp_path / "adaspark-test-config.toml"))


@pytest.fixture
def chat_store(tmp_path):
    """A real store file of the test's own, open for the test (the chat's conversations)."""
    from adaspark_app.store import Store

    store = Store.open(tmp_path / "chat.db")
    yield store
    store.close()


@pytest.fixture(scope="session")
def model_path() -> str:
    from adaspark_app.engine.backend import default_model_path

    return default_model_path()


@pytest.fixture(scope="session")
def public_prompts() -> list[dict]:
    """MT-Bench questions (first two per category), see tests/data/README.md."""
    return [json.loads(line) for line in (DATA / "mtbench_sample.jsonl").read_text().splitlines()]
