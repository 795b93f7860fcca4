#!/usr/bin/env bash
# test_slurm.sh: data-parallel training of the CPU build under a real Slurm (tests/slurm/harness.sh brings up
# a private single-node cluster: Debian's slurm-wlm, installed with apt-get when missing). Tiny model, T=32, B=4.
#   - srun -n 2 and -n 4 train as 1 process with --grad-accum 2 / 4 (the same global batch): the loss of every
#     step within 2e-3 relative (test_trainer.sh's bound: the ranks' sums are added in another order), also with
#     --zero 1, and with --zero 1 and small buckets (--bucket-mb: many overlapped reductions);
#   - every rank ends with the same weights (MLM_TEST_WEIGHTS_CRC=1: each rank prints CRC-32s of them);
#   - the NCCL id travels by TCP (--bootstrap tcp) and by file (--bootstrap file);
#   - two jobs at once on the node do not collide;
#   - a run stopped on 2 ranks resumes on 4 (and one with --zero 1 on 4 resumes without it on 2);
#   - a SIGKILLed rank makes every other rank exit non-zero within 60 s (the time is printed);
#   - sbatch: a signal (scancel --signal=USR1, what --signal=USR1@T sends) checkpoints and stops with exit 0,
#     and the run resumes; ./trainer started in a batch script without srun is refused, naming srun;
#   - examples/slurm/*.sbatch: bash syntax; run here with their GPU and CPU requests removed and TRAINER set:
#     one_node_2gpu.sbatch is stopped by --run-steps and finishes when submitted again; paper_cluster.sbatch
#     (on 1 node) stages the shards, is stopped by --run-steps, requeues itself, resumes and finishes;
#   - paper_cluster.sbatch after a failure: a rank SIGKILLed after step 5 requeues the job, which resumes from its
#     checkpoint and finishes (Restarts=1, the output names the restart and the checkpoint); with MAX_RESTARTS=1 a
#     kill before any checkpoint restarts from step 0 and a second kill ends the job FAILED, naming the bound; a bad
#     flag (exit 1 before step 1) and a divergence (exit 2) end it FAILED without a requeue; MAX_RESTARTS=x is refused.
# If Slurm cannot be installed or started, this test fails (it never passes without having run).
# TRAINER picks the binary (default ./trainer_cpu).
cd "$(dirname "$0")/.."
if [ "${1:-}" != --inside ]; then
  bash tests/slurm/harness.sh bash tests/test_slurm.sh --inside
  rc=$?
  if [ $rc -eq 3 ]; then
    echo "FAIL test_slurm: no Slurm to test under (the harness's reason is above)"
    echo "0 passed, 1 failed"
    exit 1
  fi
  exit $rc
fi

