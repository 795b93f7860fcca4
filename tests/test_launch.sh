#!/usr/bin/env bash
# test_launch.sh: several ranks of ./trainer_cpu started by hand with the variables srun or torchrun set:
#   - no hangs: a rank SIGKILLed mid-training makes the other exit non-zero within 60 s, naming the step and
#     the collective (of 3 ranks: both others); a rank SIGSTOPped (alive, so only --nccl-timeout can catch it: NCCL_EMU_TIMEOUT_S is
#     600) makes the other exit non-zero after --nccl-timeout, naming the step and the collective;
#   - agreement: ranks given different flags or different data all stop, saying what differs; ranks with
#     different free memory all take the smallest automatic micro-batch;
#   - launch: inside a Slurm step (SLURM_STEP_ID set), torchrun-style RANK/WORLD_SIZE/LOCAL_RANK;
#   - bootstrap: --bootstrap file with a stale id file in --out; two launches at once on one node (TCP);
#     a stranger on the same MASTER_PORT is refused and the launch it tried to join goes on; a black-holed
#     MASTER_ADDR costs --nccl-timeout, not the kernel's SYN retries;
#   - agreement messages name the flag and both values (--lr, --steps, --ckpt-every under --zero 1);
#   - the environment: RANK without WORLD_SIZE (and the reverse, and SLURM_NTASKS > 1 without SLURM_PROCID)
#     is an error; bad EMU_DEVICE_BYTES / NCCL_EMU_TIMEOUT_S exit 1;
#   - rank 0's checkpoint and export writes may outlast --nccl-timeout (MLM_TEST_SLOW_WRITE_S).
# Run by tests/run.sh; needs tools/requirements.txt (tools/prepare.py).
cd "$(dirname "$0")/.."
pass=0; fail=0
ok()  { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL test_launch: $*"; }
check() { if eval "$1"; then ok; else bad "$2"; fi; }
W=$(mktemp -d /tmp/mlm_launch_XXXXXX)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill -CONT "$p" 2>/dev/null; kill -KILL "$p" 2>/dev/null; done; rm -rf "$W"; }
trap cleanup EXIT
export EMU_THREADS=1
unset SLURM_NTASKS SLURM_PROCID SLURM_LOCALID SLURM_JOB_ID SLURM_STEP_ID SLURM_STEPID SLURM_RESTART_COUNT \
  SLURM_JOB_NODELIST SLURM_STEP_NODELIST MASTER_ADDR MASTER_PORT RANK WORLD_SIZE LOCAL_RANK

python3 tools/prepare.py bytes --input cpu tests --out "$W/data" --seq-len 32 --val-fraction 0.3 >"$W/prep.log" 2>&1
check '[ -f "$W/data/train_00000.bin" ]' "tools/prepare.py made no shards: $(tail -n 3 "$W/prep.log")"
COMMON=(--data "$W/data/train_*.bin" --preset tiny --seq 32 --batch 8 --lr 5e-3 --warmup 2 --seed 7)
rank() {  # rank R WORLD OUT LOG ARGS...: start rank R of WORLD in the background (hand-set srun variables)
  local r=$1 n=$2 out=$3 log=$4; shift 4
  SLURM_NTASKS=$n SLURM_PROCID=$r SLURM_LOCALID=$r NCCL_EMU_TIMEOUT_S=600 ./trainer_cpu "${COMMON[@]}" --out "$out" \
    "$@" >"$log" 2>&1 &
  PIDS+=($!)
}
wait_step() { for i in $(seq 1 600); do grep -qE "^step +$1/" "$2" && return 0; sleep 0.05; done; return 1; }
wait_gone() {  # wait_gone PID LIMIT_S: wait until PID exits (at most LIMIT_S); sets rc (or "running") and secs
  local t0; t0=$(date +%s.%N)
  for i in $(seq 1 $(($2 * 20))); do kill -0 "$1" 2>/dev/null || break; sleep 0.05; done
  secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  if kill -0 "$1" 2>/dev/null; then rc=running; return; fi
  wait "$1"; rc=$?
}

