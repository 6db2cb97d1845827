"""Model folder trees as the Hugging Face cache, LM Studio and Ollama lay them out, with real GGUF
headers written by gguf-py's GGUFWriter, and the broken files people really have: a file that is
not a GGUF, a download cut short. Used by tests/test_models_*.py and the picker's UI test."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import gguf
import numpy as np

CHAT_TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
GEMMA_TOKENS = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>", "a", "b"]


def write_gguf(path: Path, arch: str = "llama", *, template: str | None = CHAT_TEMPLATE,
               tokens: list[str] | None = None, file_type: int = 7, name: str = "tiny",
               layers: int | None = None) -> Path:
    """A small GGUF (two F32 tensors, ~1 KB of data) with the metadata discovery reads
    (`layers`: an `{arch}.block_count`, none by default)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(name)
    if layers is not None:
        w.add_block_count(layers)
    w.add_context_length(128)
    w.add_file_type(file_type)  # 7: MOSTLY_Q8_0
    if template is not None:
        w.add_chat_template(template)
    w.add_token_list(tokens or ["<s>", "</s>", "a", "b"])
    rng = np.random.default_rng(len(str(path)))
    w.add_tensor("token_embd.weight", rng.standard_normal((16, 8)).astype(np.float32))
    w.add_tensor("output_norm.weight", rng.standard_normal(8).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def truncate(path: Path, keep: int = 64) -> Path:
    """Cut a file's last `keep` bytes off (a download that stopped)."""
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - keep])
    return path


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def hf_tree(cache: Path, repo: str = "acme/Tiny-GGUF", revision: str = "0123abcd") -> dict[str, Path]:
    """models--org--name/{blobs,snapshots/<rev>,refs/main}: a good file, one that is not a GGUF,
    a truncated one (all snapshot symlinks into blobs/), and an .incomplete blob."""
    repo_dir = cache / f"models--{repo.replace('/', '--')}"
    blobs, snap = repo_dir / "blobs", repo_dir / "snapshots" / revision
    blobs.mkdir(parents=True)
    snap.mkdir(parents=True)
    (repo_dir / "refs").mkdir()
    (repo_dir / "refs" / "main").write_text(revision)
    out = {}

    def blob_link(filename: str, blob: Path) -> Path:
        final = blobs / sha256(blob)
        blob.rename(final)
        link = snap / filename
        link.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(final, link.parent), link)
        return link

    out["good"] = blob_link("tiny-Q8_0.gguf", write_gguf(blobs / "tmp-good"))
    bad = blobs / "tmp-bad"
    bad.write_bytes(b"<!DOCTYPE html><html>rate limited</html>" * 4)
    out["corrupt"] = blob_link("tiny-Q4_K_M.gguf", bad)
    out["truncated"] = blob_link("tiny-F16.gguf", truncate(write_gguf(blobs / "tmp-trunc", file_type=1)))
    part = truncate(write_gguf(blobs / "tmp-part"), keep=200)
    out["partial"] = part.rename(blobs / (sha256(part) + ".incomplete"))
    (snap / "README.md").write_text("not a model")
    return out


def lmstudio_tree(models: Path) -> dict[str, Path]:
    """publisher/repo/file.gguf: a good file, one that is not a GGUF, a partial download."""
    d = models / "lmstudio-community" / "Tiny-GGUF"
    out = {"good": write_gguf(d / "Tiny-Q8_0.gguf")}
    out["corrupt"] = d / "Tiny-Q4_0.gguf"
    out["corrupt"].write_bytes(b"\x00" * 512)
    out["partial"] = truncate(write_gguf(d / "Tiny-Q6_K.gguf.part"), keep=100)
    return out


def ollama_manifest(models: Path, blob: Path, host: str, namespace: str, name: str, tag: str,
                    size: int | None = None) -> Path:
    """A manifest naming `blob` as its model layer (the blob is renamed to sha256-<hex>)."""
    digest = sha256(blob)
    final = models / "blobs" / f"sha256-{digest}"
    final.parent.mkdir(parents=True, exist_ok=True)
    if blob != final:
        blob.rename(final)
    manifest = models / "manifests" / host / namespace / name / tag
    manifest.parent.mkdir(parents=True, exist_ok=True)
    manifest.write_text(json.dumps({
        "schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {"mediaType": "application/vnd.docker.container.image.v1+json",
                   "digest": "sha256:" + "0" * 64, "size": 2},
        "layers": [
            {"mediaType": "application/vnd.ollama.image.model", "digest": f"sha256:{digest}",
             "size": size if size is not None else final.stat().st_size},
            {"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:" + "1" * 64, "size": 10},
        ],
    }))
    return final


def ollama_tree(models: Path) -> dict[str, Path]:
    """manifests/registry.ollama.ai/<ns>/<name>/<tag> + blobs/sha256-<hex>: a library model, a
    user's model, a blob that is not a GGUF, a blob shorter than its manifest says, a -partial."""
    tmp = models / "blobs"
    tmp.mkdir(parents=True)
    out = {"good": ollama_manifest(models, write_gguf(tmp / "t1"), "registry.ollama.ai", "library", "tiny",
                                   "latest")}
    out["user"] = ollama_manifest(models, write_gguf(tmp / "t2", name="other"), "registry.ollama.ai", "someone",
                                  "tiny", "q8")
    junk = tmp / "t3"
    junk.write_bytes(b"PK\x03\x04" + b"\x00" * 300)
    out["corrupt"] = ollama_manifest(models, junk, "registry.ollama.ai", "library", "junk", "latest")
    short = write_gguf(tmp / "t4", name="short")
    full_size = short.stat().st_size
    out["short"] = ollama_manifest(models, short, "registry.ollama.ai", "library", "short", "latest",
                                   size=full_size + 4096)
    out["partial"] = tmp / ("sha256-" + "ab" * 32 + "-partial")
    out["partial"].write_bytes(b"GGUF" + b"\x00" * 100)
    (tmp / ("sha256-" + "ab" * 32 + "-partial-0")).write_text('{"Offset": 0}')
    return out