pass=0; fail=0
ok()  { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL test_slurm: $*"; }
check() { if eval "$1"; then ok; else bad "$2"; fi; }
TRAINER=${TRAINER:-./trainer_cpu}
W=$(mktemp -d /tmp/mlm_slurm_XXXXXX)
chmod 755 "$W"
trap 'rm -rf "$W"' EXIT
export EMU_THREADS=1 NCCL_EMU_TIMEOUT_S=60   # 4 ranks share 2 cores
T0=$(date +%s)

python3 tools/prepare.py bytes --input cpu tests --out "$W/data" --seq-len 32 --val-fraction 0.3 >"$W/prep.log" 2>&1
check '[ -f "$W/data/train_00000.bin" ]' "tools/prepare.py made no shards: $(tail -n 3 "$W/prep.log")"
COMMON=(--data "$W/data/train_*.bin" --preset tiny --seq 32 --batch 4 --lr 5e-3 --warmup 2 --seed 7 --ckpt-minutes 0)
section() { echo "  [$(($(date +%s) - T0)) s] $*"; }
tail_of() { tail -n 3 "$@" 2>/dev/null | tr '\n' ' ' | cut -c1-600; }
loss_at() { grep -E "^step +$1/" "$2" | sed -E 's/.*loss ([0-9.]+).*/\1/'; }
# same_loss A.log B.log FIRST LAST: every step's loss within 2e-3 relative
same_loss() {
  local s a b
  for s in $(seq "$3" "$4"); do
    a=$(loss_at "$s" "$1"); b=$(loss_at "$s" "$2")
    awk -v a="$a" -v b="$b" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && b != "" && d <= 2e-3 * a) }' ||
      { echo "  step $s: $1 loss '$a', $2 loss '$b'"; return 1; }
  done
}
# same_weights NAME N: N ranks printed one and the same CRC-32 of their floatX weights and of their fp32 master
# weights (MLM_TEST_WEIGHTS_CRC=1: "rank R weights: floatX crc32 X, fp32 master crc32 Y"; the gathered master
# weights under ZeRO-1)
same_weights() {
  local crcs
  crcs=$(cat "$W/$1".*.log 2>/dev/null | sed -n -E "s/^rank [0-9]+ weights: floatX crc32 ([0-9a-f]+), fp32 master crc32 ([0-9a-f]+).*/\1 \2/p")
  [ "$(echo "$crcs" | grep -c .)" = "$2" ] && [ "$(echo "$crcs" | sort -u | wc -l)" = 1 ] ||
    { echo "  $1: weights CRCs of the ranks: $(echo "$crcs" | tr '\n' ' ')"; return 1; }
}
# run N NAME ARGS...: srun -n N of the trainer, one log per rank ($W/NAME.RANK.log), --out $W/NAME
run() {
  local n=$1 name=$2; shift 2
  MLM_TEST_WEIGHTS_CRC=1 timeout 300 srun -K -n "$n" -o "$W/$name.%t.log" \
    "$TRAINER" "${COMMON[@]}" --out "$W/$name" "$@" >"$W/$name.srun" 2>&1
}

# 1. references: one process, the same global batches
section "1. references: one process, the same global batches"
for a in 2 4; do
  MLM_TEST_WEIGHTS_CRC=1 "$TRAINER" "${COMMON[@]}" --out "$W/ref$a" --steps 6 --grad-accum $a >"$W/ref$a.0.log" 2>&1
  check '[ -f "$W/ref$a/model.safetensors" ]' "reference run with --grad-accum $a failed: $(tail_of "$W/ref$a.0.log")"
done

# 2. srun -n 2 / -n 4 == one process with --grad-accum 2 / 4; every rank ends with the same weights
section "2. srun -n 2 / -n 4 == one process with --grad-accum "
for v in "2 plain" "4 plain" "2 zero --zero 1" "4 zero --zero 1" "4 zerob --zero 1 --bucket-mb 0.001"; do
  set -- $v
  n=$1 name=n$1$2; shift 2
  run "$n" "$name" --steps 6 "$@"
  rc=$?
  check '[ $rc -eq 0 ] && same_loss "$W/ref$n.0.log" "$W/$name.0.log" 1 6' \
    "srun -n $n $* (exit $rc) does not train as 1 process with --grad-accum $n: $(tail_of "$W/$name.0.log" "$W/$name.srun")"
  check 'same_weights "$name" "$n"' "srun -n $n $*: the ranks' weights differ after training"
done

# 3. both ways of passing the NCCL id
section "3. both ways of passing the NCCL id"
for b in tcp file; do
  run 2 boot_$b --steps 2 --bootstrap $b
  rc=$?
  check '[ $rc -eq 0 ] && same_loss "$W/ref2.0.log" "$W/boot_$b.0.log" 1 1' \
    "--bootstrap $b under srun -n 2 (exit $rc): $(tail_of "$W/boot_$b.0.log" "$W/boot_$b.srun")"
done

# 4. two jobs at once on one node
section "4. two jobs at once on one node"
run 2 par_a --steps 6 & pa=$!
run 2 par_b --steps 6 & pb=$!
wait $pa; ra=$?; wait $pb; rb=$?
check '[ $ra -eq 0 ] && [ $rb -eq 0 ] && same_loss "$W/ref2.0.log" "$W/par_a.0.log" 1 6 && same_loss "$W/ref2.0.log" "$W/par_b.0.log" 1 6' \
  "two srun -n 2 at once (exit $ra, $rb): $(tail_of "$W/par_a.0.log" "$W/par_b.0.log")"

