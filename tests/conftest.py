"""Shared fixtures: the real bundled model, public prompts, an isolated store path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import adaspark_app  # noqa: F401 - first, so the Q4_1 kernels are in use before any test imports llama_cpp

DATA = Path(__file__).parent / "data"


@pytest.fixture(autouse=True)
def _isolated_store(tmp_path, monkeypatch):
    """Every test gets its own store file through ADASPARK_STORE: nothing touches the user's."""
    monkeypatch.setenv("ADASPARK_STORE", str(tmp_path / "adaspark-test.db"))


@pytest.fixture(scope="session")
def model_path() -> str:
    from adaspark_app.engine.backend import default_model_path

    return default_model_path()


@pytest.fixture(scope="session")
def public_prompts() -> list[dict]:
    """MT-Bench questions (first two per category), see tests/data/README.md."""
    return [json.loads(line) for line in (DATA / "mtbench_sample.jsonl").read_text().splitlines()]
