#!/usr/bin/env bash
# test_train_sh.sh: ./train.sh, the one command, on the CPU build with the tiny preset (arguments given, so it
# takes seconds; the no-argument defaults train for minutes and are measured by hand, see README):
#   - it prepares bounded shards of ELF functions (DATA_INPUTS=build/cpu here), picks ./trainer_cpu and says
#     why, trains with validation, evaluates the export, plots, and prints where everything is;
#   - a second run reuses the shards; the shards' --seq must fit the run's;
#   - under srun (SLURM_NTASKS=2, two processes): rank 0 prepares the shards while rank 1 waits, both
#     train, rank 0 alone evaluates and plots;
#   - Ctrl-C (SIGINT to train.sh) stops the trainer after its step with a checkpoint: train.sh says the run
#     stopped (not "done"), prints the command that resumes it, and offers no export; a --run-steps stop the
#     same, and its printed command resumes and finishes the run;
#   - the summary: the final validation loss beside the chance level (ln 260 = 5.56 for bytes); the "try it"
#     command: machine code of an ELF file (in its .text) after a byte run, a sentence with [MASK] after a text run;
#   - your --data without --val: the val_ shards beside them (text shards here), or else a run without
#     validation and evaluation;
#   - errors: missing Python packages name the pip command; a bad TRAINER or --seq;
#   - train.sh's comments quote no machine's timings.
# The evaluation and the plot need the trainer's --eval and metrics.jsonl (issue 11's trainer side).
# Run by tests/run.sh; needs tools/requirements.txt. TRAINER=PATH runs another build of trainer_cpu; KEEP=1 keeps
# the temporary directory (its logs) for a look.
cd "$(dirname "$0")/.." || exit 1
pass=0; fail=0
ok()  { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL test_train_sh: $*"; }
check() { if eval "$1"; then ok; else bad "$2"; fi; }
W=$(mktemp -d /tmp/mlm_train_sh_XXXXXX)
[ -n "${KEEP:-}" ] || trap 'rm -rf "$W"' EXIT
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
out=$(eval "$try --inputs-only" 2>&1); rc=$?
check '[[ "$try" == *" --length 30 "* ]] && [ $rc = 0 ]' "the \"try it\" command ($try) does not fit --seq 32 or fails: $out"
# ... on machine code: the window lies in the .text section of an ELF file (the section headers, by pyelftools)
python3 -c '
import re, sys
from elftools.elf.elffile import ELFFile
m = re.search(r"--file (\S+) --offset (\d+) --length (\d+) ", sys.argv[1])
assert m, "no --file F --offset N --length L"
f, off, n = m.group(1), int(m.group(2)), int(m.group(3))
t = ELFFile(open(f, "rb")).get_section_by_name(".text")
assert t is not None and t["sh_offset"] <= off and off + n <= t["sh_offset"] + t["sh_size"], (f, off, n, t and t.header)
' "$try" 2>"$W/err.txt"; rc=$?  # (rc: a $? in check's condition would be that of the message's $(...))
check '[ $rc = 0 ]' "the \"try it\" bytes are not machine code (.text of an ELF file): $try: $(tail -n 1 "$W/err.txt")"
# the final validation loss (the export's evaluation) beside the chance level, and what such a short run learns
loss=$(python3 -c 'import json, sys; print("%.3f" % [json.loads(l) for l in open(sys.argv[1])][-1]["val_loss"])' "$W/a/metrics.jsonl")
check 'grep -qE "^  loss +validation $loss .*ln 260 = 5\.56" "$W/a.log" && grep -A 2 "^  loss" "$W/a.log" | grep -q "0x00"' \
  "the summary does not give the final validation loss ($loss) beside ln 260 = 5.56: $(grep -A 2 '^  loss' "$W/a.log")"
python3 -c '
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
val = [r for r in recs if r["kind"] == "val"][-1]; ev = recs[-1]
assert ev["kind"] == "eval" and (ev["val_sequences"], ev["val_masked"]) == (val["val_sequences"], val["val_masked"]), (val, ev)
' "$W/a/metrics.jsonl" 2>"$W/err.txt"; rc=$?
check '[ $rc = 0 ]' "the evaluation does not cover what the last validation covered: $(tail -n 1 "$W/err.txt")"
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
check 'grep -q "^train.sh: the run stopped after step [0-9]* (on a signal): it is not finished" "$W/s.log" && grep -q "^train.sh: resume it with: ./train.sh .*--out $W/s .*--resume *$" "$W/s.log"' \
  "train.sh did not say the run stopped and how to resume: $(grep train.sh "$W/s.log" | tail -n 3)"
check '! grep -qE "^train.sh: done|^  (export|try it) |evaluating" "$W/s.log" && grep -q "^train.sh: stopped in " "$W/s.log" && grep -qE "^  resume +./train.sh .*--resume" "$W/s.log"' \
  "after Ctrl-C train.sh said done, evaluated or offered an export: $(grep -E '^(train.sh|  [a-z])' "$W/s.log" | tail -n 8)"
# --run-steps stops the same way; the printed command resumes the run, which then finishes
DATA_DIR=$W/data ./train.sh "${TINY[@]}" --steps 6 --run-steps 3 --out "$W/r" >"$W/r.log" 2>&1; rc=$?
resume=$(sed -n 's/^  resume *//p' "$W/r.log")
check '[ $rc = 0 ] && grep -q "^train.sh: the run stopped after step 3 (--run-steps)" "$W/r.log" && ! grep -q "^train.sh: done" "$W/r.log" && [ -n "$resume" ]' \
  "--run-steps 3: exit $rc, $(grep -E '^(train.sh|  [a-z])' "$W/r.log" | tail -n 4)"
DATA_DIR=$W/data eval "$resume" >"$W/r2.log" 2>&1; rc=$?
check '[ $rc = 0 ] && grep -qE "^step +6/6" "$W/r2.log" && grep -q "^train.sh: done" "$W/r2.log" && [ -f "$W/r/model.safetensors" ]' \
  "the printed resume command ($resume) did not finish the run: exit $rc, $(tail -n 3 "$W/r2.log")"

# 4b. your --data without --val: the val_ shards beside them (text shards: the "try it" is a sentence) ...
python3 tools/prepare.py text --input README.md tools --train-vocab 400 --out "$W/text" --seq-len 32 --val-fraction 0.2 \
  >"$W/tprep.log" 2>&1 || bad "tools/prepare.py text: $(tail -n 2 "$W/tprep.log")"
./train.sh "${TINY[@]}" --steps 4 --data "$W/text/train_*.bin" --out "$W/t" >"$W/t.log" 2>&1; rc=$?
check '[ $rc = 0 ] && grep -q "^train.sh: --data without --val: validating on $W/text/val_\*.bin" "$W/t.log" && grep -q "^train.sh: evaluating: .* --val $W/text/val_" "$W/t.log" && grep -q "^train.sh: done" "$W/t.log"' \
  "--data without --val (val_ shards beside them): exit $rc, $(grep -E '^(train.sh|trainer)' "$W/t.log" | tail -n 3)"
try=$(sed -n 's/^  try it *//p' "$W/t.log")
out=$(eval "$try --inputs-only" 2>&1); rc=$?
check '[[ "$try" == *"--text \""*"[MASK]"* ]] && [[ "$try" != *"--file"* ]] && [ $rc = 0 ]' \
  "the \"try it\" after a text run is not a sentence with [MASK], or fails: $try: $out"
# ... else no validation: train.sh drops its --val-every and the evaluation, and says so
mkdir -p "$W/noval" && cp "$W/data"/train_*.bin "$W/noval/"
./train.sh --preset tiny --seq 32 --batch 8 --lr 5e-3 --warmup 2 --steps 3 --data "$W/noval/train_*.bin" --out "$W/n" \
  >"$W/n.log" 2>&1; rc=$?
cmd=$(grep "^train.sh: training: " "$W/n.log")
check '[ $rc = 0 ] && grep -q "^train.sh: --data without --val (no $W/noval/val_\*.bin): a run without validation" "$W/n.log" && [[ "$cmd" != *--val* ]] && ! grep -q evaluating "$W/n.log" && grep -q "^train.sh: done" "$W/n.log"' \
  "--data without --val and no val_ shards: exit $rc, $cmd $(grep -E '^(train.sh|trainer)' "$W/n.log" | tail -n 3)"
check 'grep -qE "^  loss +training [0-9.]+ at step 3, no validation \(chance for 260 tokens: ln 260 = 5\.56\)" "$W/n.log"' \
  "no training loss beside the chance level without validation: $(grep -A 1 '^  loss' "$W/n.log")"

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
expect_error "--val-every with --data and no --val (no $W/noval/val_\*.bin): give --val GLOB" \
  ./train.sh --preset tiny --seq 32 --val-every 2 --steps 2 --data "$W/noval/train_*.bin" --out "$W/e"
mkdir -p "$W/notdata"
expect_error "has no meta.json" env DATA_DIR="$W/notdata" ./train.sh "${TINY[@]}" --steps 2 --out "$W/e"
./train.sh --help >"$W/help.log" 2>&1; rc=$?
check '[ $rc -eq 0 ] && grep -q "the main job in one command" "$W/help.log" && grep -q "srun -K " "$W/help.log" && ! grep -E "srun +-N" "$W/help.log"' \
  "./train.sh --help: exit $rc, or srun without -K: $(grep srun "$W/help.log")"

# 6. the comments say what a default does, not how long it took on some machine
timings=$(grep -nE "[0-9.]+ s (per|each)|[0-9] s[,;)]|[0-9.]+ (minutes|min)\b|: minutes|H100|H200|A100|[0-9]-core|\bVM\b" train.sh)
check '[ -z "$timings" ]' "train.sh quotes a machine's timings: $timings"

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