# 5. resume on another number of ranks (same global batch: 2 x 2 = 4 x 1 micro-batches)
section "5. resume on another number of ranks (same global bat"
run 2 re --steps 6 --run-steps 3 --grad-accum 2
r1=$?
run 4 re --steps 6 --resume
r2=$?
check '[ $r1 -eq 0 ] && [ $r2 -eq 0 ] && grep -q "resumed from .* at step 3" "$W/re.0.log" && same_loss "$W/ref4.0.log" "$W/re.0.log" 4 6' \
  "2 ranks for 3 steps, then 4 ranks --resume (exit $r1, $r2): $(tail_of "$W/re.0.log" "$W/re.srun")"
run 4 rz --steps 6 --run-steps 3 --zero 1
r1=$?
run 2 rz --steps 6 --resume --grad-accum 2
r2=$?
check '[ $r1 -eq 0 ] && [ $r2 -eq 0 ] && grep -q "resumed from .* at step 3" "$W/rz.0.log" && same_loss "$W/ref4.0.log" "$W/rz.0.log" 4 6' \
  "4 ranks with --zero 1 for 3 steps, then 2 ranks without (exit $r1, $r2): $(tail_of "$W/rz.0.log" "$W/rz.srun")"

# 6. a rank killed with SIGKILL: every other rank exits non-zero on its own (no srun -K) within 60 s.
section "6. a rank killed with SIGKILL: every other rank exits"
#    Each task is a shell that records the trainer's exit status; the trainer of rank 2 is killed.
timeout 300 srun --kill-on-bad-exit=0 -n 4 -o "$W/kill.%t.log" bash -c \
  '"$@"; echo $? >"'"$W"'/kill.rc.$SLURM_PROCID"' _ "$TRAINER" "${COMMON[@]}" --out "$W/kill" --steps 100000 \
  >"$W/kill.srun" 2>&1 &
kill_srun=$!
for _ in $(seq 600); do grep -qE "^step +3/" "$W/kill.0.log" 2>/dev/null && break; kill -0 $kill_srun 2>/dev/null || break; sleep 0.1; done
victim=
for p in $(pgrep -f -- "--out $W/kill"); do
  tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx SLURM_PROCID=2 && [ "$(cat "/proc/$p/comm")" != bash ] && victim=$p
done
check '[ -n "$victim" ]' "no trainer process of rank 2 to kill: $(tail_of "$W/kill.0.log" "$W/kill.srun")"
if [ -n "$victim" ]; then
  t_kill=$(date +%s.%N)
  kill -KILL "$victim"
  for _ in $(seq 700); do [ -f "$W/kill.rc.0" ] && [ -f "$W/kill.rc.1" ] && [ -f "$W/kill.rc.3" ] && break; sleep 0.1; done
  secs=$(awk -v a="$t_kill" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  rcs="$(cat "$W/kill.rc.0" 2>/dev/null) $(cat "$W/kill.rc.1" 2>/dev/null) $(cat "$W/kill.rc.3" 2>/dev/null)"
  echo "  SIGKILL of rank 2: ranks 0, 1, 3 exited with '$rcs' after ${secs} s"
  check 'awk -v s="$secs" -v r="$rcs" "BEGIN { n = split(r, a, \" \"); for (i = 1; i <= n; i++) if (a[i] == 0) exit 1; exit !(n == 3 && s <= 60) }"' \
    "after SIGKILL of rank 2, ranks 0, 1, 3 exited with '$rcs' after $secs s (want 3 non-zero within 60 s): $(tail_of "$W/kill.0.log")"
fi
kill $kill_srun 2>/dev/null   # the timeout around srun, if ranks are still there: srun cancels the step
wait $kill_srun 2>/dev/null

# 7. sbatch: scancel --signal=USR1 (what --signal=USR1@T sends before the time limit) checkpoints and stops
section "7. sbatch: scancel --signal=USR1 (what --signal=USR1@"
# wait_job ID: until the job has ended (at most 120 s); prints "STATE EXITCODE". A job that requeued itself
# is released at once (Slurm holds a requeued job about two minutes before it may start again).
# (A requeued job waits: Slurm delays its start while the last instance's credential and cleanup end. The test
# starts it 2 s after it is seen pending, not at once: an earlier start, once in a CI run, ended FAILED 1:0 before
# the script's first line.)
wait_job() {
  local st re ex pending_since=""
  for _ in $(seq 1200); do
    read -r st re ex < <(scontrol show job "$1" 2>/dev/null | tr ' ' '\n' |
      sed -n -E 's/^(JobState|Restarts|ExitCode)=//p' | tr '\n' ' ')
    case "$st" in
      PENDING)
        if [ "${re:-0}" -gt 0 ]; then
          pending_since=${pending_since:-$(date +%s)}
          [ $(($(date +%s) - pending_since)) -ge 2 ] && scontrol update JobId="$1" StartTime=now >/dev/null 2>&1
        fi
        sleep 0.1 ;;
      RUNNING | COMPLETING | CONFIGURING | REQUEUE* | "") sleep 0.1 ;;
      *) echo "$st $ex "; return ;;
    esac
  done
  echo "TIMEOUT"
}
cat >"$W/sig.sbatch" <<EOF
#!/bin/bash
#SBATCH -n 2
#SBATCH -t 10
#SBATCH -o $W/sig.out
srun -K -o "$W/sig.%t.log" $TRAINER --data '$W/data/train_*.bin' ${COMMON[*]:2} --out $W/sig --steps 100000
EOF
job=$(timeout 30 sbatch --parsable "$W/sig.sbatch")
for _ in $(seq 600); do
  grep -qE "^step +3/" "$W/sig.0.log" 2>/dev/null && break
  [ -n "$job" ] && [ -n "$(squeue -h -j "$job" 2>/dev/null)" ] || break
  sleep 0.1
