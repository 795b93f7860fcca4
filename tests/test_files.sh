#!/usr/bin/env bash
# test_files.sh: one way to open a file (files.h), on the CPU build (./trainer_cpu), tiny model:
#   - every file the trainer reads is a regular file of a bounded size: a FIFO, a directory, /dev/zero or a file
#     over its bound (sparse) named like a checkpoint (--eval, --resume), model.safetensors (--init-from), a shard,
#     tokenizer.json, the NCCL id file (--bootstrap file) or the staging marker (--stage-dir) is refused at once with
#     one line naming the path and what was expected (or, the id file and the marker, passed over), never waited on;
#   - tokenizer.json beside the shards is read at start-up: broken (also cut short) or of another vocabulary (300
#     ids beside 260-id byte shards), the run stops before step 1; a good one (WordLevel, Unigram) is exported as it
#     was at the start, even when the file is replaced by a FIFO mid-run;
#   - where it writes: DIR/lock a symbolic link is refused, the file it points to untouched; so is metrics.jsonl for
#     --eval --out; links left at checkpoint.bin.tmp and run.json.tmp are replaced, never written through;
#   - a stale DIR/.export.tmp holding a subdirectory (and a link out of it) is removed whole at the start;
#   - two 2-rank launches at once into one --out on different MASTER_PORTs, each holding one byte of the lock: the
#     one whose rank 0 has byte 0 runs, the other's two processes stop at once naming the lock.
# Run by tests/run.sh; needs tools/requirements.txt (python3 tools/prepare.py). TRAINER overrides ./trainer_cpu.
cd "$(dirname "$0")/.."
TRAINER=${TRAINER:-./trainer_cpu}
pass=0; fail=0
check() {  # check CONDITION WHAT DETAILS
  if eval "$1"; then pass=$((pass + 1)); echo "ok   $2"; else fail=$((fail + 1)); echo "FAIL $2: $3"; fi
}
W=$(mktemp -d /tmp/mlm_files_XXXXXX)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; done; rm -rf "$W"; }
trap cleanup EXIT
export EMU_THREADS=1
unset MLM_TEST_INF_GRAD MLM_TEST_INF_LOSS MLM_TEST_METRICS_FAIL

mkdir -p "$W/in"
for i in $(seq 1 40); do echo "alpha beta gamma delta $i kernel tensor shard" >>"$W/in/a.txt"; done
python3 tools/prepare.py bytes --input "$W/in" --out "$W/data" --seq-len 32 --val-fraction 0 >"$W/prep.log" 2>&1 ||
  { echo "tools/prepare.py failed: $(tail -n 2 "$W/prep.log")"; echo "0 passed, 1 failed"; exit 1; }
SHARD="$W/data/train_00000.bin"
COMMON=(--preset tiny --seq 32 --batch 4 --lr 5e-3 --seed 7 --loader-threads 1)
T=(--data "$W/data/train_*.bin" "${COMMON[@]}")
run() { timeout 30 "$TRAINER" "$@"; }  # a blocking open ends as exit 124: a failure
# refused WHAT PATTERN ARGS...: exit 1 with PATTERN (fixed string) in the output, before any step
refused() {
  local what=$1 want=$2; shift 2
  local out; out=$(run "$@" 2>&1); local rc=$?
  check '[ $rc = 1 ] && echo "$out" | grep -qF -- "$want" && ! echo "$out" | grep -q "^step "' "$what" \
    "exit $rc, want 1 and '$want': $(echo "$out" | grep -v '^step ' | tail -n 2)"
}
run "${T[@]}" --out "$W/r" --steps 2 >"$W/r.log" 2>&1
check '[ -f "$W/r/model.safetensors" ] && [ -f "$W/r/checkpoint.bin" ]' "a first run" "$(tail -n 2 "$W/r.log")"
VICTIM="$W/victim.txt"
echo "precious" >"$VICTIM"

# 1. readers: a checkpoint
mkfifo "$W/ck.fifo"; truncate -s $(((1 << 42) + 1)) "$W/ck.big"
refused "--eval a FIFO" "--eval $W/ck.fifo: not a regular file but a FIFO (expected an mlm.c checkpoint)" \
  --eval "$W/ck.fifo" --val "$SHARD" --batch 4 --val-batches 1
refused "--eval /dev/zero" "--eval /dev/zero: not a regular file but a character device" \
  --eval /dev/zero --val "$SHARD" --batch 4 --val-batches 1
refused "--eval a checkpoint over 4 TiB" \
  "--eval $W/ck.big: 4398046511105 bytes, more than the 4 TiB (4398046511104 bytes) an mlm.c checkpoint may have" \
  --eval "$W/ck.big" --val "$SHARD" --batch 4 --val-batches 1
