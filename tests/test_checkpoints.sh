#!/usr/bin/env bash
# test_checkpoints.sh: checkpoints and divergence on the CPU build (./trainer_cpu), tiny model:
#   - SIGKILL torture: at least 20 kills at random moments, a third of them while a checkpoint is being
#     written (MLM_TEST_CKPT_DELAY_MS stretches each write by 150 ms so that the kills land inside it);
#     every --resume loads, and the run ends byte-identical to an uninterrupted one;
#   - corruption: a byte flipped in the header, the weights, the AdamW state or the CRC, a truncated or
#     lengthened file: --resume skips it, says why, and takes the older checkpoint; intact checkpoints
#     that do not fit the run (step beyond --steps, another --seq, a data row past its epoch) are refused;
#   - divergence (the MLM_TEST_INF_GRAD / MLM_TEST_INF_LOSS hooks): a non-finite step is skipped with the
#     weights and AdamW state untouched; --max-bad-steps in a row stop with exit code 2, the checkpoint whose
#     weights gave them set aside (checkpoint-STEP.bin.diverged) and the message true about what is left;
#   - a full disk (a small tmpfs, when run as root) during a checkpoint and during the export.
# Run by tests/run.sh; needs tools/requirements.txt (python3 tools/prepare.py). TRAINER overrides ./trainer_cpu.
cd "$(dirname "$0")/.."
TRAINER=${TRAINER:-./trainer_cpu}
pass=0; fail=0
ok()  { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL test_checkpoints: $*"; }
check() { if eval "$1"; then ok; else bad "$2"; fi; }
W=$(mktemp -d /tmp/mlm_ckpt_XXXXXX)
MOUNTS=()
cleanup() { for m in "${MOUNTS[@]}"; do umount "$m" 2>/dev/null; done; rm -rf "$W"; }
trap cleanup EXIT
export EMU_THREADS=1  # one OS thread: runs are bitwise repeatable
unset MLM_TEST_INF_GRAD MLM_TEST_INF_LOSS

python3 tools/prepare.py bytes --input cpu --out "$W/data" --seq-len 32 --val-fraction 0 >"$W/prep.log" 2>&1 ||
  { echo "tools/prepare.py failed: $(tail -n 2 "$W/prep.log")"; echo "0 passed, 1 failed"; exit 1; }
COMMON=(--data "$W/data/train_*.bin" --preset tiny --seq 32 --batch 8 --lr 5e-3 --warmup 2 --seed 7 --loader-threads 1)
ckpt_step() { python3 -c 'import struct,sys; d=open(sys.argv[1],"rb").read(56); print(struct.unpack_from("<i", d, 52)[0])' "$1" 2>/dev/null; }
# the state in a checkpoint (weights, AdamW moments): everything between the header and the CRC
ckpt_body() { python3 -c 'import struct,sys; d=open(sys.argv[1],"rb").read(); h=struct.unpack_from("<I", d, 12)[0]; sys.stdout.buffer.write(d[h:-8])' "$1"; }

# 1. SIGKILL torture
STEPS=30
"$TRAINER" "${COMMON[@]}" --out "$W/ref" --steps $STEPS --ckpt-every 1 >"$W/ref.log" 2>&1
check '[ -f "$W/ref/model.safetensors" ] && [ "$(ckpt_step "$W/ref/checkpoint.bin")" = $STEPS ]' \
  "the uninterrupted run failed: $(tail -n 2 "$W/ref.log")"
kills=0; in_write=0; resumes=0; loaded=0; runs=0; problems=""
RANDOM=12345
while [ $kills -lt 24 ] && [ $runs -lt 60 ]; do
  runs=$((runs + 1))
  args=("${COMMON[@]}" --out "$W/t" --steps $STEPS --ckpt-every 1)
  ls "$W"/t/checkpoint*.bin >/dev/null 2>&1 && { args+=(--resume); resumes=$((resumes + 1)); }
  rm -f "$W/t/checkpoint.bin.tmp"
  MLM_TEST_CKPT_DELAY_MS=150 "$TRAINER" "${args[@]}" >"$W/t$runs.log" 2>&1 &  # each write takes 150 ms longer
  pid=$!
  # the moments are counted from an event, so that the runs make progress however fast the machine is
  if [ $((runs % 3)) = 0 ]; then  # every third run: kill while a checkpoint is being written
    for i in $(seq 1 6000); do [ -e "$W/t/checkpoint.bin.tmp" ] && break; kill -0 $pid 2>/dev/null || break; sleep 0.01; done
    sleep "0.0$((RANDOM % 10))"
  else  # the others: at a random moment within about two steps after the first step
    for i in $(seq 1 6000); do grep -qE "^step " "$W/t$runs.log" && break; kill -0 $pid 2>/dev/null || break; sleep 0.01; done
    sleep "0.$((RANDOM % 6))$((RANDOM % 10))"
  fi
  kill -9 $pid 2>/dev/null && kills=$((kills + 1))
  wait $pid 2>/dev/null
  [ -e "$W/t/checkpoint.bin.tmp" ] && in_write=$((in_write + 1))
  grep -q "resumed from" "$W/t$runs.log" && loaded=$((loaded + 1))
  grep -qE "skipped|error|no intact" "$W/t$runs.log" && problems="$problems run $runs: $(grep -E "skipped|error|no intact" "$W/t$runs.log" | head -n 1);"
  [ -f "$W/t/model.safetensors" ] && break  # it finished before the kill
done
"$TRAINER" "${COMMON[@]}" --out "$W/t" --steps $STEPS --ckpt-every 1 --resume >"$W/tfinal.log" 2>&1
echo "  (torture: $kills kills in $runs runs, $in_write during a checkpoint write, $loaded of $resumes resumes got as far as loading)"
check '[ $kills -ge 20 ] && [ $in_write -ge 3 ]' "only $kills kills, $in_write during a checkpoint write"
check '[ -z "$problems" ] && [ $loaded -ge 10 ]' "a resume skipped a checkpoint or failed ($loaded loaded):$problems"
check 'cmp -s "$W/ref/checkpoint.bin" "$W/t/checkpoint.bin" && cmp -s "$W/ref/model.safetensors" "$W/t/model.safetensors"' \
  "after $kills kills the run does not end byte-identical to the uninterrupted one: $(tail -n 2 "$W/tfinal.log")"
check '[ "$(ls "$W"/t/checkpoint*.bin | wc -l)" = 2 ]' "--keep 2 (the default) left $(ls "$W"/t | tr '\n' ' ')"

# 2. corruption: flip one byte (python: offset from the start, or negative from the end), then --resume
"$TRAINER" "${COMMON[@]}" --out "$W/c" --steps 6 --ckpt-every 3 >"$W/c.log" 2>&1
check '[ "$(ckpt_step "$W/c/checkpoint.bin")" = 6 ] && [ "$(ckpt_step "$W/c/checkpoint-3.bin")" = 3 ]' \
  "--ckpt-every 3 did not leave checkpoint.bin (step 6) and checkpoint-3.bin: $(ls "$W/c")"
flip() { python3 -c 'import sys; p=sys.argv[1]; o=int(sys.argv[2]); d=bytearray(open(p,"rb").read()); d[o]^=0x10; open(p,"wb").write(d)' "$1" "$2"; }
n=0
for where in "8:version" "20:config" "52:step" "100:data position" "200:weights" "150000:AdamW m" "300000:AdamW v" \
  "-20000:bf16 weights" "-8:the CRC" "truncate:truncated" "append:trailing bytes"; do
  n=$((n + 1)); d="$W/c$n"; cp -r "$W/c" "$d"
  case ${where%%:*} in
    truncate) head -c 200000 "$W/c/checkpoint.bin" >"$d/checkpoint.bin" ;;
    append) echo x >>"$d/checkpoint.bin" ;;
    *) flip "$d/checkpoint.bin" "${where%%:*}" ;;
  esac
  "$TRAINER" "${COMMON[@]}" --out "$d" --steps 6 --resume >"$d.log" 2>&1; rc=$?
  check '[ $rc = 0 ] && grep -q "skipped $d/checkpoint.bin: " "$d.log" && grep -q "resumed from $d/checkpoint-3.bin at step 3" "$d.log"' \
    "a checkpoint corrupted in ${where#*:} was not skipped for the older one (exit $rc): $(grep -v '^step' "$d.log" | tail -n 3)"
