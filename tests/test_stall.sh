#!/usr/bin/env bash
# test_stall.sh: no host call blocks on a stalled collective outside the watchdog (CPU build, whose streams
# run as a GPU's do: cpu/runtime.cpp). MLM_TEST_STALL=STEP makes one rank's step-STEP collectives never
# complete (a kernel spins on the stream ahead of them); with --nccl-timeout 3 and NCCL_EMU_TIMEOUT_S=600 (so
# only the trainer's watchdog can end it), every rank must exit 1 within --nccl-timeout + 10 s, naming the
# step: 1 rank, 2 ranks (rank 1 stalls), 3 ranks (rank 0 stalls), and 2 ranks with every stream operation
# delayed (EMU_STREAM_DELAY_US) and --zero 1. A bad MLM_TEST_STALL value is one clear error. Also the CPU
# runtime's streams: a run with every stream operation delayed gives the same checkpoint; EMU_THREADS=100000
# and a bad EMU_STREAM_DELAY_US are clear errors.
# Run by tests/run.sh; needs tools/requirements.txt (tools/prepare.py).
cd "$(dirname "$0")/.."
pass=0; fail=0
ok()  { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL test_stall: $*"; }
check() { if eval "$1"; then ok; else bad "$2"; fi; }
W=$(mktemp -d /tmp/mlm_stall_XXXXXX)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; done; rm -rf "$W"; }
trap cleanup EXIT
export EMU_THREADS=1
unset SLURM_NTASKS SLURM_PROCID SLURM_LOCALID SLURM_JOB_ID SLURM_STEP_ID SLURM_STEPID SLURM_RESTART_COUNT \
  SLURM_JOB_NODELIST SLURM_STEP_NODELIST MASTER_ADDR MASTER_PORT RANK WORLD_SIZE LOCAL_RANK MLM_TEST_STALL

python3 tools/prepare.py bytes --input cpu tests --out "$W/data" --seq-len 32 --val-fraction 0.3 >"$W/prep.log" 2>&1
check '[ -f "$W/data/train_00000.bin" ]' "tools/prepare.py made no shards: $(tail -n 3 "$W/prep.log")"
COMMON=(--data "$W/data/train_*.bin" --preset tiny --seq 32 --batch 8 --lr 5e-3 --warmup 2 --seed 7 --steps 100000
  --nccl-timeout 3)
LIMIT=13  # --nccl-timeout + 10 s
now() { date +%s.%N; }

