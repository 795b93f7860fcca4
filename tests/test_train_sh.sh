#!/usr/bin/env bash
# test_train_sh.sh: ./train.sh, the one command, on the CPU build with the tiny preset (arguments given, so it
# takes seconds; the no-argument defaults train for minutes and are measured by hand, see README):
#   - it prepares bounded shards of ELF functions (DATA_INPUTS=build/cpu here), picks ./trainer_cpu and says
#     why, trains with validation, evaluates the export, plots, and prints where everything is;
#   - a second run reuses the shards; the shards' --seq must fit the run's;
#   - under srun (SLURM_NTASKS=2, two processes): rank 0 prepares the shards while rank 1 waits, both
#     train, rank 0 alone evaluates and plots;
#   - Ctrl-C (SIGINT to train.sh) stops the trainer after its step with a checkpoint, and says how to resume;
#   - errors: missing Python packages name the pip command; a bad TRAINER or --seq.
# The evaluation and the plot need the trainer's --eval and metrics.jsonl (issue 11's trainer side).
# Run by tests/run.sh; needs tools/requirements.txt. TRAINER=PATH runs another build of trainer_cpu.
cd "$(dirname "$0")/.." || exit 1
pass=0; fail=0
ok()  { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL test_train_sh: $*"; }
check() { if eval "$1"; then ok; else bad "$2"; fi; }
W=$(mktemp -d /tmp/mlm_train_sh_XXXXXX)
trap 'rm -rf "$W"' EXIT
export EMU_THREADS=2 DATA_INPUTS=build/cpu DATA_TOKENS=60000 VAL_FRACTION=0.5  # validation documents whatever the build (the split is by document)
TINY=(--preset tiny --seq 32 --batch 8 --lr 5e-3 --warmup 2 --val-every 5 --val-batches 2)

# 1. the whole job, with arguments
DATA_DIR=$W/data ./train.sh "${TINY[@]}" --steps 10 --out "$W/a" >"$W/a.log" 2>&1; rc=$?
check '[ $rc -eq 0 ]' "./train.sh exited $rc: $(tail -n 1 "$W/a.log")"
check 'grep -q "^train.sh: shards: preparing $W/data from build/cpu" "$W/a.log" && [ -f "$W/data/meta.json" ] && [ -f "$W/data/train_00000.bin" ]' \
  "no shards prepared in $W/data: $(grep -m 3 train.sh "$W/a.log")"
check 'grep -q "\"max_tokens\": 60000" "$W/data/meta.json" && [ ! -e "$W/data.tmp" ]' "the shards are not bounded by DATA_TOKENS"
if [ -n "${TRAINER:-}" ]; then  # TRAINER (another build of trainer_cpu) replaces train.sh's choice
  check 'grep -q "^train.sh: using $TRAINER: TRAINER=$TRAINER" "$W/a.log"' "train.sh did not use TRAINER=$TRAINER"
else
  check 'grep -qE "^train.sh: using ./trainer_cpu: (no usable GPU|./trainer is not built)" "$W/a.log"' \
    "train.sh did not say it uses ./trainer_cpu and why: $(grep -m 1 'using' "$W/a.log")"
fi
check 'grep -qE "^step +10/10" "$W/a/train.log" && grep -qE "^step +10/10" "$W/a.log"' \
  "the training log is not in --out/train.log and on the screen"
check '[ -f "$W/a/checkpoint.bin" ] && [ -f "$W/a/model.safetensors" ]' "no checkpoint or export in --out"
check 'grep -q "^train.sh: evaluating: ${TRAINER:-./trainer_cpu} --eval $W/a --val $W/data/val_\\\\\*.bin --out $W/a --seq 32 --batch 8 --val-batches 2 *$" "$W/a.log"' \
  "train.sh did not evaluate the export: $(grep -m 1 'evaluat' "$W/a.log")"
check 'grep -qE "^eval: loss [0-9.]+ \| accuracy [0-9.]+%? \| [0-9]+ masked tokens in [0-9]+ sequences" "$W/a.log"' \
  "no evaluation result (needs the trainer's --eval): $(grep -m 2 -iE 'eval|unknown flag' "$W/a.log" | tail -n 1)"
check '[ -s "$W/a/metrics.jsonl" ] && grep -q "\"kind\": *\"eval\"" "$W/a/metrics.jsonl"' \
  "no metrics.jsonl with the evaluation in --out (needs the trainer's metrics log)"
# the "try it" line fits the run's --seq 32 (30 bytes with [CLS] and [SEP]) and runs (its inputs only: no torch needed)
try=$(sed -n 's/^  try it *//p' "$W/a.log")
out=$($try --inputs-only 2>&1); rc=$?
check '[[ "$try" == *" --length 30 "* ]] && [ $rc = 0 ]' "the \"try it\" command ($try) does not fit --seq 32 or fails: $out"
python3 -c '
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
val = [r for r in recs if r["kind"] == "val"][-1]; ev = recs[-1]
assert ev["kind"] == "eval" and (ev["val_sequences"], ev["val_masked"]) == (val["val_sequences"], val["val_masked"]), (val, ev)
' "$W/a/metrics.jsonl" 2>"$W/err.txt"
check '[ $? = 0 ]' "the evaluation does not cover what the last validation covered: $(tail -n 1 "$W/err.txt")"
check '[ -f "$W/a/metrics.png" ] && grep -q "  plots .*$W/a/metrics.png" "$W/a.log"' "no plot written and listed"
for what in shards run log metrics checkpoint export; do
  check 'grep -qE "^  $what +" "$W/a.log"' "the closing summary does not say where the $what is"
done

# 2. a second run reuses the shards (--plan-only: the trainer plans and exits, train.sh stops there);
#    shards longer than --seq are refused
DATA_DIR=$W/data ./train.sh "${TINY[@]}" --plan-only --out "$W/b" >"$W/b.log" 2>&1; rc=$?
check 'grep -q "^train.sh: shards: reusing $W/data" "$W/b.log"' "the second run did not reuse the shards: $(grep -m 2 train.sh "$W/b.log")"
check '[ $rc -eq 0 ] && grep -q "GiB for B=8 (--batch)" "$W/b.log" && ! grep -q "evaluating" "$W/b.log"' \
  "--plan-only through train.sh: exit $rc, $(tail -n 2 "$W/b.log")"
out=$(DATA_DIR=$W/data ./train.sh --preset tiny --seq 16 --batch 8 --steps 2 --out "$W/c" 2>&1); rc=$?
check '[ $rc -ne 0 ] && echo "$out" | grep -q "holds samples of up to 32 tokens, longer than --seq 16"' "shards longer than --seq: exit $rc, $out"

# 2b. arguments keep the defaults they do not set (the CPU's: mini at T=128), and the whole command is printed;
#     --tokens replaces the default --steps (they are alternatives)
DATA_DIR=$W/data128 ./train.sh --steps 3 --plan-only --out "$W/f" >"$W/f.log" 2>&1; rc=$?
cmd=$(grep "^train.sh: training: " "$W/f.log")
check '[ $rc -eq 0 ] && echo "$cmd" | grep -q -- "--preset mini --seq 128 --batch 16 .*--val-every 50 .*--steps 3 --plan-only --out $W/f --data "' \
  "./train.sh --steps 3 dropped the CPU defaults or did not print the command (exit $rc): $cmd $(tail -n 1 "$W/f.log")"
check '! echo "$cmd" | grep -q -- "--steps 150" && grep -q "^train.sh: your arguments, and these defaults for .*: --preset mini" "$W/f.log"' \
  "the default --steps was not replaced, or the kept defaults not named: $cmd"
check 'grep -q "GiB for B=16 (--batch)" "$W/f.log"' "the trainer did not plan the mini default's B=16: $(tail -n 2 "$W/f.log")"
DATA_DIR=$W/data128 ./train.sh --tokens 10K --plan-only --out "$W/f" >"$W/f2.log" 2>&1; rc=$?
cmd=$(grep "^train.sh: training: " "$W/f2.log")
check '[ $rc -eq 0 ] && ! echo "$cmd" | grep -q -- "--steps" && echo "$cmd" | grep -q -- "--preset mini .*--tokens 10K"' \
  "--tokens with the defaults (exit $rc): $cmd $(tail -n 1 "$W/f2.log")"

# 3. under srun: 2 ranks; rank 1 waits for rank 0's shards; rank 0 evaluates and plots
for r in 0 1; do
  SLURM_JOB_ID=77 SLURM_STEP_ID=0 SLURM_NTASKS=2 SLURM_PROCID=$r SLURM_LOCALID=0 NCCL_EMU_TIMEOUT_S=60 DATA_DIR=$W/data2 \
    ./train.sh "${TINY[@]}" --steps 4 --out "$W/d" >"$W/d$r.log" 2>&1 &
done
wait
check 'grep -q "2 process(es)" "$W/d0.log" && grep -qE "^step +4/4" "$W/d0.log" && [ -f "$W/d/model.safetensors" ]' \
  "2 ranks under srun did not train: $(tail -n 3 "$W/d0.log" "$W/d1.log")"
check 'grep -q "shards: preparing" "$W/d0.log" && ! grep -q "shards:" "$W/d1.log" && ! grep -q "evaluating" "$W/d1.log"' \
  "rank 1 prepared or evaluated (only rank 0 should)"
check 'grep -q "evaluating" "$W/d0.log"' "rank 0 did not evaluate under srun"

# 4. Ctrl-C: the trainer stops after its current step with a checkpoint; train.sh says how to resume.
#    (A script's background job ignores SIGINT, and bash cannot trap a signal ignored when it starts:
#    python restores SIGINT's default first, as a terminal's foreground job has it.)
DATA_DIR=$W/data python3 -c 'import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])' \
  ./train.sh "${TINY[@]}" --steps 100000 --out "$W/s" >"$W/s.log" 2>&1 &
pid=$!
for i in $(seq 1 300); do grep -qE "^step +3/" "$W/s.log" 2>/dev/null && break; sleep 0.1; done
kill -INT $pid
wait $pid; rc=$?
check '[ $rc -eq 0 ] && grep -q "stopped after step [0-9]* (on a signal)" "$W/s.log" && [ -f "$W/s/checkpoint.bin" ]' \
  "Ctrl-C did not stop the run with a checkpoint (exit $rc, checkpoint: $(ls "$W/s")): $(grep -E '^(step|stopped|train.sh)' "$W/s.log" | tail -n 4)"
check 'grep -q "^train.sh: stopped on a signal: no evaluation (continue with: ./train.sh .*--resume)" "$W/s.log"' \
  "train.sh did not say how to resume: $(grep train.sh "$W/s.log" | tail -n 2)"

# 5. errors: one line that says what to do
printf '#!/bin/sh\nexec python3 -S "$@"\n' >"$W/python_no_site"  # no site-packages: no numpy, pyelftools, matplotlib
chmod +x "$W/python_no_site"
expect_error() {  # expect_error PATTERN COMMAND...: the command fails and its last line says PATTERN
  local pat=$1; shift
  out=$("$@" 2>&1); rc=$?
  if [ $rc -ne 0 ] && echo "$out" | tail -n 1 | grep -q -- "$pat"; then ok; else bad "'$*' gave exit $rc and: $(echo "$out" | tail -n 2)"; fi
}
if python3 -S -c 'import matplotlib' 2>/dev/null; then echo "  (skip the missing-package case: matplotlib is importable without site-packages)"
else expect_error "missing Python packages (.*matplotlib.*): $W/python_no_site -m pip install -r tools/requirements.txt" \
  env PYTHON="$W/python_no_site" DATA_DIR="$W/data" ./train.sh "${TINY[@]}" --steps 2 --out "$W/e"; fi
expect_error "TRAINER=$W/nothing: not an executable file" env TRAINER="$W/nothing" ./train.sh --steps 2
expect_error "--seq x: expected an integer >= 3" env DATA_DIR="$W/data" ./train.sh --preset tiny --seq x --steps 2 --out "$W/e"
mkdir -p "$W/notdata"
expect_error "has no meta.json" env DATA_DIR="$W/notdata" ./train.sh "${TINY[@]}" --steps 2 --out "$W/e"
./train.sh --help >"$W/help.log" 2>&1; rc=$?
check '[ $rc -eq 0 ] && grep -q "the main job in one command" "$W/help.log" && grep -q "srun -K " "$W/help.log" && ! grep -E "srun +-N" "$W/help.log"' \
  "./train.sh --help: exit $rc, or srun without -K: $(grep srun "$W/help.log")"

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
