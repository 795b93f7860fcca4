#!/usr/bin/env bash
# test_finite.sh: finite numbers only, on the CPU build (./trainer_cpu), tiny model:
#   - an export with a NaN weight: --init-from and --eval refuse it, naming the tensor (no step, no export);
#   - an export with huge finite weights (x 1e30): --eval's loss is not finite: exit 1, saying so;
#   - checkpoints whose CRC is right but that hold a NaN (master weights) or an Inf (bf16 weights): not intact:
#     --resume skips them for the older one, --eval refuses them; the 4 zero bytes after the CRC flipped: named;
#   - divergence (MLM_TEST_INF_GRAD) with --ckpt-every 1: the checkpoint whose weights gave the non-finite steps
#     is set aside as checkpoint-STEP.bin.diverged, the message names the one --resume takes, and --resume
#     takes it; with --keep 1 none is left, and the message says so;
#   - FIFOs named like a shard, a checkpoint, model.safetensors, and a directory named model.safetensors:
#     refused at once with one line (each run under a timeout: a blocking open fails the test).
# Run by tests/run.sh; needs tools/requirements.txt (python3 tools/prepare.py, numpy). TRAINER overrides ./trainer_cpu.
cd "$(dirname "$0")/.."
TRAINER=${TRAINER:-./trainer_cpu}
pass=0; fail=0
ok()  { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL test_finite: $*"; }
check() { if eval "$1"; then ok; else bad "$2"; fi; }
W=$(mktemp -d /tmp/mlm_finite_XXXXXX)
trap 'rm -rf "$W"' EXIT
export EMU_THREADS=1
unset MLM_TEST_INF_GRAD MLM_TEST_INF_LOSS

python3 tools/prepare.py bytes --input cpu --out "$W/data" --seq-len 32 --val-fraction 0 >"$W/prep.log" 2>&1 ||
  { echo "tools/prepare.py failed: $(tail -n 2 "$W/prep.log")"; echo "0 passed, 1 failed"; exit 1; }
COMMON=(--data "$W/data/train_*.bin" --preset tiny --seq 32 --batch 8 --lr 5e-3 --warmup 2 --seed 7 --loader-threads 1)
VAL=(--val "$W/data/train_*.bin" --batch 8 --val-batches 2)  # (the training shards: any shards do)
run() { timeout 60 "$TRAINER" "$@"; }  # a hang (a blocking open) ends as exit 124, a failure

# a run to start from: an export, checkpoint.bin (step 4) and checkpoint-2.bin
run "${COMMON[@]}" --out "$W/r" --steps 4 --ckpt-every 2 >"$W/r.log" 2>&1
check '[ -f "$W/r/model.safetensors" ] && [ -f "$W/r/checkpoint-2.bin" ]' "the first run failed: $(tail -n 2 "$W/r.log")"

# exports: one NaN weight; every weight times 1e30 (finite, but the forward overflows)
export_edit() {  # export_edit SRC DST MODE: DST is SRC's export with its weights edited
  mkdir -p "$2" && cp "$1/config.json" "$2/" && python3 - "$1/model.safetensors" "$2/model.safetensors" "$3" <<'EOF'
import json, struct, sys
import numpy as np
src, dst, mode = sys.argv[1:]
d = bytearray(open(src, "rb").read())
n = struct.unpack_from("<Q", d, 0)[0]
h = json.loads(d[8:8 + n])
body = np.frombuffer(d, dtype="<f4", offset=8 + n).copy()
if mode == "nan":
    b, e = h["bert.encoder.layer.0.attention.self.query.weight"]["data_offsets"]
    body[b // 4 + 7] = np.nan
else:
    body *= np.float32(1e30)
open(dst, "wb").write(bytes(d[:8 + n]) + body.tobytes())
EOF
}
export_edit "$W/r" "$W/nan" nan
export_edit "$W/r" "$W/huge" huge
out=$(run "${COMMON[@]}" --out "$W/o1" --steps 2 --init-from "$W/nan" 2>&1); rc=$?
check '[ $rc = 1 ] && echo "$out" | grep -q "model: $W/nan/model.safetensors: bert.encoder.layer.0.attention.self.query.weight holds NaN at element 7: weights must be finite numbers" && ! echo "$out" | grep -q "^step" && [ ! -e "$W/o1/model.safetensors" ]' \
  "--init-from an export with a NaN: exit $rc, $(echo "$out" | tail -n 2)"
out=$(run --eval "$W/nan" "${VAL[@]}" 2>&1); rc=$?
check '[ $rc = 1 ] && echo "$out" | grep -q "holds NaN at element 7" && ! echo "$out" | grep -q "^eval:"' \
  "--eval of an export with a NaN: exit $rc, $(echo "$out" | tail -n 2)"
out=$(run --eval "$W/huge" "${VAL[@]}" 2>&1); rc=$?
check '[ $rc = 1 ] && echo "$out" | grep -qE "trainer: --eval $W/huge: the loss is (NaN|Inf), not a finite number"' \
  "--eval of an export whose loss is not finite: exit $rc, $(echo "$out" | tail -n 2)"
out=$(run --eval "$W/r" "${VAL[@]}" 2>&1); rc=$?
check '[ $rc = 0 ] && echo "$out" | grep -q "^eval: loss [0-9]"' "--eval of the good export: exit $rc, $(echo "$out" | tail -n 2)"

# checkpoints with a right CRC and a value that is not finite
ckpt_poison() {  # ckpt_poison FILE REGION ELEMENT VALUE: REGION 0 master, 3 the bf16 weights; the CRC made right
  python3 - "$@" <<'EOF'
import struct, sys, zlib
import numpy as np
p, region, i, v = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
d = bytearray(open(p, "rb").read())
h = struct.unpack_from("<I", d, 12)[0]          # header_bytes
numel = (len(d) - h - 8) // 14                  # 3 fp32 arrays and the bf16 weights
if region < 3:
    struct.pack_into("<f", d, h + 4 * (region * numel + i), v)
else:
    struct.pack_into("<H", d, h + 12 * numel + 2 * i, np.array([v], dtype="<f4").view("<u4")[0] >> 16)
struct.pack_into("<I", d, len(d) - 8, zlib.crc32(bytes(d[:-8])))
open(p, "wb").write(d)
EOF
}
for c in "0 5 nan:fp32 master weights hold a value that is not finite (NaN or Inf) at element 5 of" \
  "3 11 inf:bf16 weights hold a value that is not finite (NaN or Inf) at element 11 of"; do
  set -- ${c%%:*}; why=${c#*:}; d="$W/p$1"
  cp -r "$W/r" "$d" && ckpt_poison "$d/checkpoint.bin" "$@"
  out=$(run "${COMMON[@]}" --out "$d" --steps 4 --resume 2>&1); rc=$?
  check '[ $rc = 0 ] && echo "$out" | grep -qF "skipped $d/checkpoint.bin: its $why" && echo "$out" | grep -q "resumed from $d/checkpoint-2.bin at step 2"' \
    "a checkpoint with a non-finite value ($c) was not skipped: exit $rc, $(echo "$out" | grep -v '^step' | tail -n 2)"
  cp "$W/r/checkpoint.bin" "$W/p.bin" && ckpt_poison "$W/p.bin" "$@"
  out=$(run --eval "$W/p.bin" "${VAL[@]}" 2>&1); rc=$?
  check '[ $rc = 1 ] && echo "$out" | grep -qF "trainer: --eval $W/p.bin: its $why"' \
    "--eval of a checkpoint with a non-finite value: exit $rc, $(echo "$out" | tail -n 1)"
done
d="$W/tail"; cp -r "$W/r" "$d"  # the last byte (of the 4 zero bytes after the CRC) flipped
python3 -c 'import sys; p=sys.argv[1]; d=bytearray(open(p,"rb").read()); d[-1]^=0x10; open(p,"wb").write(d)' "$d/checkpoint.bin"
out=$(run "${COMMON[@]}" --out "$d" --steps 4 --resume 2>&1); rc=$?
check '[ $rc = 0 ] && echo "$out" | grep -q "skipped $d/checkpoint.bin: the 4 bytes after the CRC are 10000000, not zero: corrupted"' \
  "a flipped byte after the CRC: exit $rc, $(echo "$out" | grep skipped)"

# divergence with --ckpt-every 1: steps 5, 6, 7 infinite; step 4's checkpoint holds the weights that gave them
MLM_TEST_INF_GRAD=5:0 run "${COMMON[@]}" --out "$W/d" --steps 20 --ckpt-every 1 >"$W/d.log" 2>&1; rc=$?
check '[ $rc = 2 ] && grep -qF "diverged: 3 steps in a row (--max-bad-steps 3); stopping, exit code 2: $W/d/checkpoint.bin (step 4) set aside as $W/d/checkpoint-4.bin.diverged, its weights gave step 5; the newest intact checkpoint is $W/d/checkpoint-3.bin (step 3): --resume continues from it" "$W/d.log"' \
  "divergence did not set aside step 4's checkpoint (exit $rc): $(tail -n 1 "$W/d.log")"
check '[ -f "$W/d/checkpoint-4.bin.diverged" ] && [ ! -e "$W/d/checkpoint.bin" ] && [ -f "$W/d/checkpoint-3.bin" ]' \
  "after divergence: $(ls "$W/d" | tr '\n' ' ')"
out=$(run "${COMMON[@]}" --out "$W/d" --steps 20 --resume --run-steps 2 2>&1); rc=$?
check '[ $rc = 0 ] && echo "$out" | grep -q "resumed from $W/d/checkpoint-3.bin at step 3$" && echo "$out" | grep -qF "note: $W/d/checkpoint-4.bin.diverged holds weights that diverged at step 5; from step 3 the same flags and data replay the same steps (lower --lr to get past it)"' \
  "--resume after divergence did not take step 3's checkpoint: exit $rc, $(echo "$out" | grep -v '^step' | tail -n 2)"
MLM_TEST_INF_LOSS=3:0 run "${COMMON[@]}" --out "$W/d1" --steps 20 --ckpt-every 1 --keep 1 >"$W/d1.log" 2>&1; rc=$?
check '[ $rc = 2 ] && grep -qF "$W/d1/checkpoint.bin (step 2) set aside as $W/d1/checkpoint-2.bin.diverged, its weights gave step 3; no intact checkpoint is left in $W/d1" "$W/d1.log"' \
  "divergence with --keep 1 (exit $rc): $(tail -n 1 "$W/d1.log")"

# FIFOs and a directory where files are expected: refused at once
mkdir -p "$W/fifo" "$W/fifo_out" "$W/hfdir" "$W/hffifo"
cp "$W/data/train_00000.bin" "$W/fifo/" && mkfifo "$W/fifo/train_00001.bin" "$W/fifo_out/checkpoint.bin" "$W/fifo.bin"
cp "$W/r/config.json" "$W/hfdir/" && mkdir "$W/hfdir/model.safetensors"
cp "$W/r/config.json" "$W/hffifo/" && mkfifo "$W/hffifo/model.safetensors"
CASES=$(cat <<EOF
data: $W/fifo/train_00001.bin: not a regular file|--data $W/fifo/train_*.bin --preset tiny --seq 32 --batch 8 --out $W/o2 --steps 2
$W/fifo_out/checkpoint.bin is a special file, not a file|${COMMON[*]} --out $W/fifo_out --steps 4 --resume
--eval $W/fifo.bin: not a regular file|--eval $W/fifo.bin ${VAL[*]}
model: $W/hfdir/model.safetensors: not a regular file but a directory (expected a safetensors file)|${COMMON[*]} --out $W/o3 --steps 2 --init-from $W/hfdir
model: $W/hffifo/model.safetensors: not a regular file|${COMMON[*]} --out $W/o4 --steps 2 --init-from $W/hffifo
EOF
)
set -f  # the patterns in the arguments go to the trainer as they are
while IFS='|' read -r pat args; do
  out=$(eval "run $args" 2>&1); rc=$?
  check '[ $rc = 1 ] && echo "$out" | grep -qF -- "$pat" && ! echo "$out" | grep -q 9223372036854775807' \
    "'$args' gave exit $rc (124: it blocked) and: $(echo "$out" | tail -n 2)"
done <<<"$CASES"
set +f

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