# run_world NAME WORLD STALLED_RANK STEP [ENV...] -- [FLAGS...]: start WORLD ranks, rank STALLED_RANK with
# MLM_TEST_STALL=STEP; wait for all of them (at most 60 s) and check each exits 1 in time, naming the step.
run_world() {
  local name=$1 n=$2 who=$3 step=$4; shift 4
  local envs=() r t0 p
  while [ $# -gt 0 ] && [ "$1" != -- ]; do envs+=("$1"); shift; done
  [ "${1:-}" = -- ] && shift
  local pids=()
  for r in $(seq 0 $((n - 1))); do
    local stall=()
    [ "$r" = "$who" ] && stall=(MLM_TEST_STALL="$step")
    env "${envs[@]}" "${stall[@]}" SLURM_NTASKS=$n SLURM_PROCID=$r SLURM_LOCALID=$r NCCL_EMU_TIMEOUT_S=600 \
      ./trainer_cpu "${COMMON[@]}" --out "$W/$name" "$@" >"$W/$name.$r.log" 2>&1 &
    pids+=($!); PIDS+=($!)
  done
  # the clock starts when the stalled rank says its step stalls
  for i in $(seq 1 1200); do grep -q "MLM_TEST_STALL: step $step" "$W/$name.$who.log" && break; sleep 0.05; done
  t0=$(now)
  check 'grep -q "MLM_TEST_STALL: step $step" "$W/$name.$who.log"' \
    "$name: rank $who never reached its stalled step $step: $(tail -n 2 "$W/$name.$who.log")"
  for r in $(seq 0 $((n - 1))); do
    p=${pids[$r]}
    for i in $(seq 1 1200); do kill -0 "$p" 2>/dev/null || break; sleep 0.05; done
    local secs rc
    secs=$(awk -v a="$t0" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }')
    if kill -0 "$p" 2>/dev/null; then
      rc=running
      kill -KILL "$p"
    else
      wait "$p"; rc=$?
    fi
    local msg
    msg=$(grep "aborting the communicator" "$W/$name.$r.log" | head -n 1)
    check '[ "$rc" = 1 ] && awk -v s="$secs" -v l=$LIMIT "BEGIN { exit !(s <= l) }"' \
      "$name: rank $r of $n ended '$rc' after ${secs} s (limit $LIMIT s): $(tail -n 1 "$W/$name.$r.log")"
    check 'echo "$msg" | grep -q "rank $r of $n: step $step: "' \
      "$name: rank $r's last words do not name step $step: $(tail -n 1 "$W/$name.$r.log")"
    echo "  ($name: rank $r of $n exited $rc ${secs} s after the stall: ${msg#trainer: })"
  done
}

run_world one 1 0 3
run_world two 2 1 3
run_world three 3 0 2
run_world delayed 2 0 2 EMU_STREAM_DELAY_US=200 -- --zero 1

# a bad value: one clear error naming the variable
MLM_TEST_STALL=x ./trainer_cpu "${COMMON[@]}" --out "$W/bad" >"$W/bad.log" 2>&1
rc=$?
check '[ $rc != 0 ] && grep -q "MLM_TEST_STALL=x" "$W/bad.log"' "MLM_TEST_STALL=x: exit $rc, $(tail -n 1 "$W/bad.log")"

# the CPU runtime's streams: with every stream operation delayed (EMU_STREAM_DELAY_US), host code that read
# a result before synchronizing would read stale data; a delayed 2-rank run must give byte for byte the
# checkpoint of an undelayed one
SHORT=(--data "$W/data/train_*.bin" --preset tiny --seq 32 --batch 8 --lr 5e-3 --warmup 2 --seed 7 --steps 4
  --val "$W/data/val_*.bin" --val-every 4 --val-batches 2)
for d in 0 300; do
  for r in 0 1; do
    EMU_STREAM_DELAY_US=$d SLURM_NTASKS=2 SLURM_PROCID=$r SLURM_LOCALID=$r ./trainer_cpu "${SHORT[@]}" \
      --out "$W/det$d" >"$W/det$d.$r.log" 2>&1 &
    PIDS+=($!)
  done
  wait "${PIDS[-2]}"; r0=$?; wait "${PIDS[-1]}"; r1=$?
  check '[ $r0 = 0 ] && [ $r1 = 0 ]' "EMU_STREAM_DELAY_US=$d, 2 ranks: exit $r0 $r1: $(tail -n 1 "$W/det$d.0.log")"
done
check 'cmp -s "$W/det0/checkpoint.bin" "$W/det300/checkpoint.bin"' \
  "EMU_STREAM_DELAY_US=300 changed the checkpoint: $(cmp "$W/det0/checkpoint.bin" "$W/det300/checkpoint.bin" 2>&1)"
check '[ "$(grep "val loss" "$W/det0.0.log" | sed "s/|.*ms.*//")" = "$(grep "val loss" "$W/det300.0.log" | sed "s/|.*ms.*//")" ]' \
  "EMU_STREAM_DELAY_US=300 changed the validation line: $(grep "val loss" "$W/det300.0.log")"

# the CPU runtime's knobs: an absurd value is one clear error, not a crash
EMU_THREADS=100000 ./trainer_cpu "${SHORT[@]}" --out "$W/thr" >"$W/thr.log" 2>&1
rc=$?
check '[ $rc = 2 ] && grep -q "EMU_THREADS=100000 is out of range" "$W/thr.log"' \
  "EMU_THREADS=100000: exit $rc, $(tail -n 1 "$W/thr.log")"
EMU_STREAM_DELAY_US=abc ./trainer_cpu "${SHORT[@]}" --out "$W/dly" >"$W/dly.log" 2>&1
rc=$?
check '[ $rc = 2 ] && grep -q "EMU_STREAM_DELAY_US=abc" "$W/dly.log"' "EMU_STREAM_DELAY_US=abc: exit $rc, $(tail -n 1 "$W/dly.log")"

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