done
grep -h "skipped" "$W"/c[0-9]*.log | sed -E 's/.*checkpoint.bin: /  (skipped: /; s/$/)/' | sort | uniq -c | head -n 4
d="$W/cboth"; cp -r "$W/c" "$d"; flip "$d/checkpoint.bin" 300; flip "$d/checkpoint-3.bin" 300
"$TRAINER" "${COMMON[@]}" --out "$d" --steps 6 --resume >"$d.log" 2>&1; rc=$?
check '[ $rc = 1 ] && grep -q "no intact checkpoint in $d (checkpoint.bin: checksum mismatch.*checkpoint-3.bin: checksum mismatch" "$d.log"' \
  "two corrupt checkpoints did not fail with both reasons (exit $rc): $(tail -n 1 "$d.log")"
# intact checkpoints that do not fit the run: refused, never an older checkpoint instead
expect_refused() {  # expect_refused NAME PATTERN ARGS...
  local name=$1 pat=$2; shift 2
  "$TRAINER" "$@" >"$W/refused.log" 2>&1; rc=$?
  check '[ $rc = 1 ] && grep -q -- "$pat" "$W/refused.log" && ! grep -q "resumed from" "$W/refused.log"' \
    "$name: exit $rc, $(tail -n 1 "$W/refused.log")"
}
expect_refused "a checkpoint at step 6 with --steps 4" "its step 6 is beyond --steps 4" "${COMMON[@]}" --out "$W/c" --steps 4 --resume
expect_refused "a checkpoint of --seq 32 with --seq 40" "saved for another model or --seq" \
  --data "$W/data/train_*.bin" --preset tiny --seq 40 --batch 8 --out "$W/c" --steps 6 --resume
