#!/usr/bin/env bash
# test_trainer.sh: the whole program, end to end, on the CPU build (./trainer_cpu), tiny model:
#   - it learns: the loss falls on real data (byte-level shards of this repository's own sources);
#   - deterministic: the same run twice gives byte-identical checkpoints, with several OS threads;
#   - resume: 10 steps + --resume 10 steps give bit-for-bit the weights of 20 uninterrupted steps;
#   - a signal (SIGUSR1, SIGTERM) stops the run after the current step with a checkpoint;
#   - data parallel: 2 processes (NCCL over shared memory) match 1 process with --grad-accum 2;
#   - --init-from a Hugging Face export continues from its weights; --stage-dir trains from local copies;
#   - the attention kernels follow the device's compute capability; the wgmma ones train as the mma.sync ones do;
#   - the memory planner picks a larger micro-batch when the device has more memory;
#   - bad input: each gives one clear error and a non-zero exit.
# Run by tests/run.sh; needs tools/requirements.txt (python3 tools/prepare.py).
cd "$(dirname "$0")/.."
pass=0; fail=0
ok()  { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL test_trainer: $*"; }
check() { if eval "$1"; then ok; else bad "$2"; fi; }
W=$(mktemp -d /tmp/mlm_trainer_XXXXXX)
trap 'rm -rf "$W"' EXIT
# Several OS threads run the CPU runtime's blocks, which then finish in varying orders: the kernels' sums have
# a fixed order all the same (no floating-point atomics), so runs are bitwise repeatable, as on a GPU.
export EMU_THREADS=4

python3 tools/prepare.py bytes --input cpu tests --out "$W/data" --seq-len 32 --val-fraction 0.3 >"$W/prep.log" 2>&1
check '[ -f "$W/data/train_00000.bin" ] && [ -f "$W/data/val_00000.bin" ]' "tools/prepare.py made no shards: $(tail -n 3 "$W/prep.log")"
COMMON=(--data "$W/data/train_*.bin" --preset tiny --seq 32 --batch 8 --lr 5e-3 --warmup 2 --seed 7)
loss_at() { grep -E "^step +$1/" "$2" | sed -E 's/.*loss ([0-9.]+).*/\1/'; }

# 1. it learns
./trainer_cpu "${COMMON[@]}" --out "$W/a" --steps 20 --val "$W/data/val_*.bin" --val-every 20 --val-batches 2 >"$W/a.log" 2>&1
check '[ -f "$W/a/model.safetensors" ] && [ -f "$W/a/config.json" ] && [ -f "$W/a/checkpoint.bin" ]' \
  "20 steps did not leave checkpoint.bin + the Hugging Face export: $(tail -n 3 "$W/a.log")"
l1=$(loss_at 1 "$W/a.log"); l20=$(loss_at 20 "$W/a.log")
check 'awk -v a="$l1" -v b="$l20" "BEGIN { exit !(a > 5 && b < a - 0.5) }"' "loss did not fall: step 1 $l1, step 20 $l20"
check 'grep -q "val loss" "$W/a.log"' "no validation loss printed"
# static allocation: the memory plan is exactly what was allocated, and the loop allocates nothing
before=$(sed -n -E 's/^device memory allocated before step 1: ([0-9]+) bytes \(the plan: ([0-9]+) bytes\)/\1 \2/p' "$W/a.log")
after=$(sed -n -E 's/^device memory allocated after the last step: ([0-9]+) bytes/\1/p' "$W/a.log")
check '[ -n "$before" ] && [ "${before% *}" = "${before#* }" ] && [ "$after" = "${before% *}" ]' \
  "device memory: before step 1 / plan = $before, after the last step = $after"

# 1b. deterministic: the same run again gives the same checkpoint and export, byte for byte
./trainer_cpu "${COMMON[@]}" --out "$W/a2" --steps 20 --val "$W/data/val_*.bin" --val-every 20 --val-batches 2 >"$W/a2.log" 2>&1
check 'cmp -s "$W/a/checkpoint.bin" "$W/a2/checkpoint.bin" && cmp -s "$W/a/model.safetensors" "$W/a2/model.safetensors"' \
  "two identical runs (EMU_THREADS=$EMU_THREADS) gave different checkpoints: $(cmp "$W/a/checkpoint.bin" "$W/a2/checkpoint.bin" 2>&1 | head -n 1)"

# 1b. the attention kernels follow the device: the mma.sync ones by default (the CPU runtime reports compute
# capability 8.0), the wgmma ones (attention.cuh) on a compute capability 9.0 device (EMU_COMPUTE_CAPABILITY=9.0),
# where the mini model (head size 64) trains like the mma.sync kernels: the same losses to 0.2% over 3 steps, and the
# log says which kernels ran
MINI=(--data "$W/data/train_*.bin" --preset mini --seq 32 --batch 4 --lr 2e-3 --warmup 1 --seed 7 --steps 3)
EMU_LAUNCH_STATS=2 ./trainer_cpu "${MINI[@]}" --out "$W/mma" >"$W/mma.log" 2>&1; rc=$?
ran=$(grep -cE "^emu: kernel void attention_(forward|backward_dq|backward_dkdv)<64>" "$W/mma.log")
check '[ $rc -eq 0 ] && grep -q "^attention: attention_forward, attention_backward_dq, attention_backward_dkdv (CPU runtime .*, head size 64)" "$W/mma.log" && [ "$ran" = 3 ]' \
  "compute capability 8.0: exit $rc, $ran of the 3 mma.sync kernels launched: $(grep "^attention:" "$W/mma.log"; tail -n 2 "$W/mma.log")"
EMU_COMPUTE_CAPABILITY=9.0 EMU_LAUNCH_STATS=2 ./trainer_cpu "${MINI[@]}" --out "$W/wg" >"$W/wg.log" 2>&1; rc=$?
ran=$(grep -cE "^emu: kernel void attention_(forward|backward_dq|backward_dkdv)_wgmma<64>" "$W/wg.log")
old=$(grep -cE "^emu: kernel void attention_(forward|backward_dq|backward_dkdv)<" "$W/wg.log")
check '[ $rc -eq 0 ] && grep -q "^attention: attention_forward_wgmma, attention_backward_dq_wgmma, attention_backward_dkdv_wgmma (" "$W/wg.log" && [ "$ran" = 3 ] && [ "$old" = 0 ]' \
  "compute capability 9.0: exit $rc, $ran of the 3 wgmma kernels launched, $old mma.sync ones: $(tail -n 2 "$W/wg.log")"
# losses_like_default WHAT LOG: steps 1 and 3 of LOG within 0.2% of the default kernels' run ($W/mma.log)
losses_like_default() {
  local st a b
  for st in 1 3; do
    a=$(loss_at $st "$W/mma.log"); b=$(loss_at $st "$2")
    check 'awk -v a="$a" -v b="$b" "BEGIN { d = a - b; exit !(a > 0 && d * d < (0.002 * a) ^ 2) }"' \
      "$1: step $st loss $b, the default kernels' $a (want within 0.2%)"
  done
}
losses_like_default "the wgmma attention kernels" "$W/wg.log"
# the tiny model's head size 16 runs the mma.sync kernels on 9.0 too
EMU_COMPUTE_CAPABILITY=9.0 ./trainer_cpu "${COMMON[@]}" --out "$W/t9" --steps 1 >"$W/t9.log" 2>&1; rc=$?
check '[ $rc -eq 0 ] && grep -q "^attention: attention_forward, attention_backward_dq, attention_backward_dkdv (.*head size 16)" "$W/t9.log"' \
  "compute capability 9.0, head size 16: exit $rc: $(grep "^attention:" "$W/t9.log"; tail -n 2 "$W/t9.log")"

# 2. resume is exact (with several OS threads)
./trainer_cpu "${COMMON[@]}" --out "$W/b" --steps 20 --run-steps 10 >"$W/b1.log" 2>&1
check 'grep -q "stopped after step 10" "$W/b1.log" && [ ! -f "$W/b/model.safetensors" ]' "--run-steps 10 did not stop at 10"
./trainer_cpu "${COMMON[@]}" --out "$W/b" --steps 20 --resume >"$W/b2.log" 2>&1
check 'grep -q "resumed from .* at step 10" "$W/b2.log"' "--resume did not resume at step 10: $(tail -n 2 "$W/b2.log")"
check 'cmp -s "$W/a/model.safetensors" "$W/b/model.safetensors"' "10 + 10 resumed steps differ from 20 steps"
check '[ "$(loss_at 20 "$W/b2.log")" = "$l20" ]' "loss at step 20 after resume $(loss_at 20 "$W/b2.log") != $l20"

# 2b. a signal (Slurm's SIGTERM, or SIGUSR1 from --signal) stops the run cleanly with a checkpoint
./trainer_cpu "${COMMON[@]}" --out "$W/s" --steps 100000 >"$W/s1.log" 2>&1 &
pid=$!
for i in $(seq 1 300); do grep -qE "^step +5/" "$W/s1.log" && break; sleep 0.1; done
kill -USR1 $pid
wait $pid; rc=$?
stopped=$(sed -n -E 's/^stopped after step ([0-9]+) \(on a signal\).*/\1/p' "$W/s1.log")
check '[ $rc -eq 0 ] && [ -n "$stopped" ] && [ -f "$W/s/checkpoint.bin" ]' \
  "SIGUSR1 did not stop the run with a checkpoint (exit $rc): $(tail -n 2 "$W/s1.log")"
./trainer_cpu "${COMMON[@]}" --out "$W/s" --steps 100000 --resume --run-steps 1 >"$W/s2.log" 2>&1
check 'grep -q "resumed from .* at step $stopped\$" "$W/s2.log"' "after the signal, --resume did not continue at step $stopped"

# 3. data parallel: 2 ranks of B=8 == 1 rank of B=8 with 2 micro-batches per step
./trainer_cpu "${COMMON[@]}" --out "$W/c" --steps 8 --grad-accum 2 >"$W/c.log" 2>&1
mkdir -p "$W/d"
for r in 0 1; do
  SLURM_NTASKS=2 SLURM_PROCID=$r SLURM_LOCALID=0 NCCL_EMU_TIMEOUT_S=60 \
    ./trainer_cpu "${COMMON[@]}" --out "$W/d" --steps 8 >"$W/d$r.log" 2>&1 &
done
wait
check 'grep -q "2 process(es)" "$W/d0.log" && [ -f "$W/d/model.safetensors" ]' "2-process run failed: $(tail -n 3 "$W/d0.log" "$W/d1.log")"
same=1
for s in 1 4 8; do
  a=$(loss_at $s "$W/c.log"); b=$(loss_at $s "$W/d0.log")
  awk -v a="$a" -v b="$b" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && d <= 2e-3 * a) }' || { same=0; echo "  step $s: 1 rank $a, 2 ranks $b"; }