done
timeout 30 scancel --signal=USR1 "$job"
state=$(wait_job "$job")
stopped=$(sed -n -E 's/^stopped after step ([0-9]+) \(on a signal\).*/\1/p' "$W/sig.0.log")
check '[ "$state" = "COMPLETED 0:0 " ] && [ -n "$stopped" ] && [ -f "$W/sig/checkpoint.bin" ]' \
  "sbatch + scancel --signal=USR1: job $state, stopped at step '$stopped': $(tail_of "$W/sig.out" "$W/sig.0.log")"
run 2 sig --steps 100000 --resume --run-steps 1
check 'grep -q "resumed from .* at step $stopped\$" "$W/sig.0.log"' "after the signal, srun --resume did not continue at step $stopped: $(tail_of "$W/sig.0.log")"

# 8. the trainer in a batch script of 2 tasks without srun: refused, naming srun, instead of waiting for rank 1
section "8. the trainer in a batch script of 2 tasks without s"
cat >"$W/nosrun.sbatch" <<EOF
#!/bin/bash
#SBATCH -n 2
#SBATCH -t 5
#SBATCH -o $W/nosrun.out
export NCCL_EMU_TIMEOUT_S=10   # a trainer that waits for rank 1 fails after 10 s instead of 60
$TRAINER --data '$W/data/train_*.bin' --preset tiny --seq 32 --batch 4 --out $W/nosrun --steps 2
EOF
job=$(timeout 30 sbatch --parsable "$W/nosrun.sbatch")
state=$(wait_job "$job")
check '[ "${state%% *}" = FAILED ] && grep -q "srun" "$W/nosrun.out"' \
  "./trainer in an sbatch script without srun: job $state: $(tail_of "$W/nosrun.out")"