d="$W/crow"; cp -r "$W/c" "$d"  # a data row beyond the epoch, with the CRC made right again
python3 - "$d/checkpoint.bin" <<'EOF'
import struct, sys, zlib
p = sys.argv[1]; d = bytearray(open(p, "rb").read())
h = struct.unpack_from("<I", d, 12)[0]
struct.pack_into("<Q", d, h - 64 + 24, 10**9)  # DataLoaderState.row (the state is the header's last 64 bytes)
struct.pack_into("<I", d, len(d) - 8, zlib.crc32(bytes(d[:-8])))
open(p, "wb").write(d)
EOF
expect_refused "a data row past the epoch" "not in an epoch" "${COMMON[@]}" --out "$d" --steps 6 --resume

# 2b. a checkpoint of the slab layout before 2026-11-24 (the word embeddings in V rows, not a multiple of 8: V = 260
# here, 264 rows now): made from c's by dropping the pad rows from every region and writing a new CRC. --resume
# and --eval refuse it by name, saying what to do instead (not "corrupted": its checksum is right)
python3 - "$W/c/checkpoint.bin" "$W/old_layout.bin" <<'PY'
import struct, sys, zlib
d = bytearray(open(sys.argv[1], "rb").read())
hb = struct.unpack_from("<I", d, 12)[0]
V, C = struct.unpack_from("<i", d, 16)[0], struct.unpack_from("<i", d, 28)[0]
xb, numel = struct.unpack_from("<i", d, 56)[0], struct.unpack_from("<Q", d, 64)[0]
assert V % 8 != 0 and xb == 2, (V, xb)
old_w, new_w = (V * C + 7) & ~7, ((V + 7) & ~7) * C  # the word embeddings' slab elements, before and now
body, pos, out = d[hb:-8], 0, b""
for size in (4, 4, 4, 2):  # master, AdamW m, AdamW v (fp32), the bf16 weights
    r = body[pos:pos + numel * size]
    out += r[:old_w * size] + r[new_w * size:]
    pos += numel * size
