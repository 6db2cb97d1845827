#!/usr/bin/env bash
# Issue 18's benchmark: lossless sampling, `adaspark` against `ar` at temperature 0.7 and 1.0
# (top-p 0.95, the other settings llama.cpp's defaults, seed fixed), on MT-Bench (both turns)
# and the long pastes. Both arms draw with the same seed, so report.json's `identical_share`
# is the share of replies byte-identical to `ar`; the report gives the speed ratio with its
# bootstrap interval and accepted tokens per round by source; ROUNDS.jsonl-style calibration
# (expected vs accepted per round) is in each arm's replies.jsonl / report.
#
#   benchmarks/sampling_bench.sh                 # the full benchmark (hours on 2 cores)
#   SMOKE=1 benchmarks/sampling_bench.sh         # 1 turn, 16 tokens, T 0.7: 2 replies, the commands run
#
# Not covered here: llama-server with ngram-mod at the same settings. benchmarks/peers/run_peers.py
# sends temperature 0 today; it needs sampling options before that half of the benchmark can run.
set -euo pipefail
cd "$(dirname "$0")/.."

SEED=${SEED:-18}
OUT=${OUT:-benchmarks/results/sampling}
MAX_TOKENS=${MAX_TOKENS:-512}
CORPORA=(mtbench longpaste)
TEMPS=(0.7 1.0)
if [[ -n "${SMOKE:-}" ]]; then
  TEMPS=(0.7)  # one reply per arm: 2 replies
  OUT=${OUT}-smoke
  MAX_TOKENS=16
  mkdir -p "$OUT"
  head -n 1 benchmarks/corpora/mtbench.jsonl | python3 -c '
import json, sys
c = json.loads(sys.stdin.readline()); c["turns"] = c["turns"][:1]; print(json.dumps(c))' > "$OUT/smoke.jsonl"
fi

for T in "${TEMPS[@]}"; do
  if [[ -n "${SMOKE:-}" ]]; then
    adaspark bench "$OUT/smoke.jsonl" --arms ar,adaspark --max-tokens "$MAX_TOKENS" \
      --temperature "$T" --top-p 0.95 --seed "$SEED" --report "$OUT/smoke-t$T" --no-progress --keep-capped
    continue
  fi
  for C in "${CORPORA[@]}"; do
    adaspark bench "benchmarks/corpora/$C.jsonl" --arms ar,adaspark --max-tokens "$MAX_TOKENS" \
      --temperature "$T" --top-p 0.95 --seed "$SEED" --report "$OUT/$C-t$T"
  done
done