# 1. a rank SIGKILLed mid-training: the other exits non-zero within 60 s, naming the step and the collective
rank 0 2 "$W/k" "$W/k0.log" --steps 100000 --nccl-timeout 50
rank 1 2 "$W/k" "$W/k1.log" --steps 100000 --nccl-timeout 50
p0=${PIDS[-2]}; p1=${PIDS[-1]}
wait_step 3 "$W/k0.log"
kill -KILL "$p1"
wait_gone "$p0" 60
msg=$(grep "aborting the communicator" "$W/k0.log")
check '[ "$rc" != running ] && [ "$rc" != 0 ] && echo "$msg" | grep -qE "rank 0 of 2: step [0-9]+: .*AllReduce.*died"' \
  "SIGKILLed peer: rank 0 ended '$rc' after ${secs}s: $(tail -n 1 "$W/k0.log")"
echo "  (SIGKILLed rank 1: rank 0 exited $rc after ${secs} s: ${msg#trainer: })"

# 1b. of 3 ranks, rank 2 SIGKILLed: both survivors exit non-zero within 60 s
for r in 0 1 2; do rank $r 3 "$W/k3" "$W/k3_$r.log" --steps 100000 --nccl-timeout 50; done
wait_step 2 "$W/k3_0.log"
kill -KILL "${PIDS[-1]}"
for r in 0 1; do
  wait_gone "${PIDS[-3 + r]}" 60
  check '[ "$rc" != running ] && [ "$rc" != 0 ] && grep -qE "rank $r of 3: step [0-9]+: .*AllReduce.*(died|aborted)" "$W/k3_$r.log"' \
    "3 ranks, rank 2 SIGKILLed: rank $r ended '$rc' after ${secs}s: $(tail -n 1 "$W/k3_$r.log")"
done

# 2. a rank SIGSTOPped: alive, so only the --nccl-timeout deadline can catch it
rank 0 2 "$W/s" "$W/s0.log" --steps 100000 --nccl-timeout 3
rank 1 2 "$W/s" "$W/s1.log" --steps 100000 --nccl-timeout 3
p0=${PIDS[-2]}; p1=${PIDS[-1]}
wait_step 3 "$W/s0.log"
kill -STOP "$p1"
wait_gone "$p0" 60
msg=$(grep "aborting the communicator" "$W/s0.log")
check '[ "$rc" != running ] && [ "$rc" != 0 ] && echo "$msg" | grep -qE "rank 0 of 2: step [0-9]+: .*AllReduce.*: no progress for [0-9]+ s \(--nccl-timeout 3\)"' \
  "SIGSTOPped peer: rank 0 ended '$rc' after ${secs}s: $(tail -n 1 "$W/s0.log")"
check 'awk -v s="$secs" "BEGIN { exit !(s >= 2.5 && s < 30) }"' "SIGSTOPped peer: rank 0 took ${secs}s with --nccl-timeout 3"
echo "  (SIGSTOPped rank 1, --nccl-timeout 3: rank 0 exited $rc after ${secs} s)"
kill -CONT "$p1"
wait_gone "$p1" 30
# (whether rank 1 first sees rank 0's abort or rank 0's exit is a race: either is NCCL's remote error)
check '[ "$rc" != running ] && [ "$rc" != 0 ] && grep -qE "rank 1 of 2: step [0-9]+: .*AllReduce.*(rank 0 aborted the communicator|remote process exited, aborted or timed out)" "$W/s1.log"' \
  "the continued rank 1 ended '$rc': $(tail -n 1 "$W/s1.log")"

# 3. agreement: different flags, different data: every rank stops, naming what differs
rank 0 2 "$W/a" "$W/a0.log" --steps 5
rank 1 2 "$W/a" "$W/a1.log" --steps 7 --lr 1e-3
wait "${PIDS[-2]}"; rc0=$?; wait "${PIDS[-1]}"; rc1=$?
check '[ $rc0 = 1 ] && [ $rc1 = 1 ] && grep -q "rank 0 of 2: the ranks disagree on --lr: 0.005 here, 0.001 on another rank" "$W/a0.log" &&
  grep -q "rank 1 of 2: the ranks disagree on --lr: 0.001 here, 0.005 on another rank" "$W/a1.log" &&
  grep -q "rank 1 of 2: the ranks disagree on --steps: 7 here, from 5 to 7 over the ranks" "$W/a1.log"' \
  "different --lr and --steps: exits $rc0 $rc1: $(tail -n 2 "$W/a0.log" "$W/a1.log")"
