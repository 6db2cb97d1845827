#!/usr/bin/env bash
# One device call on an NVIDIA GPU: llama-cpp-python built with CUDA and AdaSpark's batch-invariant
# kernels (adaspark_app/native/cuda_exact.patch, switched by ADASPARK_CUDA_EXACT), AdaSpark's engine
# on the GPU with the stock kernels and the exact ones, and each Qwen2.5 shape's verify-cost curve
# and row identity across batch sizes in both.
#
# Here, once per session (both folders are ignored; .git/info/exclude lists them):
#   mkdir -p .gpu && cp ../shared/gpu/* .gpu/     # trimmed llama-cpp-python sdist, shape headers, probe.py
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_17_x86_64 -d .whl diskcache==5.6.3 sqlite-utils==4.2.1 sqlite-fts4==1.0.3 \
#     click-default-group==1.2.4 platformdirs==4.14.9 gguf==0.19.0
#   (what llama_cpp and AdaSpark's engine import that the image lacks; their other needs are on it)
# benchmarks/gpu/compile_check.sh checks here, without a GPU, that the patched source compiles and links.
# Then one call:  run(command="bash benchmarks/gpu/run.sh", carry=[".gpu", ".whl"], timeout_s=600)
# MODES (default "stock exact"): the kernel modes, each ADASPARK_CUDA_EXACT value: stock 0, exact 1, and
# narrow 2 (exact with the stock kernel's launches of at most 4 columns only, to tell them apart).
# Here on a CPU (no build, small probe):  STAGE=measure MODELS=q05 CONTEXTS=512 WIDTHS=1,2,4 bash benchmarks/gpu/run.sh
# and with IMAGE_LIKE=1, this Python lacks what the image lacks, but for the wheels (benchmarks/gpu/image/)
# Time: the CUDA build took 235-289 s for the llama target alone on 16 cores; the rest shares
# what is left of DEADLINE (570 s): placement, the engine checks (ENGINE_LIMIT conversations), the probes.
#
# $OUT gets 7 files (a call brings back 8 at most): gpu.txt (the GPU, the build), placement.txt
# (llama.cpp's own log of the load: offloaded layers, KV buffers, graph splits), engine.md and
# engine_stock.json / engine_exact.json (benchmarks/gpu/engine_check.py on a random-weight
# Qwen2.5-0.5B shape, ADASPARK_CUDA_EXACT=0 and 1), probes.json ({shape: {stock, exact}}: .gpu/probe.py
# per shape, q7, q15, q05) and probe.log (their logs). Then here:
#   python -m benchmarks.cost.curve_learn PROBE.json   # the learned prices beside a measured curve
set -u
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
REPO=$(pwd); W=${GPU_WORK:-/tmp/gpuwork}; SITE=$W/site; mkdir -p "$W" "$SITE"
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
# every stage ends by DEADLINE seconds after the start (the device allows 600 s per call), keeping
# a reserve for what follows (cap SECONDS RESERVE); a stage cut short keeps what it wrote
DEADLINE=${DEADLINE:-570}
left() { local l=$(( DEADLINE - ($(date +%s) - t0) - ${1:-0} )); [ $l -lt 5 ] && l=5; echo $l; }
cap() { local l; l=$(left "$2"); [ "$l" -gt "$1" ] && l=$1; echo "$l"; }  # at most $1 s, keeping $2 s
nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv >"$OUT/gpu.txt" 2>&1
python3 -V >>"$OUT/gpu.txt" 2>&1

python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" .whl/*.whl || exit 1
export SITE
# the trimmed source with AdaSpark's CUDA patch (checked on a CPU run too: it must apply to what the GPU builds)
rm -rf "$W/src"; mkdir -p "$W/src"; tar -xJf .gpu/llama-cpp-python-0.3.36-src.tar.xz -C "$W/src" || exit 1
PYTHONPATH=$REPO python3 -m adaspark_app.native.cuda_exact "$W/src" | tee -a "$OUT/gpu.txt" || exit 1
gpu_lib_ok() {  # llama_cpp from $SITE offloads, and its libggml-cuda carries the patch
  PYTHONPATH=$SITE:$REPO python3 -c "
import llama_cpp, sys
from adaspark_app.native.cuda_exact import library_rows
ok = bool(llama_cpp.llama_supports_gpu_offload()) and library_rows() is not None
print('llama_supports_gpu_offload and the patch:', ok); sys.exit(0 if ok else 1)" >>"$OUT/gpu.txt" 2>&1
}
if [ "${STAGE:-all}" != measure ]; then
  # the README's CUDA install, for this GPU's architecture alone (sm_90: H100/H200), on the patched source
  CMAKE_ARGS="-DGGML_CUDA=on -DLLAVA_BUILD=OFF -DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCH:-90}" \
  CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) python3 -m pip install --no-build-isolation --no-deps --no-compile \
    --target "$SITE" "$W/src" >"$W/build.log" 2>&1 || { tail -n 40 "$W/build.log"; exit 1; }
  tail -n 5 "$W/build.log" >>"$OUT/gpu.txt"
  gpu_lib_ok
  stamp "CUDA build of llama-cpp-python done"
  export PYTHONPATH=$SITE:$REPO
