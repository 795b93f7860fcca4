#!/usr/bin/env bash
# test_run_dir.sh: one run per --out, every file whole, and the signals that stop a run, on the CPU build
# (./trainer_cpu), tiny model:
#   - a finished run's --out: a new run there without --resume is refused and every file stays as it was;
#     --overwrite replaces it (its numbered checkpoints, metrics and export deleted first); the records of a
#     run without a checkpoint are kept as metrics.jsonl.prev by a new run;
#   - DIR/lock: a holder (another process's fcntl lock) refuses a run, naming its host, pid and job; --eval
#     --out there is not refused; a dead holder blocks nothing; a second trainer beside a running one is
#     refused naming it; two 2-rank hand launches at once into one --out: one run forms, the other processes
#     are refused, nothing hangs;
#   - flags that were silently ignored are errors (--preset beside --init-from when it names another shape); an --out too long or a checkpoint.bin that is a directory
#     fails at the start; a resume that changes --steps or the global batch says so in one line;
#   - SIGINT and SIGHUP stop like SIGTERM (a checkpoint, exit 0); with --grad-accum the stop comes between
#     micro-batches: the step cut short is dropped, the checkpoint is the last complete step, and the resumed
#     run ends byte-identical to an uninterrupted one (also 2 ranks with the signal on one); a stop with
#     --grad-accum 100000 is answered within seconds;
#   - metrics.jsonl writes that fail (MLM_TEST_METRICS_FAIL: half a record, then ENOSPC; as root also a tmpfs
#     that fills for a few seconds mid-run) are reported once,
#     leave no torn line, and the run goes on; a partial last record left by a killed writer is cut off before
#     --eval --out appends; the export under a file-size limit (ulimit -f) appears whole or
#     not at all.
# Run by tests/run.sh; needs tools/requirements.txt (python3 tools/prepare.py). TRAINER overrides ./trainer_cpu.
cd "$(dirname "$0")/.."
TRAINER=${TRAINER:-./trainer_cpu}
TRAINER=$(cd "$(dirname "$TRAINER")" && pwd)/$(basename "$TRAINER")  # absolute: one case runs from another directory
pass=0; fail=0
ok()  { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL test_run_dir: $*"; }
check() { if eval "$1"; then ok; else bad "$2"; fi; }
W=$(mktemp -d /tmp/mlm_rundir_XXXXXX)
PIDS=(); MOUNTS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; done
  for m in "${MOUNTS[@]}"; do umount "$m" 2>/dev/null; done
  rm -rf "$W"
}
trap cleanup EXIT
export EMU_THREADS=1  # one OS thread: runs are bitwise repeatable
unset MLM_TEST_INF_GRAD MLM_TEST_INF_LOSS MLM_TEST_METRICS_FAIL

python3 tools/prepare.py bytes --input cpu --out "$W/data" --seq-len 32 --val-fraction 0.3 >"$W/prep.log" 2>&1 ||
  { echo "tools/prepare.py failed: $(tail -n 2 "$W/prep.log")"; echo "0 passed, 1 failed"; exit 1; }
COMMON=(--data "$W/data/train_*.bin" --preset tiny --seq 32 --batch 8 --lr 5e-3 --warmup 2 --seed 7 --loader-threads 1)
VAL=(--val "$W/data/val_*.bin")
ckpt_step() { python3 -c 'import struct,sys; d=open(sys.argv[1],"rb").read(56); print(struct.unpack_from("<i", d, 52)[0])' "$1" 2>/dev/null; }
sums() { (cd "$1" && find . -type f ! -name lock | sort | xargs md5sum); }
wait_step() { for i in $(seq 1 1200); do grep -qsE "^step +$1/" "$2" && return 0; sleep 0.05; done; return 1; }
wait_gone() {  # wait_gone PID LIMIT_S: sets rc (or "running") and secs
  local t0; t0=$(date +%s.%N)
  for i in $(seq 1 $(($2 * 20))); do kill -0 "$1" 2>/dev/null || break; sleep 0.05; done
  secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  if kill -0 "$1" 2>/dev/null; then rc=running; return; fi
  wait "$1"; rc=$?
}
expect_error() {  # expect_error PATTERN CMD...: exit 1 and PATTERN in the output, no training step
  local want=$1; shift
  local out; out=$(timeout 120 "$@" 2>&1); local rc=$?  # (a trainer that should have refused might train on)
  if [ $rc = 1 ] && echo "$out" | grep -q -- "$want" && ! echo "$out" | grep -q "^step "; then ok; else
    bad "expected exit 1 and '$want', got exit $rc: $(echo "$out" | tail -n 2)"
  fi
}