done
check '[ $same = 1 ]' "2 ranks x B=8 do not match 1 rank x 2 micro-batches of B=8"

# 3b. an epoch's end that leaves rank 1 a micro-batch with no token: 70 bytes make 3 rows of 32, so the
#     second global micro-batch of 2 rows has none for rank 1. Its gradient must be zero, not garbage.
mkdir -p "$W/small_in"
head -c 70 cpu/runtime.cpp >"$W/small_in/f.txt"
python3 tools/prepare.py bytes --input "$W/small_in" --out "$W/small" --seq-len 32 --val-fraction 0 >/dev/null 2>&1
for r in 0 1; do
  SLURM_NTASKS=2 SLURM_PROCID=$r SLURM_LOCALID=0 NCCL_EMU_TIMEOUT_S=60 \
    ./trainer_cpu --data "$W/small/train_*.bin" --preset tiny --seq 32 --batch 1 --lr 1e-3 --seed 7 \
    --out "$W/g" --steps 4 >"$W/g$r.log" 2>&1 &
done
wait
norms=$(grep -E "^step +[0-9]+/4" "$W/g0.log" | sed -E 's/.*norm ([0-9.]+).*/\1/' | tr '\n' ' ')
check 'grep -qE "^step +4/4" "$W/g0.log" && awk -v n="$norms" "BEGIN { k = split(n, a); for (i = 1; i <= k; i++) if (a[i] > 10) exit 1; exit !(k == 4) }"' \
  "an empty micro-batch at the epoch's end gave gradient norms: $norms $(tail -n 2 "$W/g0.log" "$W/g1.log")"