cp -r "$W/r" "$W/rs" && mkfifo "$W/rs/checkpoint-9.bin" && mkdir "$W/rs/checkpoint-8.bin"
out=$(run "${T[@]}" --out "$W/rs" --steps 3 --resume 2>&1); rc=$?
check '[ $rc = 0 ] && echo "$out" | grep -q "^resumed from $W/rs/checkpoint.bin at step 2"' \
  "--resume beside a FIFO and a directory named checkpoint-N.bin" "exit $rc: $(echo "$out" | tail -n 2)"
# model.safetensors (--init-from): a directory, a FIFO, /dev/zero, larger than twice the model's F32 bytes + 64 MiB
for k in dir fifo zero big; do mkdir -p "$W/hf_$k" && cp "$W/r/config.json" "$W/hf_$k/"; done
mkdir "$W/hf_dir/model.safetensors"; mkfifo "$W/hf_fifo/model.safetensors"
ln -s /dev/zero "$W/hf_zero/model.safetensors"; truncate -s 1G "$W/hf_big/model.safetensors"
refused "--init-from: model.safetensors a directory" \
  "model: $W/hf_dir/model.safetensors: not a regular file but a directory (expected a safetensors file)" \
  "${T[@]}" --out "$W/o1" --steps 2 --init-from "$W/hf_dir"
refused "--init-from: model.safetensors a FIFO" "model: $W/hf_fifo/model.safetensors: not a regular file but a FIFO" \
  "${T[@]}" --out "$W/o1" --steps 2 --init-from "$W/hf_fifo"
refused "--init-from: model.safetensors /dev/zero" \
  "model: $W/hf_zero/model.safetensors: not a regular file but a character device" \
  "${T[@]}" --out "$W/o1" --steps 2 --init-from "$W/hf_zero"
refused "--init-from: model.safetensors over its bound, not read" \
  "model: $W/hf_big/model.safetensors: 1073741824 bytes, more than the" \
  "${T[@]}" --out "$W/o1" --steps 2 --init-from "$W/hf_big"
# shards
for k in fifo dir zero big; do mkdir -p "$W/s_$k" && cp "$SHARD" "$W/s_$k/"; done
mkfifo "$W/s_fifo/train_00001.bin"; mkdir "$W/s_dir/train_00001.bin"; ln -s /dev/zero "$W/s_zero/train_00001.bin"
truncate -s $(((1 << 40) + 1)) "$W/s_big/train_00001.bin"
refused "a shard a FIFO" "data: $W/s_fifo/train_00001.bin: not a regular file but a FIFO (expected a shard" \
  --data "$W/s_fifo/train_*.bin" "${COMMON[@]}" --out "$W/o2" --steps 2
refused "a shard a directory" "data: $W/s_dir/train_00001.bin: not a regular file but a directory" \
  --data "$W/s_dir/train_*.bin" "${COMMON[@]}" --out "$W/o2" --steps 2
refused "a shard /dev/zero" "data: $W/s_zero/train_00001.bin: not a regular file but a character device" \
  --data "$W/s_zero/train_*.bin" "${COMMON[@]}" --out "$W/o2" --steps 2
refused "a shard over 1 TiB" \
  "data: $W/s_big/train_00001.bin: 1099511627777 bytes, more than the 1 TiB (1099511627776 bytes) a shard" \
  --data "$W/s_big/train_*.bin" "${COMMON[@]}" --out "$W/o2" --steps 2

# 2. tokenizer.json beside the shards: read at start-up
tokenizer() {  # tokenizer FILE IDS [unigram]: a WordLevel (or Unigram) tokenizer.json of IDS ids, 4 of them added
  python3 - "$@" <<'EOF'
import json, sys
n = int(sys.argv[2])
vocab = {f"t{i}": i for i in range(n - 4)}
model = {"type": "WordLevel", "vocab": vocab, "unk_token": "[PAD]"}
if sys.argv[3:] == ["unigram"]:  # a list of [token, score]: the ids are the positions
    model = {"type": "Unigram", "unk_id": 0, "vocab": [[f"t\"{i}", -1.5] for i in range(n - 4)]}
added = [{"id": n - 4 + i, "content": s, "special": True} for i, s in enumerate(["[PAD]", "[CLS]", "[SEP]", "[MASK]"])]
json.dump({"version": "1.0", "added_tokens": added, "normalizer": None, "model": model}, open(sys.argv[1], "w"))
EOF
}
for k in fifo dir zero big foreign good swap uni bad; do mkdir -p "$W/t_$k" && cp "$SHARD" "$W/t_$k/"; done
tokenizer "$W/t_uni/tokenizer.json" 260 unigram; echo '{"model": {"vocab": {"a": 0, "b": ' >"$W/t_bad/tokenizer.json"
mkfifo "$W/t_fifo/tokenizer.json"; mkdir "$W/t_dir/tokenizer.json"; ln -s /dev/zero "$W/t_zero/tokenizer.json"
truncate -s 300M "$W/t_big/tokenizer.json"; tokenizer "$W/t_foreign/tokenizer.json" 300
tokenizer "$W/t_good/tokenizer.json" 260; tokenizer "$W/t_swap/tokenizer.json" 260
for k in fifo dir zero; do
  refused "tokenizer.json beside the shards: $k" "$W/t_$k/tokenizer.json: not a regular file but" \
    --data "$W/t_$k/train_*.bin" "${COMMON[@]}" --out "$W/o_$k" --steps 2