# 1. a finished run's --out
"$TRAINER" "${COMMON[@]}" --out "$W/a" --steps 4 --ckpt-every 1 --keep 3 >"$W/a.log" 2>&1
check '[ -f "$W/a/model.safetensors" ] && [ -f "$W/a/checkpoint-3.bin" ] && [ "$(ckpt_step "$W/a/checkpoint.bin")" = 4 ]' \
  "the first run failed: $(tail -n 2 "$W/a.log")"
before=$(sums "$W/a")
expect_error "trainer: --out $W/a holds another run (checkpoint.bin, model.safetensors, config.json, 2 checkpoint-STEP.bin): --resume continues it, --overwrite replaces it" \
  "$TRAINER" "${COMMON[@]}" --out "$W/a" --steps 4
check '[ "$(sums "$W/a")" = "$before" ]' "a refused run changed the finished run's files"
cp -r "$W/a" "$W/a2"
"$TRAINER" "${COMMON[@]}" --out "$W/a2" --steps 2 --overwrite >"$W/a2.log" 2>&1; rc=$?
check '[ $rc = 0 ] && grep -q "^--overwrite: removed 11 file(s) of the earlier run in $W/a2$" "$W/a2.log" && [ ! -e "$W/a2/checkpoint-3.bin" ] &&
  [ ! -e "$W/a2/checkpoint-2.bin" ] && [ "$(ckpt_step "$W/a2/checkpoint.bin")" = 2 ] && [ "$(grep -c . "$W/a2/metrics.jsonl")" = 2 ]' \
  "--overwrite (exit $rc): $(grep -E "overwrite|trainer:" "$W/a2.log" | head -n 2) $(ls "$W/a2" | tr '\n' ' ')"

# 2. the lock
mkdir -p "$W/l"
python3 -c 'import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)  # byte 0, as rank 0 of a run holds it
os.write(fd, b"otherhost 4242 77.0\n"); print("held", flush=True); time.sleep(120)' "$W/l/lock" >"$W/holder.log" 2>&1 &
holder=$!; PIDS+=($holder)
for i in $(seq 1 200); do grep -q held "$W/holder.log" && break; sleep 0.05; done
expect_error "trainer: --out $W/l: another run is using it: $W/l/lock is held by pid 4242 on host otherhost (job 77.0)" \
  "$TRAINER" "${COMMON[@]}" --out "$W/l" --steps 2
check '[ "$(ls "$W/l")" = lock ]' "a refused run wrote into the locked --out: $(ls "$W/l" | tr '\n' ' ')"
"$TRAINER" --eval "$W/a/checkpoint.bin" "${VAL[@]}" --batch 8 --val-batches 2 --out "$W/l" >"$W/ev.log" 2>&1; rc=$?
check '[ $rc = 0 ] && grep -q "\"kind\":\"eval\"" "$W/l/metrics.jsonl"' "--eval --out into a locked --out (it only appends a record): exit $rc: $(tail -n 1 "$W/ev.log")"
kill -KILL $holder; wait $holder 2>/dev/null
"$TRAINER" "${COMMON[@]}" --out "$W/l" --steps 2 >"$W/l.log" 2>&1; rc=$?
check '[ $rc = 0 ] && [ -f "$W/l/model.safetensors" ] && grep -q "^$(hostname) [0-9]* -$" "$W/l/lock"' \
  "a dead holder's lock blocked a run, or the lock does not name this host (exit $rc): $(tail -n 1 "$W/l.log") / $(cat "$W/l/lock")"
