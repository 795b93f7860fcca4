#!/usr/bin/env bash
# test_limits.sh: the trainer at the edges of its environment (docs/robustness.md):
#   - a closed stdout (`./trainer_cpu ... | head -n 3`): SIGPIPE stops the run like SIGTERM, with a checkpoint
#     and exit 0, instead of killing it with nothing saved; later writes to stdout neither kill nor hang it;
#   - a closed stdout during training, with --grad-accum 2 (the stop between micro-batches);
#   - EMU_THREADS at the top of its documented range (1024 OS threads) runs kernels: the fiber stacks fit in
#     vm.max_map_count (they were one mapping and one guard page per kernel thread: "cannot map a fiber stack").
# Run by tests/run.sh; needs tools/requirements.txt. TRAINER overrides ./trainer_cpu.
cd "$(dirname "$0")/.."
TRAINER=${TRAINER:-./trainer_cpu}
pass=0; fail=0
ok()  { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL test_limits: $*"; }
W=$(mktemp -d /tmp/mlm_limits_XXXXXX)
trap 'rm -rf "$W"' EXIT
export EMU_THREADS=1

mkdir -p "$W/in"
for i in $(seq 1 200); do echo "alpha beta gamma delta $i kernel tensor shard fiber stack pipe" >>"$W/in/a.txt"; done
python3 tools/prepare.py bytes --input "$W/in" --out "$W/data" --seq-len 32 --val-fraction 0 >"$W/prep.log" 2>&1 ||
  bad "tools/prepare.py failed: $(tail -n 2 "$W/prep.log")"
T=(--data "$W/data/train_*.bin" --preset tiny --seq 32 --batch 4 --lr 1e-3 --seed 7)

# 1. stdout closed after 3 lines (during start-up): the run trains step 1, saves it, and exits 0, in bounded time
timeout 300 "$TRAINER" "${T[@]}" --out "$W/p" --steps 1000 2>"$W/p.err" | head -n 3 >"$W/p.head"
rcs=("${PIPESTATUS[@]}")
if [ "${rcs[0]}" = 0 ] && [ -f "$W/p/checkpoint.bin" ] && [ "$(wc -l <"$W/p.head")" = 3 ] &&
  grep -q "stdout was closed (SIGPIPE)" "$W/p.err"; then ok; else
  bad "| head -n 3: trainer exit ${rcs[0]} (124: hung; 141: killed by SIGPIPE), checkpoint: $(ls "$W/p" 2>&1 | tr '\n' ' '), stderr: $(tail -n 2 "$W/p.err")"
fi
# ... and the checkpoint is a real one: --resume continues from it
timeout 300 "$TRAINER" "${T[@]}" --out "$W/p" --steps 3 --resume >"$W/p2.log" 2>&1; rc=$?
if [ $rc = 0 ] && grep -qE "^step +3/3" "$W/p2.log"; then ok; else bad "--resume after | head: exit $rc, $(tail -n 2 "$W/p2.log")"; fi

# 2. stdout closed during training (the reader goes after the first step's line), with --grad-accum 2
timeout 300 "$TRAINER" "${T[@]}" --out "$W/q" --steps 100000 --grad-accum 2 2>"$W/q.err" |
  { grep -m 1 -E "^step +1/" >"$W/q.head"; }
rcs=("${PIPESTATUS[@]}")
if [ "${rcs[0]}" = 0 ] && [ -f "$W/q/checkpoint.bin" ] && [ -s "$W/q.head" ]; then ok; else
  bad "stdout closed during training: trainer exit ${rcs[0]}, checkpoint: $(ls "$W/q" 2>&1 | tr '\n' ' '), stderr: $(tail -n 2 "$W/q.err")"
fi

# 3. EMU_THREADS=1024, the top of the documented range: a training step (kernels of up to 1024 threads per
# block on every OS thread), three times (it failed in most runs when each fiber was its own mapping)
for i in 1 2 3; do
  EMU_THREADS=1024 timeout 300 "$TRAINER" "${T[@]}" --out "$W/t$i" --steps 1 >"$W/t$i.log" 2>&1; rc=$?
  if [ $rc = 0 ] && [ -f "$W/t$i/model.safetensors" ]; then ok; else
    bad "EMU_THREADS=1024 (run $i): exit $rc, $(grep -m 1 -E "cannot map|cpu runtime" "$W/t$i.log" || tail -n 1 "$W/t$i.log")"
  fi
done

echo "$pass passed, $fail failed"
[ $fail = 0 ]
