#!/usr/bin/env bash
# bench_vs_peer.sh: mlm.c against its PyTorch peer on this machine's GPU, for the same presets and T.
# Runs `./trainer --bench` (mlm.c's real training step on synthetic packed batches, the planner's largest
# micro-batch) and `tools/bench_peer.py` (Hugging Face BertForMaskedLM with SDPA, bf16 autocast, fused
# AdamW, at its best micro-batch; it also finds its largest), then prints one table: tokens/s and the
# largest micro-batch of each, and the ratios mlm.c / peer. Builds nothing: run ./build.sh gpu first.
#
#   tools/bench_vs_peer.sh                                # bert-base and bert-large, T=512
#   tools/bench_vs_peer.sh --preset bert-base --seq 128 --steps 20
#   tools/bench_vs_peer.sh --peer-batch 64,128,256 --mlmc-log runs/gpu_session/bench.log
#
# --peer-batch B,B times the peer at these micro-batches only (bench_peer.py --batch; its search for its largest
# still runs), not at every power of two from a sixteenth of its largest up and the largest itself.
# --mlmc-log FILE takes mlm.c's side from FILE, the output of a `./trainer --bench` already run at the same
# presets and T (a bench-result line for each), instead of running it again.
# Both logs are kept in a directory it names (LOG_DIR=... to choose it). TRAINER=path picks the mlm.c
# binary (default ./trainer), TRAINER_FLAGS more flags for its --bench (such as "--batch 512"), PYTHON the
# interpreter with torch and transformers (default python3).
# Without a GPU, the trainer, torch or transformers it stops with a one-line error and exit code 2.
set -uo pipefail
cd "$(dirname "$0")/.."
die() { echo "bench_vs_peer.sh: $*" >&2; exit 2; }

PRESETS=bert-base,bert-large T=512 STEPS=10 PEER_BATCH="" MLMC_LOG=""
while [ $# -gt 0 ]; do
  case "$1" in
    --preset) [ $# -ge 2 ] || die "--preset needs a value"; PRESETS=$2; shift 2 ;;
    --seq) [ $# -ge 2 ] || die "--seq needs a value"; T=$2; shift 2 ;;
    --steps) [ $# -ge 2 ] || die "--steps needs a value"; STEPS=$2; shift 2 ;;
    --peer-batch) [ $# -ge 2 ] || die "--peer-batch needs a value"; PEER_BATCH=$2; shift 2 ;;
    --mlmc-log) [ $# -ge 2 ] || die "--mlmc-log needs a file"; MLMC_LOG=$2; shift 2 ;;
    -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
    *) die "$1: unknown argument (--preset A,B --seq T --steps N --peer-batch B,B --mlmc-log FILE)" ;;
  esac
