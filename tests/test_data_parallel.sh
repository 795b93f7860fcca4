#!/usr/bin/env bash
# test_data_parallel.sh: bucketed, overlapped gradient reduction and ZeRO-1 on the CPU build, 2 processes
# (NCCL over shared memory, rank and world from hand-set SLURM_* variables), tiny model, T=32:
#   - 2 ranks x B=8 give the losses of 1 rank x 2 micro-batches of B=8 (the same global batch) with small
#     buckets (many of them, launched as the backward makes them), with --grad-reduce bf16, --zero 1 (with
#     small buckets, and with the default: one bucket, padded), and --zero 1 with bf16 (tests/test_trainer.sh
#     checks the default buckets without ZeRO);
#   - after training both ranks hold the same weights (checksums every rank prints under MLM_TEST_WEIGHTS_CRC);
#   - without clipping, --zero 1 ends with bit for bit the weights of the same run without it (the same
#     reduction, each element's AdamW update and rounding the same, whichever rank makes it);
#   - checkpoints stay in one format: a 2-rank --zero 1 run resumed on 1 rank without ZeRO, and a 1-rank run
#     resumed on 2 ranks with --zero 1, continue with the losses of the uninterrupted run; a --zero 1 run
#     stopped and resumed with --zero 1 ends with a checkpoint identical to the uninterrupted one;
#   - the planner: --zero 1 at world 2 frees memory and gives a larger micro-batch (--plan-only needs no
#     other rank);
#   - bad values of --grad-reduce, --zero, --bucket-mb are refused.
# Tolerances (losses are printed with 4 decimals): fp32 reduction within 1e-4 of the 1-rank loss (2 ranks sum
# in another order than 1 rank's micro-batches; measured: equal). --zero 1 within 1e-3: its gradient norm for
# clipping adds the ranks' pieces in another order, the clipped update differs in the last bits, and
# stochastic rounding to bf16 turns some of those into a different bf16 weight (measured: at most 2e-4 by
# step 8). --grad-reduce bf16 within 1e-3 (bf16 keeps 8 bits of each gradient; measured: at most 2e-4).
# Run by tests/run.sh; needs tools/requirements.txt (python3 tools/prepare.py).
cd "$(dirname "$0")/.."
pass=0; fail=0
ok()  { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL test_data_parallel: $*"; }
check() { if eval "$1"; then ok; else bad "$2"; fi; }
W=$(mktemp -d /tmp/mlm_dp_XXXXXX)
trap 'rm -rf "$W"' EXIT

python3 tools/prepare.py bytes --input cpu tests --out "$W/data" --seq-len 32 --val-fraction 0 >"$W/prep.log" 2>&1
check '[ -f "$W/data/train_00000.bin" ]' "tools/prepare.py made no shards: $(tail -n 3 "$W/prep.log")"
COMMON=(--data "$W/data/train_*.bin" --preset tiny --seq 32 --batch 8 --lr 5e-3 --warmup 2 --seed 7 --steps 8)
SMALL=(--bucket-mb 0.01)  # 2,621 floats: the tiny model's 28,328 gradients (the word embeddings padded to a multiple of 8 rows) in 12 buckets
loss_at() { grep -E "^step +$1/" "$2" | sed -E 's/.*loss ([0-9.]+).*/\1/'; }

# run2 NAME ARGS...: 2 ranks, logs $W/NAME0.log and $W/NAME1.log, output in $W/NAME
run2() {
  local name=$1 r; shift
  mkdir -p "$W/$name"
  for r in 0 1; do
    SLURM_NTASKS=2 SLURM_PROCID=$r SLURM_LOCALID=0 NCCL_EMU_TIMEOUT_S=60 MLM_TEST_WEIGHTS_CRC=1 \
      ./trainer_cpu "${COMMON[@]}" --out "$W/$name" "$@" >"$W/$name$r.log" 2>&1 &
  done
  wait
}
# same_losses REF LOG TOL STEPS...: the losses of LOG at STEPS are within TOL of REF's
same_losses() {
  local ref=$1 log=$2 tol=$3 s a b same=1; shift 3
  for s in "$@"; do
    a=$(loss_at "$s" "$ref"); b=$(loss_at "$s" "$log")
    awk -v a="$a" -v b="$b" -v t="$tol" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && b != "" && d <= t) }' ||
      { same=0; echo "  step $s: $(basename "$ref") $a, $(basename "$log") $b (tolerance $tol)"; }
  done
  [ $same = 1 ]
}
# same_weights NAME: both ranks printed the same checksums of their weights
same_weights() {
  local a b
  a=$(sed -n -E 's/^rank 0 weights: (.*)/\1/p' "$W/${1}0.log"); b=$(sed -n -E 's/^rank 1 weights: (.*)/\1/p' "$W/${1}1.log")
  [ -n "$a" ] && [ "$a" = "$b" ] || { echo "  rank 0: '$a', rank 1: '$b'"; return 1; }
}