done
refused "tokenizer.json over 256 MiB" \
  "$W/t_big/tokenizer.json: 314572800 bytes, more than the 256 MiB (268435456 bytes) a Hugging Face tokenizer.json" \
  --data "$W/t_big/train_*.bin" "${COMMON[@]}" --out "$W/o_big" --steps 2
refused "a tokenizer.json of 300 ids beside 260-id shards" \
  "$W/t_foreign/tokenizer.json has a vocabulary of 300 ids, the shards have 260" \
  --data "$W/t_foreign/train_*.bin" "${COMMON[@]}" --out "$W/o_foreign" --steps 2
refused "a tokenizer.json cut short" "$W/t_bad/tokenizer.json: not a Hugging Face tokenizer.json (malformed JSON" \
  --data "$W/t_bad/train_*.bin" "${COMMON[@]}" --out "$W/o_bad" --steps 2
for k in good uni; do
  out=$(run --data "$W/t_$k/train_*.bin" "${COMMON[@]}" --out "$W/o_$k" --steps 2 2>&1); rc=$?
  check '[ $rc = 0 ] && cmp -s "$W/t_$k/tokenizer.json" "$W/o_$k/tokenizer.json"' "a tokenizer.json of 260 ids ($k): exported" \
    "exit $rc: $(echo "$out" | tail -n 2)"
done
cp "$W/t_swap/tokenizer.json" "$W/swap.json"
run --data "$W/t_swap/train_*.bin" "${COMMON[@]}" --out "$W/o_swap" --steps 30 >"$W/swap.log" 2>&1 &
pid=$!; PIDS+=($pid)
for i in $(seq 1 600); do grep -qs "^step  *2/" "$W/swap.log" && break; sleep 0.05; done
rm "$W/t_swap/tokenizer.json" && mkfifo "$W/t_swap/tokenizer.json"
wait $pid; rc=$?
check '[ $rc = 0 ] && cmp -s "$W/swap.json" "$W/o_swap/tokenizer.json"' \
  "tokenizer.json replaced by a FIFO mid-run: the export has the one read at the start" \
  "exit $rc: $(tail -n 2 "$W/swap.log")"

# 3. the NCCL id file and the staging marker: a FIFO there never blocks
mkdir -p "$W/id" && mkfifo "$W/id/nccl_id.j9.0.0"
out=$(SLURM_JOB_ID=j9 SLURM_STEP_ID=0 SLURM_NTASKS=2 SLURM_PROCID=1 run "${T[@]}" --out "$W/id" --steps 2 \
  --bootstrap file --nccl-timeout 1 2>&1); rc=$?
check '[ $rc = 1 ] && echo "$out" | grep -qF "rank 1 waited 1 s for the NCCL id in $W/id/nccl_id.j9.0.0 (not a regular file but a FIFO"' \
  "--bootstrap file: the id file a FIFO" "exit $rc: $(echo "$out" | tail -n 1)"
mkdir -p "$W/stage" && mkfifo "$W/stage/.staged-train_*.bin"
out=$(run "${T[@]}" --out "$W/o_stage" --steps 2 --stage-dir "$W/stage" 2>&1); rc=$?
check '[ $rc = 0 ] && [ -f "$W/stage/train_00000.bin" ] && [ -f "$W/o_stage/model.safetensors" ]' \
  "--stage-dir: the marker a FIFO" "exit $rc: $(echo "$out" | tail -n 2)"

# 4. writers: a symbolic link where the run writes in place is refused, one left at a .tmp name replaced
mkdir -p "$W/lk" && ln -s "$VICTIM" "$W/lk/lock"
refused "DIR/lock a symbolic link" "trainer: --out $W/lk: $W/lk/lock: is a symbolic link: refused" \
  "${T[@]}" --out "$W/lk" --steps 2