# --ckpt-every changes the collectives (under --zero 1 every rank gathers the shards for rank 0 to write)
rank 0 2 "$W/ce" "$W/ce0.log" --steps 5 --zero 1 --ckpt-every 2
rank 1 2 "$W/ce" "$W/ce1.log" --steps 5 --zero 1 --ckpt-every 3
wait "${PIDS[-2]}"; rc0=$?; wait "${PIDS[-1]}"; rc1=$?
check '[ $rc0 = 1 ] && [ $rc1 = 1 ] && grep -q "rank 0 of 2: the ranks disagree on --ckpt-every: 2 here, from 2 to 3 over the ranks" "$W/ce0.log" &&
  grep -q "rank 1 of 2: the ranks disagree on --ckpt-every: 3 here" "$W/ce1.log"' \
  "different --ckpt-every under --zero 1: exits $rc0 $rc1: $(tail -n 1 "$W/ce0.log" "$W/ce1.log")"
rank 0 2 "$W/b" "$W/b0.log" --steps 5
SLURM_NTASKS=2 SLURM_PROCID=1 ./trainer_cpu --data "$W/data/val_*.bin" --preset tiny --seq 32 --batch 8 --lr 5e-3 \
  --warmup 2 --seed 7 --out "$W/b" --steps 5 >"$W/b1.log" 2>&1
rc1=$?; wait "${PIDS[-1]}"; rc0=$?
check '[ $rc0 = 1 ] && [ $rc1 = 1 ] && grep -q "disagree on the training data" "$W/b0.log" && grep -q "disagree on the training data" "$W/b1.log"' \
  "different --data: exits $rc0 $rc1: $(tail -n 1 "$W/b0.log" "$W/b1.log")"
# the automatic micro-batch: the smallest any rank can hold (a real one-step run on two ranks with 1.114 GB
# and 1.2 GB of device memory: B=68 and, capped at 4096 tokens on the CPU runtime, 128; --plan-only plans for its
# own rank alone, without the others)
python3 tools/prepare.py bytes --input cpu --out "$W/data32" --seq-len 32 --val-fraction 0 >"$W/prep32.log" 2>&1
for r in 0 1; do
  EMU_DEVICE_BYTES=$([ $r = 0 ] && echo 1.114e9 || echo 1.2e9) SLURM_NTASKS=2 SLURM_PROCID=$r SLURM_LOCALID=0 \
    NCCL_EMU_TIMEOUT_S=60 ./trainer_cpu --data "$W/data32/train_*.bin" --out "$W/p" --preset tiny --seq 32 \
    --steps 1 >"$W/p$r.log" 2>&1 &
done
wait
b_small=$(EMU_DEVICE_BYTES=1.114e9 ./trainer_cpu --data "$W/data32/train_*.bin" --out "$W/p1" --preset tiny --seq 32 \
  --plan-only 2>&1 | sed -n -E 's/.*total .* GiB for B=([0-9]+) .*/\1/p')
b2=$(sed -n -E 's/.*total .* GiB for B=([0-9]+) .*/\1/p' "$W/p0.log")
check '[ -n "$b_small" ] && [ "$b2" = "$b_small" ] && grep -q "micro-batch: B=$b_small, the smallest any rank can hold" "$W/p0.log"' \
  "1.114 GB + 1.2 GB ranks: B=$b2, one 1.114 GB rank B=$b_small: $(tail -n 2 "$W/p0.log")"

