#!/usr/bin/env bash
# train.sh: the main job in one command. With no arguments:
#   1. data   prepares shards from this machine's own ELF files (the seed paper's domain: binary code,
#             one sample per function, one token per byte), a bounded sample of /usr/lib and /usr/bin,
#             into data/elf_T<seq>_<tokens>/; reused when already there;
#   2. binary ./trainer when `./trainer --info` finds a GPU, else ./trainer_cpu (it says which and why);
#             runs ./build.sh first when neither is built;
#   3. train  on the CPU the `mini` preset (150 steps at T=128), on a GPU `bert-base` (300 steps at T=512),
#             with validation (every validation sequence once); into runs/<date>-<time>/ (runs/job-<id>/
#             under Slurm), log in train.log;
#   4. eval   ./trainer --eval on the export, on the validation shards (what the last validation covered);
#   5. plots  tools/plot.py: runs/.../metrics.png from metrics.jsonl;
#   6. prints where everything is, the final validation loss beside the chance level (ln V for V tokens), and
#             a tools/fill_mask.py command to try the model (machine code for a byte model, a sentence for text).
# With arguments, each one you give replaces that flag's default (at the top of train.sh, for this machine's
# binary: CPU or GPU) and the defaults you do not override stay (--tokens or --epochs replace --steps); it
# prints the whole trainer command. train.sh adds --data/--val (its shards, prepared at the run's --seq) and
# --out when you give none. Your own --data without --val: the validation shards beside them when their
# name says where (--data 'D/train_*.bin': D/val_*.bin, as tools/prepare.py writes them) and they exist;
# else a run without validation (train.sh drops its default --val-every) and without the evaluation (4):
#   ./train.sh --steps 300                                       # the CPU defaults (mini, T=128), 300 steps
#   ./train.sh --preset tiny --seq 32 --batch 16 --steps 300 --val-every 100
#   ./train.sh --data 'data/wiki/train_*.bin' --seq 128          # your shards (validates on data/wiki/val_*.bin)
#   ./train.sh --out runs/a --steps 400                          # into runs/a
#   ./train.sh --out runs/a --steps 400 --resume                 # after a stop: the same, continued
# Under srun every rank runs train.sh: rank 0 (SLURM_PROCID) prepares the shards, evaluates and
# plots; the other ranks wait for the shards (the data directory and --out must be on a file system
# every node sees, as the trainer's --out already must be):
#   srun -K -N 2 --ntasks-per-node 4 --gpus-per-node 4 ./train.sh   (-K: one rank failing ends the job)
# Ctrl-C, SIGTERM or SIGUSR1 stop the trainer after its current step with a checkpoint (so does --run-steps):
# train.sh then says the run stopped, prints the command that resumes it (--resume), plots what was logged,
# and neither evaluates nor offers the export (the trainer writes it only at the last step).
# Environment: TRAINER (the binary, instead of the choice in 2), DATA_TOKENS (the data bound), VAL_FRACTION (its validation share, 0.01),
# DATA_INPUTS (what to prepare, default "/usr/lib /usr/bin"), DATA_DIR (where), PYTHON (default python3).
set -uo pipefail
cd "$(dirname "$0")" || exit 1

# ---- the defaults: what a run with no arguments does (edit here) -------------------------------------------
# Validation (and the evaluation) cover every validation sequence once (the trainer's default, no --val-batches).
# CPU: the mini preset (512 positions) at T=128, where a step costs far less than at T=512; 16 rows a step.
CPU_TRAIN=(--preset mini --seq 128 --batch 16 --steps 150 --lr 2e-3 --warmup 15 --val-every 50)
CPU_DATA_TOKENS=4000000   # 4 M bytes of ELF functions: the 150 steps see 0.3 M tokens, no sample twice
# GPU: bert-base at T=512, the largest micro-batch that fits (the trainer's automatic --batch), a short run.
GPU_TRAIN=(--preset bert-base --seq 512 --steps 300 --warmup 30 --val-every 50 --ckpt-every 100)
GPU_DATA_TOKENS=64000000  # 64 M bytes of ELF functions
read -r -a DATA_INPUTS <<<"${DATA_INPUTS:-/usr/lib /usr/bin}"
# ------------------------------------------------------------------------------------------------------------