numel -= new_w - old_w
struct.pack_into("<QQ", d, 64, numel, len(out))
h = bytes(d[:hb]) + out
open(sys.argv[2], "wb").write(h + struct.pack("<II", zlib.crc32(h), 0))
PY
mkdir -p "$W/old" && cp "$W/old_layout.bin" "$W/old/checkpoint.bin"
"$TRAINER" "${COMMON[@]}" --out "$W/old" --steps 12 --resume >"$W/old.log" 2>&1; rc=$?
check '[ $rc = 1 ] && grep -q "\-\-resume: .*old/checkpoint.bin: its parameter slab holds .* saved by an older trainer; start from that run.s export instead (--init-from DIR" "$W/old.log"' \
  "an old-layout checkpoint: --resume (exit $rc) did not refuse it by name: $(tail -n 2 "$W/old.log")"
"$TRAINER" --eval "$W/old_layout.bin" --val "$W/data/train_*.bin" --val-batches 1 >"$W/old_eval.log" 2>&1; rc=$?
check '[ $rc = 1 ] && grep -q "\-\-eval .*old_layout.bin: its parameter slab holds .* saved by an older trainer" "$W/old_eval.log"' \
  "an old-layout checkpoint: --eval (exit $rc) did not refuse it by name: $(tail -n 2 "$W/old_eval.log")"

# 3. divergence
# 3a. one infinite gradient: skipped, the state untouched (step 5's checkpoint holds step 4's state), then on
"$TRAINER" "${COMMON[@]}" --out "$W/d1" --steps 8 --run-steps 4 >"$W/d1a.log" 2>&1
cp "$W/d1/checkpoint.bin" "$W/d1_step4.bin"
MLM_TEST_INF_GRAD=5 "$TRAINER" "${COMMON[@]}" --out "$W/d1" --steps 8 --resume --run-steps 1 >"$W/d1.log" 2>&1; rc=$?
check '[ $rc = 0 ] && grep -q "step 5: loss .*, gradient norm inf: not finite; update skipped (1 in a row)" "$W/d1.log" && [ "$(ckpt_step "$W/d1/checkpoint.bin")" = 5 ]' \
  "an infinite gradient at step 5 was not skipped with a checkpoint after it (exit $rc): $(grep -v '^step' "$W/d1.log" | tail -n 2)"
check 'cmp -s <(ckpt_body "$W/d1_step4.bin") <(ckpt_body "$W/d1/checkpoint.bin")' \
  "the skipped step 5 changed the weights or the AdamW state"
"$TRAINER" "${COMMON[@]}" --out "$W/d1" --steps 8 --resume >"$W/d1b.log" 2>&1; rc=$?
check '[ $rc = 0 ] && [ -f "$W/d1/model.safetensors" ] && ! cmp -s <(ckpt_body "$W/d1_step4.bin") <(ckpt_body "$W/d1/checkpoint.bin")' \
  "after the skipped step the run did not go on to the end (exit $rc): $(tail -n 1 "$W/d1b.log")"
# 3b. infinite from step 5 on: steps 5, 6, 7 skipped, then exit 2; checkpoint.bin (step 4) holds the weights that
# gave them: set aside as checkpoint-4.bin.diverged; checkpoint-2.bin is the intact one --resume takes
MLM_TEST_INF_GRAD=5:0 "$TRAINER" "${COMMON[@]}" --out "$W/d2" --steps 20 --ckpt-every 2 >"$W/d2.log" 2>&1; rc=$?
check '[ $rc = 2 ] && grep -q "update skipped (3 in a row)" "$W/d2.log" && grep -qF "diverged: 3 steps in a row (--max-bad-steps 3); stopping, exit code 2: $W/d2/checkpoint.bin (step 4) set aside as $W/d2/checkpoint-4.bin.diverged, its weights gave step 5; the newest intact checkpoint is $W/d2/checkpoint-2.bin (step 2)" "$W/d2.log"' \
  "a diverging run did not stop with exit 2 and the truth (exit $rc): $(tail -n 1 "$W/d2.log")"
check '[ "$(ckpt_step "$W/d2/checkpoint-4.bin.diverged")" = 4 ] && [ ! -f "$W/d2/model.safetensors" ] && ! grep -qE "^step +8/" "$W/d2.log"' \
  "after divergence: files: $(ls "$W/d2" | tr '\n' ' ')"