done
[[ "$T" =~ ^[0-9]+$ ]] || die "--seq $T: expected a positive integer"
[[ "$STEPS" =~ ^[0-9]+$ ]] && [ "$STEPS" -ge 1 ] || die "--steps $STEPS: expected a positive integer"
[ -z "$PEER_BATCH" ] || [[ "$PEER_BATCH" =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] ||
  die "--peer-batch $PEER_BATCH: expected comma-separated positive integers"
[ -z "$MLMC_LOG" ] || [ -s "$MLMC_LOG" ] || die "--mlmc-log $MLMC_LOG: no such file, or empty"
[ -z "$MLMC_LOG" ] || [ -z "${TRAINER_FLAGS:-}" ] ||
  die "--mlmc-log and TRAINER_FLAGS: the log's run had its own flags (TRAINER_FLAGS is for a run here)"
IFS=, read -ra LIST <<<"$PRESETS"
if [ -n "$MLMC_LOG" ]; then
  for p in "${LIST[@]}"; do
    grep -q -E "^bench-result preset=$p T=$T " "$MLMC_LOG" ||
      die "--mlmc-log $MLMC_LOG: no bench-result line of preset $p at T=$T (a ./trainer --bench output)"
  done
fi
TRAINER=${TRAINER:-./trainer}
PYTHON=${PYTHON:-python3}
read -ra TFLAGS <<<"${TRAINER_FLAGS:-}"

[ -x "$TRAINER" ] || die "$TRAINER is not built (./build.sh gpu makes it)"
info=$("$TRAINER" --info 2>&1) || die "no usable GPU: $TRAINER --info says: $(echo "$info" | grep -v '^$' | head -n 1)"
check=$("$PYTHON" tools/bench_peer.py --check 2>&1) || die "the peer cannot run: $(echo "$check" | head -n 1)"

LOG_DIR=${LOG_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/bench_vs_peer_XXXXXX")}
mkdir -p "$LOG_DIR" || die "cannot create the log directory $LOG_DIR"
echo "device: $(echo "$info" | head -n 1)"
echo "peer: $(echo "$check" | sed 's/^bench_peer.py: //'); logs in $LOG_DIR"
if [ -n "$MLMC_LOG" ]; then
  echo "mlm.c: $MLMC_LOG (./trainer --bench's output, not run again)"
  cp "$MLMC_LOG" "$LOG_DIR/mlmc.log" || die "cannot copy $MLMC_LOG into $LOG_DIR"
else
  echo "running: $TRAINER --bench --preset $PRESETS --seq $T --bench-steps $STEPS${TFLAGS[*]:+ ${TFLAGS[*]}}"
  "$TRAINER" --bench --preset "$PRESETS" --seq "$T" --bench-steps "$STEPS" "${TFLAGS[@]}" >"$LOG_DIR/mlmc.log" 2>&1 ||
    die "$TRAINER --bench failed (exit $?): $(tail -n 1 "$LOG_DIR/mlmc.log")"
fi
PEER_ARGS=(--preset "$PRESETS" --seq "$T" --steps "$STEPS")
[ -z "$PEER_BATCH" ] || PEER_ARGS+=(--batch "$PEER_BATCH")
echo "running: $PYTHON tools/bench_peer.py ${PEER_ARGS[*]}"
"$PYTHON" tools/bench_peer.py "${PEER_ARGS[@]}" >"$LOG_DIR/peer.log" 2>&1 ||
  die "tools/bench_peer.py failed (exit $?): $(tail -n 1 "$LOG_DIR/peer.log")"

# field FILE TAG PRESET KEY: the value of KEY= in the "TAG preset=PRESET ..." line of FILE
field() { grep -E "^$2 preset=$3 T=$T " "$1" | tail -n 1 | tr ' ' '\n' | sed -n "s/^$4=//p"; }

echo
echo "mlm.c vs the PyTorch peer, T=$T (tokens/s: real tokens; mlm.c at the planner's largest micro-batch, the peer at its best)"
[ ${#TFLAGS[@]} -eq 0 ] || echo "mlm.c with ${TFLAGS[*]}"
[ -z "$MLMC_LOG" ] || echo "mlm.c from $MLMC_LOG"
[ -z "$PEER_BATCH" ] || echo "the peer timed at micro-batches $PEER_BATCH only"
echo "peer: $(grep -m1 '^peer: ' "$LOG_DIR/peer.log" | sed 's/^peer: //')"
printf '%-12s %14s %10s %8s %14s %10s %12s %12s\n' preset "mlm.c tok/s" "mlm.c B" "MFU" "peer tok/s" "peer B" "tok/s ratio" "max B ratio"
for p in "${LIST[@]}"; do
  mt=$(field "$LOG_DIR/mlmc.log" bench-result "$p" tokens_per_s); mb=$(field "$LOG_DIR/mlmc.log" bench-result "$p" max_batch)
  mfu=$(field "$LOG_DIR/mlmc.log" bench-result "$p" mfu)
  pt=$(field "$LOG_DIR/peer.log" peer-result "$p" tokens_per_s); pb=$(field "$LOG_DIR/peer.log" peer-result "$p" max_batch)
  pbest=$(field "$LOG_DIR/peer.log" peer-result "$p" batch)
  [ -n "$mt" ] && [ -n "$pt" ] || die "$p: no result line in $LOG_DIR/mlmc.log or $LOG_DIR/peer.log"
  awk -v p="$p" -v mt="$mt" -v mb="$mb" -v mfu="${mfu:-na}" -v pt="$pt" -v pb="$pb" -v pbest="$pbest" 'BEGIN {
    m = mfu == "na" ? "n/a" : sprintf("%.1f%%", 100 * mfu)
    printf "%-12s %14.0f %10d %8s %14.0f %10s %11.2fx %11.2fx\n", p, mt, mb, m, pt, pb " (" pbest ")", mt / pt, mb / pb }'
done
echo "(peer B: its largest micro-batch, and in brackets the one it was fastest at)"
