#!/usr/bin/env bash
# Issue 18's benchmark: lossless sampling, `adaspark` against `ar` at temperature 0.7 and 1.0
# (top-p 0.95, the other settings llama.cpp's defaults, seed fixed), on MT-Bench (both turns)
# and the long pastes, then llama-server plain and ngram-mod at the same settings on the same
# prompts (benchmarks/speed/run_peers.py, client clock). Both AdaSpark arms draw with the same
# seed, so each report's "identical to base" column is the share of replies byte-identical to
# `ar`; report.md also gives the speed ratio with its bootstrap interval, accepted tokens per
# round by source and the acceptance model's calibration (expected over accepted tokens on tree
# rounds) at that temperature.
#
#   benchmarks/speed/sampling_bench.sh                 # the benchmark (about 30 minutes on 2 cores)
#   SMOKE=1 benchmarks/speed/sampling_bench.sh         # 1 turn, 16 tokens, T 0.7: 2 replies, the commands run
#   MT_EVERY=1 PASTES=20 benchmarks/speed/sampling_bench.sh   # every MT-Bench conversation and paste
#
# The sets: every MT_EVERY-th MT-Bench conversation (default 2: 40 conversations, 80 replies)
# and the first PASTES long pastes (default 12), MAX_TOKENS per reply (default 256), replies
# that reach the cap kept (--keep-capped) and counted. Peers: the first PEER_MT MT-Bench
# conversations of that subset and the first PEER_PASTES pastes, needing LLAMA_SERVER_BIN (a
# llama-server built from the llama-cpp-python 0.3.36 sdist, see benchmarks/speed/peers.md);
# without it that step is skipped and says so.
set -euo pipefail
cd "$(dirname "$0")/../.."

SEED=${SEED:-18}
OUT=${OUT:-benchmarks/results/speed/sampling}
MAX_TOKENS=${MAX_TOKENS:-256}
MT_EVERY=${MT_EVERY:-2}
PASTES=${PASTES:-12}
PEER_MT=${PEER_MT:-12}
PEER_PASTES=${PEER_PASTES:-8}
TEMPS=(${TEMPS:-0.7 1.0})
mkdir -p "$OUT"

if [[ -n "${SMOKE:-}" ]]; then
  OUT=${OUT}-smoke
  mkdir -p "$OUT"
  zcat benchmarks/corpora/mtbench.jsonl.gz | head -n 1 | python3 -c '
import json, sys
c = json.loads(sys.stdin.readline()); c["turns"] = c["turns"][:1]; print(json.dumps(c))' > "$OUT/smoke.jsonl"
  adaspark bench "$OUT/smoke.jsonl" --arms ar,adaspark --max-tokens 16 \
    --temperature 0.7 --top-p 0.95 --seed "$SEED" --report "$OUT/smoke-t0.7" --no-progress --keep-capped
  exit 0
fi

zcat benchmarks/corpora/mtbench.jsonl.gz | awk -v k="$MT_EVERY" 'NR % k == 1 || k == 1' > "$OUT/mtbench-set.jsonl"
zcat benchmarks/corpora/longpaste.jsonl.gz | head -n "$PASTES" > "$OUT/longpaste-set.jsonl"
echo "sets: $(wc -l < "$OUT/mtbench-set.jsonl") MT-Bench conversations, $(wc -l < "$OUT/longpaste-set.jsonl") pastes; $(lscpu | sed -n 's/^Model name: *//p')"

for T in "${TEMPS[@]}"; do
  for C in mtbench longpaste; do
    adaspark bench "$OUT/$C-set.jsonl" --arms ar,adaspark --max-tokens "$MAX_TOKENS" --keep-capped \
      --temperature "$T" --top-p 0.95 --seed "$SEED" --report "$OUT/$C-t$T" --no-progress
  done
done

if [[ -z "${LLAMA_SERVER_BIN:-}" || ! -x "${LLAMA_SERVER_BIN}" ]]; then
  echo "peers skipped: set LLAMA_SERVER_BIN to a llama-server binary" >&2
  exit 0
fi
head -n "$PEER_MT" "$OUT/mtbench-set.jsonl" > "$OUT/peers-set.jsonl"
head -n "$PEER_PASTES" "$OUT/longpaste-set.jsonl" >> "$OUT/peers-set.jsonl"
python3 -m benchmarks.speed.run_peers "$OUT/peers-set.jsonl" \
  --peers server-plain,server-ngram-mod,adaspark:ar,adaspark --server-bin "$LLAMA_SERVER_BIN" \
  --max-tokens "$MAX_TOKENS" --keep-capped --temperature 0.7 --top-p 0.95 --seed "$SEED" \
  --out "$OUT/peers-t0.7"
