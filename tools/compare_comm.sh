#!/usr/bin/env bash
# compare_comm.sh: the convergence evidence for --comm. Three data-parallel runs of the mini
# preset on RANKS CPU processes (./trainer_cpu, no srun: rank and world from hand-set SLURM_* variables, NCCL
# over shared memory), then one figure of their loss curves against tokens and a table of their losses at equal
# tokens:
#   fp32    --comm fp32 (the unchanged path), STEPS steps of RANKS x BATCH rows of SEQ tokens, AdamW at LR
#   bf16    --comm bf16, the same
#   onebit  --comm onebit (1-bit Adam), the same (skipped, with a note, when the trainer has no --comm onebit)
# The shards (this machine's ELF functions, as train.sh makes them, at SEQ) go to data/elf_T$SEQ_$DATA_TOKENS;
# runs to $OUT/MODE (default runs/compare); a run whose metrics.jsonl already reaches its last step is kept
# (rerun the script to finish the others; delete a run's folder to redo it). The figure: $FIG (default
# docs/comm_curves.png) by tools/plot.py --overlay, which also prints the table.
#
#   tools/compare_comm.sh                      # all three runs, the figure and the table
#   MODES="fp32 onebit" STEPS=100 tools/compare_comm.sh   # some of them, shorter
#
# Environment (defaults): TRAINER (./trainer_cpu), RANKS (4), SEQ (64), BATCH (8), STEPS (500), LR (2e-3),
# WARMUP (STEPS / 20), VAL_EVERY (STEPS / 5), MODES ("fp32 bf16 onebit"),
# OUT (runs/compare), FIG (docs/comm_curves.png), DATA_TOKENS (4000000), SEED (1337), EXTRA (none: more trainer
# flags for every run, split at spaces, e.g. EXTRA="--comm-refresh 50" MODES=onebit OUT=runs/r50).
set -u
cd "$(dirname "$0")/.."
TRAINER=${TRAINER:-./trainer_cpu}
RANKS=${RANKS:-4}
SEQ=${SEQ:-64}
BATCH=${BATCH:-8}
STEPS=${STEPS:-500}
LR=${LR:-2e-3}
WARMUP=${WARMUP:-$((STEPS / 20))}
VAL_EVERY=${VAL_EVERY:-$((STEPS / 5))}
MODES=${MODES:-fp32 bf16 onebit}
OUT=${OUT:-runs/compare}
FIG=${FIG:-docs/comm_curves.png}
DATA_TOKENS=${DATA_TOKENS:-4000000}
SEED=${SEED:-1337}
EXTRA=${EXTRA:-}
PYTHON=${PYTHON:-python3}
die() { echo "compare_comm.sh: $*" >&2; exit 1; }

[ -x "$TRAINER" ] || die "no trainer at $TRAINER (./build.sh cpu builds ./trainer_cpu; or set TRAINER)"
for v in RANKS SEQ BATCH STEPS WARMUP VAL_EVERY DATA_TOKENS SEED; do
  [[ ${!v} =~ ^[0-9]+$ ]] && [ "${!v}" -gt 0 -o "$v" = WARMUP ] || die "$v=${!v}: expected a positive integer"
done
HELP=$("$TRAINER" --help)
# the trainer's name for the gradient reduction's type: --comm (with onebit), or the older --grad-reduce
if grep -q -- '--comm ' <<<"$HELP"; then COMM=--comm; else COMM=--grad-reduce; fi

# ---- shards: this machine's ELF functions, one token per byte, as train.sh prepares them ----
DATA=data/elf_T${SEQ}_${DATA_TOKENS}
if [ ! -f "$DATA/meta.json" ]; then
  rm -rf "$DATA.tmp"
  "$PYTHON" tools/prepare.py bytes --input /usr/lib /usr/bin --elf-functions --out "$DATA.tmp" --seq-len "$SEQ" \
    --max-tokens "$DATA_TOKENS" --val-fraction 0.01 >/dev/null || die "tools/prepare.py failed (see above)"
  mv "$DATA.tmp" "$DATA"
fi

# done RUN STEPS: RUN's metrics.jsonl has a train record of step STEPS
finished() { [ -f "$1/metrics.jsonl" ] && grep -q "\"kind\":\"train\",\"step\":$2," "$1/metrics.jsonl"; }

# run MODE STEPS ARGS...: RANKS processes of the trainer into $OUT/MODE, logs rankR.log there
run() {
  local mode=$1 steps=$2 dir=$OUT/$1 r fail=0 pids=()
  shift 2
  if finished "$dir" "$steps"; then
    echo "$mode: $dir already has its $steps steps (kept)"
    return 0
  fi
  rm -rf "$dir"
  mkdir -p "$dir"
  echo "$mode: $RANKS ranks, $steps steps, $(date -u +%H:%M:%S) UTC: $TRAINER $*"
  local t0=$SECONDS
  for ((r = 0; r < RANKS; r++)); do
    SLURM_NTASKS=$RANKS SLURM_PROCID=$r SLURM_LOCALID=0 NCCL_EMU_TIMEOUT_S=1200 \
      "$TRAINER" --data "$DATA/train_*.bin" --val "$DATA/val_*.bin" --out "$dir" --preset mini --seq "$SEQ" \
      --batch "$BATCH" --steps "$steps" --val-every "$VAL_EVERY" --seed "$SEED" --nccl-timeout 1200 "$@" $EXTRA \
      >"$dir/rank$r.log" 2>&1 &
    pids+=($!)
  done
  for r in "${pids[@]}"; do wait "$r" || fail=1; done
  [ $fail = 0 ] || { tail -n 3 "$dir"/rank*.log >&2; die "$mode: a rank failed (logs in $dir)"; }
  echo "$mode: done in $((SECONDS - t0)) s: $(grep -E '^step ' "$dir/rank0.log" | tail -n 1)"
}

runs=()
for mode in $MODES; do
  case $mode in
    fp32 | bf16)
      run "$mode" "$STEPS" $COMM "$mode" --lr "$LR" --warmup "$WARMUP" || exit 1 ;;
    onebit)
      if [ $COMM != --comm ] || ! grep -q -- "$mode" <<<"$HELP"; then
        echo "$mode: skipped: $TRAINER has no --comm $mode"
        continue
      fi
      run "$mode" "$STEPS" --comm "$mode" --lr "$LR" --warmup "$WARMUP" || exit 1 ;;
    *) die "MODES: unknown mode '$mode' (expected fp32, bf16 or onebit)" ;;
  esac
  runs+=("$OUT/$mode")
done
[ ${#runs[@]} -gt 0 ] || die "no run to plot"
mkdir -p "$(dirname "$FIG")"
"$PYTHON" tools/plot.py --overlay "${runs[@]}" --x tokens --out "$FIG" || die "tools/plot.py --overlay failed"