else  # the llama_cpp installed here; the carried wheels after this Python's own packages
  export PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH}
  [ -n "${IMAGE_LIKE:-}" ] && export IMAGE_LIKE PYTHONPATH=$REPO/benchmarks/gpu/image:$PYTHONPATH ADASPARK_STOCK_KERNELS=1
fi
python3 -c "import llama_cpp; print('llama_supports_gpu_offload:', bool(llama_cpp.llama_supports_gpu_offload()))" \
  | tee -a "$OUT/gpu.txt"

# random-weight GGUFs of the real shapes (cost depends on shapes and types, not values)
tar -xJf .gpu/qwen2.5-shapes-headers.tar.xz -C "$W" || exit 1
python3 - "$W" <<'PY' || exit 1
import sys
sys.path.insert(0, ".gpu")
from probe import build
build(f"{sys.argv[1]}/q05", f"{sys.argv[1]}/q05.gguf")
PY
stamp "q05 written"

# where llama.cpp placed the engine's model: its own log of the load, and of each graph's splits
# (GGML_SCHED_DEBUG=1: one "## SPLIT" line per backend run; one CUDA0 split per graph = no op on the CPU)
GGML_SCHED_DEBUG=1 ADASPARK_LLAMA_LOG=1 ADASPARK_CUDA_EXACT=1 timeout $(cap 60 150) python3 - "$W/q05.gguf" >"$W/placement.log" 2>&1 <<'PY'
import sys
from adaspark_app.engine.backend import LlamaBackend
b = LlamaBackend(sys.argv[1], n_ctx=4096, gpu_layers="all")
toks = b.tokenize("one two three four five six seven eight nine ten " * 4)
b.prefill(toks, 0)
out = b.verify(toks[:16], list(range(len(toks), len(toks) + 16)), [(0,)] * 16)
print("placement:", b.offload.describe(), "kv types", b.kv_types, "16-row verify ms", round(out.seconds * 1e3, 3))
b.close()
PY
grep -E "placement:|offload|KV buffer|splits =|flash_attn|CUDA0|model buffer|compute buffer|no FlashAttention|SPLIT|error" \
  "$W/placement.log" | head -n 80 >"$OUT/placement.txt"
cat "$OUT/placement.txt"; stamp "placement read"

# the engine with the stock kernels, then the batch-invariant ones (one process each: the switch is read once)
: >"$OUT/engine.md"
switch() { case $1 in stock) echo 0;; exact) echo 1;; narrow) echo 2;; esac; }  # ADASPARK_CUDA_EXACT's values
set -- ${MODES:-stock exact}; modes="$*"
for mode in $modes; do
  x=$(switch $mode)
  ADASPARK_CUDA_EXACT=$x timeout $(cap 100 150) python3 -m benchmarks.gpu.engine_check --model "$W/q05.gguf" \
    --script benchmarks/corpora/longpaste.jsonl --limit ${ENGINE_LIMIT:-4} --max-tokens 64 \
    --out-json "$OUT/engine_$mode.json" --out "$W/engine_$mode.md" 2>&1 | tail -n 30
  { echo "## ADASPARK_CUDA_EXACT=$x"; cat "$W/engine_$mode.md" 2>/dev/null; echo; } >>"$OUT/engine.md"
  stamp "engine check ($mode kernels) done"
done

merge_probes() {  # every probe JSON written so far, as {shape: {mode: probe}}
  python3 - "$W" "$OUT/probes.json" <<'PY'
import glob, json, os, sys
out = {}
for f in sorted(glob.glob(os.path.join(sys.argv[1], "probe_*_*.json"))):
    shape, mode = os.path.basename(f)[len("probe_"):-len(".json")].rsplit("_", 1)
    try:
        out.setdefault(shape, {})[mode] = json.load(open(f))
    except ValueError:
        pass
json.dump(out, open(sys.argv[2], "w"), indent=1)
PY
}
set -- ${MODELS:-q7 q15 q05}
while [ $# -gt 0 ]; do
  m=$1; shift
  [ -f "$W/$m.gguf" ] || python3 -c "import sys; sys.path.insert(0, '.gpu'); from probe import build; build('$W/$m', '$W/$m.gguf')"
  k=0; nm=$(echo $modes | wc -w)
  for mode in $modes; do
    x=$(switch $mode); k=$(( k + 1 ))
    # the shapes and modes left share what time is left (the 7B first: the GPU users' size)
    runs=$(( nm * $# + nm - k + 1 ))  # this run and those after it
    ADASPARK_CUDA_EXACT=$x timeout $(( $(left) / runs )) \
      python3 .gpu/probe.py --model "$W/$m.gguf" \
      --contexts ${CONTEXTS:-512,2048,8192} ${WIDTHS:+--widths $WIDTHS} ${WIDTHS:+--ident ${WIDTHS#1,}} \
      --out "$W/probe_${m}_$mode.json" >"$W/${m}_$mode.log" 2>&1
    echo "$m $mode rc=$?"; { echo "== $m ADASPARK_CUDA_EXACT=$x"; cat "$W/${m}_$mode.log"; } >>"$OUT/probe.log"
    grep -E "^C=|Error|Traceback|fault" "$W/${m}_$mode.log" | tail -n 8 | cut -c1-300
    merge_probes
    stamp "$m probed ($mode kernels)"
  done
  [ "$m" = q05 ] || rm -f "$W/$m.gguf"
done
