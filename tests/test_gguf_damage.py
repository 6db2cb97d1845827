"""A damaged model file is an error of one line, never a crash: the bundled model with a few bytes
of its header changed at random (a fixed seed), through `adaspark run`.

The mutations land where llama.cpp reads structure: the header and the first metadata (counts,
types, the architecture's numbers), the special-token ids and chat template, and the tensor
table. Each copy either runs or stops with one line and exit 2: no traceback, no llama.cpp
assertion. A broad sample, not the findings themselves: the damage a wider run of the same kind
found (a vocabulary token twice, which llama.cpp aborted on; a tensor name read on into the table,
quoted whole in the error) has tests of its own in test_gguf_file.py and test_cli_errors.py."""

from __future__ import annotations

import os
import random
import struct
import subprocess
import sys

import pytest

from adaspark_app.engine.backend import default_model_path
from adaspark_app.gguf_file import read_gguf_header

pytestmark = pytest.mark.model

COPIES = 24


def _mutations(data_offset: int, table_start: int, seed: int = 11) -> list[list[tuple[int, bytes]]]:
    """COPIES sets of (offset, new bytes): bytes, u32 and u64 words in the three regions."""
    rng = random.Random(seed)
    out = []
    for _ in range(COPIES):
        edits = []
        for _ in range(rng.randint(1, 3)):
            region = rng.random()
            at = (rng.randrange(8, 6000) if region < 0.4 else
                  rng.randrange(table_start - 600, table_start) if region < 0.6 else
                  rng.randrange(table_start, data_offset - 8))
            kind = rng.choice(("byte", "u32", "u64"))
            if kind == "byte":
                new = bytes([rng.randrange(256)])
            elif kind == "u32":
                new = struct.pack("<I", rng.choice((0, 1, 2**31, 2**32 - 1, rng.randrange(2**32))))
            else:
                new = struct.pack("<Q", rng.choice((0, 2**63, 2**64 - 1, rng.randrange(2**64))))
            edits.append((at, new))
        out.append(edits)
    return out


def test_a_damaged_header_is_one_line_or_a_reply_never_a_crash(tmp_path):
    src = default_model_path()
    header = read_gguf_header(src, skip_arrays=True)
    first_tensor = next(iter(header.tensors))
    with open(src, "rb") as fh:
        head = fh.read(header.data_offset)
    table_start = head.index(struct.pack("<Q", len(first_tensor)) + first_tensor.encode())
    model = tmp_path / "damaged.gguf"
    with open(src, "rb") as fh, open(model, "wb") as out:
        while chunk := fh.read(1 << 24):
            out.write(chunk)
    script = tmp_path / "s.jsonl"
    script.write_text('{"id": "a", "turns": ["Hi"]}\n')
    env = {k: v for k, v in os.environ.items() if k != "ADASPARK_FORBID_MODEL"}
    outcomes = []
    for edits in _mutations(header.data_offset, table_start):
        with open(model, "r+b") as fh:
            for at, new in edits:
                fh.seek(at)
                fh.write(new)
        proc = subprocess.run([sys.executable, "-m", "adaspark_app.cli", "run", str(script), "--model", str(model),
                               "--fresh-store", "--max-tokens", "2", "--out", str(tmp_path / "o.jsonl")],
                              capture_output=True, text=True, timeout=120, env=env)
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        where = f"edits {[(at, new.hex()) for at, new in edits]}: rc {proc.returncode}, {proc.stderr[-300:]!r}"
        assert proc.returncode in (0, 2), where
        if proc.returncode == 2:
            assert len(lines) == 1 and lines[0].startswith("adaspark: error: ") and len(lines[0]) < 2000, where
        assert "Traceback" not in proc.stderr and "GGML_ASSERT" not in proc.stderr, where
        outcomes.append(proc.returncode)
        with open(model, "r+b") as fh:  # the copy back as it was, for the next edits
            for at, new in edits:
                fh.seek(at)
                fh.write(head[at:at + len(new)])
    assert outcomes.count(2) >= COPIES // 2, outcomes  # most damage is found, not read past