check '[ "$(cat "$VICTIM")" = precious ]' "DIR/lock a symbolic link: the file it points to untouched" "$(head -c 80 "$VICTIM" | tr -d "\000")"
mkdir -p "$W/ev" && ln -s "$VICTIM" "$W/ev/metrics.jsonl"
out=$(run --eval "$W/r/checkpoint.bin" --val "$SHARD" --batch 4 --val-batches 1 --out "$W/ev" 2>&1); rc=$?
check '[ $rc != 0 ] && echo "$out" | grep -qF "$W/ev/metrics.jsonl: is a symbolic link: refused" && [ "$(cat "$VICTIM")" = precious ]' \
  "--eval --out: metrics.jsonl a symbolic link" "exit $rc, victim: $(head -c 80 "$VICTIM" | tr -d "\000"): $(echo "$out" | tail -n 1)"
mkdir -p "$W/tl" && ln -s "$VICTIM" "$W/tl/checkpoint.bin.tmp" && ln -s "$VICTIM" "$W/tl/run.json.tmp"
out=$(run "${T[@]}" --out "$W/tl" --steps 2 2>&1); rc=$?
check '[ $rc = 0 ] && [ "$(cat "$VICTIM")" = precious ] && [ -f "$W/tl/checkpoint.bin" ] && [ ! -L "$W/tl/run.json" ]' \
  "links left at checkpoint.bin.tmp and run.json.tmp: replaced, not written through" \
  "exit $rc, victim: $(head -c 80 "$VICTIM" | tr -d "\000"): $(echo "$out" | tail -n 1)"

# 5. a stale export staging directory with a subdirectory and a link to a directory outside
mkdir -p "$W/st/.export.tmp/sub/deeper" "$W/keep" && echo x >"$W/st/.export.tmp/sub/deeper/f" && echo k >"$W/keep/k"
ln -s "$W/keep" "$W/st/.export.tmp/sub/out"
out=$(run "${T[@]}" --out "$W/st" --steps 2 2>&1); rc=$?
check '[ $rc = 0 ] && [ -f "$W/st/model.safetensors" ] && [ ! -e "$W/st/.export.tmp" ] && [ -f "$W/keep/k" ]' \
  "a stale .export.tmp with a subdirectory: removed at the start, the export written" \
  "exit $rc: $(echo "$out" | grep -v '^step' | tail -n 2)"

# 6. two 2-rank launches into one --out, MASTER_PORTs apart: y's rank 1 takes its byte first, then x's rank 0
# byte 0, then the other two start. The launch whose rank 0 has byte 0 (x, unless the machine is slow) runs; the
# other's ranks stop at once (its rank 0: byte 0 is held; its rank 1 sees that, before or in the bootstrap)
P=$((21000 + RANDOM % 18000))
launch() {  # launch NAME PORT RANK: its exit code and end time go to two_NAME.rc
  (MASTER_PORT=$2 SLURM_NTASKS=2 SLURM_PROCID=$3 SLURM_LOCALID=$3 NCCL_EMU_TIMEOUT_S=60 timeout 60 "$TRAINER" "${T[@]}" \
    --out "$W/two" --steps 3 --nccl-timeout 20 >"$W/two_$1.log" 2>&1; echo "$? $(date +%s)" >"$W/two_$1.rc") &
  PIDS+=($!)
}
mkdir -p "$W/two"
start=$(date +%s)
launch y1 $((P + 1)) 1; sleep 0.5
launch x0 $P 0; sleep 0.5
launch x1 $P 1; launch y0 $((P + 1)) 0
wait
declare -A rc secs
for k in x0 x1 y0 y1; do read -r rc[$k] end <"$W/two_$k.rc"; secs[$k]=$((end - start)); done
won=""; lost=""
for l in x y; do
  if [ "${rc[${l}0]}" = 0 ] && [ "${rc[${l}1]}" = 0 ]; then won="$won$l"; else lost="$lost$l"; fi
done
check '[ ${#won} = 1 ] && [ -f "$W/two/model.safetensors" ]' "two launches at once: one of them runs" \
  "exits x ${rc[x0]} ${rc[x1]}, y ${rc[y0]} ${rc[y1]}: $(tail -q -n 1 "$W"/two_*.log | tr '\n' '|')"
check '[ ${#lost} = 1 ] && [ "${rc[${lost}0]}" = 1 ] && [ "${rc[${lost}1]}" = 1 ] && [ ${secs[${lost}0]} -lt 15 ] &&
  [ ${secs[${lost}1]} -lt 15 ] && grep -q "another run is using it: $W/two/lock is held by pid" "$W/two_${lost}0.log" &&
  grep -q "another run is using it: $W/two/lock is held by pid" "$W/two_${lost}1.log"' \
  "two launches at once: the other one's ranks stop at once, naming the lock" \
  "exits ${rc[${lost}0]} ${rc[${lost}1]} after ${secs[${lost}0]} s and ${secs[${lost}1]} s: $(tail -q -n 1 "$W/two_${lost}0.log" "$W/two_${lost}1.log" | tr '\n' '|')"

echo "$pass passed, $fail failed"
[ $fail = 0 ]
