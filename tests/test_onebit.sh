#!/usr/bin/env bash
# test_onebit.sh: --comm onebit (1-bit Adam, compress.h) end to end on the CPU build, 4 processes (NCCL over
# shared memory, rank and world from hand-set SLURM_* variables), tiny model, T=32, B=8, 16 steps:
#   - the same run with --comm fp32, bf16 and --comm onebit --comm-warmup 4 --comm-var-steps 0 (v fixed after the
#     warm-up: a 16-step run is too short for the default variance steps, 16 of them at spacing 1): onebit's losses during the warm-up
#     identical to bf16's (it is AdamW with the bf16 all-reduce); after it each step's loss within 5% of fp32's at the same step (measured: at most
#     2.8% to 3.6% above it in three runs; the shards are made from cpu/ and tests/, so the figure moves a
#     little as those files change; the test prints it), and falling (the last step's below the warm-up's last);
#   - comm_bytes (the trainer's own count, in the log and metrics.jsonl): after the warm-up at least 16x fewer
#     than fp32's per step (measured: 6,090 against 169,242 bytes, 27.8x: the step's loss all-reduce is in both);
#   - every rank's total ("comm: rank R sent B bytes in N NCCL calls") equals the CPU NCCL's own count
#     (NCCL_EMU_STATS), in both modes;
#   - every rank ends with the same weights (MLM_TEST_WEIGHTS_CRC); the all-to-all's connections opened before step 1;
#   - --comm-refresh 1 (a lazy refresh every step is AdamW, reduced in bf16) on one rank: every step's loss and the
#     final weights (their CRC) equal fp32's;
#   - checkpoints hold no 1-bit Adam errors: a onebit run's checkpoint.bin is the size of an fp32 run's; a run
#     stopped after 10 steps (--run-steps) and resumed on 4 ranks says its errors start from zero and ends within
#     1% of the uninterrupted run's loss; resumed on 2 ranks it finishes;
#   - one process, the default warm-up (--warmup's: 2), --comm-var-steps 1: the compression still runs (its loss
#     equals fp32's up to step 4, step 3 being a variance step, and differs from step 5), 0 bytes sent;
#     an infinite gradient (MLM_TEST_INF_GRAD) skips the step and the run goes on; the memory plan counts the
#     1-bit Adam buffers (what is allocated before step 1 equals the plan);
#   - --comm onebit --comm-refresh 3 --comm-var-steps 1 (2 ranks, the slab in at least 3 parts, each exchanged
#     after the backward and updated under the next forward): steps 5, 7, 10, 13, 16 are the variance steps
#     (onebit_schedule: spacing 1, 2, then every 3; bf16's bytes, over 8x the others');
#     stopped after step 8 and resumed, the same steps are; two runs give the same losses and weights, bit for bit
#     (a race between a part's update and the forward that reads it would show);
#   - bad input: unknown --comm, --comm-warmup >= --steps, --comm-warmup, --comm-refresh or --comm-var-steps without
#     onebit, --comm-refresh -1, onebit with --zero 1 or --bench: one line naming the flag, exit 1, nothing written.
# Run by tests/run.sh; needs tools/requirements.txt (python3 tools/prepare.py). About a minute on 2 cores.
cd "$(dirname "$0")/.."
TRAINER=${TRAINER:-./trainer_cpu}
pass=0; fail=0
ok()  { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL test_onebit: $*"; }
check() { if eval "$1"; then ok; else bad "$2"; fi; }
W=$(mktemp -d /tmp/mlm_onebit_XXXXXX)
trap 'rm -rf "$W"' EXIT

python3 tools/prepare.py bytes --input cpu tests --out "$W/data" --seq-len 32 --val-fraction 0 >"$W/prep.log" 2>&1
check '[ -f "$W/data/train_00000.bin" ]' "tools/prepare.py made no shards: $(tail -n 3 "$W/prep.log")"
COMMON=(--data "$W/data/train_*.bin" --preset tiny --seq 32 --batch 8 --lr 5e-3 --warmup 2 --seed 7 --steps 16)
loss_at() { grep -E "^step +$1/" "$2" | sed -E 's/.*loss ([0-9.]+).*/\1/'; }
bytes_at() { grep -E "^step +$1/" "$2" | sed -E 's/.*comm_bytes ([0-9]+).*/\1/'; }

# runn NAME N ARGS...: N ranks, logs $W/NAME.R.log, output in $W/NAME, the CPU NCCL's counts in $W/NAME.stats.R
runn() {
  local name=$1 n=$2 r; shift 2
  for r in $(seq 0 $((n - 1))); do
    SLURM_NTASKS=$n SLURM_PROCID=$r SLURM_LOCALID=0 NCCL_EMU_TIMEOUT_S=60 MLM_TEST_WEIGHTS_CRC=1 \
      NCCL_EMU_STATS="$W/$name.stats" $TRAINER "${COMMON[@]}" --out "$W/$name" "$@" >"$W/$name.$r.log" 2>&1 &
  done
  wait
}
# counts_agree NAME N: every rank's own total equals the CPU NCCL's count for it
counts_agree() {
  local name=$1 n=$2 r own emu same=1
  for r in $(seq 0 $((n - 1))); do
    own=$(sed -n -E "s/^comm: rank $r sent ([0-9]+) bytes in ([0-9]+) NCCL calls/\1 \2/p" "$W/$name.$r.log")
    emu=$(sed -n -E 's/^nccl-emu-stats rank [0-9]+ nranks [0-9]+ calls ([0-9]+) bytes_sent ([0-9]+)/\2 \1/p' \
      "$W/$name.stats.$r" 2>/dev/null)
    [ -n "$own" ] && [ "$own" = "$emu" ] || { same=0; echo "  $name rank $r: trainer '$own', CPU NCCL '$emu' (bytes calls)"; }
  done
  [ $same = 1 ]
}
same_weights() {
  local name=$1 n=$2 r a b
  a=$(sed -n -E 's/^rank 0 weights: (.*)/\1/p' "$W/$name.0.log")
  for r in $(seq 1 $((n - 1))); do
    b=$(sed -n -E "s/^rank $r weights: (.*)/\\1/p" "$W/$name.$r.log")
    [ -n "$a" ] && [ "$a" = "$b" ] || { echo "  rank 0: '$a', rank $r: '$b'"; return 1; }
  done
}

# 1. fp32 and onebit on 4 ranks
runn fp32 4 --comm fp32
runn bf16 4 --comm bf16
runn onebit 4 --comm onebit --comm-warmup 4 --comm-var-steps 0
for m in fp32 onebit; do
  check 'grep -qE "^step +16/16" "$W/$m.0.log" && [ -f "$W/$m/model.safetensors" ]' \
    "4 ranks, --comm $m: the run failed: $(tail -n 3 "$W/$m.0.log" "$W/$m.1.log")"
  check 'counts_agree $m 4' "--comm $m: the trainer's byte counts differ from the CPU NCCL's"
  check 'same_weights $m 4' "--comm $m: the ranks' weights differ"
done
for s in 1 2 3 4; do
  check '[ -n "$(loss_at $s "$W/bf16.0.log")" ] && [ "$(loss_at $s "$W/bf16.0.log")" = "$(loss_at $s "$W/onebit.0.log")" ]' \
    "step $s (warm-up): onebit's loss $(loss_at $s "$W/onebit.0.log") differs from bf16's $(loss_at $s "$W/bf16.0.log")"
done
for s in $(seq 5 16); do
  a=$(loss_at $s "$W/fp32.0.log"); b=$(loss_at $s "$W/onebit.0.log")
  check 'awk -v a="$a" -v b="$b" "BEGIN { d = (b - a) / a; if (d < 0) d = -d; exit !(a != \"\" && b != \"\" && d <= 0.05) }"' \
    "step $s: onebit's loss $b is not within 5% of fp32's $a"
  fb=$(bytes_at $s "$W/fp32.0.log"); ob=$(bytes_at $s "$W/onebit.0.log")
  check '[ -n "$fb" ] && [ -n "$ob" ] && [ $((ob * 16)) -le "$fb" ]' \
    "step $s: onebit sent $ob bytes, fp32 $fb: not 16x fewer"
done
check 'awk -v a="$(loss_at 4 "$W/onebit.0.log")" -v b="$(loss_at 16 "$W/onebit.0.log")" "BEGIN { exit !(b < a - 0.1) }"' \
  "onebit's loss did not fall after the warm-up: $(loss_at 4 "$W/onebit.0.log") at step 4, $(loss_at 16 "$W/onebit.0.log") at 16"
# the all-to-all's connections are opened at start-up, before step 1 (not inside the first compressed step)
check 'awk "/all-to-all connections to 3 ranks/ { c = NR } /^step +1\// { s = NR } END { exit !(c && s && c < s) }" "$W/onebit.0.log"' \
  "no start-up all-to-all before step 1: $(grep -m1 "connections" "$W/onebit.0.log")"
check 'grep -q "\"comm_bytes\":$(bytes_at 16 "$W/onebit.0.log")}" "$W/onebit/metrics.jsonl"' \
  "metrics.jsonl lacks step 16's comm_bytes $(bytes_at 16 "$W/onebit.0.log"): $(tail -n 1 "$W/onebit/metrics.jsonl")"
worst=$(for s in $(seq 5 16); do echo "$(loss_at $s "$W/fp32.0.log") $(loss_at $s "$W/onebit.0.log") $s"; done |
  awk '{ d = ($2 - $1) / $1; if (d > w) { w = d; at = $3 } } END { printf "%.2f%% at step %d", 100 * w, at }')
echo "after the warm-up onebit's loss is at most $worst above fp32's"
echo "4 ranks, step 16: fp32 loss $(loss_at 16 "$W/fp32.0.log"), $(bytes_at 16 "$W/fp32.0.log") bytes; onebit loss $(loss_at 16 "$W/onebit.0.log"), $(bytes_at 16 "$W/onebit.0.log") bytes"

# ... --comm-refresh 1: every step after the warm-up is a refresh whose v decays by b2^1 with bc2 = 1 - b2^t, which is
# AdamW itself, its gradients reduced in bf16: on one rank (nothing to reduce) every step's loss and the final
# weights are fp32's, bit for bit
runn every 1 --comm onebit --comm-warmup 4 --comm-refresh 1 --grad-accum 4
runn fp1 1 --comm fp32 --grad-accum 4
same=1
for s in $(seq 1 16); do [ -n "$(loss_at $s "$W/every.0.log")" ] && [ "$(loss_at $s "$W/every.0.log")" = "$(loss_at $s "$W/fp1.0.log")" ] || same=0; done
wa=$(sed -n -E 's/^rank 0 weights: (.*)/\1/p' "$W/every.0.log") wb=$(sed -n -E 's/^rank 0 weights: (.*)/\1/p' "$W/fp1.0.log")
check '[ $same = 1 ] && [ -n "$wa" ] && [ "$wa" = "$wb" ]' \
  "--comm-refresh 1 (AdamW every step) differs from fp32: step 16 $(loss_at 16 "$W/every.0.log") vs $(loss_at 16 "$W/fp1.0.log"), weights '$wa' vs '$wb'"

# 2. checkpoints hold no 1-bit Adam errors: the size of fp32's; stopped after step 10 and resumed on 4 ranks, the
# errors start from zero (said) and the loss ends within 1% of the uninterrupted run's
check '[ -f "$W/onebit/checkpoint.bin" ] && [ "$(stat -c %s "$W/onebit/checkpoint.bin")" = "$(stat -c %s "$W/fp32/checkpoint.bin")" ]' \
  "a onebit checkpoint is $(stat -c %s "$W/onebit/checkpoint.bin") bytes, fp32's $(stat -c %s "$W/fp32/checkpoint.bin")"
runn part 4 --comm onebit --comm-warmup 4 --comm-var-steps 0 --run-steps 10
cp -r "$W/part" "$W/part2"
runn part 4 --comm onebit --comm-warmup 4 --comm-var-steps 0 --resume
a=$(loss_at 16 "$W/onebit.0.log") b=$(loss_at 16 "$W/part.0.log")
check 'grep -q "errors start from zero" "$W/part.0.log" && awk -v a="$a" -v b="$b" "BEGIN { d = (b - a) / a; if (d < 0) d = -d; exit !(a != \"\" && b != \"\" && d <= 0.01) }"' \
  "resumed at step 10: step 16's loss $b, the uninterrupted run's $a (want within 1%, errors reset): $(tail -n 2 "$W/part.0.log")"
echo "resumed at step 10 (1-bit Adam errors reset): step 16's loss $b, uninterrupted $a"
# ... on 2 ranks
runn part2 2 --comm onebit --comm-warmup 4 --comm-var-steps 0 --resume --grad-accum 2
check 'grep -qE "^step +16/16" "$W/part2.0.log"' "a 4-rank onebit checkpoint resumed on 2 ranks: $(tail -n 3 "$W/part2.0.log")"

# 3. one process: the compression runs (the loss leaves fp32's after the warm-up), nothing is sent. No
# --comm-warmup: the default, --warmup's 2; with --comm-var-steps 1 step 3 is a variance step (AdamW), step 4
# compressed (step 4's loss, of step 3's weights, is still fp32's; step 5's is not)
MLM_TEST_INF_GRAD=9 runn one 1 --comm onebit --grad-accum 4 --comm-var-steps 1
check 'grep -qE "^step +16/16" "$W/one.0.log"' "1 rank, onebit: the run failed: $(tail -n 3 "$W/one.0.log")"
check 'grep -q "step 9: .*not finite; update skipped" "$W/one.0.log"' \
  "1 rank, onebit: an infinite gradient at step 9 was not skipped: $(grep -m1 "step 9" "$W/one.0.log")"
check 'grep -qE "allocated before step 1: ([0-9]+) bytes \(the plan: \1 bytes\)" "$W/one.0.log"' \
  "1 rank, onebit: the plan differs from what was allocated: $(grep "allocated before" "$W/one.0.log")"
check '[ -n "$(loss_at 4 "$W/one.0.log")" ] && [ "$(loss_at 4 "$W/one.0.log")" = "$(loss_at 4 "$W/fp32.0.log")" ] && [ "$(loss_at 5 "$W/one.0.log")" != "$(loss_at 5 "$W/fp32.0.log")" ]' \
  "1 rank, onebit, the default warm-up (2 steps) and a variance step at 3: step 4 should equal fp32's and step 5 differ: $(loss_at 4 "$W/one.0.log") $(loss_at 5 "$W/one.0.log")"
check 'grep -qE "^step +8/" "$W/one.0.log" && ! grep -E "^step +8/" "$W/one.0.log" | grep -q comm_bytes && grep -q "\"comm_bytes\":0}" "$W/one/metrics.jsonl"' \
  "1 rank: the log line has no comm_bytes (nothing is sent) and metrics.jsonl says 0: $(grep -E "^step +8/" "$W/one.0.log")"

# 4. --comm onebit --comm-refresh 3 on 2 ranks, the slab in several parts (--bucket-mb 0.005: buckets of 1,308
# elements, parts of 4), each exchanged after the backward in the forward's order while the next step's forward
# runs (each layer waits for its part): the variance steps 5, 7, 10, 13, 16 (spacing 1, then 2, then 3) send bf16's
# bytes (over 8x the others), the rest compressed
PARTS=(--comm onebit --comm-warmup 4 --comm-refresh 3 --comm-var-steps 1 --grad-accum 2 --bucket-mb 0.005)
runn refresh 2 "${PARTS[@]}"
check 'grep -qE "^step +16/16" "$W/refresh.0.log"' "--comm-refresh 3: the run failed: $(tail -n 3 "$W/refresh.0.log")"
parts=$(sed -n -E 's/^comm: onebit .* in ([0-9]+) parts after the backward, under the next forward.*/\1/p' "$W/refresh.0.log")
check '[ -n "$parts" ] && [ "$parts" -ge 3 ]' "--bucket-mb 0.005: onebit in '$parts' parts, want at least 3"
# refreshes LOG: the steps after the warm-up that sent over 8x step 6's bytes (bf16's: the variance steps)
refreshes() {
  local low s b got=""
  low=$(bytes_at 6 "$W/refresh.0.log")
  for s in $(seq 5 16); do
    b=$(bytes_at $s "$1")
    [ -n "$b" ] && [ -n "$low" ] && [ "$b" -gt $((8 * low)) ] && got="$got $s"
  done
  echo "$got"
}
check '[ "$(refreshes "$W/refresh.0.log")" = " 5 7 10 13 16" ]' "--comm-refresh 3 --comm-var-steps 1: bf16-sized steps '$(refreshes "$W/refresh.0.log")', want ' 5 7 10 13 16'"
b2=$(bytes_at 2 "$W/refresh.0.log") b7=$(bytes_at 7 "$W/refresh.0.log")  # a warm-up step, a refresh: both bf16
check '[ -n "$b2" ] && [ "$b7" = "$b2" ]' "a refresh step sent $b7 bytes, a warm-up step $b2: want the same (bf16)"
w1=$(bytes_at 2 "$W/onebit.0.log") w32=$(bytes_at 2 "$W/fp32.0.log")  # 4 ranks: the warm-up's bf16 is half fp32's
check '[ -n "$w1" ] && [ -n "$w32" ] && [ $((2 * w1)) -ge $((w32 - 64)) ] && [ $((2 * w1)) -le $((w32 + 64)) ]' \
  "a warm-up step sent $w1 bytes, want half of fp32's $w32 (bf16)"
check 'counts_agree refresh 2' "--comm-refresh 3: the trainer's byte counts differ from the CPU NCCL's"
# ... stopped after step 8 (between the variance steps 7 and 10) and resumed: the schedule, the lazy update's v
# and its bias correction depend on the step alone, so the resumed run has its variance steps at 10, 13 and 16 too
runn rpart 2 "${PARTS[@]}" --run-steps 8
runn rpart 2 "${PARTS[@]}" --resume
check 'grep -qE "^step +16/16" "$W/rpart.0.log" && [ "$(refreshes "$W/rpart.0.log")" = " 10 13 16" ]' \
  "--comm-refresh 3 resumed at step 8: bf16-sized steps '$(refreshes "$W/rpart.0.log")', want ' 10 13 16': $(tail -n 2 "$W/rpart.0.log")"
# ... twice, the same bits: every step's loss and both ranks' weights
runn again 2 "${PARTS[@]}"
same=1
for s in $(seq 1 16); do [ -n "$(loss_at $s "$W/again.0.log")" ] && [ "$(loss_at $s "$W/again.0.log")" = "$(loss_at $s "$W/refresh.0.log")" ] || same=0; done
wa=$(sed -n -E 's/^rank 1 weights: (.*)/\1/p' "$W/again.1.log") wb=$(sed -n -E 's/^rank 1 weights: (.*)/\1/p' "$W/refresh.1.log")
check '[ $same = 1 ] && [ -n "$wa" ] && [ "$wa" = "$wb" ] && same_weights again 2' \
  "onebit in parts, twice: step 16 $(loss_at 16 "$W/again.0.log") vs $(loss_at 16 "$W/refresh.0.log"), weights '$wa' vs '$wb'"

# 5. bad input: one line naming the flag, exit 1, nothing written
bad_input() {  # bad_input WHAT EXPECTED ARGS...
  local what=$1 want=$2 out rc; shift 2
  out=$($TRAINER "${COMMON[@]}" --out "$W/bad" "$@" 2>&1); rc=$?
  [ $rc = 1 ] && [ "$(printf '%s\n' "$out" | wc -l)" = 1 ] && printf '%s' "$out" | grep -q -- "$want" && [ ! -e "$W/bad" ] ||
    { echo "  $what: rc $rc, output: $out"; return 1; }
}
check 'bad_input "unknown --comm" "--comm int8: expected fp32, bf16 or onebit" --comm int8' "unknown --comm accepted"
check 'bad_input "warm-up too long" "--comm-warmup 16" --comm onebit --comm-warmup 16' "--comm-warmup 16 of 16 steps"
check 'bad_input "warm-up without onebit" "--comm-warmup: only with --comm onebit" --comm-warmup 3' "--comm-warmup alone"
check 'bad_input "onebit with zero" "--comm onebit with --zero 1" --comm onebit --zero 1' "onebit with --zero 1"
check 'bad_input "refresh without onebit" "--comm-refresh: only with --comm onebit" --comm-refresh 5' "--comm-refresh alone"
check 'bad_input "var-steps without onebit" "--comm-var-steps: only with --comm onebit" --comm-var-steps 2' "--comm-var-steps alone"
check 'bad_input "refresh -1" "--comm-refresh -1: expected an integer in \[0," --comm onebit --comm-refresh -1' "--comm-refresh -1"
out=$($TRAINER --bench --preset tiny --seq 32 --batch 4 --comm onebit 2>&1); rc=$?
check '[ $rc = 1 ] && printf "%s" "$out" | grep -q "not with --bench"' "onebit with --bench: rc $rc: $out"

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
