#!/usr/bin/env bash
# test_state_gate.sh: the gate for the numbers in a checkpoint's state (checkpoint.h: ckpt_value_ok,
# ckpt_counters_ok), on the CPU build (./trainer_cpu), tiny model. Each checkpoint is forged with its CRC made right
# (python3, zlib.crc32 over every byte before the CRC, as ckpt_verify checks it):
#   - AdamW v holding a negative value: --resume and --eval refuse it, naming the file, the buffer, the element and
#     the value (exit 1, no step);
#   - a --comm onebit checkpoint (2 ranks) holds no 1-bit Adam errors; made into one of the older files that did
#     (olderrors: the errors appended), it resumes (the errors read through and not used); with a NaN in rank 1's
#     worker errors, or 1e30 (finite, beyond 2^64) in the servers' errors: --resume refuses it by name, exit 1;
#   - a token count of 2^63: --resume refuses it (exit 1), no negative tokens in the metrics;
#   - the writer: a checkpoint whose AdamW m holds 3e38 (finite; the gate lets it in) makes the next step's weights
#     infinite: the checkpoint of that step is not written, no export either, exit code 2 with the divergence
#     message, the checkpoint whose weights gave the step set aside.
# Run by tests/run.sh; needs tools/requirements.txt (python3 tools/prepare.py). TRAINER overrides ./trainer_cpu.
cd "$(dirname "$0")/.."
TRAINER=${TRAINER:-./trainer_cpu}
pass=0; fail=0
ok()  { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL test_state_gate: $*"; }
check() { if eval "$1"; then ok; else bad "$2"; fi; }
W=$(mktemp -d /tmp/mlm_gate_XXXXXX)
[ -n "${KEEP:-}" ] || trap 'rm -rf "$W"' EXIT
export EMU_THREADS=1
unset MLM_TEST_INF_GRAD MLM_TEST_INF_LOSS

python3 tools/prepare.py bytes --input cpu --out "$W/data" --seq-len 32 --val-fraction 0 >"$W/prep.log" 2>&1 ||
  { echo "tools/prepare.py failed: $(tail -n 2 "$W/prep.log")"; echo "0 passed, 1 failed"; exit 1; }
COMMON=(--data "$W/data/train_*.bin" --preset tiny --seq 32 --batch 8 --lr 5e-3 --warmup 2 --seed 7 --loader-threads 1)
VAL=(--val "$W/data/train_*.bin" --batch 8 --val-batches 1)
run() { timeout 120 "$TRAINER" "$@"; }

# ckpt_forge FILE WHAT INDEX VALUE: sets one value of a checkpoint and makes its CRC right again. WHAT: master, m, v
# (fp32, element INDEX), worker:Q (rank Q's 1-bit Adam errors), server (the servers' errors), tokens (the
# header's token count: INDEX is ignored, VALUE an integer), or olderrors (INDEX ranks' errors, all VALUE, appended
# as the files written before 2026-11-28 held them: header.onebit_world = INDEX, the body that much longer). The layout is CkptHeader's (checkpoint.h): header_bytes
# at 12, x_bytes at 56, numel at 64, the token count 72 bytes before the body (the data position, 64, after it).
ckpt_forge() {
  python3 - "$@" <<'EOF'
import struct, sys, zlib
p, what, i, v = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
d = bytearray(open(p, "rb").read())
hb = struct.unpack_from("<I", d, 12)[0]
xb, world, numel = struct.unpack_from("<iiQ", d, 56)
if what == "tokens":
    struct.pack_into("<Q", d, hb - 72, int(v))
elif what == "olderrors":
    struct.pack_into("<i", d, 60, i)
    struct.pack_into("<Q", d, 72, struct.unpack_from("<Q", d, 72)[0] + (i + 1) * numel * 4)
    d[-8:-8] = struct.pack("<f", float(v)) * ((i + 1) * numel)
else:
    bf16 = 2 * numel if xb == 2 else 0
    start = {"master": 0, "m": 4 * numel, "v": 8 * numel}.get(what)
    if what.startswith("worker:"):
        start = 12 * numel + bf16 + 4 * numel * int(what[7:])
    elif what == "server":
        start = 12 * numel + bf16 + 4 * numel * world
    assert start is not None and hb + start + 4 * (i + 1) <= len(d) - 8, (what, i, world)
    struct.pack_into("<f", d, hb + start + 4 * i, float(v))
struct.pack_into("<I", d, len(d) - 8, zlib.crc32(bytes(d[:-8])))
open(p, "wb").write(d)
EOF
}
numel_of() { python3 -c 'import struct,sys; print(struct.unpack_from("<Q", open(sys.argv[1],"rb").read(72), 64)[0])' "$1"; }

# the run to start from: checkpoint.bin (step 4), checkpoint-2.bin and the export
run "${COMMON[@]}" --out "$W/r" --steps 4 --ckpt-every 2 >"$W/r.log" 2>&1
check '[ -f "$W/r/model.safetensors" ] && [ -f "$W/r/checkpoint-2.bin" ]' "the first run failed: $(tail -n 2 "$W/r.log")"
N=$(numel_of "$W/r/checkpoint.bin")

# 1. a negative AdamW v: refused by --resume (the only checkpoint: exit 1) and by --eval
d="$W/v"; mkdir -p "$d" && cp "$W/r/checkpoint.bin" "$d/" && ckpt_forge "$d/checkpoint.bin" v 3 -1.5
out=$(run "${COMMON[@]}" --out "$d" --steps 6 --resume 2>&1); rc=$?
why="its AdamW v hold a value below zero (v is a mean of squares) at element 3 of $N (-1.5)"
check '[ $rc = 1 ] && echo "$out" | grep -qF "no intact checkpoint in $d (checkpoint.bin: $why: not intact)" && ! echo "$out" | grep -q "^step"' \
  "--resume of a checkpoint with a negative v: exit $rc, $(echo "$out" | grep -v '^step' | tail -n 2)"
check '[ ! -e "$d/model.safetensors" ]' "--resume of a checkpoint with a negative v exported: $(ls "$d" | tr '\n' ' ')"
out=$(run --eval "$d/checkpoint.bin" "${VAL[@]}" 2>&1); rc=$?
check '[ $rc = 1 ] && echo "$out" | grep -qF "trainer: --eval $d/checkpoint.bin: $why: not intact"' \
  "--eval of a checkpoint with a negative v: exit $rc, $(echo "$out" | tail -n 1)"
# with an older intact checkpoint beside it, --resume says why it skips the forged one and takes the older one
d="$W/v_old"; cp -r "$W/r" "$d" && ckpt_forge "$d/checkpoint.bin" v 0 -2
out=$(run "${COMMON[@]}" --out "$d" --steps 6 --resume 2>&1); rc=$?
check '[ $rc = 0 ] && echo "$out" | grep -qF "skipped $d/checkpoint.bin: its AdamW v hold a value below zero (v is a mean of squares) at element 0 of $N (-2): not intact" && echo "$out" | grep -q "resumed from $d/checkpoint-2.bin at step 2"' \
  "a negative v beside an older checkpoint: exit $rc, $(echo "$out" | grep -v '^step' | tail -n 2)"

# 2. a token count of 2^63 (it read as negative tokens and epochs in the metrics): refused, exit 1
d="$W/tok"; mkdir -p "$d" && cp "$W/r/checkpoint.bin" "$d/" && ckpt_forge "$d/checkpoint.bin" tokens 0 9223372036854775808
out=$(run "${COMMON[@]}" --out "$d" --steps 6 --resume 2>&1); rc=$?
check '[ $rc = 1 ] && echo "$out" | grep -qF "trainer: --resume: $d/checkpoint.bin: its token count 9223372036854775808 is out of range (0 to 2^62)" && ! echo "$out" | grep -q "^step"' \
  "a token count of 2^63: exit $rc, $(echo "$out" | grep -v '^step' | tail -n 2)"
check '! grep -q "\"tokens\": *-" "$d/metrics.jsonl" 2>/dev/null' "negative tokens in the metrics: $(tail -n 1 "$d/metrics.jsonl" 2>/dev/null)"

# 3. the writer: AdamW m = 3e38 at element 5 (finite: loaded) overflows step 5's update to an infinite weight; step 5's
# checkpoint is not written, nor the export; exit 2; checkpoint.bin (step 4), whose state gave step 5, set aside
d="$W/w"; cp -r "$W/r" "$d" && rm "$d/model.safetensors" && ckpt_forge "$d/checkpoint.bin" m 5 3e38
out=$(run "${COMMON[@]}" --out "$d" --steps 5 --resume 2>&1); rc=$?
check '[ $rc = 2 ] && echo "$out" | grep -qF "trainer: diverged: step 5 left the state not finite (its fp32 master weights hold a value that is not finite (NaN or Inf) at element 5 of $N (" && echo "$out" | grep -qF "it was not written; stopping, exit code 2: $d/checkpoint.bin (step 4) set aside as $d/checkpoint-4.bin.diverged, its weights gave step 5; the newest intact checkpoint is $d/checkpoint-2.bin (step 2)"' \
  "a step that made the weights infinite: exit $rc, $(echo "$out" | grep -v '^step' | tail -n 2)"
check '[ ! -e "$d/model.safetensors" ] && [ ! -e "$d/checkpoint.bin" ] && [ ! -e "$d/checkpoint.bin.tmp" ] && [ -f "$d/checkpoint-4.bin.diverged" ]' \
  "after a non-finite state: $(ls "$d" | tr '\n' ' ')"
# the same at a --ckpt-every checkpoint before the last step: the run stops there
d="$W/w2"; cp -r "$W/r" "$d" && ckpt_forge "$d/checkpoint.bin" m 5 3e38
out=$(run "${COMMON[@]}" --out "$d" --steps 8 --ckpt-every 1 --resume 2>&1); rc=$?
check '[ $rc = 2 ] && echo "$out" | grep -qF "trainer: diverged: step 5 left the state not finite" && ! echo "$out" | grep -qE "^step +6/"' \
  "a step that made the weights infinite before the last: exit $rc, $(echo "$out" | grep -v '^step' | tail -n 2)"

# 4. --comm onebit on 2 ranks: no errors in the checkpoint; an older file's errors read through, and gated
runn() {  # runn DIR LOG ARGS...: 2 ranks (SLURM_* by hand, as tests/test_onebit.sh); logs LOG.0, LOG.1; exit codes LOG.rc
  local dir=$1 log=$2 r; shift 2
  for r in 0 1; do
    (SLURM_NTASKS=2 SLURM_PROCID=$r SLURM_LOCALID=0 NCCL_EMU_TIMEOUT_S=60 timeout 120 "$TRAINER" "${COMMON[@]}" \
      --out "$dir" "$@" >"$log.$r" 2>&1; echo $? >"$log.rc$r") &
  done
  wait
}
runn "$W/o" "$W/o.log" --comm onebit --comm-warmup 2 --steps 4 --ckpt-every 4
check '[ "$(cat "$W/o.log.rc0")" = 0 ] && [ -f "$W/o/checkpoint.bin" ]' "the onebit run failed: $(tail -n 2 "$W/o.log.0")"
world=$(python3 -c 'import struct,sys; print(struct.unpack_from("<i", open(sys.argv[1],"rb").read(64), 60)[0])' "$W/o/checkpoint.bin")
check '[ "$world" = 0 ]' "a onebit checkpoint says it holds the errors of $world ranks, want 0"
d="$W/o_old"; mkdir -p "$d" && cp "$W/o/checkpoint.bin" "$d/" && ckpt_forge "$d/checkpoint.bin" olderrors 2 0.001
runn "$d" "$d.log" --comm onebit --comm-warmup 2 --steps 6 --resume
check '[ "$(cat "$d.log.rc0")" = 0 ] && grep -qE "^step +6/6" "$d.log.0" && grep -q "errors start from zero" "$d.log.0"' \
  "an older onebit checkpoint (with errors) did not resume: exit $(cat "$d.log.rc0"), $(grep -v '^step' "$d.log.0" | tail -n 2)"
for c in "worker:1|7|nan|1-bit Adam worker errors of rank 1 hold a value that is not finite (NaN or Inf) at element 7 of $N (nan)" \
  "server|9|1e30|1-bit Adam server errors hold a value beyond +-2^64 (no error a run makes) at element 9 of $N (1e+30)"; do
  IFS='|' read -r what i v why <<<"$c"; d="$W/o_${what%%:*}"
  mkdir -p "$d" && cp "$W/o/checkpoint.bin" "$d/" && ckpt_forge "$d/checkpoint.bin" olderrors 2 0.001 &&
    ckpt_forge "$d/checkpoint.bin" "$what" "$i" "$v"
  runn "$d" "$d.log" --comm onebit --comm-warmup 2 --steps 6 --resume
  check '[ "$(cat "$d.log.rc0")" = 1 ] && [ "$(cat "$d.log.rc1")" = 1 ] && grep -qF "checkpoint.bin: its $why: not intact" "$d.log.0" && ! grep -q "^step" "$d.log.0"' \
    "an older --comm onebit checkpoint with a bad error buffer ($what): exit $(cat "$d.log.rc0") $(cat "$d.log.rc1"), $(grep -v '^step' "$d.log.0" | tail -n 2)"
done

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