# 4. launch: a Slurm step (the job id and step id name the launch), torchrun-style variables
for r in 0 1; do
  SLURM_JOB_ID=4242 SLURM_STEP_ID=0 SLURM_NTASKS=2 SLURM_PROCID=$r SLURM_LOCALID=$r SLURM_STEP_NODELIST=localhost \
    ./trainer_cpu "${COMMON[@]}" --out "$W/j" --steps 2 >"$W/j$r.log" 2>&1 &
  WORLD_SIZE=2 RANK=$r LOCAL_RANK=$r ./trainer_cpu "${COMMON[@]}" --out "$W/t" --steps 2 >"$W/t$r.log" 2>&1 &
done
wait
check 'grep -q "2 process(es)" "$W/j0.log" && [ -f "$W/j/model.safetensors" ]' "a Slurm step of 2: $(tail -n 1 "$W/j0.log" "$W/j1.log")"
check 'grep -q "2 process(es)" "$W/t0.log" && [ -f "$W/t/model.safetensors" ]' "torchrun-style 2 ranks: $(tail -n 1 "$W/t0.log" "$W/t1.log")"

# 5. bootstrap: --bootstrap file over a stale id file (rank 1 first); two launches at once (TCP)
mkdir -p "$W/f"
head -c 160 /dev/urandom >"$W/f/nccl_id.local.0.0"
rank 1 2 "$W/f" "$W/f1.log" --steps 2 --bootstrap file
sleep 0.5
rank 0 2 "$W/f" "$W/f0.log" --steps 2 --bootstrap file
for r in 0 1; do rank $r 2 "$W/x" "$W/x$r.log" --steps 2; rank $r 2 "$W/y" "$W/y$r.log" --steps 2; done
wait
check 'grep -q "2 process(es)" "$W/f0.log" && [ -f "$W/f/model.safetensors" ] && [ ! -e "$W/f/nccl_id.local.0.0" ]' \
  "--bootstrap file over a stale id file: $(tail -n 1 "$W/f0.log" "$W/f1.log")"
check '[ -f "$W/x/model.safetensors" ] && [ -f "$W/y/model.safetensors" ]' \
  "two launches at once: $(tail -qn 1 "$W/x0.log" "$W/x1.log" "$W/y0.log" "$W/y1.log")"
# a stranger (another launch's rank 1) on the same MASTER_PORT is refused; the launch it tried goes on
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])')
MASTER_PORT=$port rank 0 2 "$W/m" "$W/m0.log" --steps 2 --nccl-timeout 30
sleep 0.5
out=$(MASTER_PORT=$port SLURM_NTASKS=2 SLURM_PROCID=1 ./trainer_cpu "${COMMON[@]}" --out "$W/other" --steps 2 --nccl-timeout 2 2>&1); rc=$?
MASTER_PORT=$port rank 1 2 "$W/m" "$W/m1.log" --steps 2 --nccl-timeout 30
wait
check '[ $rc = 1 ] && echo "$out" | grep -q "got no NCCL id from rank 0 at 127.0.0.1:$port .*refused this launch"' \
  "a stranger on port $port: exit $rc: $(echo "$out" | tail -n 1)"
check '[ -f "$W/m/model.safetensors" ]' "the launch the stranger tried to join: $(tail -n 1 "$W/m0.log" "$W/m1.log")"

# 6. the environment: a rank or world-size variable without the other is an error (never a silent rank 0);
#    a bad variable of the CPU runtime or NCCL exits 1 (exit code 2 means divergence)
expect_env() {  # expect_env MESSAGE VAR=VALUE...: the trainer exits 1 saying MESSAGE
  local want=$1; shift
  out=$(env "$@" ./trainer_cpu "${COMMON[@]}" --out "$W/e" --steps 2 --nccl-timeout 5 2>&1); rc=$?
  check '[ $rc = 1 ] && echo "$out" | grep -qF "$want"' "$* : exit $rc, want 1 and '$want': $(echo "$out" | tail -n 1)"
}
expect_env "WORLD_SIZE=2 is set but RANK is not" WORLD_SIZE=2
expect_env "RANK=1 is set but WORLD_SIZE is not" RANK=1
expect_env "SLURM_NTASKS=2 is set but SLURM_PROCID is not" SLURM_NTASKS=2 SLURM_LOCALID=0
expect_env "EMU_DEVICE_BYTES=lots is not a non-negative number" EMU_DEVICE_BYTES=lots
for r in 0 1; do
  SLURM_NTASKS=2 SLURM_PROCID=$r SLURM_LOCALID=$r NCCL_EMU_TIMEOUT_S=soon ./trainer_cpu "${COMMON[@]}" --out "$W/nt" \
    --steps 2 --nccl-timeout 20 >"$W/nt$r.log" 2>&1 &
  PIDS+=($!)