# 1. the reference: 1 rank, 2 micro-batches of B=8 per step
./trainer_cpu "${COMMON[@]}" --out "$W/ref" --grad-accum 2 >"$W/ref.log" 2>&1
check 'grep -qE "^step +8/8" "$W/ref.log"' "the 1-rank reference failed: $(tail -n 3 "$W/ref.log")"

# 2. 2 ranks == 1 rank, in every mode; the ranks' weights identical
for mode in "small" "bf16" "zero" "zero_bf16" "zero_default"; do
  case $mode in
    small) args=("${SMALL[@]}"); tol=1e-4 ;;
    bf16) args=("${SMALL[@]}" --grad-reduce bf16); tol=1e-3 ;;
    zero) args=("${SMALL[@]}" --zero 1); tol=1e-3 ;;
    zero_bf16) args=("${SMALL[@]}" --zero 1 --grad-reduce bf16); tol=1e-3 ;;
    zero_default) args=(--zero 1); tol=1e-3 ;;
  esac
  run2 "$mode" "${args[@]}"
  check 'grep -qE "^step +8/8" "$W/${mode}0.log" && [ -f "$W/$mode/model.safetensors" ]' \
    "2 ranks, $mode (${args[*]}): the run failed: $(tail -n 3 "$W/${mode}0.log" "$W/${mode}1.log")"
  check 'same_losses "$W/ref.log" "$W/${mode}0.log" $tol 1 2 4 6 8' \
    "2 ranks, $mode (${args[*]}): the losses differ from 1 rank with --grad-accum 2 by more than $tol"
  check 'same_weights "$mode"' "2 ranks, $mode (${args[*]}): the ranks hold different weights after training"
done
# without clipping the norm's order does not matter: --zero 1 gives bit for bit the weights of the run without
run2 clip0 "${SMALL[@]}" --clip 0
run2 zero_clip0 "${SMALL[@]}" --clip 0 --zero 1
w_plain=$(grep "^rank 0 weights" "$W/clip00.log"); w_zero=$(grep "^rank 0 weights" "$W/zero_clip00.log")
check '[ -n "$w_plain" ] && [ "$w_plain" = "$w_zero" ] && same_weights zero_clip0' \
  "--clip 0: --zero 1 does not end with the weights of the run without it: '$w_plain' and '$w_zero'"
check 'grep -q "gradients reduced in 12 buckets of up to 0.01 MB, fp32" "$W/small0.log"' \
  "--bucket-mb 0.01 did not make 12 buckets: $(grep "buckets" "$W/small0.log")"
check 'grep -q "ZeRO-1: this process holds 14164 of the 28328" "$W/zero0.log"' \
  "--zero 1 at world 2 does not hold half of the optimizer state: $(grep "ZeRO" "$W/zero0.log")"

# 3. checkpoints across world sizes and ZeRO-1: stop after 4 steps, resume the other way, compare with ref
#    (tolerance 1e-3: the steps under --zero 1 clip with a norm summed in another order, as above)
mkdir -p "$W/r1"
for r in 0 1; do
  SLURM_NTASKS=2 SLURM_PROCID=$r SLURM_LOCALID=0 NCCL_EMU_TIMEOUT_S=60 \
    ./trainer_cpu "${COMMON[@]}" --out "$W/r1" "${SMALL[@]}" --zero 1 --run-steps 4 >"$W/r1_$r.log" 2>&1 &
done
wait
./trainer_cpu "${COMMON[@]}" --out "$W/r1" --grad-accum 2 --resume >"$W/r1_resume.log" 2>&1
check 'grep -q "resumed from .* at step 4" "$W/r1_resume.log" && same_losses "$W/ref.log" "$W/r1_resume.log" 1e-3 5 6 7 8' \
  "2 ranks --zero 1 for 4 steps, resumed on 1 rank without ZeRO: not the uninterrupted losses: $(tail -n 2 "$W/r1_resume.log")"