# (the --eval record there, of no run with a checkpoint, is kept as metrics.jsonl.prev; the new log has 2 steps)
check 'grep -q "^note: $W/l/metrics.jsonl held [0-9]* bytes of records of an earlier run without a checkpoint: kept as $W/l/metrics.jsonl.prev$" "$W/l.log" &&
  grep -q "\"kind\":\"eval\"" "$W/l/metrics.jsonl.prev" && [ "$(grep -c . "$W/l/metrics.jsonl")" = 2 ]' \
  "the records of a run without a checkpoint were not kept: $(grep note "$W/l.log")"
# a second trainer beside a running one, then SIGINT (Ctrl-C) stops the first with a checkpoint
"$TRAINER" "${COMMON[@]}" --out "$W/r" --steps 100000 >"$W/r.log" 2>&1 &
first=$!; PIDS+=($first)
wait_step 2 "$W/r.log"
expect_error "trainer: --out $W/r: another run is using it: $W/r/lock is held by pid $first on host $(hostname) (job -)" \
  "$TRAINER" "${COMMON[@]}" --out "$W/r" --steps 100000 --resume
kill -INT $first
wait_gone $first 30
check '[ "$rc" = 0 ] && grep -q "stopped after step [0-9]* (on a signal); --resume continues from its checkpoint, $W/r/checkpoint.bin$" "$W/r.log" && [ "$(ckpt_step "$W/r/checkpoint.bin")" -ge 2 ]' \
  "SIGINT: exit $rc after ${secs}s: $(tail -n 2 "$W/r.log")"
# two hand launches of 2 ranks at once into one --out: one run forms, the others are refused, none hangs
two=()
for launch in x y; do
  for r in 0 1; do
    SLURM_NTASKS=2 SLURM_PROCID=$r SLURM_LOCALID=$r NCCL_EMU_TIMEOUT_S=60 "$TRAINER" "${COMMON[@]}" --out "$W/two" \
      --steps 3 --nccl-timeout 30 >"$W/two_$launch$r.log" 2>&1 &
    two+=($!); PIDS+=($!)
  done
done
done0=0; refused=0; other=""
for p in "${two[@]}"; do
  wait_gone "$p" 60
  if [ "$rc" = 0 ]; then done0=$((done0 + 1)); elif [ "$rc" = 1 ]; then refused=$((refused + 1)); else other="$other $rc"; fi
done
check '[ $done0 = 2 ] && [ $refused = 2 ] && [ -z "$other" ] && [ "$(grep -l "another run is using it" "$W"/two_*.log | wc -l)" = 2 ] &&
  [ "$(ckpt_step "$W/two/checkpoint.bin")" = 3 ]' \
  "two launches at once: $done0 finished, $refused refused, others:$other: $(tail -q -n 1 "$W"/two_*.log | tr '\n' '|')"

# 3. flags that were ignored, an --out too long, a checkpoint.bin that is a directory
expect_error "trainer: --val-every: needs --val GLOB" "$TRAINER" "${COMMON[@]}" --out "$W/f" --steps 2 --val-every 1
expect_error "trainer: --init-from: not with --resume" "$TRAINER" "${COMMON[@]}" --out "$W/a" --steps 4 --resume --init-from "$W/a"
expect_error "trainer: --preset mini: --init-from $W/a holds another model (2 layers x 32, 2 heads, FFN 64), whose shape is used; drop --preset" \
  "$TRAINER" "${COMMON[@]}" --preset mini --out "$W/f" --steps 2 --init-from "$W/a"
expect_error "trainer: --overwrite: not with --resume" "$TRAINER" "${COMMON[@]}" --out "$W/a" --steps 4 --resume --overwrite
cd "$W" && expect_error "trainer: --out: missing its value (got the flag --resume" "$TRAINER" "${COMMON[@]}" --out --resume --steps 2
cd "$OLDPWD" || exit 1
check '[ ! -e "$W/--resume" ]' "--out --resume created a directory named --resume"
cp -r "$W/a" "$W/seed"
expect_error "trainer: --seed 8: the run in $W/seed was started with --seed 7; drop --seed to resume" \
  "$TRAINER" "${COMMON[@]}" --seed 8 --out "$W/seed" --steps 6 --resume