# 9. the examples: bash syntax; the one-node script runs here, stops at --run-steps, finishes when resubmitted
section "9. the examples: bash syntax; the one-node script run"
for f in examples/slurm/*.sbatch; do check 'bash -n "$f"' "$f: bash syntax error"; done
sed -E '/^#SBATCH --(gpus|cpus)/d' examples/slurm/one_node_2gpu.sbatch >"$W/one_node.sbatch"
export TRAINER DATA="$W/data" OUT="$W/ex" PRESET=tiny STEPS=6
export EXTRA_ARGS="--seq 32 --batch 4 --run-steps 3 --val-batches 4"   # (a sample: the whole split takes minutes)
ex=()
for k in 1 2; do
  job=$(timeout 30 sbatch --parsable -o "$W/ex$k.out" "$W/one_node.sbatch")
  ex[$k]=$(wait_job "$job")
done
check '[ "${ex[1]}" = "COMPLETED 0:0 " ] && [ "${ex[2]}" = "COMPLETED 0:0 " ] && grep -q "resumed from .* at step 3" "$W/ex2.out" && [ -f "$W/ex/model.safetensors" ]' \
  "examples/slurm/one_node_2gpu.sbatch twice: jobs '${ex[1]}', '${ex[2]}': $(tail_of "$W/ex1.out" "$W/ex2.out")"

# the N-node script on this one node (--grad-accum 1 replaces auto: the CPU runtime has no known peak): staged
# shards, stopped by --run-steps, requeued by itself, resumed, finished
sed -E '/^#SBATCH --(gpus|cpus)/d; s/^#SBATCH --nodes=.*/#SBATCH --nodes=1/' examples/slurm/paper_cluster.sbatch >"$W/paper.sbatch"
export OUT="$W/paper" STAGE="$W/stage" EXTRA_ARGS="--seq 32 --batch 4 --grad-accum 1 --run-steps 3 --val-batches 4"
job=$(timeout 30 sbatch --parsable -o "$W/paper.out" "$W/paper.sbatch")
st=$(wait_job "$job")
restarts=$(scontrol show job "$job" 2>/dev/null | tr ' ' '\n' | sed -n 's/^Restarts=//p')
check '[ "$st" = "COMPLETED 0:0 " ] && [ "$restarts" = 1 ] && grep -q "requeued" "$W/paper.out" && grep -q "resumed from .* at step 3" "$W/paper.out" && [ -f "$W/paper/model.safetensors" ] && cmp -s "$W/stage/train_00000.bin" "$W/data/train_00000.bin"' \
  "examples/slurm/paper_cluster.sbatch: job '$st', $restarts restart(s): $(tail_of "$W/paper.out") | Slurm's log: $(grep -h -E "JobId=$job( |$)|job $job\b|StepId=$job\.|credential" "$HARNESS_DIR"/log/slurm*.log 2>/dev/null | tail -n 12 | tr '\n' ' ')"

# 10. paper_cluster.sbatch after a failure (still on 1 node): requeued from its checkpoint within MAX_RESTARTS
section "10. paper_cluster.sbatch after a failure: requeued wit"
restarts_of() { scontrol show job "$1" 2>/dev/null | tr ' ' '\n' | sed -n 's/^Restarts=//p'; }
victim_comm=$(basename "$TRAINER" | cut -c1-15)
# kill_rank1 NAME STEP K: once $W/NAME.out has logged step STEP K times (in the job's K-th launch), SIGKILLs rank 1's
# trainer there, as an Xid error or a crash would end it, and appends "killed PID after step S" to $W/NAME.kills
kill_rank1() {
  local p c
  for _ in $(seq 900); do
    c=$(grep -cE "^step +$2/" "$W/$1.out" 2>/dev/null)
    [ "${c:-0}" -ge "$3" ] && break
    sleep 0.1
  done
  for p in $(pgrep -f -- "--out $W/$1 "); do
    if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx SLURM_PROCID=1 &&
      [ "$(cat "/proc/$p/comm" 2>/dev/null)" = "$victim_comm" ] && kill -KILL "$p" 2>/dev/null; then
      echo "killed $p after step $(grep -E '^step +[0-9]+/' "$W/$1.out" | tail -n 1 | awk '{print $2}')" >>"$W/$1.kills"
      return
    fi
  done
}
PAPER_ARGS="--seq 32 --batch 4 --grad-accum 1 --val-batches 4"
# a lost rank after the checkpoint of step 3: requeued (restart 1 of the default 3), resumed from it, finished
job=$(OUT="$W/lost" STEPS=30 EXTRA_ARGS="$PAPER_ARGS --ckpt-every 3" timeout 30 sbatch --parsable -o "$W/lost.out" "$W/paper.sbatch")
kill_rank1 lost 5 1 &
killer=$!
st=$(wait_job "$job")
wait $killer
re=$(restarts_of "$job")
at=$(sed -n -E "s|^resumed from $W/lost/checkpoint.bin at step ([0-9]+)\$|\1|p" "$W/lost.out")
check '[ "$st" = "COMPLETED 0:0 " ] && [ "$re" = 1 ] && [ -s "$W/lost.kills" ] && [ -n "$at" ] && [ "$at" -ge 3 ] &&
  grep -qF "restart 1 of 3 (MAX_RESTARTS), from $W/lost/checkpoint.bin (step $at); requeued" "$W/lost.out" &&
  [ -f "$W/lost/model.safetensors" ]' \
  "paper_cluster.sbatch, rank 1 SIGKILLed ($(cat "$W/lost.kills" 2>/dev/null)): job '$st', ${re:-?} restart(s), resumed at step '$at': $(grep -E "^job |^resumed" "$W/lost.out" | tr '\n' ' ' | cut -c1-900)"