# 4. starting from a Hugging Face export (run 1's), from node-local copies of the shards
./trainer_cpu "${COMMON[@]}" --out "$W/f" --steps 2 --init-from "$W/a" --stage-dir "$W/local" >"$W/f.log" 2>&1
lf=$(loss_at 1 "$W/f.log")
check 'grep -q "^note: --warmup 2 is not below --steps 2: the learning rate only rises" "$W/f.log" && ! grep -q "^note: --warmup" "$W/a.log"' \
  "--warmup 2 of --steps 2 was not noted (or --steps 20 was): $(grep -h '^note: --warmup' "$W/f.log" "$W/a.log")"
echo "  (loss: step 1 $l1, step 20 $l20; from the export, step 1 $lf)"
# (compared with the untrained start: the step-20 loss is one batch's, and batches differ by more than 0.3)
check 'awk -v a="$lf" -v b="$l1" "BEGIN { exit !(a != \"\" && a < b - 0.4) }"' \
  "--init-from the trained export starts at loss $lf, not below the untrained start $l1 (trained: $l20): $(tail -n 2 "$W/f.log")"
check '[ -f "$W/local/train_00000.bin" ] && cmp -s "$W/local/train_00000.bin" "$W/data/train_00000.bin"' \
  "--stage-dir did not copy the shards to the local directory"