long="$W/long"; while [ ${#long} -lt 4079 ]; do long="$long/$(printf 'd%.0s' $(seq 1 200))"; done; long=${long:0:4079}
expect_error "expected a directory path of 1 to 4000 characters (this one has 4079)" "$TRAINER" "${COMMON[@]}" --out "$long" --steps 2
check '[ ! -e "$W/long" ]' "an --out too long was created"
mkdir -p "$W/cd/checkpoint.bin"
expect_error "trainer: --out $W/cd: $W/cd/checkpoint.bin is a directory, not a file" "$TRAINER" "${COMMON[@]}" --out "$W/cd" --steps 2
cp "$W/a/checkpoint-3.bin" "$W/cd/"
expect_error "$W/cd/checkpoint.bin is a directory, not a file" "$TRAINER" "${COMMON[@]}" --out "$W/cd" --steps 4 --resume

# 4. a resume that changes the schedule says so
"$TRAINER" "${COMMON[@]}" --out "$W/s" --steps 6 --run-steps 2 >"$W/s1.log" 2>&1
"$TRAINER" "${COMMON[@]}" --out "$W/s" --steps 6 --run-steps 1 --resume >"$W/s2.log" 2>&1
"$TRAINER" "${COMMON[@]}" --out "$W/s" --steps 8 --batch 4 --resume >"$W/s3.log" 2>&1; rc=$?
check '! grep -q "changes the schedule" "$W/s2.log" && [ $rc = 0 ] &&
  grep -q "^note: this resume changes the schedule from step 4 on: --steps 6 -> 8, the global batch (sequences) 8 -> 4$" "$W/s3.log"' \
  "the schedule note (exit $rc): $(grep -h "schedule" "$W/s2.log" "$W/s3.log")"

# 5. signals: SIGHUP like SIGTERM; with --grad-accum, a stop between micro-batches drops the step cut short
"$TRAINER" "${COMMON[@]}" --out "$W/h" --steps 100000 >"$W/h.log" 2>&1 &
p=$!; PIDS+=($p)
wait_step 2 "$W/h.log"; kill -HUP $p; wait_gone $p 30
check '[ "$rc" = 0 ] && grep -q "stopped after step [0-9]* (on a signal)" "$W/h.log" && [ -f "$W/h/checkpoint.bin" ]' \
  "SIGHUP: exit $rc: $(tail -n 2 "$W/h.log")"
ACC=(--steps 6 --grad-accum 32 --ckpt-minutes 0)  # the signal lands in some step S > 1 (timing): S is read
"$TRAINER" "${COMMON[@]}" --out "$W/gref" "${ACC[@]}" >"$W/gref.log" 2>&1
"$TRAINER" "${COMMON[@]}" --out "$W/g" "${ACC[@]}" >"$W/g1.log" 2>&1 &
p=$!; PIDS+=($p)
wait_step 1 "$W/g1.log"; sleep 0.2; kill -TERM $p; wait_gone $p 30
S=$(sed -n -E 's/^stopped on a signal between micro-batches of step ([0-9]+): that step is dropped; the checkpoint is of step [0-9]+$/\1/p' "$W/g1.log")
check '[ "$rc" = 0 ] && [ -n "$S" ] && [ "$S" -lt 6 ] && grep -q "the checkpoint is of step $((S - 1))$" "$W/g1.log" &&
  [ "$(ckpt_step "$W/g/checkpoint.bin")" = $((S - 1)) ] && [ "$(grep -c "\"kind\":\"train\"" "$W/g/metrics.jsonl")" = $((S - 1)) ]' \
  "a stop between micro-batches (exit $rc): $(tail -n 3 "$W/g1.log")"
"$TRAINER" "${COMMON[@]}" --out "$W/g" "${ACC[@]}" --resume >"$W/g2.log" 2>&1; rc=$?
check '[ $rc = 0 ] && cmp -s "$W/g/checkpoint.bin" "$W/gref/checkpoint.bin"' \
  "resumed after a dropped step, the run is not byte-identical to the uninterrupted one (exit $rc): $(tail -n 1 "$W/g2.log")"
# 2 ranks, the signal on rank 1 only: both stop after the same micro-batch, exit 0, and rank 0 saves step S-1
for r in 0 1; do
  SLURM_NTASKS=2 SLURM_PROCID=$r SLURM_LOCALID=$r NCCL_EMU_TIMEOUT_S=60 "$TRAINER" "${COMMON[@]}" --out "$W/g2r" \
    --steps 100 --grad-accum 8 >"$W/g2r$r.log" 2>&1 &
  PIDS+=($!)
done
q0=${PIDS[-2]}; q1=${PIDS[-1]}
wait_step 1 "$W/g2r0.log"; sleep 0.2; kill -TERM $q1
wait_gone $q0 30; rc0=$rc; wait_gone $q1 30; rc1=$rc
dropped=$(sed -n -E 's/^stopped on a signal between micro-batches of step ([0-9]+): .*/\1/p' "$W/g2r0.log")
check '[ "$rc0" = 0 ] && [ "$rc1" = 0 ] && [ -n "$dropped" ] && [ "$(ckpt_step "$W/g2r/checkpoint.bin")" = $((dropped - 1)) ]' \
  "2 ranks, SIGTERM to rank 1 mid-step: exits $rc0 $rc1: $(tail -q -n 1 "$W/g2r0.log" "$W/g2r1.log" | tr '\n' '|')"
# a long accumulation answers a stop within seconds
"$TRAINER" "${COMMON[@]}" --out "$W/long_acc" --steps 2 --grad-accum 100000 >"$W/la.log" 2>&1 &
p=$!; PIDS+=($p)
for i in $(seq 1 200); do grep -q "^training:" "$W/la.log" && break; sleep 0.05; done
sleep 1; kill -TERM $p; wait_gone $p 60
check '[ "$rc" = 0 ] && awk -v s="$secs" "BEGIN { exit !(s < 5) }" && [ "$(ckpt_step "$W/long_acc/checkpoint.bin")" = 0 ]' \
  "--grad-accum 100000: SIGTERM answered after ${secs}s, exit $rc: $(tail -n 2 "$W/la.log")"
echo "  (--grad-accum 100000: SIGTERM answered in ${secs} s)"

# 6. metrics.jsonl writes that fail: reported once, no torn line, the run goes on; plot.py plots the rest
MLM_TEST_METRICS_FAIL=3:2 "$TRAINER" "${COMMON[@]}" "${VAL[@]}" --val-every 4 --val-batches 2 --out "$W/m" --steps 8 \
  >"$W/m.log" 2>&1; rc=$?
steps=$(python3 -c 'import json, sys
lines = open(sys.argv[1]).read().split("\n")
assert lines[-1] == "", "no newline at the end"
print(" ".join("%s%d" % (r["kind"][0], r["step"]) for r in map(json.loads, lines[:-1])))' "$W/m/metrics.jsonl" 2>&1)
check '[ $rc = 0 ] && [ "$steps" = "t1 t2 t5 t6 t7 t8 v8" ] && [ "$(grep -c "cannot append to $W/m/metrics.jsonl: No space left on device" "$W/m.log")" = 1 ] &&
  grep -q "step 5: $W/m/metrics.jsonl is written again; the records of steps 3 to 4 are missing from it" "$W/m.log" &&
  grep -q "warning: $W/m/metrics.jsonl lacks 3 record(s)" "$W/m.log" && [ -f "$W/m/model.safetensors" ]' \
  "failed metrics writes (exit $rc; records: $steps): $(grep trainer: "$W/m.log" | head -n 3)"
if python3 -c "import matplotlib" 2>/dev/null; then
  python3 tools/plot.py "$W/m" >"$W/plot.log" 2>&1; rc=$?
  check '[ $rc = 0 ] && [ -s "$W/m/metrics.png" ]' "plot.py on a log with missing records: exit $rc: $(tail -n 1 "$W/plot.log")"
fi
# a disk that fills for a few seconds mid-run (a small tmpfs filled, then emptied; root only): the records of
# those steps are missing, reported once, the file has whole lines only, the run ends with its checkpoint
if [ "$(id -u)" = 0 ] && mkdir -p "$W/full" && mount -t tmpfs -o size=2m tmpfs "$W/full" 2>/dev/null; then
  MOUNTS+=("$W/full")
  "$TRAINER" "${COMMON[@]}" --out "$W/full/run" --steps 60 --ckpt-minutes 0 >"$W/full.log" 2>&1 &
  p=$!; PIDS+=($p)
  wait_step 4 "$W/full.log"
  dd if=/dev/zero of="$W/full/filler" bs=4k 2>/dev/null  # until the disk is full
  # (the file's last page may still take a few records: wait for the first failure, then two more steps)
  for i in $(seq 1 1200); do grep -q "cannot append" "$W/full.log" && break; sleep 0.05; done
  n=$(grep -cE "^step " "$W/full.log")
  for i in $(seq 1 600); do [ "$(grep -cE "^step " "$W/full.log")" -ge $((n + 2)) ] && break; sleep 0.05; done
  rm -f "$W/full/filler"
  wait_gone $p 120
  lines=$(python3 -c 'import json, sys
d = open(sys.argv[1]).read(); assert d.endswith("\n")
print(" ".join(str(json.loads(l)["step"]) for l in d.splitlines()))' "$W/full/run/metrics.jsonl" 2>&1)
  check '[ "$rc" = 0 ] && [ "$(grep -c "cannot append to $W/full/run/metrics.jsonl: No space left on device" "$W/full.log")" = 1 ] &&
    grep -q "is written again; the records of steps [0-9]* to [0-9]* are missing from it" "$W/full.log" &&
    python3 -c "import sys; s = [int(x) for x in sys.argv[1:]]; assert s == sorted(s) and 0 < len(s) < 60 and s[-1] == 60" $lines &&
    [ "$(ckpt_step "$W/full/run/checkpoint.bin")" = 60 ]' \
    "a disk full for a while (exit $rc; records: $lines): $(grep trainer: "$W/full.log" | head -n 3)"
  echo "  (full disk mid-run: $(grep -o "the records of steps [0-9]* to [0-9]* are missing" "$W/full.log"))"
else
  echo "  (a disk full for a while: skipped, it needs root to mount a small tmpfs)"
fi
# a partial last record (its writer killed mid-line) is cut off before --eval --out appends, not continued
mkdir -p "$W/pe" && printf '{"kind":"train","step":1,"loss":5}\n{"kind":"train","st' >"$W/pe/metrics.jsonl"
"$TRAINER" --eval "$W/a/checkpoint.bin" "${VAL[@]}" --batch 8 --val-batches 2 --out "$W/pe" >"$W/pe.log" 2>&1; rc=$?
kinds=$(python3 -c 'import json, sys; print(" ".join(json.loads(l)["kind"] for l in open(sys.argv[1])))' "$W/pe/metrics.jsonl" 2>&1)
check '[ $rc = 0 ] && [ "$kinds" = "train eval" ] && grep -q "ended in a partial record (19 bytes: its writer stopped in the middle): cut off" "$W/pe.log"' \
  "--eval --out after a partial last record (exit $rc): records: $kinds: $(tail -n 1 "$W/pe.log")"
# the export under a file-size limit (a resume at --steps: only the export is left): all of it or none
mkdir -p "$W/x" && cp "$W/a/checkpoint.bin" "$W/x/"
(ulimit -f 60; exec "$TRAINER" "${COMMON[@]}" --out "$W/x" --steps 4 --resume) >"$W/x.log" 2>&1; rc=$?
check '[ $rc = 1 ] && grep -q "cannot write the Hugging Face export to $W/x (see above; none of its files was replaced" "$W/x.log" &&
  [ ! -e "$W/x/config.json" ] && [ ! -e "$W/x/model.safetensors" ] && [ ! -e "$W/x/byte_tokenizer.json" ] && [ -z "$(ls -a "$W/x" | grep tmp)" ]' \
  "an export that fails (ulimit -f): exit $rc, left $(ls -a "$W/x" | tr '\n' ' '): $(tail -n 1 "$W/x.log")"
"$TRAINER" "${COMMON[@]}" --out "$W/x" --steps 4 --resume >"$W/x2.log" 2>&1; rc=$?
check '[ $rc = 0 ] && cmp -s "$W/x/model.safetensors" "$W/a/model.safetensors" && cmp -s "$W/x/config.json" "$W/a/config.json" &&
  cmp -s "$W/x/byte_tokenizer.json" "$W/a/byte_tokenizer.json" && [ -z "$(ls -a "$W/x" | grep tmp)" ]' \
  "the export written again after the limit: exit $rc: $(tail -n 1 "$W/x2.log")"

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