./trainer_cpu "${COMMON[@]}" --out "$W/r2" --grad-accum 2 --run-steps 4 >"$W/r2_first.log" 2>&1
for r in 0 1; do
  SLURM_NTASKS=2 SLURM_PROCID=$r SLURM_LOCALID=0 NCCL_EMU_TIMEOUT_S=60 \
    ./trainer_cpu "${COMMON[@]}" --out "$W/r2" "${SMALL[@]}" --zero 1 --resume >"$W/r2_$r.log" 2>&1 &
done
wait
check 'grep -q "resumed from .* at step 4" "$W/r2_0.log" && same_losses "$W/ref.log" "$W/r2_0.log" 1e-3 5 6 7 8' \
  "1 rank for 4 steps, resumed on 2 ranks with --zero 1: not the uninterrupted losses: $(tail -n 2 "$W/r2_0.log" "$W/r2_1.log")"
# --zero 1, stopped and resumed with --zero 1: the final checkpoint is bit for bit the uninterrupted run's
mkdir -p "$W/r3"
for phase in "--run-steps 4" "--resume"; do
  for r in 0 1; do
    SLURM_NTASKS=2 SLURM_PROCID=$r SLURM_LOCALID=0 NCCL_EMU_TIMEOUT_S=60 \
      ./trainer_cpu "${COMMON[@]}" --out "$W/r3" "${SMALL[@]}" --zero 1 $phase >"$W/r3_$r.log" 2>&1 &
  done
  wait
done
check 'cmp -s "$W/r3/checkpoint.bin" "$W/zero/checkpoint.bin" && cmp -s "$W/r3/model.safetensors" "$W/zero/model.safetensors"' \
  "--zero 1 stopped at step 4 and resumed does not end where the uninterrupted run did: $(cmp "$W/r3/checkpoint.bin" "$W/zero/checkpoint.bin" 2>&1)"

# 4. the planner: ZeRO-1 at world 2 holds half the optimizer state, so the micro-batch grows
plan() {  # plan WORLD ARGS...: the planner's B for bert-base, T=512 on a 16 GB device
  local world=$1; shift
  SLURM_NTASKS=$world SLURM_PROCID=0 SLURM_LOCALID=0 EMU_DEVICE_BYTES=16e9 ./trainer_cpu --data "$W/data/train_*.bin" \
    --out "$W/p" --preset bert-base --seq 512 --plan-only "$@" 2>&1 | sed -n -E 's/.*total .* GiB for B=([0-9]+) .*/\1/p'
}
b1=$(plan 1); b2=$(plan 2); z1=$(plan 1 --zero 1); z2=$(plan 2 --zero 1); z2b=$(plan 2 --zero 1 --grad-reduce bf16)
check '[ -n "$b1" ] && [ "$b1" = "$b2" ] && [ "$z1" = "$b1" ] && [ -n "$z2" ] && [ "$z2" -gt "$b2" ] && [ -n "$z2b" ] && [ "$z2b" -le "$z2" ]' \
  "planner, bert-base T=512 on 16 GB: B=$b1 (world 1), $b2 (world 2), $z1 (world 1, --zero 1), $z2 (world 2, --zero 1), $z2b (and bf16)"
echo "  (planner: bert-base, T=512, 16 GB: B=$b2 at world 2, B=$z2 with --zero 1)"

# 5. bad values
expect_error() {  # expect_error PATTERN ARGS... : the run fails and says PATTERN
  local pat=$1; shift
  out=$("$@" 2>&1); rc=$?
  if [ $rc -ne 0 ] && echo "$out" | grep -q -- "$pat"; then ok; else bad "'$*' gave exit $rc and: $(echo "$out" | tail -n 2)"; fi
}
expect_error "grad-reduce fp16: expected fp32 or bf16" ./trainer_cpu "${COMMON[@]}" --out "$W/e" --grad-reduce fp16
expect_error "zero 2: expected an integer in \[0, 1\]" ./trainer_cpu "${COMMON[@]}" --out "$W/e" --zero 2
expect_error "bucket-mb 0: expected a number" ./trainer_cpu "${COMMON[@]}" --out "$W/e" --bucket-mb 0

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