# 5. the memory planner fills the device
plan_b() { EMU_DEVICE_BYTES=$1 ./trainer_cpu --data "$W/data/train_*.bin" --out "$W/p" --preset bert-base --seq 512 --plan-only 2>&1 |
  sed -n -E 's/.*total .* GiB for B=([0-9]+) .*/\1/p'; }
b16=$(plan_b 16e9); b32=$(plan_b 32e9); b94=$(plan_b 94e9)
check '[ -n "$b16" ] && [ "$b16" -ge 1 ] && [ "$b32" -gt $((2 * b16 - 2)) ] && [ "$b94" -gt "$b32" ]' \
  "planner: B=$b16 at 16 GB, $b32 at 32 GB, $b94 at 94 GB"
echo "  (planner: bert-base, T=512 fits B=$b94 on a 94 GB H100 NVL)"

# 6. bad input: one clear error naming what is wrong, non-zero exit
expect_error() {  # expect_error PATTERN ARGS... : the run fails and says PATTERN
  local pat=$1; shift
  out=$("$@" 2>&1); rc=$?
  if [ $rc -ne 0 ] && echo "$out" | grep -q -- "$pat"; then ok; else bad "'$*' gave exit $rc and: $(echo "$out" | tail -n 2)"; fi
}
expect_error "are required" ./trainer_cpu --data "$W/data/train_*.bin" --steps 5
expect_error "unknown flag" ./trainer_cpu "${COMMON[@]}" --out "$W/e" --steps 5 --bogus 1
expect_error "expected an integer" ./trainer_cpu "${COMMON[@]}" --out "$W/e" --steps five
expect_error "no-such-dir" ./trainer_cpu --data "$W/no-such-dir/*.bin" --out "$W/e" --steps 5 --preset tiny --seq 32
expect_error "longer than the model's 40 positions" ./trainer_cpu --data "$W/data/train_*.bin" --out "$W/e" --steps 5 --preset tiny --seq 64
expect_error "unknown; one of: tiny mini bert-base" ./trainer_cpu --data "$W/data/train_*.bin" --out "$W/e" --steps 5 --preset huge
expect_error "checkpoint.bin" ./trainer_cpu "${COMMON[@]}" --out "$W/e" --steps 5 --resume
head -c 1000 "$W/a/checkpoint.bin" >"$W/e/checkpoint.bin"
expect_error "truncated" ./trainer_cpu "${COMMON[@]}" --out "$W/e" --steps 5 --resume
expect_error "needs .* GiB at B=" env EMU_DEVICE_BYTES=1e8 ./trainer_cpu --data "$W/data/train_*.bin" --out "$W/e2" --steps 5 --preset bert-base --seq 512

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