"$TRAINER" "${COMMON[@]}" --out "$W/d2" --steps 20 --resume --run-steps 1 >"$W/d2r.log" 2>&1
check 'grep -q "resumed from $W/d2/checkpoint-2.bin at step 2$" "$W/d2r.log"' "the checkpoint left by divergence does not resume: $(tail -n 1 "$W/d2r.log")"
# 3c. a loss that is not finite, before any checkpoint, --max-bad-steps 2: the message says none was written
MLM_TEST_INF_LOSS=2:0 "$TRAINER" "${COMMON[@]}" --out "$W/d3" --steps 20 --max-bad-steps 2 >"$W/d3.log" 2>&1; rc=$?
check '[ $rc = 2 ] && grep -q "step 2: loss inf" "$W/d3.log" && grep -q "diverged: 2 steps in a row (--max-bad-steps 2); stopping, exit code 2: this run has written no checkpoint" "$W/d3.log" && [ ! -e "$W/d3/checkpoint.bin" ]' \
  "an infinite loss did not stop the run truthfully (exit $rc): $(tail -n 1 "$W/d3.log")"

# 4. a full disk (tmpfs), as root only
if [ "$(id -u)" = 0 ] && mkdir -p "$W/m1" && mount -t tmpfs -o size=$((2 * $(stat -c %s "$W/c/checkpoint.bin") + 100000)) tmpfs "$W/m1" 2>/dev/null; then
  MOUNTS+=("$W/m1")
  # 4a. room for two checkpoints, not three (--keep 2 needs three while writing): the third write fails
  "$TRAINER" "${COMMON[@]}" --out "$W/m1/run" --steps 10 --ckpt-every 1 >"$W/m1.log" 2>&1; rc=$?
  check '[ $rc = 1 ] && grep -q "step 3: cannot write the checkpoint $W/m1/run/checkpoint.bin.tmp: No space left on device; stopping: the last checkpoint, $W/m1/run/checkpoint.bin (step 2), is intact" "$W/m1.log"' \
    "a full disk during a checkpoint (exit $rc): $(tail -n 1 "$W/m1.log")"
  check '[ ! -e "$W/m1/run/checkpoint.bin.tmp" ] && [ "$(ckpt_step "$W/m1/run/checkpoint.bin")" = 2 ]' \
    "the failed checkpoint write left $(ls "$W/m1/run" | tr '\n' ' ')"
  cp -r "$W/m1/run" "$W/m1copy"
  "$TRAINER" "${COMMON[@]}" --out "$W/m1copy" --steps 10 --resume --run-steps 1 >"$W/m1r.log" 2>&1
  check 'grep -q "resumed from $W/m1copy/checkpoint.bin at step 2$" "$W/m1r.log"' "the checkpoint before the full disk does not resume"
  # 4b. room for the checkpoint, not for the export (a resume at --steps: only the export is left to write): the
  #     earlier export stays whole, config.json included (the export is one set: all of it or none)
  mkdir -p "$W/m2"
  mount -t tmpfs -o size=$(($(stat -c %s "$W/c/checkpoint.bin") + 64000)) tmpfs "$W/m2" && MOUNTS+=("$W/m2")
  mkdir -p "$W/m2/run" && cp "$W/c/checkpoint.bin" "$W/m2/run/" && echo "an earlier export" >"$W/m2/run/model.safetensors"
  echo "an earlier config" >"$W/m2/run/config.json"
  "$TRAINER" "${COMMON[@]}" --out "$W/m2/run" --steps 6 --resume >"$W/m2.log" 2>&1; rc=$?
  check '[ $rc = 1 ] && grep -q "cannot write the Hugging Face export to $W/m2/run (see above; none of its files was replaced, any earlier export is untouched); the last checkpoint, $W/m2/run/checkpoint.bin (step 6), is intact" "$W/m2.log"' \
    "a full disk during the export (exit $rc): $(tail -n 2 "$W/m2.log")"
  check '[ "$(cat "$W/m2/run/model.safetensors")" = "an earlier export" ] && [ "$(cat "$W/m2/run/config.json")" = "an earlier config" ] && [ -z "$(ls -a "$W/m2/run" | grep tmp)" ]' \
    "the failed export damaged the earlier one or left a temporary file: $(ls -a "$W/m2/run" | tr '\n' ' ')"
else
  echo "  (full disk: skipped, it needs root to mount a small tmpfs)"
fi

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
