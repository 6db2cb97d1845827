#!/usr/bin/env bash
# Here, before spending device time: the device calls that `python -m benchmarks.gpu.stage pack` wrote
# into .stage/manifest.json, run one after another on this machine as the device runs them: each in a
# fresh copy of the checkout (tracked files and untracked ones git does not ignore) holding only what
# the call carries, with one stage folder and one $OUT per call. The last call runs benchmarks/gpu/run.sh
# with STAGE=measure (no CUDA build here) and whatever else the environment sets, e.g.
#
#   python -m benchmarks.gpu.stage pack --wheel "$(python3 -c 'import llama_cpp, os; print(os.path.dirname(llama_cpp.__file__))')" \
#     --server /tmp/adaspark-server/bin/llama-server      # this machine's CPU llama_cpp in place of the CUDA wheel
#   IMAGE_LIKE=1 MODELS=q05 CONTEXTS=512 WIDTHS=1,2,4 ENGINE_LIMIT=2 REAL_LIMIT=2 REAL_TOKENS=32 \
#     SETS=sharegpt-paste-16-e bash benchmarks/gpu/rehearse.sh
#
# Each call's output goes to $R/callN.log, its $OUT to $R/outN (R: REHEARSE_DIR, default /tmp/adaspark-rehearse).
set -u
REPO=$(pwd); R=${REHEARSE_DIR:-/tmp/adaspark-rehearse}
[ -f .stage/manifest.json ] || { echo "no .stage/manifest.json: run python -m benchmarks.gpu.stage pack first"; exit 2; }
rm -rf "$R"; mkdir -p "$R"
n=$(python3 -c "import json; print(len(json.load(open('.stage/manifest.json'))['calls']))")
for i in $(seq 1 "$n"); do
  d=$R/call$i; mkdir -p "$d" "$R/out$i"
  git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' f; do
    [ -e "$f" ] && mkdir -p "$d/$(dirname "$f")" && cp -a "$f" "$d/$f"
  done
  python3 -c "import json, sys; c = json.load(open('.stage/manifest.json'))['calls'][$i - 1]; print('\n'.join(c['carry'])); print(c['command'], file=sys.stderr)" \
    2>"$R/cmd$i" | while IFS= read -r c; do mkdir -p "$d/$(dirname "$c")"; cp -a "$REPO/$c" "$d/$c"; done
  cmd=$(cat "$R/cmd$i")
  echo "call $i of $n: $cmd"
  (cd "$d" && OUT=$R/out$i ADASPARK_STAGE_DIR=$R/stage GPU_WORK=$R/work STAGE=measure bash -c "$cmd") >"$R/call$i.log" 2>&1
  echo "  rc $? ($(tail -n 1 "$R/call$i.log" | cut -c1-150))"
  rm -rf "$d"
done