PYTHON=${PYTHON:-python3}
RANK=${SLURM_PROCID:-0}
NTASKS=${SLURM_NTASKS:-1}
START=$(date +%s)
say() { echo "train.sh: $*"; }
die() { echo "train.sh: $*" >&2; exit 1; }
quoted() { printf '%q ' "$@"; }  # a command as it can be pasted back into a shell
elapsed() { local s=$(($(date +%s) - $1)); printf '%dm%02ds' $((s / 60)) $((s % 60)); }

case "${1:-}" in
  -h | --help)
    sed -n '2,/^set -uo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'
    echo "The trainer's own flags: ./trainer_cpu --help"
    exit 0 ;;
esac

# ---- the arguments: which of them train.sh must know about ----
USER_ARGS=("$@")
arg_value() {  # arg_value FLAG: the value given to FLAG in the arguments (the last one), or nothing
  local i v=""
  for ((i = 0; i < ${#USER_ARGS[@]}; i++)); do
    [ "${USER_ARGS[$i]}" = "$1" ] && [ $((i + 1)) -lt ${#USER_ARGS[@]} ] && v=${USER_ARGS[$((i + 1))]}
  done
  echo "$v"
}
has_arg() { local a; for a in "${USER_ARGS[@]}"; do [ "$a" = "$1" ] && return 0; done; return 1; }
PASSTHROUGH=0  # modes that train nothing: the binary runs with the arguments as they are
for m in --bench --info --eval; do has_arg "$m" && PASSTHROUGH=1; done

# ---- 2. the binary ----
choose_binary() {
  local info=""
  if [ -n "${TRAINER:-}" ]; then
    [ -x "$TRAINER" ] || die "TRAINER=$TRAINER: not an executable file"
    BIN=$TRAINER; WHY="TRAINER=$TRAINER"; return
  fi
  BIN=""
  if [ -x ./trainer ] && info=$(./trainer --info 2>&1); then
    BIN=./trainer; WHY="./trainer --info: $(echo "$info" | head -n 1)"
  elif [ -x ./trainer_cpu ]; then
    BIN=./trainer_cpu
    if [ -x ./trainer ]; then WHY="no usable GPU (./trainer --info: $(echo "$info" | grep -v '^$' | tail -n 1))"
    else WHY="./trainer is not built (./build.sh builds it where it finds a GPU, ./build.sh gpu anyway)"; fi
  fi
}
choose_binary
if [ -z "$BIN" ]; then
  [ "$RANK" = 0 ] || die "rank $RANK: neither ./trainer nor ./trainer_cpu is built (run ./build.sh before srun)"
  say "neither ./trainer nor ./trainer_cpu is built: running ./build.sh first"
  ./build.sh || die "./build.sh failed (see above)"
  choose_binary
  [ -n "$BIN" ] || die "./build.sh built neither ./trainer nor ./trainer_cpu"
fi
if [ "$PASSTHROUGH" = 1 ]; then exec "$BIN" "$@"; fi
case "$(basename "$BIN")" in *_cpu*) ON_GPU=0 ;; *) ON_GPU=1 ;; esac  # trainer_cpu: the CPU build
[ "$RANK" = 0 ] && say "using $BIN: $WHY"

# Your --data without --val: the validation shards beside them (the first "train" in the name's last part
# replaced by "val": D/train_*.bin, D/val_*.bin) when that matches a file; else no validation, and train.sh's
# own --val-every and --val-batches defaults are dropped (the trainer's --val-every needs --val).
VAL_BESIDE="" NO_VAL=0
GIVEN_DATA=$(arg_value --data)
if [ -n "$GIVEN_DATA" ] && [ -z "$(arg_value --val)" ]; then
  base=${GIVEN_DATA##*/} dir=""
  [[ "$GIVEN_DATA" == */* ]] && dir=${GIVEN_DATA%/*}/
  looked="no \"train\" in the name to find them by"
  if [[ "$base" == *train* ]]; then
    looked="no $dir${base/train/val}"
    compgen -G "$dir${base/train/val}" >/dev/null && VAL_BESIDE=$dir${base/train/val}
  fi
  [ -n "$VAL_BESIDE" ] || NO_VAL=1
  if [ $NO_VAL = 1 ] && has_arg --val-every; then die "--val-every with --data and no --val ($looked): give --val GLOB"; fi
fi

# The training arguments: the defaults for this binary, less each flag you give (and less --steps when you
# give --tokens or --epochs, its alternatives), then yours.
if [ $ON_GPU = 1 ]; then DEFAULTS=("${GPU_TRAIN[@]}"); DATA_TOKENS=${DATA_TOKENS:-$GPU_DATA_TOKENS}
else DEFAULTS=("${CPU_TRAIN[@]}"); DATA_TOKENS=${DATA_TOKENS:-$CPU_DATA_TOKENS}; fi
VAL_FRACTION=${VAL_FRACTION:-0.01}  # the share of documents in the validation split
TRAIN=() KEPT=()
for ((i = 0; i < ${#DEFAULTS[@]}; i += 2)); do  # the defaults are pairs: --flag value
  f=${DEFAULTS[$i]}
  has_arg "$f" && continue
  [ "$f" = --steps ] && { has_arg --tokens || has_arg --epochs; } && continue
  [ $NO_VAL = 1 ] && { [ "$f" = --val-every ] || [ "$f" = --val-batches ]; } && continue
  KEPT+=("$f" "${DEFAULTS[$((i + 1))]}")
done
TRAIN=("${KEPT[@]}" "$@")
[ -z "$VAL_BESIDE" ] || TRAIN+=(--val "$VAL_BESIDE")
if [ "$RANK" = 0 ] && [ $# -gt 0 ]; then
  if [ ${#KEPT[@]} -gt 0 ]; then say "your arguments, and these defaults for $BIN (top of train.sh): ${KEPT[*]}"
  else say "your arguments replace every default for $BIN"; fi
  if [ -n "$VAL_BESIDE" ]; then say "--data without --val: validating on $VAL_BESIDE, the validation shards beside them"
  elif [ $NO_VAL = 1 ]; then
    say "--data without --val ($looked): a run without validation (train.sh's --val-every dropped), no evaluation"
  fi
fi
[[ "$DATA_TOKENS" =~ ^[1-9][0-9]*$ ]] || die "DATA_TOKENS=$DATA_TOKENS: expected a positive integer"
USER_ARGS=("${TRAIN[@]}")
SEQ=$(arg_value --seq); SEQ=${SEQ:-512}  # the trainer's default --seq
if ! [[ "$SEQ" =~ ^[0-9]+$ ]] || [ "$SEQ" -lt 3 ]; then die "--seq $SEQ: expected an integer >= 3"; fi

# ---- python packages (rank 0 runs the tools): plot.py's, and prepare.py's when it prepares the shards ----
if [ "$RANK" = 0 ]; then
  need=(matplotlib:matplotlib)
  [ -n "$(arg_value --data)" ] || need=(numpy:numpy elftools:pyelftools "${need[@]}")
  missing=$("$PYTHON" - "${need[@]}" <<'EOF' 2>&1
import importlib.util, sys
print(" ".join(p for m, p in (a.split(":") for a in sys.argv[1:]) if importlib.util.find_spec(m) is None))
EOF
  ) || die "$PYTHON does not run ($missing): set PYTHON to a Python 3"
  [ -z "$missing" ] || die "missing Python packages ($missing): $PYTHON -m pip install -r tools/requirements.txt"
fi

# ---- 1. the data: rank 0 prepares it once (into a temporary directory, renamed when complete) ----
DATA=$(arg_value --data); VAL=$(arg_value --val)
if [ -z "$DATA" ]; then
  DATA_DIR=${DATA_DIR:-data/elf_T${SEQ}_${DATA_TOKENS}}
  if [ "$RANK" = 0 ]; then
    if [ -f "$DATA_DIR/meta.json" ]; then
      prepared=$(sed -n -E 's/^ *"seq_len": ([0-9]+),?$/\1/p' "$DATA_DIR/meta.json")
      [ "${prepared:-0}" -le "$SEQ" ] || die "$DATA_DIR holds samples of up to $prepared tokens, longer than --seq $SEQ"
      say "shards: reusing $DATA_DIR (prepared earlier; remove it to prepare again)"
    elif [ -e "$DATA_DIR" ]; then
      die "$DATA_DIR exists but has no meta.json (not shards of tools/prepare.py): remove it or set DATA_DIR"
    else
      t0=$(date +%s)
      say "shards: preparing $DATA_DIR from ${DATA_INPUTS[*]} (ELF functions, one token per byte, at most $DATA_TOKENS tokens)"
      rm -rf "$DATA_DIR.tmp"
      "$PYTHON" tools/prepare.py bytes --input "${DATA_INPUTS[@]}" --elf-functions --out "$DATA_DIR.tmp" \
        --seq-len "$SEQ" --max-tokens "$DATA_TOKENS" --val-fraction "$VAL_FRACTION" ||
        die "tools/prepare.py failed (see above); nothing was written to $DATA_DIR"
      mv "$DATA_DIR.tmp" "$DATA_DIR" || die "cannot rename $DATA_DIR.tmp to $DATA_DIR"
      say "shards: $DATA_DIR prepared in $(elapsed "$t0")"
    fi
  else
    for ((i = 0; i < 3600; i++)); do [ -f "$DATA_DIR/meta.json" ] && break; sleep 1; done
    [ -f "$DATA_DIR/meta.json" ] ||
      die "rank $RANK: no $DATA_DIR/meta.json after an hour (rank 0 prepares it: is $PWD on a shared file system?)"
  fi
  DATA="$DATA_DIR/train_*.bin"
  [ -n "$VAL" ] || VAL="$DATA_DIR/val_*.bin"
  TRAIN+=(--data "$DATA")
  [ -n "$(arg_value --val)" ] || TRAIN+=(--val "$VAL")
fi

# ---- 3. train ----
OUT=$(arg_value --out)
if [ -z "$OUT" ]; then
  if [ -n "${SLURM_JOB_ID:-}" ]; then OUT=runs/job-$SLURM_JOB_ID; else OUT=runs/$(date +%Y%m%d-%H%M%S); fi
  TRAIN+=(--out "$OUT")
fi
mkdir -p "$OUT" || die "--out $OUT: cannot create the directory"
LOG=$OUT/train.log
STOPPED=0 TEE="" FAILED=""
if [ "$RANK" = 0 ]; then
  say "training: $(quoted "$BIN" "${TRAIN[@]}")"
  [ "$NTASKS" = 1 ] || say "  as rank 0 of $NTASKS (SLURM_NTASKS)"
  say "  (the log also goes to $LOG; Ctrl-C stops after the current step with a checkpoint)"
  size=$(stat -c %s "$LOG" 2>/dev/null || echo 0)
  # The output goes to the screen and the log through tee, which ignores the stop signals (Slurm sends
  # SIGTERM to every process of the job): a tee that died would break the pipe under the trainer as it
  # saves its checkpoint. tee ends when the trainer, the last writer, exits.
  exec {tee_fd}> >(trap '' INT TERM USR1; exec tee -a "$LOG")
  TEE=$!
  "$BIN" "${TRAIN[@]}" >&"$tee_fd" 2>&1 &
  PID=$!
  exec {tee_fd}>&-
else
  "$BIN" "${TRAIN[@]}" &
  PID=$!
fi
# A signal to train.sh goes to the trainer as SIGTERM: it finishes its step, saves a checkpoint, exits 0.
# (Background jobs of a script ignore SIGINT, so Ctrl-C reaches the trainer only this way.)
trap 'STOPPED=1; kill -TERM $PID 2>/dev/null' INT TERM USR1
wait $PID; RC=$?
while kill -0 $PID 2>/dev/null; do wait $PID; RC=$?; done
trap - INT TERM USR1
[ -z "$TEE" ] || wait "$TEE"  # the whole log is on the screen before train.sh goes on
if [ "$RANK" != 0 ]; then exit $RC; fi
[ $RC = 0 ] || die "the trainer exited with code $RC (see above and $LOG)"
has_arg --plan-only && exit 0
# Did the run finish? The trainer exits 0 too when it stops early with a checkpoint (a signal, sent to train.sh
# or to the trainer itself as Slurm does, or --run-steps): it then prints "stopped after step N (why); --resume
# ..." and writes no export (that comes at the last step only).
STOP_LINE=$(tail -c +$((size + 1)) "$LOG" | grep -m 1 "^stopped after step [0-9]* (")
STOPPED=0
if [ -n "$STOP_LINE" ] || [ ! -f "$OUT/model.safetensors" ]; then STOPPED=1; fi
RESUME_ARGS=(./train.sh)  # this run's command, continued: --resume (not --overwrite or --init-from, which it excludes)
for ((i = 0; i < ${#TRAIN[@]}; i++)); do
  case "${TRAIN[$i]}" in
    --resume | --overwrite) ;;
    --init-from) i=$((i + 1)) ;;
    *) RESUME_ARGS+=("${TRAIN[$i]}") ;;
  esac
done
RESUME=$(quoted "${RESUME_ARGS[@]}" --resume); RESUME=${RESUME% }  # as it can be pasted
if [ $STOPPED = 1 ]; then
  why=$(echo "$STOP_LINE" | sed -n -E 's/^stopped (after step [0-9]+ \([^)]*\)).*/\1/p')
  say "the run stopped ${why:-before its last step (no export in $OUT)}: it is not finished (no export, no evaluation)"
  say "resume it with: $RESUME"
fi

# ---- 4. evaluate: the export on the validation shards ----
EVAL_VAL=$(arg_value --val); EVAL_VAL=${EVAL_VAL:-$VAL}
if [ $STOPPED = 1 ] || [ $NO_VAL = 1 ]; then
  :  # said above
elif [ -z "$EVAL_VAL" ]; then
  say "no --val shards: no evaluation"
else
  EVAL=(--eval "$OUT" --val "$EVAL_VAL" --out "$OUT" --seq "$SEQ")
  B=$(arg_value --batch); [ -n "$B" ] && EVAL+=(--batch "$B")
  VB=$(arg_value --val-batches); [ -n "$VB" ] && EVAL+=(--val-batches "$VB")  # what the run's validation covered
  say "evaluating: $(quoted "$BIN" "${EVAL[@]}")"
  # one process, whatever the job: the Slurm variables would make it wait for peers
  env -u SLURM_NTASKS -u SLURM_PROCID -u SLURM_LOCALID "$BIN" "${EVAL[@]}" 2>&1 | tee -a "$LOG"
  [ "${PIPESTATUS[0]}" = 0 ] || { say "the evaluation failed (see above)" >&2; FAILED+=" evaluation"; }
fi

# ---- 5. plots (of what was logged, a stopped run's too) ----
PLOT_OK=0
if "$PYTHON" tools/plot.py "$OUT"; then PLOT_OK=1
elif [ $STOPPED = 1 ]; then say "no plot (see above)"
else FAILED+=" plot"; fi

# ---- 6. where everything is, the loss reached, and a command to try the model ----
# loss_summary DIR KIND: the run's last validation (or evaluation) loss from DIR/metrics.jsonl, else its last
# training loss, beside the chance level ln V (V: config.json's or run.json's vocab_size); then, for KIND bytes
# or text, what a short run learns. One line per item.
loss_summary() {
  "$PYTHON" - "$@" <<'EOF'
import json, math, os, sys
d, kind = sys.argv[1], sys.argv[2]
val = train = None
try:
    with open(os.path.join(d, "metrics.jsonl"), encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if not isinstance(r, dict):
                continue
            num = lambda k: isinstance(r.get(k), (int, float)) and not isinstance(r.get(k), bool)  # noqa: E731
            if num("val_loss"):
                val = r
            elif r.get("kind") == "train" and num("loss"):
                train = r
except OSError:
    pass
v = None
for name in ("config.json", "run.json"):
    try:
        with open(os.path.join(d, name)) as f:
            v = json.load(f)["vocab_size"]
        break
    except (OSError, ValueError, KeyError, TypeError):
        pass
chance = f"chance for {v} tokens: ln {v} = {math.log(v):.2f}" if isinstance(v, int) and v > 1 else ""
if val is not None:
    where = "of the export (--eval)" if val.get("kind") == "eval" else f"at step {val.get('step')}"
    acc = val.get("val_accuracy")
    acc = f", accuracy {acc:.3f}" if isinstance(acc, (int, float)) else ""
    chance_acc = f", accuracy 1/{v} = {1 / v:.3f}" if chance else ""
    print(f"validation {val['val_loss']:.3f} {where}{acc}" + (f" ({chance}{chance_acc})" if chance else ""))
elif train is not None:
    print(f"training {train['loss']:.3f} at step {train.get('step')}, no validation" + (f" ({chance})" if chance else ""))
else:
    sys.exit(0)
if kind == "bytes":
    print("(the CPU default, 150 steps of the mini preset, ends near 4.0-4.3: it has learned mostly which bytes are")
    print(" frequent, and fills most masks with 0x00; more steps and a larger preset learn the code around a mask)")
elif kind == "text":
    print("(a short run of a small model learns the frequent tokens first and fills most masks with them; more")
    print(" steps and a larger preset learn the context)")
EOF
}
# elf_code FILE: "OFFSET WHAT" of machine code in the ELF file FILE, from its section headers: its entry point
# (_start) in .text, else the start of .text; nothing when FILE is not such a file
elf_code() {
  "$PYTHON" - "$1" <<'EOF' 2>/dev/null
import struct, sys
with open(sys.argv[1], "rb") as f:
    d = f.read()
if d[:4] != b"\x7fELF" or d[4] not in (1, 2) or d[5] not in (1, 2):
    sys.exit(1)
e = "<" if d[5] == 1 else ">"
if d[4] == 2:  # ELF64: the header's fields after e_ident, a section header's
    h, sh = e + "HHIQQQIHHHHHH", e + "IIQQQQIIQQ"
else:
    h, sh = e + "HHIIIIIHHHHHH", e + "IIIIIIIIII"
entry, shoff, shentsize, shnum, shstrndx = (struct.unpack_from(h, d, 16)[i] for i in (3, 5, 10, 11, 12))
secs = [struct.unpack_from(sh, d, shoff + i * shentsize) for i in range(shnum)]
names = secs[shstrndx][4]
for s in secs:
    if d[names + s[0]:d.index(b"\0", names + s[0])] == b".text":
        addr, off, size = s[3], s[4], s[5]
        if addr <= entry < addr + size:
            print(off + entry - addr, "its entry point in .text (_start): machine code")
        else:
            print(off, "the start of .text: machine code")
        sys.exit(0)
sys.exit(1)
EOF
}
KIND=""
if [ -f "$OUT/byte_tokenizer.json" ]; then KIND=bytes; elif [ -f "$OUT/tokenizer.json" ]; then KIND=text; fi
echo
if [ $STOPPED = 1 ]; then say "stopped in $(elapsed "$START") ($BIN): the run is not finished (resume: below)"
else say "done in $(elapsed "$START") ($BIN)"; fi
[ -n "${DATA_DIR:-}" ] && printf '  %-11s %s\n' shards "$DATA_DIR/ (train_*.bin, val_*.bin, meta.json: what was prepared)"
printf '  %-11s %s\n' run "$OUT/"
printf '  %-11s %s\n' log "$LOG"
printf '  %-11s %s\n' metrics "$OUT/metrics.jsonl (one JSON object per logged step, validation and evaluation)"
[ $PLOT_OK = 1 ] && printf '  %-11s %s\n' plots "$OUT/metrics.png (python3 tools/plot.py $OUT)"
first=1
while IFS= read -r line; do
  if [ $first = 1 ]; then printf '  %-11s %s\n' loss "$line"; first=0; else printf '  %-11s %s\n' "" "$line"; fi
done < <(loss_summary "$OUT" "$([ $STOPPED = 1 ] || echo "$KIND")")
if [ $STOPPED = 1 ]; then
  printf '  %-11s %s\n' checkpoint "$OUT/checkpoint.bin (the command below continues it; no export until the last step)"
  printf '  %-11s %s\n' resume "$RESUME"
else
  printf '  %-11s %s\n' checkpoint "$OUT/checkpoint.bin (./train.sh ... --out $OUT --resume continues it)"
  tok=""; for f in byte_tokenizer.json tokenizer.json; do [ -f "$OUT/$f" ] && tok+=", $f"; done
  printf '  %-11s %s\n' export "$OUT/ (config.json, model.safetensors$tok: Hugging Face BertForMaskedLM)"
  try="" about=""
  if [ "$KIND" = bytes ]; then
    len=$((SEQ - 2 < 64 ? SEQ - 2 : 64))  # with [CLS] and [SEP], within the positions the run trained
    for f in /bin/ls "$BIN"; do
      code=$(elf_code "$f") && [ -n "$code" ] && break
    done
    if [ -n "$code" ]; then
      try="--file $(quoted "$f")--offset ${code%% *} --length $len --mask-every 8"
      about="($len bytes of $f at ${code%% *}, ${code#* })"
    else
      try="--file $(quoted "$BIN")--length $len --mask-every 8"
    fi
  elif [ "$KIND" = text ]; then
    try='--text "The capital of France is [MASK]." --top 5'
  fi
  if [ -n "$try" ]; then
    printf '  %-11s %s\n' "try it" "python3 tools/fill_mask.py $(quoted "$OUT")$try"
    [ -z "$about" ] || printf '  %-11s %s\n' "" "$about"
    printf '  %-11s %s\n' "" "(needs torch and transformers: python3 -m pip install torch transformers)"
  fi
fi
[ -z "$FAILED" ] || die "these steps failed:$FAILED (see above)"
exit 0