# MAX_RESTARTS=1: a kill before any checkpoint restarts from step 0 (counted); a second kill reaches the bound
job=$(OUT="$W/bound" STEPS=30 MAX_RESTARTS=1 EXTRA_ARGS="$PAPER_ARGS" timeout 30 sbatch --parsable -o "$W/bound.out" "$W/paper.sbatch")
{ kill_rank1 bound 2 1; kill_rank1 bound 2 2; } &
killer=$!
st=$(wait_job "$job")
wait $killer
re=$(restarts_of "$job")
check '[ "${st%% *}" = FAILED ] && [ "$re" = 1 ] && [ "$(grep -c . "$W/bound.kills" 2>/dev/null)" = 2 ] &&
  grep -qF "restart 1 of 1 (MAX_RESTARTS), from step 0 (no checkpoint yet); requeued" "$W/bound.out" &&
  grep -qF "not requeued: the bound of MAX_RESTARTS=1 restarts after a failure was reached" "$W/bound.out" &&
  [ ! -f "$W/bound/model.safetensors" ]' \
  "paper_cluster.sbatch with MAX_RESTARTS=1, two kills ($(cat "$W/bound.kills" 2>/dev/null | tr '\n' ' ')): job '$st', ${re:-?} restart(s): $(grep -E "^job " "$W/bound.out" | tr '\n' ' ' | cut -c1-900)"
# not requeued: a bad flag (every rank exits 1 before step 1) and a divergence (every step's loss infinite: exit 2)
job=$(OUT="$W/usage" EXTRA_ARGS="$PAPER_ARGS --no-such-flag" timeout 30 sbatch --parsable -o "$W/usage.out" "$W/paper.sbatch")
st=$(wait_job "$job")
re=$(restarts_of "$job")
check '[ "${st%% *}" = FAILED ] && [ "$re" = 0 ] && grep -q "no-such-flag: unknown flag" "$W/usage.out" &&
  grep -qF "before step 1" "$W/usage.out" && grep -qF "not requeued: it would fail the same way again" "$W/usage.out"' \
  "paper_cluster.sbatch with a bad flag: job '$st', ${re:-?} restart(s): $(tail_of "$W/usage.out")"
job=$(OUT="$W/diverge" STEPS=30 MLM_TEST_INF_LOSS=1:0 EXTRA_ARGS="$PAPER_ARGS" timeout 30 sbatch --parsable -o "$W/diverge.out" "$W/paper.sbatch")
st=$(wait_job "$job")
re=$(restarts_of "$job")
check '[ "$st" = "FAILED 2:0 " ] && [ "$re" = 0 ] && grep -q "trainer: diverged" "$W/diverge.out" &&
  grep -qF "the run diverged (exit code 2; the trainer'"'"'s message is above); not requeued" "$W/diverge.out"' \
  "paper_cluster.sbatch, a run that diverges: job '$st', ${re:-?} restart(s): $(tail_of "$W/diverge.out")"
MAX_RESTARTS=x bash "$W/paper.sbatch" >"$W/maxr.out" 2>&1
rc=$?
check '[ $rc -eq 1 ] && grep -qF "MAX_RESTARTS='"'"'x'"'"': expected the number of restarts after a failure, 0 to 9999" "$W/maxr.out"' \
  "paper_cluster.sbatch with MAX_RESTARTS=x: exit $rc: $(tail_of "$W/maxr.out")"

echo "  (test_slurm: $(($(date +%s) - T0)) s)"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
