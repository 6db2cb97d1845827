"""benchmarks/speed/run_peers.py on a GPU host: --gpu-layers reaches every peer (llama-server as -ngl),
llama-server keeps llama.cpp's stock CUDA kernels whatever AdaSpark's peers run, and a PEER+drafter
peer runs with the DSpark drafter. AdaSpark's peers are the real engine on the bundled model;
llama-server is not built in CI, so a stand-in records how it was started and answers /health."""

from __future__ import annotations

import json
import sys
from argparse import Namespace
from pathlib import Path

import pytest

from benchmarks.speed import run_peers

FAKE_SERVER = """#!{python}
import http.server, json, os, sys
port = int(sys.argv[sys.argv.index("--port") + 1])
json.dump({{"argv": sys.argv[1:], "exact": os.environ.get("ADASPARK_CUDA_EXACT")}}, open({record!r}, "w"))
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"{{}}")
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


def fake_server(tmp_path: Path) -> tuple[Path, Path]:
    record = tmp_path / "started.json"
    exe = tmp_path / "llama-server"
    exe.write_text(FAKE_SERVER.format(python=sys.executable, record=str(record)))
    exe.chmod(0o755)
    return exe, record


@pytest.mark.parametrize("gpu_layers, ngl", [("all", "999"), ("12", "12"), (None, None)])
def test_llama_server_gets_the_layers_and_the_stock_kernels(tmp_path, monkeypatch, gpu_layers, ngl):
    monkeypatch.setenv("ADASPARK_CUDA_EXACT", "1")  # AdaSpark's peers run the exact kernels
    exe, record = fake_server(tmp_path)
    peer = run_peers.ServerPeer("server-plain", str(exe), "model.gguf", 2, 4096, tmp_path, gpu_layers=gpu_layers)
    try:
        started = json.loads(record.read_text())
    finally:
        peer.close()
    assert started["exact"] == "0"
    argv = started["argv"]
    assert (argv[argv.index("-ngl") + 1] if "-ngl" in argv else None) == ngl
    assert (tmp_path / "server-plain.log").exists()  # its log stays beside the run's report


def test_a_bad_gpu_layers_value_is_one_line_and_exit_2(capsys):
    with pytest.raises(SystemExit) as e:
        run_peers.main(["benchmarks/sets/sharegpt-chat-12-j.jsonl.gz", "--gpu-layers", "most"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--gpu-layers must be a number of layers" in err and "Traceback" not in err


@pytest.mark.model
def test_the_drafter_suffix_and_the_layers_reach_adasparks_engine(model_path, tmp_path):
    args = Namespace(model=model_path, drafter=None, threads=2, n_ctx=2048, gpu_layers="0", out=str(tmp_path))
    with_drafter = run_peers.make_peer("adaspark+drafter", args, tmp_path)
    plain = run_peers.make_peer("adaspark:pinned:4", args, tmp_path)
    try:
        assert with_drafter.engine.drafter_name is not None  # the shipped drafter, as --drafter default
        assert plain.engine.drafter_name is None
        assert str(plain.engine.arm) == "pinned:4"
        for p in (with_drafter, plain):
            assert not p.engine.backend.offload.on_gpu  # --gpu-layers 0: the CPU
    finally:
        with_drafter.close()
        plain.close()
