#!/usr/bin/env bash
# The real-target figures of issues 17 and 19, in one quiet run (nothing else on the machine).
#
#   LLAMA_SERVER_BIN=.../llama-server benchmarks/real_targets_bench.sh [STEP ...]
#
# Steps (default: all, in this order): tui tui-qwen qwen-chat qwen-paste q15-paste pinned;
# with SET=s26 also qwen-humaneval qwen-code q15-humaneval (HumanEval and pasted code, s26/); with
# SET=s27 q15-paste4 q15-humaneval6 q05-chat8 q05-paste4 smol-chat8 (after the one-row kernels, s27/);
# with SET=s28 s28-q15-humaneval s28-q15-paste s28-q05-chat s28-q05-chat-b s28-q05-paste s28-smol-chat (s28/);
# with SET=s29 s29-q05-chat s29-q05-code s29-q15-paste s29-smol-chat s29-gemma-chat (s29/: peers and pinned widths together);
# with SET=s30 s30-q05-chat s30-q15-code s30-q05-code (s30/: ShareGPT chats and the last unused pasted code, landed
# code of s29), then s30b-q05-chat s30b-smol-chat s30b-q15-humaneval (after the wide widths' upper bound);
# with SET=s31 s31-q15-humaneval s31-q15-humaneval-b (s31/: HumanEval 6-19 on the 1.5B, pinned widths and peers);
# with SET=s33 s33-q05-chat s33-q05-paste s33-q15-paste (s33/: benchmarks/heldout_sets.py's sets), then
# SET=s33b s33b-q15-paste s33b-q15-code s33b-q05-paste s33b-q05-chat (the next ones, after the 4-column Q4_K tiles);
# s33b-q15-paste-r2 runs s33b-q15-paste again after the one-row trial's warm-up and quads (its first run's
# arms ran their plain steps on different kernels); s33b-cold: cold start and calibration on a fresh store;
# s33b-smol-chat (the bundled model), s33b-q05-chat-r2 and SET=s33 s33-q15-paste-r2 after the arms share one one-row trial (s33b-q05-chat's pinned arms ran vec_dot, the others not).
# with SET=s35 s35-smol-chat s35-q05-chat s35-q05-paste (s35/: the next held-out sets); SET=s33b s33b-smol-chat-r2.
# with SET=s36 s36-smol-chat s36-q05-chat s36-q05-paste s36-cold s36-q15-paste s36-q05-code (s36/: the next held-out sets, narrow widths priced after one measurement).
# with SET=s37 s37-q05-paste s37-q05-chat s37-q15-paste s37-smol-chat s37-cold (s37/: the next held-out sets).
# with SET=s38 s38-smol-chat s38-q05-chat s38-q05-paste s38-cold s38-q15-paste (s38/: the sixth held-out sets, sixteen pastes).
# with SET=s39 s39-q05-paste s39-q05-chat s39-q15-paste (s39/: the seventh held-out sets).
# with SET=s40 s40-q05-paste s40-q05-chat s40-q15-paste s40-cold (s40/: the eighth held-out sets).
# Targets come from benchmarks/targets/assemble.py (~/.cache/adaspark/targets). Held-out sets are
# in benchmarks/results/real-targets/$SET/ (default s25: conversations no tuning in this repo
# looked at; s24's sets and reports stay as they were run). Every step writes its report under
# benchmarks/results/; a failed step stops the run.
set -euo pipefail
cd "$(dirname "$0")/.."
T=${ADASPARK_TARGETS:-$HOME/.cache/adaspark/targets}
SET=${SET:-s25}
S=benchmarks/results/real-targets/$SET
U=benchmarks/results/tui-vs-headless
PEERS=adaspark:ar,adaspark,server-ngram-mod,server-plain
PEERS29=adaspark:ar,adaspark,adaspark:pinned:4,adaspark:pinned:8,server-ngram-mod,server-plain
# model_opt MODEL: sets the caller's array `model` to --model $T/MODEL.gguf, or to nothing for -
# (the bundled model)
model_opt() {
  model=()
  if [ "$1" != - ]; then model=(--model "$T/$1.gguf"); fi
}
# peers29 SET MODEL OUT: run_peers.py on $S/SET.jsonl with MODEL (model_opt),
# AdaSpark's ar, adaspark and pinned widths against llama-server, greedy, 128 tokens, capped replies kept
peers29() {
  local model
  model_opt "$2"
  python benchmarks/peers/run_peers.py "$S/$1.jsonl" "${model[@]}" --peers $PEERS29 --max-tokens 128 \
    --keep-capped --out "$S/$3"
}
# cold SET MODEL OUT: cold start and calibration on a fresh store: adaspark run of $S/SET.jsonl with
# MODEL (model_opt), greedy, 128 tokens, --log-rounds, then benchmarks/cold_start.py into
# $S/cold-start/OUT.txt
cold() {
  local model R O
  model_opt "$2"
  mkdir -p "$S/cold-start"
  R=$(mktemp --suffix=.jsonl); O=$(mktemp --suffix=.jsonl)
  adaspark run "$S/$1.jsonl" "${model[@]}" --arm adaspark --max-tokens 128 --fresh-store --out "$O" --log-rounds "$R"
  python benchmarks/cold_start.py "$R" > "$S/cold-start/$3.txt"; rm -f "$R" "$O"
}
# cold_runs "MODEL SET N" ...: cold for each, into $S/cold-start/MODEL-SET-N.txt (- is the bundled
# model, named smollm2)
cold_runs() {
  local run
  for run in "$@"; do
    set -- $run; cold "$2" "$1" "${1/-/smollm2}-$2-$3"
  done
}
steps=("$@"); [ ${#steps[@]} -eq 0 ] && steps=(tui tui-qwen qwen-chat qwen-paste q15-paste pinned)
lscpu | grep "Model name"
for step in "${steps[@]}"; do
  echo "== $step $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
  case $step in
    # TUI against headless, with headless run twice (--control) as the reference for noise
    tui) python benchmarks/tui_vs_headless.py --chat 8 --paste 4 --offset 44 --paste-offset 0 \
           --max-tokens 512 --control --out $U/$SET-512 ;;
    tui-qwen) python benchmarks/tui_vs_headless.py --model "$T/qwen0.5b.gguf" --chat 3 --paste 2 --offset 56 \
           --paste-offset 4 --max-tokens 256 --control --out $U/$SET-qwen0.5b ;;
    qwen-chat) python benchmarks/peers/run_peers.py $S/chat-heldout.jsonl --model "$T/qwen0.5b.gguf" \
           --peers $PEERS --max-tokens 128 --keep-capped --out $S/qwen0.5b-chat ;;
    qwen-paste) python benchmarks/peers/run_peers.py $S/paste-heldout.jsonl --model "$T/qwen0.5b.gguf" \
           --peers $PEERS --max-tokens 128 --keep-capped --out $S/qwen0.5b-paste ;;
    q15-paste) python benchmarks/peers/run_peers.py $S/paste-heldout-1.5b.jsonl --model "$T/qwen1.5b.gguf" \
           --peers $PEERS --max-tokens 128 --keep-capped --out $S/qwen1.5b-paste ;;
    # pinned widths against the learner (base adaspark), by category and by context band
    pinned) adaspark bench $S/pinned-mix.jsonl --model "$T/qwen0.5b.gguf" --arms adaspark,pinned:4,pinned:8,ar \
           --max-tokens 128 --keep-capped --no-progress --report $S/qwen0.5b-pinned ;;
    # HumanEval (the prompt as the user message) and pasted code on the Qwen targets (SET=s26)
    qwen-humaneval) python benchmarks/peers/run_peers.py $S/humaneval-12.jsonl --model "$T/qwen0.5b.gguf" \
           --peers $PEERS --max-tokens 128 --keep-capped --out $S/qwen0.5b-humaneval ;;
    qwen-code) python benchmarks/peers/run_peers.py $S/code-6.jsonl --model "$T/qwen0.5b.gguf" \
           --peers $PEERS --max-tokens 128 --keep-capped --out $S/qwen0.5b-code ;;
    q15-humaneval) python benchmarks/peers/run_peers.py $S/humaneval-6.jsonl --model "$T/qwen1.5b.gguf" \
           --peers $PEERS --max-tokens 128 --keep-capped --out $S/qwen1.5b-humaneval ;;
    # the 1.5B on pastes and HumanEval it had not run, one-row K-quant products on AdaSpark's kernel (SET=s27)
    q15-paste4) python benchmarks/peers/run_peers.py $S/paste-4-1.5b.jsonl --model "$T/qwen1.5b.gguf" \
           --peers $PEERS --max-tokens 128 --keep-capped --out $S/qwen1.5b-paste ;;
    q15-humaneval6) python benchmarks/peers/run_peers.py $S/humaneval-6-1.5b.jsonl --model "$T/qwen1.5b.gguf" \
           --peers $PEERS --max-tokens 128 --keep-capped --out $S/qwen1.5b-humaneval ;;
    # the 0.5B on chats and pastes it had not run (SET=s27)
    q05-chat8) python benchmarks/peers/run_peers.py $S/chat-8-0.5b.jsonl --model "$T/qwen0.5b.gguf" \
           --peers $PEERS --max-tokens 128 --keep-capped --out $S/qwen0.5b-chat ;;
    q05-paste4) python benchmarks/peers/run_peers.py $S/paste-4-0.5b.jsonl --model "$T/qwen0.5b.gguf" \
           --peers $PEERS --max-tokens 128 --keep-capped --out $S/qwen0.5b-paste ;;
    # the bundled model on the same 8 chats, after the one-row Q4_1 kernel (SET=s27)
    smol-chat8) python benchmarks/peers/run_peers.py $S/chat-8-0.5b.jsonl \
           --peers $PEERS --max-tokens 128 --keep-capped --out $S/smollm2-chat ;;
    # after the price of time for n-gram trees, the head estimate's class precision and the
    # chains' stop at control tokens (SET=s28): the learner against pinned:4 and ar, no peers
    s28-q15-humaneval) adaspark bench $S/humaneval-6-1.5b.jsonl --model "$T/qwen1.5b.gguf" --arms adaspark,pinned:4,ar \
           --max-tokens 128 --keep-capped --no-progress --report $S/qwen1.5b-humaneval ;;
    s28-q15-paste) adaspark bench $S/paste-4-1.5b.jsonl --model "$T/qwen1.5b.gguf" --arms adaspark,pinned:4,ar \
           --max-tokens 128 --keep-capped --no-progress --report $S/qwen1.5b-paste ;;
    s28-q05-chat) adaspark bench $S/chat-8.jsonl --model "$T/qwen0.5b.gguf" --arms adaspark,pinned:4,ar \
           --max-tokens 128 --keep-capped --no-progress --report $S/qwen0.5b-chat ;;
    s28-q05-chat-b) adaspark bench $S/chat-8b.jsonl --model "$T/qwen0.5b.gguf" --arms adaspark,pinned:4,ar \
           --max-tokens 128 --keep-capped --no-progress --report $S/qwen0.5b-chat-b ;;
    s28-q05-paste) adaspark bench $S/paste-4-0.5b.jsonl --model "$T/qwen0.5b.gguf" --arms adaspark,pinned:4,ar \
           --max-tokens 128 --keep-capped --no-progress --report $S/qwen0.5b-paste ;;
    s28-smol-chat) adaspark bench $S/chat-8.jsonl --arms adaspark,pinned:4,ar \
           --max-tokens 128 --keep-capped --no-progress --report $S/smollm2-chat ;;
    # the sets no target had run (SET=s29), peers and pinned widths in one interleaved run
    s29-q05-chat) peers29 chat-19 qwen0.5b qwen0.5b-chat ;;
    s29-q05-code) peers29 code-6-0.5b qwen0.5b qwen0.5b-code ;;
    s29-q15-paste) peers29 paste-4-1.5b qwen1.5b qwen1.5b-paste ;;
    s29-smol-chat) peers29 chat-19 - smollm2-chat ;;
    s29-gemma-chat) peers29 chat-19 gemma270m gemma270m-chat ;;
    # the last conversations no target had run (SET=s30): ShareGPT chats (3 turns) and pasted code
    s30-q05-chat) peers29 chat-12-sg qwen0.5b qwen0.5b-chat ;;
    s30-q15-code) peers29 code-7 qwen1.5b qwen1.5b-code ;;
    s30-q05-code) peers29 code-7 qwen0.5b qwen0.5b-code ;;
    s30b-q05-chat) peers29 chat-11-sg-b qwen0.5b qwen0.5b-chat-b ;;
    s30b-smol-chat) peers29 chat-11-sg-b - smollm2-chat-b ;;
    s30b-q15-humaneval) peers29 humaneval-6-1.5b qwen1.5b qwen1.5b-humaneval ;;
    # HumanEval 6-13 and 14-19 on the 1.5B (SET=s31): pinned widths, then the peers
    s31-q15-humaneval) python benchmarks/peers/run_peers.py $S/humaneval-8-1.5b.jsonl --model "$T/qwen1.5b.gguf" \
           --peers adaspark:ar,adaspark,adaspark:pinned:4,adaspark:pinned:8 --max-tokens 128 --keep-capped \
           --out $S/qwen1.5b-humaneval ;;
    s31-q15-humaneval-b) python benchmarks/peers/run_peers.py $S/humaneval-6b-1.5b.jsonl --model "$T/qwen1.5b.gguf" \
           --peers adaspark:ar,adaspark,adaspark:pinned:8,server-ngram-mod,server-plain --max-tokens 128 \
           --keep-capped --out $S/qwen1.5b-humaneval-b ;;
    # sets from benchmarks/heldout_sets.py (SET=s33), after the one-row kernels read rows in memory order
    s33-q05-chat) peers29 chat-12 qwen0.5b qwen0.5b-chat ;;
    s33-q05-paste) peers29 paste-10 qwen0.5b qwen0.5b-paste ;;
    s33-q15-paste) peers29 paste-10 qwen1.5b qwen1.5b-paste ;;
    s33-q15-paste-r2) peers29 paste-10 qwen1.5b qwen1.5b-paste-r2 ;;
    # the next held-out sets (SET=s33b), after the 4-column Q4_K tiles
    s33b-q15-paste) peers29 paste-10 qwen1.5b qwen1.5b-paste ;;
    s33b-q15-code) peers29 code-8 qwen1.5b qwen1.5b-code ;;
    s33b-q15-paste-r2) peers29 paste-10 qwen1.5b qwen1.5b-paste-r2 ;;
    s33b-q05-paste) peers29 paste-10 qwen0.5b qwen0.5b-paste ;;
    s33b-q05-chat) peers29 chat-12 qwen0.5b qwen0.5b-chat ;;
    s33b-q05-chat-r2) peers29 chat-12 qwen0.5b qwen0.5b-chat-r2 ;;
    s33b-smol-chat) peers29 chat-12 - smollm2-chat ;;
    # the bundled model's chats again, AdaSpark's arms only (adaspark bench, no llama-server), SET=s33b
    s33b-smol-chat-r2) adaspark bench $S/chat-12.jsonl --arms ar,adaspark,pinned:4,pinned:8 --max-tokens 128 \
           --keep-capped --no-progress --report $S/smollm2-chat-r2
       python benchmarks/rebase_report.py $S/smollm2-chat-r2/replies.jsonl --base adaspark \
           > $S/smollm2-chat-r2/rebased-adaspark.md ;;
    # the next held-out sets (SET=s35): the bundled model's pinned widths again, then the 0.5B
    s35-smol-chat) peers29 chat-12 - smollm2-chat ;;
    s35-q05-chat) peers29 chat-12 qwen0.5b qwen0.5b-chat ;;
    s35-q05-paste) peers29 paste-10 qwen0.5b qwen0.5b-paste ;;
    # cold start and calibration on a fresh store (SET=s33b): --log-rounds, then benchmarks/cold_start.py
    s33b-cold) for run in "qwen0.5b chat-12" "qwen0.5b paste-10" "qwen1.5b paste-10"; do
         set -- $run; cold "$2" "$1" "$1-$2"
       done ;;
    # the next held-out sets: SET=s36 (after narrow widths are priced from one measurement), SET=s37, SET=s38, SET=s39, SET=s40
    s36-smol-chat|s37-smol-chat|s38-smol-chat|s39-smol-chat) peers29 chat-12 - smollm2-chat ;;
    s36-q05-chat|s37-q05-chat|s38-q05-chat|s39-q05-chat|s40-q05-chat) peers29 chat-12 qwen0.5b qwen0.5b-chat ;;
    s36-q05-paste|s37-q05-paste) peers29 paste-10 qwen0.5b qwen0.5b-paste ;;
    s36-q15-paste|s37-q15-paste) peers29 paste-10 qwen1.5b qwen1.5b-paste ;;
    s36-q05-code) peers29 code-8 qwen0.5b qwen0.5b-code ;;
    # the sixth to eighth held-out sets (SET=s38, SET=s39, SET=s40): sixteen pastes, for a tighter interval on the 0.5B's paste bar
    s38-q05-paste|s39-q05-paste|s40-q05-paste) peers29 paste-16 qwen0.5b qwen0.5b-paste ;;
    s38-q15-paste|s39-q15-paste|s40-q15-paste) peers29 paste-16 qwen1.5b qwen1.5b-paste ;;
    # cold start and calibration on a fresh store, two runs each (SET=s36; - is the bundled model)
    s36-cold) cold_runs "- chat-12 1" "- chat-12 2" "qwen0.5b chat-12 1" "qwen0.5b chat-12 2" "qwen0.5b paste-10 1" \
                        "qwen0.5b paste-10 2" ;;
    # the same, one run each, with the 1.5B (SET=s37)
    s37-cold) cold_runs "- chat-12 1" "qwen0.5b chat-12 1" "qwen0.5b paste-10 1" "qwen1.5b paste-10 1" ;;
    s38-cold) cold_runs "- chat-12 1" "qwen0.5b chat-12 1" "qwen0.5b paste-16 1" ;;
    s40-cold) cold_runs "qwen0.5b chat-12 1" "qwen0.5b paste-16 1" "qwen1.5b paste-16 1" ;;
    *) echo "unknown step $step" >&2; exit 2 ;;
  esac
done
echo "== done $(date -u +%H:%M:%S)"