done
wait "${PIDS[-2]}"; rc0=$?; wait "${PIDS[-1]}"; rc1=$?
check '[ $rc0 = 1 ] && [ $rc1 = 1 ] && grep -q "NCCL_EMU_TIMEOUT_S=soon is not a number of seconds" "$W/nt0.log"' \
  "NCCL_EMU_TIMEOUT_S=soon: exits $rc0 $rc1 (want 1 1): $(tail -n 1 "$W/nt0.log")"

# 7. a black-holed MASTER_ADDR: rank 0's address drops the connection (here a socket on 127.0.0.1 whose accept
#    queue is full, so the kernel drops the SYNs, as a firewall would); rank 1 gives up at --nccl-timeout 2,
#    not after the kernel's SYN retries (over two minutes)
python3 -c '
import socket, sys, time
ls = socket.socket(); ls.bind(("127.0.0.1", 0)); ls.listen(0)
fill = []
for i in range(4):
    s = socket.socket(); s.setblocking(False); s.connect_ex(ls.getsockname()); fill.append(s); time.sleep(0.05)
print(ls.getsockname()[1], flush=True)
time.sleep(120)' >"$W/bh.port" &
PIDS+=($!); bh=$!
for i in $(seq 1 100); do [ -s "$W/bh.port" ] && break; sleep 0.05; done
port=$(cat "$W/bh.port")
t0=$(date +%s.%N)
out=$(SLURM_NTASKS=2 SLURM_PROCID=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port ./trainer_cpu "${COMMON[@]}" --out "$W/bh" \
  --steps 2 --nccl-timeout 2 2>&1); rc=$?
secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
kill "$bh" 2>/dev/null
check '[ -n "$port" ] && [ $rc = 1 ] && awk -v s="$secs" "BEGIN { exit !(s < 10) }" &&
  echo "$out" | grep -q "got no NCCL id from rank 0 at 127.0.0.1:$port in 2 s (last: .*no answer to the connection"' \
  "black-holed MASTER_ADDR (port $port), --nccl-timeout 2: exit $rc after ${secs}s: $(echo "$out" | tail -n 1)"
echo "  (black-holed MASTER_ADDR, --nccl-timeout 2: rank 1 gave up after ${secs} s)"

# 8. rank 0's writes may outlast --nccl-timeout: the others' deadline covers them. Rank 0 takes 2 s more for
#    each checkpoint (steps 2 and 4) and the export, with --nccl-timeout 1 and --zero 1; both ranks finish.
t0=$(date +%s.%N)
for r in 0 1; do
  MLM_TEST_SLOW_WRITE_S=2 rank $r 2 "$W/sw" "$W/sw$r.log" --steps 4 --ckpt-every 2 --zero 1 --nccl-timeout 1
done
wait "${PIDS[-2]}"; rc0=$?; wait "${PIDS[-1]}"; rc1=$?
secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
check '[ $rc0 = 0 ] && [ $rc1 = 0 ] && [ -f "$W/sw/model.safetensors" ] && [ -f "$W/sw/checkpoint-2.bin" ] &&
  awk -v s="$secs" "BEGIN { exit !(s >= 6) }"' \
  "slow writes of rank 0 (2 s each, --nccl-timeout 1): exits $rc0 $rc1 after ${secs}s: $(tail -n 1 "$W/sw0.log" "$W/sw1.log")"
echo "  (rank 0 writing 2 s longer each time, --nccl-timeout 1: both ranks finished in ${secs} s)"

echo "$pass passed, $fail failed"
[ $fail = 0 ]
